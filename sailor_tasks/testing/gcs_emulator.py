"""A local GCS JSON API server for development, tests and benchmarks: ``gcp-storage-emulator`` on
127.0.0.1 and a free port (docker-compose.yaml runs the same server as a service).

gcsfs talks to it through ``STORAGE_EMULATOR_HOST`` with anonymous requests (``storage.fs_options``
never sends credentials to an emulator). ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` keeps gcsfs
2026.10 off the gRPC path the emulator does not serve (otherwise every call waits 46-100 s).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def gcs_emulator() -> Iterator[str]:
    """Start the emulator (in memory) and yield its URL; stop it by PID on exit.

    Point gcsfs at it with ``STORAGE_EMULATOR_HOST=<url>`` and ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``.
    """
    port = free_port()
    exe = shutil.which("gcp-storage-emulator", path=os.path.dirname(sys.executable)) or shutil.which(
        "gcp-storage-emulator"
    )
    if exe is None:
        raise RuntimeError("gcp-storage-emulator is not installed (it is pinned in requirements.txt)")
    proc = subprocess.Popen(
        [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b?project=test", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gcp-storage-emulator did not start on {url}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
