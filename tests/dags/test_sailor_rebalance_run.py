"""sailor_rebalance end to end with dag.test() on a demo ledger: real solve, real copies, real report."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from sailor_tasks import storage
from sailor_tasks.data.copier import copy_dataset
from sailor_tasks.data.manifest import read_manifest
from sailor_tasks.ledger import Ledger
from sailor_tasks.paths import replica_path

pytestmark = pytest.mark.slow

# us-east1 supplies 650 GPUs in the catalog (240 T4, 240 L4, 80 V100, ...); three teams use 900
# there for 22 of the window's 24 hours (region ratio ≈ 1.27 before, T4 cell ≈ 1.53).
DEMO_LOAD = {"vision": ("T4", 400), "speech": ("L4", 300), "ranking": ("V100", 200)}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]))


@pytest.fixture
def demo_ledger(settings, demo_dataset):
    """Utilization of three teams crowding us-east1's T4s for a day, reading the demo dataset,
    which has a verified replica in us-east1 (as place_data left it)."""
    ledger = Ledger(settings.ledger_url)
    now = dt.datetime.now(dt.UTC)
    src = storage.resolve(demo_dataset, settings)
    dst = storage.resolve(f"sailor://us-east1/{replica_path(demo_dataset)}", settings)
    result = copy_dataset(src, dst)
    ledger.record_replica(
        demo_dataset, "us-east1", dst, result.manifest.total_bytes, len(result.manifest.files)
    )
    for team, (gpu, gpus) in DEMO_LOAD.items():
        run_id = f"seed__{team}"
        ledger.upsert_run(
            run_id,
            job_name=f"{team}-job",
            team=team,
            status="success",
            backend="local",
            model="tiny_gpt",
            dataset_uri=demo_dataset,
            request={},
        )
        ledger.record_utilization(
            run_id, team, "us-east1", gpu, gpus, now - dt.timedelta(hours=23), now - dt.timedelta(hours=1)
        )
    return ledger


def _asset_events(run_id):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        asset_id = session.scalar(select(AssetModel.id).where(AssetModel.name == "sailor_assignment"))
        return session.scalars(
            select(AssetEvent).where(AssetEvent.asset_id == asset_id, AssetEvent.source_run_id == run_id)
        ).all()


def _replica_events(run_id):
    """URI and extra of each event of the alias sailor_datasets from ``run_id``."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(
            select(AssetEvent).where(
                AssetEvent.source_run_id == run_id, AssetEvent.source_task_id == "replicate_data"
            )
        ).all()
        return [
            {"uri": e.asset.uri, **(e.extra or {})}
            for e in events
            if [a.name for a in e.source_aliases] == ["sailor_datasets"]
        ]


def _states(dagrun):
    return {ti.task_id: ti.state for ti in dagrun.get_task_instances()}


def test_rebalance_publishes_replicates_and_reports(dagbag, settings, demo_ledger, demo_dataset):
    dagrun = dagbag.dags["sailor_rebalance"].test(run_conf={"window_days": 1, "byte_budget_gb": 1})
    assert dagrun.state == "success", _states(dagrun)

    assignment = demo_ledger.latest_assignment()
    assert assignment is not None and set(assignment.shares) == set(DEMO_LOAD)
    for shares in assignment.shares.values():
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-4)
    (night,) = demo_ledger.rebalance_nights()
    assert night["assignment_version"] == assignment.version and not night["dry_run"]
    assert night["max_ratio_before"] > 1.0 >= night["max_ratio_after"]
    assert night["region_ratio_after"]["us-east1"] <= 1.0

    # every region the assignment uses now holds a verified copy of the dataset
    replicas = demo_ledger.replicas([demo_dataset])[demo_dataset]
    used = {r for shares in assignment.shares.values() for r in shares}
    assert used <= set(replicas) and len(replicas) > 1
    src = read_manifest(storage.resolve(demo_dataset, settings))
    for region in replicas:
        copy = storage.resolve(f"sailor://{region}/{replica_path(demo_dataset)}", settings)
        assert read_manifest(copy).files == src.files
    assert night["bytes_replicated"] == src.total_bytes * (len(replicas) - 1)

    # data-aware DAGs see a new event of the assignment asset
    events = _asset_events(dagrun.run_id)
    assert len(events) == 1 and events[0].extra["version"] == assignment.version
    # and every copy made is an event of the dataset alias, as place_data's copies are
    copies = _replica_events(dagrun.run_id)
    assert sorted(e["region"] for e in copies) == sorted(r for r in replicas if r != "us-east1")
    for e in copies:
        assert e["uri"] == storage.resolve(f"sailor://{e['region']}/{replica_path(demo_dataset)}", settings)
        assert e["dataset_uri"] == demo_dataset and e["bytes"] == src.total_bytes

    # the report: a PNG chart and a markdown summary stored with the run
    assert storage.read_bytes(night["report_uri"]).startswith(b"\x89PNG")
    summary = storage.read_bytes(night["summary_uri"]).decode()
    assert f"v{assignment.version} published" in summary and "Top moves" in summary


def test_dry_run_reports_but_publishes_and_copies_nothing(dagbag, settings, demo_ledger, demo_dataset):
    dagrun = dagbag.dags["sailor_rebalance"].test(
        run_conf={"window_days": 1, "dry_run": True, "byte_budget_gb": 1}
    )
    assert dagrun.state == "success", _states(dagrun)
    states = _states(dagrun)
    assert states["publish_assignment"] == "skipped" and states["report"] == "success"
    assert demo_ledger.latest_assignment() is None and _asset_events(dagrun.run_id) == []
    assert demo_ledger.replicas([demo_dataset]) == {demo_dataset: ("us-east1",)}
    (night,) = demo_ledger.rebalance_nights()
    assert night["dry_run"] and night["assignment_version"] is None and night["bytes_replicated"] == 0
    assert night["max_ratio_after"] <= 1.0 < night["max_ratio_before"]
    assert "dry run" in storage.read_bytes(night["summary_uri"]).decode()


def test_infeasible_quota_fails_solve_without_retries_and_changes_nothing(dagbag, demo_ledger, demo_dataset):
    conf = {"window_days": 1, "quotas": {"vision": {"max": {"*": 0, "us-east1": 10}}}}
    dagrun = dagbag.dags["sailor_rebalance"].test(run_conf=conf)
    states = _states(dagrun)
    assert dagrun.state == "failed" and states["solve_assignment"] == "failed", states
    ti = dagrun.get_task_instance("solve_assignment")
    assert ti.try_number == 1  # AirflowFailException: a configuration problem is not retried
    assert demo_ledger.latest_assignment() is None and demo_ledger.rebalance_nights() == []
    assert demo_ledger.replicas([demo_dataset]) == {demo_dataset: ("us-east1",)}
