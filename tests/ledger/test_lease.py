"""Ledger leases: one holder at a time, renewed while held, taken over once expired, and a lost
lease detected before its holder publishes anything."""

from __future__ import annotations

import threading
import time

import pytest

from sailor_tasks.errors import LeaseBusyError, LeaseLostError
from sailor_tasks.ledger import Ledger


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path}/ledger.db"


def test_one_holder_at_a_time_until_release_or_expiry(url):
    a, b = Ledger(url), Ledger(url)  # two processes' ledgers on one database
    assert a.try_lease("replica:x", "a", ttl_s=30)
    assert not b.try_lease("replica:x", "b", ttl_s=30)
    assert b.lease_holder("replica:x") == "a"
    assert b.try_lease("replica:y", "b", ttl_s=30)  # another name is free
    assert a.try_lease("replica:x", "a", ttl_s=30)  # the holder renews
    assert a.release_lease("replica:x", "a")
    assert b.try_lease("replica:x", "b", ttl_s=0.2)
    time.sleep(0.3)  # b stops renewing (killed): its lease lapses
    assert a.lease_holder("replica:x") is None
    assert not b.renew_lease("replica:x", "b", ttl_s=30)  # too late to renew
    assert a.try_lease("replica:x", "a", ttl_s=30)


def test_lease_is_renewed_while_held_and_waiters_get_it_after(url):
    first, second = Ledger(url), Ledger(url)
    order: list[str] = []
    inside = threading.Event()

    def hold() -> None:
        with first.lease("replica:z", ttl_s=0.3, poll_s=0.02):
            order.append("first in")
            inside.set()
            time.sleep(1.0)  # three times the TTL: only renewals keep it
            order.append("first out")

    t = threading.Thread(target=hold)
    t.start()
    inside.wait(5)
    with second.lease("replica:z", ttl_s=0.3, poll_s=0.02):
        order.append("second in")
    t.join()
    assert order == ["first in", "first out", "second in"]
    assert first.live_leases() == []


def test_busy_lease_times_out_naming_the_holder(url):
    a, b = Ledger(url), Ledger(url)
    assert a.try_lease("replica:q", "copier-on-host-a", ttl_s=30)
    with pytest.raises(LeaseBusyError, match="copier-on-host-a"):
        b.lease("replica:q", wait_s=0.2, poll_s=0.05).acquire()


def test_lost_lease_is_detected_before_publishing(url):
    a, b = Ledger(url), Ledger(url)
    lease = a.lease("replica:w", ttl_s=30)
    lease.acquire()
    try:
        lease.check()  # still held
        # another holder takes it over (as after an expiry the renewer missed)
        with b.engine.begin() as c:
            c.exec_driver_sql("UPDATE leases SET expires_at = 0")
        assert b.try_lease("replica:w", "b", ttl_s=30)
        with pytest.raises(LeaseLostError, match="replica:w"):
            lease.check()
    finally:
        lease.release()
    assert a.lease_holder("replica:w") == "b"  # releasing a lost lease leaves the new holder's


def test_bad_lease_options_are_refused(url):
    with pytest.raises(ValueError, match="ttl_s=0"):
        Ledger(url).lease("x", ttl_s=0)


def test_a_lease_not_renewed_for_a_whole_ttl_is_lost_though_the_ledger_never_said_so(url):
    """The ledger unreachable (every renewal raises) for longer than the lease lasts: another
    holder may have taken it, so the holder counts it lost rather than working on for ever."""
    from sailor_tasks.ledger.lease import Lease

    ledger = Ledger(url)
    lease = Lease(ledger, "replica:x", ttl_s=0.3)
    lease.acquire()
    try:
        lease.raise_if_lost()  # held
        calls = []

        def unreachable(*a, **k):
            calls.append(1)
            raise OSError("connection refused")

        ledger.renew_lease = unreachable
        assert lease.lost.wait(2.0), "still counted as held after several lapsed ttls"
        assert len(calls) >= 2  # it kept trying while the lease could still be its own
        with pytest.raises(LeaseLostError):
            lease.raise_if_lost()
    finally:
        lease._stop.set()
