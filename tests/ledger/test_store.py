from __future__ import annotations

import datetime as dt

from sailor_tasks.ledger import Ledger
from sailor_tasks.model import Reservation


def test_runs_upsert_and_list(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/l.db")
    base = dict(
        job_name="j",
        team="t",
        status="validated",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/d",
        request={"a": 1},
    )
    ledger.upsert_run("r1", **base)
    ledger.upsert_run("r1", status="success", final_loss=1.5)
    (run,) = ledger.list_runs()
    assert run["status"] == "success" and run["final_loss"] == 1.5 and run["request"] == {"a": 1}


def test_reservations_are_keyed_by_run_and_released_once(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/l.db")
    ledger.reserve(Reservation("r1", "us-east1", "us-east1-b", "T4", 2, "spot"))
    ledger.reserve(Reservation("r1", "us-east1", "us-east1-c", "T4", 2, "spot"))  # a retried plan
    assert [r.zone for r in ledger.live_reservations()] == ["us-east1-c"]
    assert ledger.release("r1") is True
    assert ledger.release("r1") is False
    assert ledger.live_reservations() == []


def test_utilization_window_and_assignment_versions(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/l.db")
    now = dt.datetime.now(dt.UTC)
    ledger.record_utilization("r1", "t", "us-east1", "T4", 2, now - dt.timedelta(hours=1), now)
    ledger.record_utilization(
        "r0", "t", "us-east1", "T4", 1, now - dt.timedelta(days=30, hours=2), now - dt.timedelta(days=30)
    )
    recent = ledger.utilization_by_team_region(now - dt.timedelta(days=7))
    assert recent == {("t", "us-east1", "T4"): 2.0}
    assert ledger.latest_assignment() is None
    ledger.publish_assignment({"t": {"us-east1": 1.0}}, source="test")
    v2 = ledger.publish_assignment({"t": {"us-east1": 0.5, "asia-east1": 0.5}}, source="test")
    latest = ledger.latest_assignment()
    assert latest.version == v2.version == 2 and latest.shares["t"]["asia-east1"] == 0.5


def test_a_retried_publish_or_report_of_one_rebalance_run_records_it_once(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/l.db")
    shares, load = {"t": {"us-east1": 0.25, "asia-east1": 0.75}}, {"us-east1": 0.9}
    first = ledger.publish_assignment(shares, source="sailor_rebalance/night-1", region_load=load)
    again = ledger.publish_assignment(shares, source="sailor_rebalance/night-1", region_load=load)
    assert again.version == first.version == 1 and ledger.latest_assignment().version == 1
    # Another run, or other shares, is a new version even when the shares repeat.
    assert ledger.publish_assignment(shares, source="sailor_rebalance/night-2", region_load=load).version == 2
    assert ledger.publish_assignment({"t": {"us-east1": 1.0}}, source="sailor_rebalance/night-2").version == 3
    night = dict(
        dry_run=False,
        assignment_version=1,
        window_days=1.0,
        solver_status="optimal",
        max_ratio_before=1.2,
        max_ratio_after=0.9,
        lower_bound=0.9,
        allocation_rate_before=0.5,
        allocation_rate_after=0.6,
        region_ratio_before={},
        region_ratio_after={},
        bytes_planned=10,
    )
    ledger.record_rebalance("night-1", bytes_replicated=4, **night)
    ledger.record_rebalance("night-1", bytes_replicated=10, **night)  # the report task's retry
    nights = [n for n in ledger.rebalance_nights() if n["run_id"] == "night-1"]
    assert len(nights) == 1 and nights[0]["bytes_replicated"] == 10


def test_times_read_back_are_in_utc_whatever_the_database_session_zone():
    """PostgreSQL returns aware times in its session's zone (not always UTC): they are shown as
    UTC, so they are converted, not only labelled."""
    import datetime as dt

    from sailor_tasks.ledger.store import aware

    kolkata = dt.timezone(dt.timedelta(hours=5, minutes=30))
    assert aware(dt.datetime(2026, 11, 29, 20, 49, 38, tzinfo=kolkata)) == dt.datetime(
        2026, 11, 29, 15, 19, 38, tzinfo=dt.UTC
    )
    assert str(aware(dt.datetime(2026, 11, 29, 20, 49, 38, tzinfo=kolkata)))[:19] == "2026-11-29 15:19:38"
    assert aware(dt.datetime(2026, 11, 29, 15, 19, 38)).tzinfo is dt.UTC  # SQLite's naive UTC
    assert aware(None) is None


def test_attained_service_keeps_the_holding_a_replaced_reservation_had(tmp_path, monkeypatch):
    """A re-plan replaces the run's reservation in place (one row per run): the GPU-seconds it
    held before still count towards its team's attained service, and so does a holding released
    and reserved again; the window clips them all."""
    from sailor_tasks.ledger import store

    t0 = dt.datetime(2026, 11, 29, 12, tzinfo=dt.UTC)
    clock = [t0]
    monkeypatch.setattr(store, "utcnow", lambda: clock[0])
    ledger = Ledger(f"sqlite:///{tmp_path}/l.db")
    for run, team in (("r1", "a"), ("r2", "b")):
        ledger.upsert_run(
            run,
            job_name="j",
            team=team,
            status="planned",
            backend="local",
            model="tiny_gpt",
            dataset_uri="d",
            request={},
        )
    ledger.reserve(Reservation("r1", "us-east1", "us-east1-b", "T4", 2, "spot"))
    ledger.reserve(Reservation("r2", "us-east1", "us-east1-b", "T4", 1, "spot"))
    clock[0] = t0 + dt.timedelta(seconds=100)
    ledger.reserve(Reservation("r1", "us-west1", "us-west1-a", "T4", 4, "spot"))  # re-planned
    clock[0] = t0 + dt.timedelta(seconds=150)
    ledger.release("r2")
    clock[0] = t0 + dt.timedelta(seconds=250)
    ledger.reserve(Reservation("r2", "us-east1", "us-east1-b", "T4", 1, "spot"))  # reserved again
    now = t0 + dt.timedelta(seconds=300)
    assert ledger.team_gpu_seconds(t0, now) == {"a": 2 * 100 + 4 * 200, "b": 150 + 50}
    # the window starts at 120 s: r1's first holding is out, r2's first counts from 120 s
    since = t0 + dt.timedelta(seconds=120)
    assert ledger.team_gpu_seconds(since, now) == {"a": 4 * 180, "b": 30 + 50}


def test_placements_and_preemptions_are_read_back_in_utc(tmp_path):
    """Their times come back as aware UTC, as every other table's (SQLite stores naive UTC)."""
    from sailor_tasks.model import Placement

    ledger = Ledger(f"sqlite:///{tmp_path}/l.db")
    ledger.record_placement(
        Placement("r1", "gcp", "us-east1", "us-east1-b", "T4", 1, 1, 1, "spot", "n1-standard-4", 0.5)
    )
    at = dt.datetime(2026, 11, 29, 12, 30, tzinfo=dt.UTC)
    ledger.record_preemption("r1", 1, "us-east1", "us-east1-b", True, 10, 0, None, at=at)
    (placement,) = ledger.placements("r1")
    (preemption,) = ledger.preemptions("r1")
    assert (
        placement["created_at"].tzinfo is dt.UTC
        and preemption["at"] == at
        and preemption["at"].tzinfo is dt.UTC
    )
