"""sailor_train with backend=gke through dag.test(): the train task defers on AttemptPodsTrigger and
resumes from its event, through Airflow's own deferral machinery (trigger serialised, rebuilt and
run inline, the event handed back to the task).

The Kubernetes API and GKE are the in-memory fakes of tests/airflow_glue/test_operators.py (pods
run as local processes, buckets on a local GCS API server); the trigger's own run loop reads them
through a fake of the provider's async hook.
"""

from __future__ import annotations

import os

import pytest

from sailor_tasks.data.demo import DEMO_DATASET
from tests.airflow_glue.test_operators import PARAMS, FakeAsyncHook, gke_env  # noqa: F401  (fixture)

pytestmark = [pytest.mark.gke, pytest.mark.gcs, pytest.mark.slow]


def test_sailor_train_on_gke_defers_train_and_finishes_from_the_trigger_events(gke_env, monkeypatch):  # noqa: F811
    from airflow.dag_processing.dagbag import DagBag

    from sailor_tasks.airflow_glue import gcp
    from sailor_tasks.airflow_glue.triggers import AttemptPodsTrigger

    core = gke_env.core
    core.mode = "process"
    fired: list[dict] = []
    hook = FakeAsyncHook(core)
    run = AttemptPodsTrigger.run

    async def recorded(self):
        async for event in run(self):
            fired.append({**event.payload, "pod_names": self.pod_names, "poll_interval": self.poll_interval})
            yield event

    monkeypatch.setattr(AttemptPodsTrigger, "hook", lambda self: hook)
    monkeypatch.setattr(AttemptPodsTrigger, "run", recorded)
    monkeypatch.setattr(gcp, "POD_POLL_INTERVAL_S", 0.2)
    dag = DagBag(dag_folder=str(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])).dags["sailor_train"]
    dagrun = dag.test(run_conf={**PARAMS, "dataset_uri": DEMO_DATASET})
    states = {ti.task_id: ti.state for ti in dagrun.get_task_instances()}
    assert dagrun.state == "success", states

    # The task deferred once for the two-node attempt, on both pods at once.
    (event,) = fired
    assert [n.rsplit("-", 3)[1:] for n in event["pod_names"]] == [["a1", "node", "0"], ["a1", "node", "1"]]
    assert event["status"] == "success" and event["poll_interval"] == 0.2
    assert {p["phase"] for p in event["pods"].values()} == {"Succeeded"}
    assert {name for name, _ in hook.log_reads} == set(event["pod_names"])  # both pods' logs streamed
    (run_row,) = gke_env.ctx.ledger.list_runs()
    assert run_row["status"] == "success" and run_row["backend"] == "gke" and run_row["steps"] == 12
    (attempt,) = gke_env.ctx.ledger.attempts(run_row["run_id"])
    assert attempt["outcome"] == "completed"
    assert sorted(core.deleted) == sorted(event["pod_names"])  # succeeded pods cleaned up
    assert "delete_node_pool" in gke_env.clusters.calls  # teardown released the node pool
