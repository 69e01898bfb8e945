"""Lineage as Airflow Assets: a sailor_train run's placed dataset and committed checkpoint are asset
events of their aliases, the checkpoint naming the data it was trained on; sailor_assignment_review
is scheduled on the assignment sailor_rebalance publishes and reports what it means for live runs."""

from __future__ import annotations

import os

import pytest

from sailor_tasks.ledger import Ledger
from sailor_tasks.model import Reservation

TINY = {
    "job_name": "lineage",
    "team": "qa",
    "model": "tiny_gpt",
    "num_workers": 1,
    "total_steps": 10,
    "checkpoint_every_steps": 5,
    "batch_size": 8,
}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]))


def _events(run_id: str) -> list[dict]:
    """(alias names, asset URI, extra, task) of every asset event a dag run emitted."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == run_id)).all()
        return [
            {
                "aliases": sorted(a.name for a in e.source_aliases),
                "uri": e.asset.uri,
                "extra": dict(e.extra or {}),
                "task": e.source_task_id,
            }
            for e in events
        ]


@pytest.mark.slow
def test_a_checkpoint_is_an_asset_naming_the_dataset_copy_it_was_trained_on(dagbag, settings, demo_dataset):
    dagrun = dagbag.dags["sailor_train"].test(run_conf={**TINY, "dataset_uri": demo_dataset})
    assert dagrun.state == "success"
    (run,) = Ledger(settings.ledger_url).list_runs()
    events = {e["task"]: e for e in _events(dagrun.run_id)}
    assert set(events) == {"place_data", "finalize"}

    data, ckpt = events["place_data"], events["finalize"]
    assert data["aliases"] == ["sailor_datasets"] and ckpt["aliases"] == ["sailor_checkpoints"]
    assert data["uri"].startswith("file://") and f"/buckets/{run['region']}/" in data["uri"]
    assert data["extra"]["dataset_uri"] == demo_dataset and data["extra"]["files"] > 0
    assert ckpt["uri"] == run["checkpoint_uri"] and ckpt["uri"].endswith("step-00000010")
    assert ckpt["extra"]["trained_on"] == data["uri"]  # the lineage: checkpoint → the data copy
    assert ckpt["extra"]["dataset_uri"] == demo_dataset and ckpt["extra"]["steps"] == 10


def test_the_review_dag_is_scheduled_on_the_assignment_the_rebalance_publishes(dagbag):
    publish = dagbag.dags["sailor_rebalance"].get_task("publish_assignment")
    published = {o.name for o in publish.outlets}
    review = dagbag.dags["sailor_assignment_review"]
    consumed = {a.name for a in review.timetable.asset_condition.objects}
    assert published == consumed == {"sailor_assignment"}


def test_review_reports_live_runs_outside_their_teams_new_regions(dagbag, settings):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    ledger = Ledger(settings.ledger_url)
    for run_id, team, region in [("r-off", "vision", "us-east1"), ("r-on", "vision", "us-central1")]:
        ledger.upsert_run(
            run_id,
            job_name=run_id,
            team=team,
            status="running",
            backend="local",
            model="tiny_gpt",
            dataset_uri="sailor://source/datasets/demo-text",
            request={},
        )
        ledger.reserve(Reservation(run_id, region, f"{region}-a", "T4", 4, "spot"))
    ledger.publish_assignment(
        {"vision": {"us-central1": 0.7, "europe-west4": 0.3}},
        source="test",
        region_load={"us-central1": 1.2, "europe-west4": 0.5},
    )

    dagrun = dagbag.dags["sailor_assignment_review"].test()
    assert dagrun.state == "success"
    with create_session() as session:
        (value,) = [
            r.value
            for r in session.query(XComModel).filter(
                XComModel.dag_id == "sailor_assignment_review",
                XComModel.run_id == dagrun.run_id,
                XComModel.task_id == "review",
                XComModel.key == "return_value",
            )
        ]
    assert value["version"] == ledger.latest_assignment().version
    assert value["live_reservations"] == 2
    assert value["outside"] == [
        {
            "run_id": "r-off",
            "team": "vision",
            "region": "us-east1",
            "gpus": 4,
            "assigned_regions": ["europe-west4", "us-central1"],
        }
    ]
    assert value["overloaded"] == {"us-central1": 1.2}


def test_a_run_that_committed_no_checkpoint_emits_no_checkpoint_event():
    """A user's command may exit 0 without saving a checkpoint (``checkpoint_uri`` None): the run
    succeeded, and ``finalize`` emits no asset event rather than failing on an asset of no URI."""
    from collections import defaultdict

    from sailor_tasks.airflow_glue import lineage

    class Events(list):
        def add(self, asset, extra):
            self.append((asset.uri, extra["run_id"]))

    events: defaultdict = defaultdict(Events)
    summary = {
        "job_name": "j",
        "team": "t",
        "steps": 10,
        "final_loss": None,
        "data_uri": "file:///data",
        "region": "us-central1",
    }
    request = {"dataset_uri": "sailor://source/d", "model": "tiny_gpt"}
    assert lineage.emit_checkpoint(events, request, {**summary, "checkpoint_uri": None}, "r1") is None
    assert not events[lineage.CHECKPOINTS]
    uri = "file:///ckpt/step-00000010"
    assert lineage.emit_checkpoint(events, request, {**summary, "checkpoint_uri": uri}, "r2").uri == uri
    assert events[lineage.CHECKPOINTS] == [(uri, "r2")]
