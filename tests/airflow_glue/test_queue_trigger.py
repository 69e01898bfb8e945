"""SailorPlanOperator and QueueAdmissionTrigger: a run that does not fit defers (no worker slot)
on a trigger that polls its queue entry; the trigger fires when it is admitted (or at its
re-check), and the resumed task returns the admitted placement or fails naming what it waited for."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib

import pytest

from sailor_tasks import stages
from sailor_tasks.catalog import load_catalog

ZONE = "us-central1-a"


@pytest.fixture
def tight(ctx, tmp_path, demo_dataset, monkeypatch):
    supply = tmp_path / "supply.yaml"
    supply.write_text(
        f"version: 1\ndefaults:\n  capacity_gpus: {{}}\n  preemption_rate_per_hour: {{T4: 0.0}}\nzones:\n  {ZONE}:\n    T4: {{capacity_gpus: 2}}\n"
    )
    monkeypatch.setenv("SAILOR_SUPPLY_FILE", str(supply))
    load_catalog.cache_clear()
    yield ctx
    load_catalog.cache_clear()


def _request(ctx, run_id, dataset, **params):
    return stages.validate(
        {"dataset_uri": dataset, "num_workers": 2, "gpu_type": "T4", **params}, run_id, ctx
    )


def _first_event(trigger, timeout_s=10.0):
    async def first():
        async for event in trigger.run():
            return event.payload
        return None

    return asyncio.run(asyncio.wait_for(first(), timeout_s))


def test_plan_defers_while_queued_and_resumes_with_the_admitted_placement(tight, demo_dataset):
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.airflow_glue.operators import SailorPlanOperator
    from sailor_tasks.airflow_glue.queue_trigger import QueueAdmissionTrigger

    ctx = tight
    first = SailorPlanOperator(task_id="plan", request=_request(ctx, "run-1", demo_dataset))
    assert first.execute({"run_id": "run-1"})["zone"] == ZONE  # it fits: no deferral

    op = SailorPlanOperator(task_id="plan", request=_request(ctx, "run-2", demo_dataset), poll_s=0.05)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"run_id": "run-2"})
    assert deferred.value.method_name == "resume_plan"
    trigger = deferred.value.trigger
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)  # as the triggerer does
    assert isinstance(rebuilt, QueueAdmissionTrigger) and kwargs["run_id"] == "run-2"
    assert kwargs == {"run_id": "run-2", "recheck_at": kwargs["recheck_at"], "poll_s": 0.05}  # no ledger URL

    # Still queued and before the re-check: the trigger keeps polling.
    with pytest.raises(TimeoutError):
        _first_event(rebuilt, timeout_s=0.3)
    stages.teardown("run-1", ctx)  # capacity frees: the teardown's admission pass admits run-2
    event = _first_event(rebuilt)
    assert event == {"run_id": "run-2", "state": "admitted"}
    placement = op.resume_plan({"run_id": "run-2"}, event)
    assert placement["zone"] == ZONE and placement["run_id"] == "run-2"
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-2"]


def test_the_trigger_fires_at_its_recheck_and_a_timed_out_run_fails_naming_what_it_waited_for(
    tight, demo_dataset
):
    from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

    from sailor_tasks.airflow_glue.operators import SailorPlanOperator
    from sailor_tasks.airflow_glue.queue_trigger import QueueAdmissionTrigger

    ctx = tight
    stages.plan(_request(ctx, "run-1", demo_dataset), "run-1", ctx)
    op = SailorPlanOperator(task_id="plan", request=_request(ctx, "run-2", demo_dataset, max_queue_hours=0.5))
    with pytest.raises(TaskDeferred):
        op.execute({"run_id": "run-2"})
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)).isoformat()
    trigger = QueueAdmissionTrigger("run-2", recheck_at=past, poll_s=0.05)
    assert _first_event(trigger) == {"run_id": "run-2", "state": "recheck"}
    # The re-check finds it still waiting: it defers again.
    with pytest.raises(TaskDeferred):
        op.resume_plan({"run_id": "run-2"}, {"state": "recheck"})
    stages.admit_queued(ctx, now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    assert _first_event(trigger) == {"run_id": "run-2", "state": "timed_out"}
    with pytest.raises(AirflowFailException, match=r"QueueTimeoutError: .*waited 0.5 h .*2x T4 GPUs"):
        op.resume_plan({"run_id": "run-2"}, {"state": "timed_out"})


def test_a_read_of_the_queue_entry_that_fails_is_retried_at_the_next_poll(monkeypatch):
    from sailor_tasks.airflow_glue import queue_trigger

    reads = []

    def read_state(run_id):
        reads.append(run_id)
        if len(reads) == 1:
            raise ConnectionError("ledger briefly unreachable")
        return "admitted"

    monkeypatch.setattr(queue_trigger, "read_state", read_state)
    trigger = queue_trigger.QueueAdmissionTrigger(run_id="run-1", recheck_at=None, poll_s=0.01)
    assert _first_event(trigger) == {"run_id": "run-1", "state": "admitted"} and len(reads) == 2


@pytest.mark.slow
def test_a_run_whose_plan_fails_while_queued_is_torn_down_and_leaves_the_queue(
    tight, demo_dataset, monkeypatch
):
    """Cancelled (or its trigger failed) while plan waits in the queue: plan ends failed, and
    teardown must still take the run out of the queue, or a later admission pass hands it GPUs."""
    import os

    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.airflow_glue.operators import SailorPlanOperator

    ctx = tight
    stages.plan(_request(ctx, "holder", demo_dataset), "holder", ctx)  # takes the only 2 T4s
    real_plan = SailorPlanOperator._plan

    def cancelled_while_deferred(self, context):
        try:
            return real_plan(self, context)
        except TaskDeferred:
            raise RuntimeError("the dag run was marked failed while plan was deferred") from None

    monkeypatch.setattr(SailorPlanOperator, "_plan", cancelled_while_deferred)
    dag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).dags["sailor_train"]
    dag.get_task("plan").retries = 0
    dagrun = dag.test(run_conf={"dataset_uri": demo_dataset, "num_workers": 2, "gpu_type": "T4"})
    states = {ti.task_id: ti.state for ti in dagrun.get_task_instances()}
    assert states["plan"] == "failed" and states["teardown"] == "success", states
    assert ctx.ledger.queue_entry(dagrun.run_id)["state"] == "left"
    assert ctx.ledger.get_run(dagrun.run_id)["status"] == "failed"
    assert stages.teardown("holder", ctx)["admitted"] == []  # the capacity freed goes to no dead run
    assert ctx.ledger.live_reservations() == []
