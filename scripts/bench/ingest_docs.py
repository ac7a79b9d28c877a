#!/usr/bin/env python3
"""Writes 10,000 documents in the node layout `ce bench ingest` uses, for measuring by hand:
ROOT/docs/dNNNNN/content.md (~250 characters from a 48-word vocabulary, seeded) and
ROOT/docs/dNNNNN/.meta.json ({"meta": {"group": "gN"}}).

    python3 scripts/bench/ingest_docs.py /tmp/fp/src
    ce --data-dir D import /tmp/fp/src/docs --into ctx://bench/docs
"""
import os, random, json, sys
root = sys.argv[1]
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon phi chi psi omega river mountain cloud forest ocean desert valley meadow stone iron copper silver golden crimson azure violet amber ivory ember frost storm thunder lightning breeze shadow light".split()
random.seed(7)
for i in range(10000):
    d = os.path.join(root, "docs", f"d{i:05d}")
    os.makedirs(d, exist_ok=True)
    text = " ".join(random.choice(words) for _ in range(40))[:250]
    open(os.path.join(d, "content.md"), "w").write(text)
    json.dump({"meta": {"group": f"g{i % 10}"}}, open(os.path.join(d, ".meta.json"), "w"))
