"""Processes to kill for fault injection (tests and bench/faults.py): a dataset copier that copies
slowly, holding its replica's ledger lease, so that a test can kill -9 it mid-file.

``python -m sailor_tasks.testing.faults copy SRC DST LEDGER_URL [--ttl S] [--delay S]`` copies
``SRC`` to ``DST`` with ``copy_dataset`` reading the source in 4 KiB chunks, ``--delay`` seconds
apart, while holding the lease ``replica:DST`` of the ledger at ``LEDGER_URL`` (``--ttl`` seconds).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sailor_tasks import storage
from sailor_tasks.data import copier
from sailor_tasks.ledger import Ledger


class _SlowReads:
    """A file opened for reading whose every ``read`` waits ``delay_s`` first."""

    def __init__(self, f: Any, delay_s: float):
        self._f, self._delay_s = f, delay_s

    def read(self, n: int = -1) -> bytes:
        time.sleep(self._delay_s)
        return self._f.read(n)

    def __enter__(self) -> _SlowReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


class _SlowSource:
    def __init__(self, fs: Any, delay_s: float):
        self._fs, self._delay_s = fs, delay_s

    def open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        f = self._fs.open(path, mode, **kw)
        return _SlowReads(f, self._delay_s) if "r" in mode else f

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


def slow_copy(src: str, dst: str, ledger_url: str, ttl_s: float, delay_s: float) -> copier.CopyResult:
    """``copy_dataset(src, dst)`` under the replica's lease, reading ``src`` slowly."""
    real = storage.filesystem

    def filesystem(uri: str) -> tuple[Any, str]:
        fs, path = real(uri)
        return (_SlowSource(fs, delay_s) if uri.startswith(src) else fs), path

    storage.filesystem = filesystem  # type: ignore[assignment]
    copier.CHUNK_BYTES = 4096
    ledger = Ledger(ledger_url)
    try:
        return copier.copy_dataset(
            src,
            dst,
            progress=None,
            max_workers=1,
            lease=lambda name: ledger.lease(name, ttl_s=ttl_s, poll_s=0.1),
        )
    finally:
        storage.filesystem = real  # type: ignore[assignment]
        ledger.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sailor_tasks.testing.faults")
    sub = parser.add_subparsers(dest="command", required=True)
    copy = sub.add_parser("copy", help="copy a dataset slowly under its replica's ledger lease")
    copy.add_argument("src", help="source dataset URI")
    copy.add_argument("dst", help="replica URI")
    copy.add_argument("ledger_url", help="SQLAlchemy URL of the ledger")
    copy.add_argument("--ttl", type=float, default=2.0, help="lease time-to-live in seconds")
    copy.add_argument("--delay", type=float, default=0.005, help="seconds before each 4 KiB read")
    args = parser.parse_args(argv)
    result = slow_copy(args.src, args.dst, args.ledger_url, args.ttl, args.delay)
    print(f"copied {result.bytes_copied} B, skipped {result.bytes_skipped} B")


if __name__ == "__main__":
    main()
