#!/usr/bin/env python3
"""What a unique index on random keys costs a SQLite WAL: a table shaped like the index files'
`records` (an integer row id, a 32-hex `id` = hash of (uri, level), `uri`, `level`, ~1.1 KB of
payload, an index on (uri, level)) holding 10,000 nodes x 3 levels, from which 9,900 nodes
are deleted in URI order, one transaction per batch of records, as the index worker does.
Prints the WAL bytes written with and without a UNIQUE index on `id`, per batch size, as JSON
(docs/benchmarks.md, "A bulk delete without savepoints").

    python3 scripts/bench/wal_amplification.py [PAGE_SIZE=4096]
"""
import hashlib, json, os, sqlite3, sys, tempfile

PAGE = int(sys.argv[1]) if len(sys.argv) > 1 else 4096


def wal_mib(unique_id, batch_records):
    path = os.path.join(tempfile.mkdtemp(), "records.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute(f"PRAGMA page_size={PAGE}")
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA wal_autocheckpoint=0")
    unique = "UNIQUE" if unique_id else ""
    c.execute(f"CREATE TABLE records (doc INTEGER PRIMARY KEY, id TEXT NOT NULL {unique}, "
              "uri TEXT NOT NULL, level INTEGER NOT NULL, payload TEXT NOT NULL)")
    c.execute("CREATE INDEX records_by_uri ON records (uri, level)")
    uris = [f"ctx://bench/docs/d{i:05}" for i in range(10000)]
    c.execute("BEGIN")
    for u in uris:
        for level in range(3):
            key = hashlib.md5(f"{u}#{level}".encode()).hexdigest()
            c.execute("INSERT INTO records (id, uri, level, payload) VALUES (?, ?, ?, ?)",
                      (key, u, level, "x" * 1100))
    c.execute("COMMIT")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    frames, nodes = 0, batch_records // 3
    gone = uris[100:]
    for k in range(0, len(gone), nodes):
        c.execute("BEGIN")
        for u in gone[k:k + nodes]:
            c.execute("DELETE FROM records WHERE uri = ?", (u,))
        c.execute("COMMIT")
        frames += os.path.getsize(path + "-wal") // (PAGE + 24)
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = os.path.getsize(path)
    c.close()
    return round(frames * PAGE / 2**20, 1), round(size / 2**20, 1)


out = {"page_size": PAGE, "runs": []}
for batch in (300, 600, 1500):
    for unique_id in (True, False):
        wal, size = wal_mib(unique_id, batch)
        out["runs"].append({"records_per_transaction": batch, "unique_id_index": unique_id,
                            "wal_mib": wal, "file_mib": size})
print(json.dumps(out, indent=1))
