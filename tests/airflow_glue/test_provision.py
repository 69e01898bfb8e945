"""SailorProvisionOperator on GKE, offline: cluster and node-pool operations are waited for in the
triggerer (the Google provider's GKEOperationTrigger), not in a worker slot.

GKE is an in-memory ClusterManager whose operations run for a while (``RUNNING``) before they end
(``DONE``, with an error message or not); the trigger's run loop is driven against a fake of the
provider's async GKE hook that answers with the client library's ``Operation`` objects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from types import SimpleNamespace

import pytest

from sailor_tasks import stages, storage
from sailor_tasks.backends import gke
from sailor_tasks.model import run_key
from tests.backends.test_gke import FakeClusterManager

pytestmark = [pytest.mark.gke, pytest.mark.gcs]

REGION = "us-central1"
PARAMS = {"backend": "gke", "num_workers": 2, "regions": [REGION], "market": "spot", "total_steps": 12, "checkpoint_every_steps": 6}


class RunningOperations(FakeClusterManager):
    """Every create/resize/delete starts an operation that stays RUNNING until ``finish`` ends it."""

    def __init__(self):
        super().__init__()
        self.ops: dict[str, object] = {}

    def _op(self):
        from google.cloud.container_v1 import types

        name = f"operation-{len(self.ops) + 1}"
        op = types.Operation(name=name, status=types.Operation.Status.RUNNING, location=REGION)
        self.ops[name] = op
        return op

    def finish(self, name, error=""):
        from google.cloud.container_v1 import types

        self.ops[name] = types.Operation(
            name=name, status=types.Operation.Status.DONE, **({"error": {"message": error}} if error else {})
        )

    def get_operation(self, *, name):
        return self.ops[name.rsplit("/", 1)[-1]]


@pytest.fixture
def gke_run(gcs, settings, monkeypatch):
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    for bucket in ("source", REGION):
        gcs(f"{prefix}-{bucket}")
    monkeypatch.setenv("SAILOR_BUCKET_TEMPLATE", f"gs://{prefix}-{{bucket}}")
    monkeypatch.setenv("SAILOR_GCP_PROJECT", "acme-ml")
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
    from sailor_tasks.settings import Settings

    clusters = RunningOperations()
    monkeypatch.setattr(gke.GkeBackend, "_client", lambda self: clusters)
    ctx = stages.StageContext(Settings.from_env())
    write_demo_dataset(storage.resolve(DEMO_DATASET, ctx.settings), num_shards=1, shard_bytes=40_000)
    run_id = f"manual__prov-{uuid.uuid4().hex[:6]}"
    request = stages.validate({**PARAMS, "dataset_uri": DEMO_DATASET}, run_id, ctx)
    placement = stages.plan(request, run_id, ctx)
    yield SimpleNamespace(ctx=ctx, clusters=clusters, run_id=run_id, request=request, placement=placement)
    from sailor_tasks import gcp_auth

    gcp_auth.set_provider(None)
    gke.set_pod_runner(None)


def _context(run_id):
    ti = SimpleNamespace(dag_id="sailor_train", task_id="provision", run_id=run_id, try_number=1, max_tries=2)
    return {"ti": ti, "run_id": run_id}


def _operator(env):
    from sailor_tasks.airflow_glue.operators import SailorProvisionOperator

    return SailorProvisionOperator(task_id="provision", request=env.request, placement=env.placement)


def test_provision_defers_on_each_gke_operation_and_ends_with_the_pool(gke_run):
    from airflow.sdk.exceptions import TaskDeferred

    op, context = _operator(gke_run), _context(gke_run.run_id)
    with pytest.raises(TaskDeferred) as cluster:
        op.execute(context)
    classpath, kwargs = cluster.value.trigger.serialize()
    assert classpath == "sailor_tasks.airflow_glue.triggers.LeasedOperationTrigger"
    assert kwargs["run_id"] == gke_run.run_id  # renews the run's lease while the operation runs
    assert kwargs["operation_name"] == "operation-1" and kwargs["project_id"] == "acme-ml"
    assert kwargs["location"] == REGION and kwargs["gcp_conn_id"] == "google_cloud_default"
    assert cluster.value.method_name == "resume_provision"
    pending = cluster.value.kwargs["pending"]
    assert pending["phase"] == "cluster" and "create cluster sailor-us-central1" in pending["what"]
    assert gke_run.clusters.calls == ["get_cluster", "create_cluster"]  # nothing waited in the worker

    gke_run.clusters.finish("operation-1")
    with pytest.raises(TaskDeferred) as pool:
        op.resume_provision(context, event={"status": "success", "operation_name": "operation-1"}, pending=pending)
    pending = pool.value.kwargs["pending"]
    assert pending["phase"] == "pool" and pool.value.trigger.operation_name == "operation-2"
    assert gke_run.ctx.ledger.get_run(gke_run.run_id)["status"] == "planned"  # not provisioned yet

    gke_run.clusters.finish("operation-2")
    out = op.resume_provision(context, event={"status": "success"}, pending=pending)
    assert out == {"backend": "gke", "run_key": run_key(gke_run.run_id), "status": "ready"}
    (created,) = gke_run.clusters.pools.values()
    assert created.name == gke.node_pool_name(run_key(gke_run.run_id), _placement(gke_run))
    assert gke_run.ctx.ledger.get_run(gke_run.run_id)["status"] == "provisioned"


def _placement(env):
    from sailor_tasks.model import Placement, from_dict

    return from_dict(Placement, env.placement)


def test_a_failed_operation_fails_the_task_with_its_message(gke_run):
    from airflow.sdk.exceptions import TaskDeferred

    op, context = _operator(gke_run), _context(gke_run.run_id)
    with pytest.raises(TaskDeferred) as cluster:
        op.execute(context)
    gke_run.clusters.finish("operation-1")
    with pytest.raises(TaskDeferred) as pool:
        op.resume_provision(context, event={"status": "success"}, pending=cluster.value.kwargs["pending"])
    # The trigger reports an operation that ended in error as done: the task reads its error.
    gke_run.clusters.finish("operation-2", error="Insufficient regional quota to satisfy request: NVIDIA_L4_GPUS")
    with pytest.raises(RuntimeError, match="NVIDIA_L4_GPUS"):
        op.resume_provision(context, event={"status": "success"}, pending=pool.value.kwargs["pending"])
    with pytest.raises(RuntimeError, match="operation-2.*failed: Operation has failed"):
        op.resume_provision(
            context,
            event={"status": "failed", "message": "Operation has failed with status: ABORTING"},
            pending=pool.value.kwargs["pending"],
        )
    assert gke_run.ctx.ledger.get_run(gke_run.run_id)["status"] == "planned"


def test_the_operation_trigger_polls_until_done_against_the_client_librarys_operations(monkeypatch):
    """The provider's trigger as the triggerer runs it (serialised, rebuilt, its run loop)."""
    from airflow.providers.google.cloud.triggers.kubernetes_engine import GKEOperationTrigger
    from google.cloud.container_v1 import types

    pending = gke.PendingOperation("operation-9", REGION, "acme-ml", "pool", "create node pool p")
    trigger = GKEOperationTrigger(
        operation_name=pending.name, project_id=pending.project, location=pending.location, poll_interval=0
    )
    classpath, kwargs = trigger.serialize()
    rebuilt = GKEOperationTrigger(**kwargs)
    answers = [types.Operation.Status.PENDING, types.Operation.Status.RUNNING, types.Operation.Status.DONE]
    asked = []

    class FakeAsyncHook:
        async def get_operation(self, operation_name, project_id):
            asked.append((operation_name, project_id))
            return types.Operation(name=operation_name, status=answers[len(asked) - 1])

    monkeypatch.setattr(GKEOperationTrigger, "_get_hook", lambda self: FakeAsyncHook())

    async def first_event():
        async for event in rebuilt.run():
            return event.payload

    payload = asyncio.run(first_event())
    assert payload["status"] == "success" and payload["operation_name"] == "operation-9"
    assert asked == [("operation-9", "acme-ml")] * 3


def _operation_hook(statuses, asked):
    """A fake of the provider's async GKE hook answering ``statuses`` one poll after another."""
    from google.cloud.container_v1 import types

    class FakeAsyncHook:
        async def get_operation(self, operation_name, project_id):
            asked.append(operation_name)
            return types.Operation(name=operation_name, status=statuses[min(len(asked), len(statuses)) - 1])

    return FakeAsyncHook()


def _first_event(trigger):
    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first())


def test_the_operation_trigger_renews_the_runs_lease_while_the_operation_runs(gke_run, monkeypatch):
    """A node pool that takes longer than the lease: the triggerer renews it every poll, so the
    reconciler does not reclaim the run while GKE works (a reconcile at the old expiry finds a
    renewed lease)."""
    from airflow.sdk.exceptions import TaskDeferred
    from google.cloud.container_v1 import types

    from sailor_tasks.airflow_glue import triggers

    op, context = _operator(gke_run), _context(gke_run.run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    before = gke_run.ctx.ledger.reservation_leases()[gke_run.run_id]
    classpath, kwargs = deferred.value.trigger.serialize()
    trigger = triggers.LeasedOperationTrigger(**{**kwargs, "poll_interval": 0.02})  # as the triggerer rebuilds it
    running = [types.Operation.Status.RUNNING] * 10 + [types.Operation.Status.DONE]
    asked: list[str] = []
    monkeypatch.setattr(triggers.LeasedOperationTrigger, "_get_hook", lambda self: _operation_hook(running, asked))
    renewals: list[str] = []
    real = triggers.renew_lease
    monkeypatch.setattr(triggers, "renew_lease", lambda run_id, holder: (renewals.append(holder), real(run_id, holder)))

    payload = _first_event(trigger)
    assert payload["status"] == "success" and len(asked) == 11
    assert len(renewals) >= 3 and set(renewals) == {triggers.OPERATION_LEASE_HOLDER}
    after = gke_run.ctx.ledger.reservation_leases()[gke_run.run_id]
    assert after["holder"] == triggers.OPERATION_LEASE_HOLDER and after["expires_at"] >= before["expires_at"]
    assert after["renewed_at"] > before["renewed_at"]
    assert stages.reconcile(gke_run.ctx, now=before["expires_at"])["reclaimed"] == []


def test_a_lease_reclaimed_while_the_operation_runs_fails_the_task_for_good(gke_run, monkeypatch):
    """The reconciler reclaimed the run while GKE created its capacity (the triggerer was down past
    the lease): the trigger stops polling and fires ``lease_reclaimed``; the task fails without a
    retry, naming the reclaim."""
    import datetime as dt

    from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
    from google.cloud.container_v1 import types

    from sailor_tasks.airflow_glue import triggers

    op, context = _operator(gke_run), _context(gke_run.run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    lease = gke_run.ctx.ledger.reservation_leases()[gke_run.run_id]
    assert stages.reconcile(gke_run.ctx, now=lease["expires_at"] + dt.timedelta(seconds=1))["reclaimed"] == [
        gke_run.run_id
    ]
    _, kwargs = deferred.value.trigger.serialize()
    trigger = triggers.LeasedOperationTrigger(**{**kwargs, "poll_interval": 0.02})
    asked: list[str] = []
    monkeypatch.setattr(
        triggers.LeasedOperationTrigger,
        "_get_hook",
        lambda self: _operation_hook([types.Operation.Status.RUNNING], asked),
    )
    payload = _first_event(trigger)
    assert payload["status"] == triggers.LEASE_RECLAIMED and "reclaimed at" in payload["message"]
    assert asked == []  # the operation is no longer followed
    with pytest.raises(AirflowFailException, match="LeaseReclaimedError"):
        op.resume_provision(context, event=payload, pending=deferred.value.kwargs["pending"])


def test_blocking_provision_waits_through_the_same_steps(gke_run, monkeypatch):
    """Outside the deferrable task (recovery inside ``train``, scripts), ``provision`` waits in process."""
    backend = gke.GkeBackend(gke_run.ctx.settings, client=gke_run.clusters, poll_s=0)

    def finish_all(pending):
        gke_run.clusters.finish(pending.name)
        return original(backend, pending)

    original = gke.GkeBackend.wait
    monkeypatch.setattr(backend, "wait", finish_all)
    record = backend.provision(run_key(gke_run.run_id), dataclasses.replace(_placement(gke_run)))
    assert record["status"] == "ready" and len(gke_run.clusters.ops) == 2


def test_another_runs_operation_that_failed_does_not_fail_the_task_that_waited_for_it(gke_run):
    """The task waited for an operation that is not its run's (``busy``: another run's pool, a
    GKE upgrade). Whatever the trigger reports, the task provisions on instead of failing."""
    from airflow.sdk.exceptions import TaskDeferred

    op, context = _operator(gke_run), _context(gke_run.run_id)
    busy = {"name": "op-other", "location": REGION, "project": "acme-ml", "phase": "busy", "what": "x"}
    gke_run.clusters.ops["op-other"] = None
    gke_run.clusters.finish("op-other", error="ZONE_RESOURCE_POOL_EXHAUSTED (another run's pool)")
    for event in ({"status": "success"}, {"status": "failed", "message": "ABORTING"}):
        with pytest.raises(TaskDeferred) as cluster:  # it provisions from the start: its cluster first
            op.resume_provision(context, event=event, pending=busy)
        assert cluster.value.kwargs["pending"]["phase"] == "cluster"
