#!/usr/bin/env python3
"""Starts (or reuses) a PostgreSQL 16 server with the pgvector extension for tests of the
pgvector vector index, and prints a libpq URL for it on stdout.

The server comes from the PyPI package `pgserver` (PostgreSQL 16.2 + pgvector 0.6.2 in a
wheel); this script installs nothing: `python3 -m pip install pgserver` first (.ci/run does).

    python3 scripts/pgvector-server.py          # start or reuse, print the URL
    python3 scripts/pgvector-server.py --stop   # stop the server (keeps its data directory)

Data directory: ${CE_PGVECTOR_DIR:-/tmp/ce-pgvector}. The server listens on a unix socket in
that directory only (no TCP port), trusts local connections and keeps running after this
script exits (started with pgserver's cleanup_mode=None); running the script again reuses it.
As root, pgserver runs it as the system user `pgserver`.

The URL names the socket directory percent-encoded as the host and the `postgres`
database, e.g. `postgresql://postgres@%2Ftmp%2Fce-pgvector/postgres`: the Rust `postgres`
crate, libpq and psql all accept it.
"""

import fcntl
import logging
import os
import subprocess
import sys
import urllib.parse
import warnings


def fail(msg: str) -> None:
    print(f"pgvector-server: {msg}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    # pgserver's platformdirs warns when XDG_RUNTIME_DIR is unset; that is harmless here.
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    try:
        import pgserver
        from pgserver._commands import POSTGRES_BIN_PATH
    except ImportError:
        fail("the Python package `pgserver` is missing: run `python3 -m pip install pgserver`")

    data = os.path.abspath(os.environ.get("CE_PGVECTOR_DIR", "/tmp/ce-pgvector"))
    if "--stop" in sys.argv[1:]:
        if not os.path.exists(os.path.join(data, "postmaster.pid")):
            print(f"no server running in {data}", file=sys.stderr)
            return
        cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", data, "-w", "stop"]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "pgserver", "--"] + cmd
        subprocess.run(cmd, check=True)
        return

    parent = os.path.dirname(data)
    os.makedirs(parent, exist_ok=True)
    # Test processes started at once (several test binaries, several checkouts) would race
    # to initialise the same directory: one starts the server, the others wait and reuse it.
    lock = open(data.rstrip("/") + ".lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        # cleanup_mode=None: the server outlives this interpreter (the default stops it at
        # exit). get_server reuses a running server of this directory, or starts it.
        server = pgserver.get_server(data, cleanup_mode=None)
    except Exception as e:  # noqa: BLE001 - any failure is reported the same way
        log = os.path.join(data, "log")
        tail = ""
        if os.path.exists(log):
            with open(log, encoding="utf-8", errors="replace") as f:
                tail = "".join(f.readlines()[-20:])
        fail(f"cannot start PostgreSQL in {data}: {e!r}\n{tail}")

    info = server.get_postmaster_info()
    if info.socket_dir is None:
        fail(f"the server in {data} has no unix socket (postmaster.pid: {info})")
    host = urllib.parse.quote(str(info.socket_dir), safe="")
    url = f"postgresql://postgres@{host}/postgres"
    if info.port and int(info.port) != 5432:
        url = f"postgresql://postgres@{host}:{int(info.port)}/postgres"

    # The extension must be creatable (it is created per database by the index itself).
    psql = [str(POSTGRES_BIN_PATH / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", url]
    check = subprocess.run(
        psql + ["-tA", "-c", "CREATE EXTENSION IF NOT EXISTS vector; "
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0 or not check.stdout.strip():
        fail(f"CREATE EXTENSION vector failed on {url}: {check.stderr.strip()}")
    print(url)


if __name__ == "__main__":
    main()
