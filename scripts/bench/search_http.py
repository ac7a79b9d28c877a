#!/usr/bin/env python3
"""Search latency over HTTP as a client sees it: POSTs each line of QUERIES to a running
`ce serve` (`/v1/search`, mode MODE, optional extra JSON fields such as a filter) ROUNDS times
and prints p50/p95/p99/max in ms as JSON.

    PORT=7420 python3 scripts/bench/search_http.py QUERIES MODE [ROUNDS=1] ['{"account_id":"a"}']
"""
import json, os, sys, time, urllib.request
PORT = os.environ.get("PORT", "7420")
queries, mode = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
qs = [l.strip() for l in open(queries)]
lat = []
for _ in range(rounds):
    for q in qs:
        body = json.dumps({"query": q, "mode": mode, **extra}).encode()
        req = urllib.request.Request("http://127.0.0.1:%s/v1/search" % PORT, data=body, headers={"content-type": "application/json"})
        t = time.perf_counter(); r = urllib.request.urlopen(req).read(); lat.append((time.perf_counter() - t) * 1e3)
s = sorted(lat)
pick = lambda p: s[min(len(s) - 1, int(p * len(s)))]
print(json.dumps({"mode": mode, "extra": extra, "n": len(s), "p50": round(pick(.5), 2), "p95": round(pick(.95), 2), "p99": round(pick(.99), 2), "max": round(s[-1], 2)}))
