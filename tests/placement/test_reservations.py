"""Optimistic reservations: conflicts re-plan on a fresh view, retries are idempotent, never overcommit."""

from __future__ import annotations

import dataclasses

import pytest

from sailor_tasks.catalog.offers import Catalog
from sailor_tasks.errors import CapacityUnavailableError
from sailor_tasks.ledger import Ledger
from sailor_tasks.model import ClusterState, JobRequest, Offer, Reservation
from sailor_tasks.placement.index import index_for
from sailor_tasks.placement.reservations import ledger_state, plan_and_reserve


def offer(zone, spot, cap):
    return Offer("gcp", zone.rsplit("-", 1)[0], zone, "V100", 1, "n1-standard-8", 2.0, spot, False, cap, 0.0)


CATALOG = Catalog((offer("us-east1-b", 0.5, 4), offer("us-east1-c", 0.6, 4)))


def req(n=4):
    return JobRequest(
        job_name="j", team="t", dataset_uri="sailor://source/d", model="gpt_25m", num_workers=n, market="spot"
    )


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    yield led
    led.dispose()


def test_reserve_if_free_refuses_to_overcommit(ledger):
    assert ledger.reserve_if_free(Reservation("a", "us-east1", "us-east1-b", "V100", 3, "spot"), 4)
    assert not ledger.reserve_if_free(Reservation("b", "us-east1", "us-east1-b", "V100", 2, "spot"), 4)
    assert ledger.reserve_if_free(Reservation("b", "us-east1", "us-east1-b", "V100", 1, "spot"), 4)
    assert sorted(r.run_id for r in ledger.live_reservations()) == ["a", "b"]


def test_conflict_on_a_stale_view_replans_on_a_fresh_one(ledger):
    # Another planner took us-east1-b after this planner's first snapshot was taken.
    stale = ClusterState()
    views = iter([stale])

    def snapshot():
        return next(views, None) or ledger_state(ledger, req(), "mine")

    ledger.reserve_if_free(Reservation("other", "us-east1", "us-east1-b", "V100", 4, "spot"), 4)
    reserved = plan_and_reserve(req(), CATALOG, ledger, "mine", snapshot=snapshot)
    assert reserved.attempts == 2 and len(reserved.conflicts) == 1
    assert "us-east1-b taken by another planner" in reserved.conflicts[0]
    assert reserved.placement.zone == "us-east1-c"
    assert "reserved on attempt 2 after 1 conflict(s)" in reserved.placement.explanation[-1]


def test_bounded_retries_end_in_a_capacity_error_with_history(ledger):
    ledger.reserve_if_free(Reservation("x", "us-east1", "us-east1-b", "V100", 4, "spot"), 4)
    ledger.reserve_if_free(Reservation("y", "us-east1", "us-east1-c", "V100", 4, "spot"), 4)
    with pytest.raises(CapacityUnavailableError, match="after 3 attempts") as err:
        plan_and_reserve(req(), CATALOG, ledger, "mine", snapshot=ClusterState, max_attempts=3)
    assert len(err.value.history) == 3 and err.value.retryable
    assert {r.run_id for r in ledger.live_reservations()} == {"x", "y"}


def test_retry_of_the_same_run_is_idempotent(ledger):
    first = plan_and_reserve(req(), CATALOG, ledger, "run-1")
    again = plan_and_reserve(req(), CATALOG, ledger, "run-1")
    assert (again.placement.zone, again.attempts) == (first.placement.zone, 1)
    live = ledger.live_reservations()
    assert [(r.run_id, r.zone, r.gpus) for r in live] == [("run-1", "us-east1-b", 4)]


def test_teardown_release_frees_the_capacity(ledger):
    plan_and_reserve(req(), CATALOG, ledger, "run-1")
    plan_and_reserve(req(), CATALOG, ledger, "run-2")
    with pytest.raises(CapacityUnavailableError):
        plan_and_reserve(req(), CATALOG, ledger, "run-3")
    assert ledger.release("run-1")
    assert plan_and_reserve(req(), CATALOG, ledger, "run-3").placement.zone == "us-east1-b"


def test_ledger_state_carries_dataset_size_and_assignment_load(ledger):
    ledger.record_replica("sailor://source/d", "us-east1", "file:///x", 5_000_000, 2)
    ledger.publish_assignment({"t": {"us-east1": 1.0}}, source="test", region_load={"us-east1": 1.5})
    state = ledger_state(ledger, req(), "run-1")
    assert state.dataset_bytes == {"sailor://source/d": 5_000_000}
    assert state.replicas == {"sailor://source/d": ("us-east1",)}
    assert state.assignment.region_load == {"us-east1": 1.5}
    assert state.checkpoint is None
    assert ledger_state(ledger, req(), "run-1", checkpoint=("us-east1", 7)).checkpoint == ("us-east1", 7)


def test_ledger_state_reads_the_gpus_held_per_zone_and_type_summed_by_the_database(ledger):
    """A snapshot carries the sums, not every reservation row: the run's own reservation and
    released ones do not count, and the planner counts what the sums hold."""
    for run_id, zone, gpus in (("a", "us-east1-b", 2), ("b", "us-east1-b", 3), ("c", "us-east1-c", 4)):
        ledger.reserve(Reservation(run_id, "us-east1", zone, "V100", gpus, "spot"))
    ledger.reserve(Reservation("mine", "us-east1", "us-east1-c", "V100", 8, "spot"))
    ledger.reserve(Reservation("gone", "us-east1", "us-east1-c", "V100", 8, "spot"))
    ledger.release("gone")
    state = ledger_state(ledger, req(), "mine")
    assert state.reservations == ()
    assert state.held_gpus == {("us-east1-b", "V100"): 5, ("us-east1-c", "V100"): 4}
    index = index_for(CATALOG)
    by_zone = {z: int(n) for (z, g), n in zip(index.groups, index.used_gpus(state), strict=True) if n}
    assert by_zone == {"us-east1-b": 5, "us-east1-c": 4}
    both = dataclasses.replace(
        state, reservations=(Reservation("x", "us-east1", "us-east1-b", "V100", 1, "spot"),)
    )
    assert int(index.used_gpus(both).sum()) == 10  # the sums and the reservations add up


def _race(i, url, barrier, results):
    ledger = Ledger(url)
    barrier.wait()
    try:
        results.put(("placed", plan_and_reserve(req(), CATALOG, ledger, f"p{i}").placement.zone))
    except CapacityUnavailableError:
        results.put(("failed_clean", None))
    finally:
        ledger.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_parallel_planners_in_processes_never_overcommit(tmp_path, request, backend):
    import multiprocessing as mp

    url = f"sqlite:///{tmp_path}/race.db" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    Ledger(url).dispose()
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(i, url, barrier, results)) for i in range(6)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    # Two zones with room for one 4-GPU run each: exactly two planners win, four fail cleanly.
    assert sorted(zone for status, zone in outcomes if status == "placed") == ["us-east1-b", "us-east1-c"]
    assert sum(status == "failed_clean" for status, _ in outcomes) == 4
    ledger = Ledger(url)
    assert sorted(r.zone for r in ledger.live_reservations()) == ["us-east1-b", "us-east1-c"]
    ledger.dispose()
