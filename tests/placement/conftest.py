"""A private PostgreSQL cluster for the reservation tests (started in a temp folder on a free port,
as user ``postgres`` when the tests run as root; stopped afterwards)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile

import pytest


@pytest.fixture(scope="session")
def postgres_url():
    if not (shutil.which("initdb") and shutil.which("pg_ctl")):
        pytest.skip("initdb/pg_ctl are not on PATH (apt-get install -y postgresql provides them)")
    # Not under pytest's tmp folder: that one is private to root, and the server runs as postgres.
    root = tempfile.mkdtemp(prefix="sailor-test-pg-")
    prefix: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = os.path.join(root, "data")

    def run(*argv: str) -> None:
        subprocess.run([*prefix, *argv], check=True, capture_output=True, text=True)

    run("initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    run("pg_ctl", "-D", data, "-o", opts, "-l", os.path.join(root, "log"), "-w", "start")
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        run("pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)
