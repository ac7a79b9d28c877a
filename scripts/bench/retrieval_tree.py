#!/usr/bin/env python3
"""The tree of `ce bench retrieval` as an import folder, for profiling a long-running server.

Same word generator, seed and sizes as crates/ce-cli/src/bench_retrieval.rs (`tree_ops`): 100
topics x 10 subtopics, each with a 12-word abstract, and LEAVES leaves with a 10-word abstract
and a 60-word content. Writes DIR/tree (import it with `ce import DIR/tree --into ctx://bench`)
and DIR/queries.txt (the bench's 300 four-word queries, drawn after the tree as it draws them).

    python3 scripts/bench/retrieval_tree.py DIR [LEAVES=100000]
"""
import math, os, sys
N = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
out = os.path.join(sys.argv[1], "tree")
TOPICS, SUBTOPICS, VOCAB = 100, 10, 20000
SYL = ["ka","lo","mi","ne","ra","tu","si","vo","pe","da","zu","qi","ho","be","fy","wa"]
M = (1 << 64) - 1
class Rng:
    def __init__(s, x): s.x = x
    def next(s):
        x = s.x
        x ^= x >> 12; x ^= (x << 25) & M; x ^= x >> 27
        s.x = x
        return (x * 0x2545F4914F6CDD1D) & M
    def unit(s): return (s.next() >> 11) / float(1 << 53)
    def zipf(s, n):
        r = int(math.exp(math.log(n) * s.unit()))
        return min(max(r - 1, 0), n - 1)
def word(i):
    w = ""
    while True:
        w += SYL[i % 16]; i //= 16
        if i == 0: return w
rng = Rng(0x9e3779b97f4a7c15)
def words(t, n):
    sl = VOCAB // TOPICS
    return " ".join(word(t*sl + rng.zipf(sl)) if rng.next() % 2 == 0 else word(rng.zipf(VOCAB)) for _ in range(n))
def put(path, abs_, content=None):
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, ".abstract.md"), "w").write(abs_)
    if content is not None:
        open(os.path.join(path, "content.md"), "w").write(content)
per = max(-(-N // (TOPICS*SUBTOPICS)), 1)
written = 0
for t in range(TOPICS):
    put(f"{out}/t{t}", words(t, 12))
    for s in range(SUBTOPICS):
        put(f"{out}/t{t}/s{s}", words(t, 12))
        for d in range(per):
            if written == N: break
            written += 1
            put(f"{out}/t{t}/s{s}/d{d}", words(t, 10), words(t, 60))
# queries after the tree, as the bench draws them
with open(os.path.join(sys.argv[1], "queries.txt"), "w") as f:
    for i in range(300):
        f.write(words(i % TOPICS, 4) + "\n")
