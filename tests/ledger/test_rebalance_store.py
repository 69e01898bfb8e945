from __future__ import annotations

import datetime as dt

from sailor_tasks.ledger import Ledger


def test_assignment_round_trips_shares_and_region_load(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/l.db")
    ledger.publish_assignment({"a": {"r1": 0.5, "r2": 0.5}}, "test", region_load={"r1": 0.9, "r2": 0.4})
    a = ledger.latest_assignment()
    assert a.shares == {"a": {"r1": 0.5, "r2": 0.5}} and a.region_load == {"r1": 0.9, "r2": 0.4}


def test_published_shares_keep_where_each_gpu_type_of_a_team_goes(ctx):
    from sailor_tasks.stages.rebalance import publish_assignment

    # what the solver places: team t's A100s stay in us-east1, 91% of its T4 demand moves west
    placement = {"t": {"us-east1": {"A100": 9.0, "T4": 0.5}, "europe-west4": {"T4": 5.0}}}
    solution = {
        "shares": {"t": {"us-east1": 0.655, "europe-west4": 0.345}},
        "region_load_after": {"us-east1": 0.8, "europe-west4": 0.7},
        "placement": placement,
        "replicate": [],
    }
    version = publish_assignment(solution, source="night-1", ctx=ctx)["version"]
    a = ctx.ledger.latest_assignment()
    assert a.version == version and a.shares == solution["shares"]
    assert a.gpu_shares == {
        "t": {"A100": {"us-east1": 1.0}, "T4": {"us-east1": 0.090909, "europe-west4": 0.909091}}
    }
    assert publish_assignment(solution, source="night-1", ctx=ctx)["version"] == version  # a retry


def test_utilization_rows_overlap_the_window_with_the_runs_dataset(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/l.db")
    now = dt.datetime.now(dt.UTC)
    ledger.upsert_run(
        "r",
        job_name="j",
        team="t",
        status="success",
        backend="local",
        model="m",
        dataset_uri="sailor://source/d",
        request={},
    )
    ledger.record_utilization(
        "r", "t", "us-east1", "T4", 4, now - dt.timedelta(hours=30), now - dt.timedelta(hours=2)
    )
    ledger.record_utilization(
        "old", "t", "us-east1", "T4", 4, now - dt.timedelta(days=9), now - dt.timedelta(days=8)
    )
    rows = ledger.utilization_rows(now - dt.timedelta(days=1), now)
    assert [(r["run_id"], r["dataset_uri"], r["gpus"]) for r in rows] == [("r", "sailor://source/d", 4)]


def test_rebalance_nights_newest_first(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/l.db")
    common = dict(
        dry_run=False,
        window_days=7.0,
        solver_status="optimal",
        max_ratio_before=2.0,
        max_ratio_after=0.9,
        lower_bound=0.85,
        allocation_rate_before=0.6,
        allocation_rate_after=0.85,
        region_ratio_before={"r1": 2.0},
        region_ratio_after={"r1": 0.9},
        bytes_planned=10,
        bytes_replicated=10,
    )
    ledger.record_rebalance("n1", assignment_version=1, report_uri="file:///a.png", **common)
    ledger.record_rebalance("n2", assignment_version=2, report_uri="file:///b.png", **common)
    newest = ledger.rebalance_nights(limit=1)[0]
    assert newest["run_id"] == "n2" and newest["report_uri"] == "file:///b.png"
    assert newest["region_ratio_after"] == {"r1": 0.9}


def test_overlapping_publishes_of_one_rebalance_run_make_one_version(tmp_path):
    """A retried publish while the first still runs: the idempotency check and the insert are one
    serialised transaction, so the tries agree on one version."""
    import threading

    from sailor_tasks.ledger import Ledger

    url = f"sqlite:///{tmp_path}/l.db"
    Ledger(url).dispose()
    results, errors = [], []
    barrier = threading.Barrier(4)

    def publish():
        ledger = Ledger(url)
        barrier.wait()
        try:
            results.append(ledger.publish_assignment({"t": {"r": 1.0}}, source="night/1").version)
        except Exception as exc:  # a lock timeout would show here
            errors.append(repr(exc))
        finally:
            ledger.dispose()

    threads = [threading.Thread(target=publish) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and results == [1, 1, 1, 1]
