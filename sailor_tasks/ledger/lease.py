"""Expiring named leases in the ledger: one holder at a time, renewed in the background.

A holder takes the lease (``Ledger.try_lease``), a daemon thread renews it every ``ttl_s / 3``
seconds, and the holder releases it when its work ends. A holder killed with kill -9 stops
renewing: its lease expires ``ttl_s`` later and the next holder takes it over. Work that must not
publish after losing its lease (a copy about to write its manifest) checks ``Lease.check()`` first.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from sailor_tasks.errors import LeaseBusyError, LeaseLostError

logger = logging.getLogger(__name__)

DEFAULT_TTL_S = 60.0
"""Seconds a lease outlives its holder's last renewal (renewed every third of it)."""
DEFAULT_WAIT_S = 1800.0
"""Seconds a caller waits for a busy lease before ``LeaseBusyError`` (a copy may take minutes)."""


def new_holder() -> str:
    """A holder name unique to this call: host, process and a random suffix (shown when busy)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """One held lease; a context manager that renews it while the block runs and releases it after.

    Args:
        ledger: the ``Ledger`` holding the lease.
        name: what is locked (e.g. ``replica:<uri>``).
        ttl_s: seconds the lease lasts after each renewal.
        wait_s: seconds to wait for a busy lease.
        poll_s: seconds between tries while it is busy.
    """

    def __init__(
        self,
        ledger: Any,
        name: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        wait_s: float = DEFAULT_WAIT_S,
        poll_s: float = 0.5,
    ):
        if not ttl_s > 0 or not wait_s >= 0 or not poll_s > 0:
            raise ValueError(
                f"lease {name!r}: ttl_s={ttl_s}, wait_s={wait_s}, poll_s={poll_s} must be positive"
            )
        self.ledger, self.name = ledger, name
        self.ttl_s, self.wait_s, self.poll_s = ttl_s, wait_s, poll_s
        self.holder = new_holder()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lease, waiting while another holder keeps it.

        Raises:
            LeaseBusyError: still held by another after ``wait_s``.
        """
        start = time.monotonic()
        while not self.ledger.try_lease(self.name, self.holder, self.ttl_s):
            waited = time.monotonic() - start
            if waited >= self.wait_s:
                raise LeaseBusyError(self.name, self.ledger.lease_holder(self.name) or "?", waited)
            time.sleep(self.poll_s)
        self._stop.clear()
        self.lost.clear()
        self._renewer = threading.Thread(target=self._renew, name=f"lease-{self.name}", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        renewed = time.monotonic()
        while not self._stop.wait(self.ttl_s / 3):
            try:
                ok = self.ledger.renew_lease(self.name, self.holder, self.ttl_s)
            except Exception as exc:  # the ledger unreachable: keep trying until the lease would lapse
                logger.warning("lease %s: renewal failed (%s)", self.name, exc)
                if time.monotonic() - renewed < self.ttl_s:
                    continue
                # Not renewed for a whole ttl: another holder may have taken it by now.
                ok = False
            if not ok:
                logger.error("lease %s of %s was lost (expired or taken over)", self.name, self.holder)
                self.lost.set()
                return
            renewed = time.monotonic()

    def raise_if_lost(self) -> None:
        """Raise ``LeaseLostError`` once the renewals found the lease lost or lapsed (no ledger
        call: cheap enough before every unit of the work)."""
        if self.lost.is_set():
            raise LeaseLostError(self.name, self.holder)

    def check(self) -> None:
        """Raise ``LeaseLostError`` unless the ledger still shows this holder holding the lease."""
        if self.lost.is_set() or not self.ledger.renew_lease(self.name, self.holder, self.ttl_s):
            self.lost.set()
            raise LeaseLostError(self.name, self.holder)

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
            self._renewer = None
        try:
            self.ledger.release_lease(self.name, self.holder)
        except Exception as exc:  # the ledger unreachable: the lease expires on its own
            logger.warning("lease %s: release failed (%s); it expires in %.0f s", self.name, exc, self.ttl_s)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
