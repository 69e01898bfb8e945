"""sailor_train with backend=gke through dag.test(): the train task defers on GKEStartPodTrigger and
resumes from its event, through Airflow's own deferral machinery (trigger serialised, rebuilt and
run inline, the event handed back to the task).

The Kubernetes API and GKE are the in-memory fakes of tests/test_operators.py (pods run as local
processes, buckets on a local GCS API server); only the trigger's polling loop is replaced, by one
that waits for the fake pod and sends the event the provider's trigger sends.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from sailor_tasks.data.demo import DEMO_DATASET
from tests.airflow_glue.test_operators import PARAMS, gke_env  # noqa: F401  (fixture)

pytestmark = [pytest.mark.gke, pytest.mark.gcs, pytest.mark.slow]


def test_sailor_train_on_gke_defers_train_and_finishes_from_the_trigger_events(gke_env, monkeypatch):  # noqa: F811
    from airflow.dag_processing.dagbag import DagBag
    from airflow.providers.google.cloud.triggers.kubernetes_engine import GKEStartPodTrigger
    from airflow.triggers.base import TriggerEvent

    core = gke_env.core
    core.mode = "process"
    fired: list[dict] = []

    async def run(self):
        while core.exit_code(self.pod_name) is None:
            await asyncio.sleep(0.05)
        status = "success" if core.exit_code(self.pod_name) == 0 else "failed"
        event = {"status": status, "namespace": self.pod_namespace, "name": self.pod_name}
        fired.append({**event, "poll_interval": self.poll_interval, "cluster_url": self._cluster_url})
        yield TriggerEvent({**event, "message": status, **self.trigger_kwargs})

    monkeypatch.setattr(GKEStartPodTrigger, "run", run)
    dag = DagBag(dag_folder=str(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])).dags["sailor_train"]
    dagrun = dag.test(run_conf={**PARAMS, "dataset_uri": DEMO_DATASET})
    states = {ti.task_id: ti.state for ti in dagrun.get_task_instances()}
    assert dagrun.state == "success", states

    # The task deferred once per pod of the two-node attempt, each on its own pod's trigger.
    assert [f["name"].rsplit("-", 3)[1:] for f in fired] == [["a1", "node", "0"], ["a1", "node", "1"]]
    assert {f["status"] for f in fired} == {"success"} and {f["poll_interval"] for f in fired} == {15}
    (run_row,) = gke_env.ctx.ledger.list_runs()
    assert run_row["status"] == "success" and run_row["backend"] == "gke" and run_row["steps"] == 12
    (attempt,) = gke_env.ctx.ledger.attempts(run_row["run_id"])
    assert attempt["outcome"] == "completed"
    assert sorted(core.deleted) == sorted(f["name"] for f in fired)  # succeeded pods cleaned up
    assert "delete_node_pool" in gke_env.clusters.calls  # teardown released the node pool
