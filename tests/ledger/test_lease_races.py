"""Reservation leases and named leases under races: a renewal and the reconciler's reclaim never
both win, the reconciler fences a lease before it stops the run, and a lease granted after a long
wait for the ledger's write lock is not born expired."""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
import time

import pytest
from sqlalchemy import event

from sailor_tasks import backends
from sailor_tasks.errors import LeaseReclaimedError, ReservationReleasedError
from sailor_tasks.ledger.store import Ledger, utcnow
from sailor_tasks.model import Reservation
from sailor_tasks.stages import queueing


def _reserved(ledger: Ledger) -> dt.datetime:
    ledger.reserve(Reservation("run-a", "us-central1", "us-central1-a", "A100", 8, "spot"), lease_s=1)
    return utcnow() + dt.timedelta(seconds=5)  # the 1 s lease has expired by then


def test_a_reclaim_landing_inside_a_renewal_cannot_both_win(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    later = _reserved(ledger)
    threads, result = [], {}

    def reclaim_between(conn, cursor, statement, *args):
        # the reconciler (another process) runs just after the renewal read "the reservation is live"
        if not threads and statement.lstrip().startswith("SELECT reservations.run_id"):
            th = threading.Thread(
                target=lambda: result.setdefault("reclaimed", ledger.reclaim("run-a", later))
            )
            threads.append(th)
            th.start()
            th.join(3)

    engines = {ledger.engine, ledger._locking_engine}
    for engine in engines:
        event.listen(engine, "after_cursor_execute", reclaim_between)
    try:
        renewed = ledger.renew_reservation_lease("run-a", 900, "train heartbeat")
        threads[0].join()
    finally:
        for engine in engines:
            event.remove(engine, "after_cursor_execute", reclaim_between)
    live = [r.run_id for r in ledger.live_reservations()]
    assert renewed != result["reclaimed"]  # exactly one of them won
    assert (live == ["run-a"]) is renewed
    if not renewed:  # reclaimed: the run learns it at its next renewal
        assert ledger.reservation_leases()["run-a"]["reclaimed_at"] is not None


def test_the_reconciler_stops_no_run_whose_lease_was_renewed_meanwhile_and_fences_the_ones_it_stops(
    tmp_path, monkeypatch
):
    from sailor_tasks.settings import Settings
    from sailor_tasks.stages.context import StageContext

    ctx = StageContext(Settings.from_env({"SAILOR_STATE_DIR": str(tmp_path)}))
    ctx.ledger.upsert_run(
        "run-a", status="running", backend="local", team="t", job_name="j", model="m",
        dataset_uri="file:///x", request={},
    )  # fmt: skip
    now = _reserved(ctx.ledger)
    calls = []

    class Backend:
        def cancel(self, key):
            calls.append("cancel")
            # the run's heartbeat beats while its backend is being stopped: too late, it was fenced
            assert ctx.ledger.renew_reservation_lease("run-a", 900, "train heartbeat") is False
            return 1

        def teardown(self, key):
            calls.append("teardown")

    monkeypatch.setattr(backends, "get_backend", lambda name, settings: Backend())
    out = queueing.reconcile(ctx, now=now)
    assert calls == ["cancel", "teardown"] and out["reclaimed"] == ["run-a"]
    assert ctx.ledger.live_reservations() == [] and ctx.ledger.get_run("run-a")["status"] == "failed"

    # A renewal that lands before the reconciler claims the lease wins: nothing is stopped.
    calls.clear()
    ctx.ledger.reserve(Reservation("run-b", "us-central1", "us-central1-a", "A100", 8, "spot"), lease_s=1)
    expired = ctx.ledger.expired_leases(now)
    ctx.ledger.renew_reservation_lease("run-b", 900, "train heartbeat")
    monkeypatch.setattr(ctx.ledger, "expired_leases", lambda when: expired)  # read before the renewal
    assert queueing.reconcile(ctx, now=now)["reclaimed"] == [] and calls == []
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-b"]


def test_a_named_lease_granted_after_a_long_wait_for_the_write_lock_is_not_born_expired(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    ledger.try_lease("warm-up", "w", 1)
    locked = threading.Event()

    def busy_writer():  # another process holds the write lock for longer than the lease's ttl
        con = sqlite3.connect(f"{tmp_path}/ledger.db", isolation_level=None)
        con.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(2.0)
        con.execute("COMMIT")
        con.close()

    threading.Thread(target=busy_writer).start()
    locked.wait()
    assert ledger.try_lease("replica:x", "A", 1.5)  # waits ~2 s for the lock
    assert ledger.lease_holder("replica:x") == "A"
    assert not ledger.try_lease("replica:x", "B", 60)


def _run(ledger: Ledger, run_id: str, status: str = "validated") -> None:
    ledger.upsert_run(
        run_id, job_name="j", team="a", status=status, backend="local", model="m", dataset_uri="x", request={}
    )


def test_a_plan_that_lost_the_race_to_its_teardown_reserves_nothing_and_keeps_the_run_ended(tmp_path):
    """A retried plan read the run ``planned``, then its teardown released it and ended it: the
    plan's reservation and its ``planned`` mark would hold GPUs for an ended run for a whole lease."""
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    _run(ledger, "x")
    res = Reservation("x", "us-central1", "us-central1-a", "T4", 2, "spot")
    assert ledger.reserve_if_free(res, 4) and ledger.mark_planned("x")
    ledger.release("x")  # teardown
    ledger.upsert_run("x", status="failed")
    with pytest.raises(ReservationReleasedError, match="ended .failed."):
        ledger.reserve_if_free(res, 4)
    assert ledger.live_reservations() == [] and ledger.get_run("x")["status"] == "failed"

    # the same race one step later: the reservation was made, then the run ended before its mark
    _run(ledger, "y")
    assert ledger.reserve_if_free(Reservation("y", "us-central1", "us-central1-a", "T4", 1, "spot"), 4)
    ledger.upsert_run("y", status="cancelled")
    assert ledger.mark_planned("y") is False
    assert ledger.get_run("y")["status"] == "cancelled" and ledger.live_reservations() == []


def test_a_plan_cannot_undo_the_reconcilers_claim_on_an_expired_lease(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    _run(ledger, "run-a", "running")
    later = _reserved(ledger)
    assert ledger.claim_expired("run-a", later)
    with pytest.raises(LeaseReclaimedError):
        ledger.reserve_if_free(Reservation("run-a", "us-central1", "us-central1-b", "A100", 8, "spot"), 16)
    assert ledger.renew_reservation_lease("run-a", 900, "train heartbeat") is False  # still fenced
    assert ledger.reclaim("run-a", later) and ledger.live_reservations() == []


def test_a_cancel_landing_while_the_reconciler_reclaims_stays_a_cancel(tmp_path, monkeypatch):
    """The reconciler marks the run failed in its reclaim's transaction, only if the run is still
    live; a user's cancel (or the train task's own end) recorded just before is not overwritten,
    nor is the attempt it ended when the reconciler reads the attempts afterwards."""
    from sailor_tasks.settings import Settings
    from sailor_tasks.stages.context import StageContext

    ctx = StageContext(Settings.from_env({"SAILOR_STATE_DIR": str(tmp_path)}))
    _run(ctx.ledger, "run-a", "running")
    now = _reserved(ctx.ledger)
    ctx.ledger.start_attempt("run-a", 1, 1, {"region": "us-central1", "zone": "us-central1-a"}, {})

    class Backend:
        def cancel(self, key):
            return 1

        def teardown(self, key):
            return True

    monkeypatch.setattr(backends, "get_backend", lambda name, settings: Backend())
    reclaim = ctx.ledger.reclaim

    def cancel_lands(run_id, now=None, **kw):  # the cancel commits, then the reclaim's transaction
        ctx.ledger.end_attempt("run-a", 1, "cancelled", detail="stopped while running (run cancelled)")
        ctx.ledger.advance_run("run-a", "cancelled", from_statuses=("running",))
        return reclaim(run_id, now, **kw)

    monkeypatch.setattr(ctx.ledger, "reclaim", cancel_lands)
    assert queueing.reconcile(ctx, now=now)["reclaimed"] == ["run-a"]
    assert ctx.ledger.get_run("run-a")["status"] == "cancelled"
    assert ctx.ledger.attempts("run-a")[0]["outcome"] == "cancelled"
