"""The queue on a PostgreSQL ledger under races: PostgreSQL does not serialise writers the way
SQLite's ``BEGIN IMMEDIATE`` does, so an admission that read "queued" must keep the entry locked
until it commits, or a teardown that takes the run out of the queue meanwhile is overwritten."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Callable, Iterator

from sqlalchemy import event

from sailor_tasks.ledger.store import Ledger, utcnow
from sailor_tasks.model import RUN_STATUSES_DONE, Reservation


def _queued(ledger: Ledger, run_id: str) -> None:
    ledger.enqueue(
        run_id,
        team="ml",
        priority="normal",
        gpu_type="A100",
        gpus=8,
        request={},
        policy="fifo",
        max_wait_until=utcnow() + dt.timedelta(hours=1),
    )


@contextlib.contextmanager
def _racing_after_the_state_read(
    ledger: Ledger, other: Callable[[], object], read: str = "queue_entries.state", locking: bool = True
) -> Iterator[dict]:
    """While the block runs, the first time ``ledger`` runs a statement naming ``read`` (default:
    a read of a queue entry's state) in a locking transaction (any, when not ``locking``),
    ``other`` (another process's call) runs in a thread, given 2 s to finish before the
    transaction goes on; its result (or error) is in the yielded dict under ``"other"`` once the
    block ends."""
    out: dict = {}

    def run_other() -> None:
        try:
            out["other"] = other()
        except Exception as exc:
            out["other"] = exc

    thread = threading.Thread(target=run_other)

    def after_read(conn, cursor, statement, *args):
        if not thread.is_alive() and "other" not in out and read in statement:
            thread.start()
            thread.join(2)  # returns at once unless the read holds the entry

    engine = ledger._locking_engine if locking else ledger.engine
    event.listen(engine, "after_cursor_execute", after_read)
    try:
        yield out
    finally:
        event.remove(engine, "after_cursor_execute", after_read)
        thread.join(30)


def _admit(ledger: Ledger, zone: str) -> bool:
    return ledger.reserve_if_free(
        Reservation("run-q", zone[:-2], zone, "A100", 8, "spot"), capacity_gpus=16, admit={"zone": zone}
    )


def test_a_run_that_leaves_the_queue_while_it_is_admitted_is_not_left_admitted(postgres):
    """An admission pass (one process) read the entry as queued; the run's teardown (another
    process) takes it out of the queue before the admission commits. Either the teardown wins (the
    admission changes nothing) or it waits and learns the run was admitted (returns False, and
    releases the reservation itself): never a run reported gone that holds GPUs."""
    url = postgres.create_database("queue_leave_race")
    admitting, tearing_down = Ledger(url), Ledger(url)
    _queued(admitting, "run-q")
    with _racing_after_the_state_read(
        admitting, lambda: tearing_down.end_queue_entry("run-q", "left", "cancelled")
    ) as race:
        admitted = _admit(admitting, "us-central1-a")
    state = tearing_down.queue_entry("run-q")["state"]
    assert (admitted, race["other"], state) in ((True, False, "admitted"), (False, True, "left"))
    assert [r.run_id for r in tearing_down.live_reservations()] == (["run-q"] if admitted else [])
    admitting.dispose()
    tearing_down.dispose()


def test_two_admission_passes_admit_a_queued_run_once(postgres):
    """Two admission passes (two processes) pick the same queued run for different zones: one
    admits it, the other changes nothing."""
    url = postgres.create_database("queue_admit_race")
    first, second = Ledger(url), Ledger(url)
    _queued(first, "run-q")
    with _racing_after_the_state_read(first, lambda: _admit(second, "us-east1-b")) as race:
        admitted = _admit(first, "us-central1-a")
    assert (admitted, race["other"]) == (True, False)
    entry = first.queue_entry("run-q")
    assert entry["state"] == "admitted" and entry["placement"] == {"zone": "us-central1-a"}
    assert [(r.run_id, r.zone) for r in first.live_reservations()] == [("run-q", "us-central1-a")]
    first.dispose()
    second.dispose()


def test_a_run_torn_down_while_it_is_recorded_planned_ends_failed(postgres):
    """``plan`` (an admission pass, say) reserved the run and records it ``planned``; the run's
    teardown (another process) releases the reservation meanwhile and marks the unfinished run
    ``failed``. Either order must end ``failed`` with nothing held: never ``planned`` for a run
    whose teardown is over."""
    url = postgres.create_database("planned_teardown_race")
    planning, tearing_down = Ledger(url), Ledger(url)
    planning.upsert_run(
        "run-p",
        job_name="j",
        team="ml",
        status="validated",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/d",
        request={},
    )
    planning.reserve(Reservation("run-p", "us-central1", "us-central1-a", "A100", 8, "spot"))

    def teardown() -> bool:
        released = tearing_down.release("run-p")
        if tearing_down.get_run("run-p")["status"] not in RUN_STATUSES_DONE:
            tearing_down.upsert_run("run-p", status="failed")
        return released

    with _racing_after_the_state_read(planning, teardown, read="reservations.released_at IS NULL") as race:
        planned = planning.mark_planned("run-p", zone="us-central1-a")
    assert race["other"] is True and planned is True  # the teardown waited for the planned record
    assert tearing_down.get_run("run-p")["status"] == "failed"
    assert tearing_down.live_reservations() == []


def test_a_run_torn_down_while_it_is_recorded_provisioned_keeps_its_end(postgres, tmp_path):
    """``provision`` records the run ``provisioned`` while its teardown (another process) marks it
    ``failed``: either order must end ``failed``, never ``provisioned`` after the teardown."""
    from sailor_tasks.settings import Settings
    from sailor_tasks.stages import StageContext
    from sailor_tasks.stages.prepare import _mark_provisioned

    url = postgres.create_database("provisioned_teardown_race")
    provisioning, tearing_down = Ledger(url), Ledger(url)
    provisioning.upsert_run(
        "run-p",
        job_name="j",
        team="ml",
        status="planned",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/d",
        request={},
    )
    ctx = StageContext(Settings.from_env({}).with_state_dir(str(tmp_path / "state")))
    ctx.__dict__["ledger"] = provisioning

    def teardown() -> None:
        if tearing_down.get_run("run-p")["status"] not in RUN_STATUSES_DONE:
            tearing_down.upsert_run("run-p", status="failed")

    with _racing_after_the_state_read(provisioning, teardown, read="runs.run_id", locking=False) as race:
        _mark_provisioned(ctx, "run-p")
    assert "other" in race and not isinstance(race["other"], Exception), race
    assert tearing_down.get_run("run-p")["status"] == "failed"


def test_re_reserving_a_run_while_its_lease_is_renewed_never_deadlocks(postgres):
    """A recovery re-reserves the run (``reserve_if_free`` into another zone) while its training
    heartbeat renews the lease: both lock the reservation's row, then the lease's, so one waits
    for the other and both succeed."""
    url = postgres.create_database("reserve_renew_order")
    reserving, renewing = Ledger(url), Ledger(url)
    reserving.reserve(Reservation("run-x", "us-east1", "us-east1-c", "A100", 8, "spot"))

    with _racing_after_the_state_read(
        reserving, lambda: renewing.renew_reservation_lease("run-x"), read="DELETE FROM reservation_leases"
    ) as race:
        moved = reserving.reserve_if_free(
            Reservation("run-x", "us-east1", "us-east1-b", "A100", 8, "spot"), capacity_gpus=16
        )
    assert moved is True and race["other"] is True, race
    (live,) = renewing.live_reservations()
    assert live.zone == "us-east1-b"
