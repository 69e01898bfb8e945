"""The queue on a PostgreSQL ledger under races: PostgreSQL does not serialise writers the way
SQLite's ``BEGIN IMMEDIATE`` does, so an admission that read "queued" must keep the entry locked
until it commits, or a teardown that takes the run out of the queue meanwhile is overwritten."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from sqlalchemy import event

from sailor_tasks.ledger.store import Ledger, utcnow
from sailor_tasks.model import Reservation


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    from sailor_tasks.testing.airflow_stack import Postgres

    pg = Postgres(tmp_path_factory.mktemp("pg"))
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


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


def test_a_run_that_leaves_the_queue_while_it_is_admitted_is_not_left_admitted(postgres):
    """An admission pass (one process) read the entry as queued; the run's teardown (another
    process) takes it out of the queue before the admission commits. Either the teardown wins (the
    admission changes nothing) or it waits and learns the run was admitted (returns False, and
    releases the reservation itself): never a run reported gone that holds GPUs."""
    url = postgres.create_database("queue_leave_race")
    admitting, tearing_down = Ledger(url), Ledger(url)
    _queued(admitting, "run-q")
    left: dict[str, bool] = {}
    teardown = threading.Thread(
        target=lambda: left.setdefault("run-q", tearing_down.end_queue_entry("run-q", "left", "cancelled"))
    )

    def teardown_after_the_read(conn, cursor, statement, *args):
        if not teardown.is_alive() and "run-q" not in left and "queue_entries.state" in statement:
            teardown.start()
            teardown.join(2)  # returns at once unless the admission's read holds the entry

    event.listen(admitting._locking_engine, "after_cursor_execute", teardown_after_the_read)
    try:
        admitted = admitting.reserve_if_free(
            Reservation("run-q", "us-central1", "us-central1-a", "A100", 8, "spot"),
            capacity_gpus=16,
            admit={"zone": "us-central1-a"},
        )
    finally:
        event.remove(admitting._locking_engine, "after_cursor_execute", teardown_after_the_read)
    teardown.join(30)
    state = tearing_down.queue_entry("run-q")["state"]
    live = [r.run_id for r in tearing_down.live_reservations()]
    assert (admitted, left["run-q"], state) in ((True, False, "admitted"), (False, True, "left"))
    assert live == (["run-q"] if admitted else [])
    admitting.dispose()
    tearing_down.dispose()


def test_two_admission_passes_admit_a_queued_run_once(postgres):
    """Two admission passes (two processes) pick the same queued run for different zones: one
    admits it, the other changes nothing (it does not fail on the first one's rows)."""
    url = postgres.create_database("queue_admit_race")
    first, second = Ledger(url), Ledger(url)
    _queued(first, "run-q")
    outcome: dict[str, object] = {}

    def admit_b() -> None:
        try:
            outcome["b"] = second.reserve_if_free(
                Reservation("run-q", "us-east1", "us-east1-b", "A100", 8, "spot"),
                capacity_gpus=16,
                admit={"zone": "us-east1-b"},
            )
        except Exception as exc:  # the bug: a unique violation on the first pass's rows
            outcome["b"] = exc

    other = threading.Thread(target=admit_b)

    def second_after_the_read(conn, cursor, statement, *args):
        if not other.is_alive() and "b" not in outcome and "queue_entries.state" in statement:
            other.start()
            other.join(2)

    event.listen(first._locking_engine, "after_cursor_execute", second_after_the_read)
    try:
        a = first.reserve_if_free(
            Reservation("run-q", "us-central1", "us-central1-a", "A100", 8, "spot"),
            capacity_gpus=16,
            admit={"zone": "us-central1-a"},
        )
    finally:
        event.remove(first._locking_engine, "after_cursor_execute", second_after_the_read)
    other.join(30)
    assert (a, outcome["b"]) == (True, False)
    entry = first.queue_entry("run-q")
    assert entry["state"] == "admitted" and entry["placement"] == {"zone": "us-central1-a"}
    assert [(r.run_id, r.zone) for r in first.live_reservations()] == [("run-q", "us-central1-a")]
    first.dispose()
    second.dispose()
