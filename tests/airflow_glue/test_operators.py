"""SailorTrainOperator: the train task of sailor_train, deferrable on GKE, offline.

No Kubernetes API server runs here. ``FakeCoreV1`` answers the CoreV1Api calls the provider's
GKEStartPodOperator makes (create/list/read/patch/delete pods, pod logs, services) over in-memory
pods whose outcome the test scripts, or, in ``process`` mode, whose container command runs as a
local process with the pod's env (the rendezvous service's DNS name becomes 127.0.0.1). The test
plays the triggerer: it waits for the pod named by the deferred GKEStartPodTrigger, then hands the
operator the event the trigger would send (status, pod, and the trigger's ``trigger_kwargs``).
Buckets are on a local GCS API server; GKE node pools on an in-memory ClusterManager.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace

import pytest

from sailor_tasks import stages, storage
from sailor_tasks.backends import gke
from sailor_tasks.errors import LedgerSchemaError, NoFeasibleOfferError
from sailor_tasks.model import run_key
from sailor_tasks.testing.gcs_emulator import free_port
from tests.backends.test_gke import FakeClusterManager

pytestmark = [pytest.mark.gke, pytest.mark.gcs]

REGION = "us-central1"
PARAMS = {
    "job_name": "gke-defer",
    "team": "qa",
    "model": "tiny_gpt",
    "backend": "gke",
    "num_workers": 2,
    "regions": [REGION],
    "market": "spot",
    "total_steps": 12,
    "checkpoint_every_steps": 6,
    "batch_size": 4,
}
CLUSTER_URL, CA_CERT = "https://34.118.0.9", "Q0EtY2VydA=="
GKE_OPS = "airflow.providers.google.cloud.operators.kubernetes_engine"


def _api_error(status: int):
    from kubernetes.client.exceptions import ApiException

    return ApiException(status=status, reason="fake")


def _matches(labels: dict, selector: str) -> bool:
    for term in selector.split(","):
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "!=" in term:
            key, value = term.split("!=")
            if labels.get(key) == value:
                return False
        else:
            key, value = term.split("=", 1)
            if labels.get(key) != value:
                return False
    return True


class FakeCoreV1:
    """In-memory pods, services, namespaces and service accounts with the CoreV1Api methods the
    pod operators call. As on a fresh cluster, only the ``default`` namespace exists at first; a
    pod or service in a namespace that does not exist is refused (404), and so is a pod naming a
    service account that does not exist (403, the ServiceAccount admission controller)."""

    def __init__(self, folder: str, mode: str = "scripted"):
        from kubernetes.client import ApiClient

        self.api_client = ApiClient()
        self.mode = mode
        self.pods: dict[str, dict] = {}  # name -> {"body": manifest dict, "labels", "exit", "proc", "log"}
        self.services: dict[str, object] = {}
        self.deleted: list[str] = []
        self.deleted_services: list[str] = []
        self.namespaces: dict[str, object] = {"default": None}
        self.service_accounts: dict[tuple[str, str], object] = {}
        self.sent: list[dict] = []
        """Every namespace and service account manifest received, as JSON, in order."""
        self.port = free_port()
        self.progress = os.path.join(folder, "progress.json")
        """Rank 0's progress file; every pod's output goes to ``<pod name>.log`` beside it."""

    # pods
    def create_namespaced_pod(self, body, namespace, **_):
        name = body["metadata"]["name"]
        if namespace not in self.namespaces:
            raise _api_error(404)
        account = body["spec"].get("serviceAccountName") or "default"
        if account != "default" and (namespace, account) not in self.service_accounts:
            raise _api_error(403)
        if name in self.pods:
            raise _api_error(409)
        pod = {"body": body, "labels": dict(body["metadata"]["labels"]), "exit": None, "proc": None}
        self.pods[name] = pod
        if self.mode == "process":
            pod["proc"], pod["log"] = self._start(body)
        return body

    def _start(self, body):
        (container,) = body["spec"]["containers"]
        cmd = [sys.executable if c == "python" else c for c in container["command"]]
        cmd = [
            "--master-addr=127.0.0.1"
            if c.startswith("--master-addr=")
            else f"--master-port={self.port}"
            if c.startswith("--master-port=")
            else c
            for c in cmd
        ]
        env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]}, "OMP_NUM_THREADS": "1"}
        env.pop("MASTER_ADDR", None)
        env.pop("MASTER_PORT", None)
        if body["metadata"]["labels"]["sailor.dev/node-rank"] == "0":
            env["SAILOR_PROGRESS_FILE"] = self.progress
        out = open(os.path.join(os.path.dirname(self.progress), f"{body['metadata']['name']}.log"), "w+")
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return proc, out

    def exit_code(self, name):
        pod = self.pods[name]
        if pod["proc"] is not None:
            return pod["proc"].poll()
        return pod["exit"]

    def read_namespaced_pod(self, name, namespace, **_):
        from kubernetes.client import models as k8s

        if name not in self.pods:
            raise _api_error(404)
        pod, code = self.pods[name], self.exit_code(name)
        state = (
            k8s.V1ContainerState(running=k8s.V1ContainerStateRunning())
            if code is None
            else k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=code))
        )
        phase = "Running" if code is None else ("Succeeded" if code == 0 else "Failed")
        if pod.get("waiting"):  # (reason, message): the container has not started
            reason, message = pod["waiting"]
            state = k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason=reason, message=message))
            phase = "Pending"
        status = k8s.V1ContainerStatus(
            name=gke.CONTAINER_NAME, image="i", image_id="", ready=code is None, restart_count=0, state=state
        )
        return k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=dict(pod["labels"])),
            spec=k8s.V1PodSpec(
                containers=[k8s.V1Container(name=gke.CONTAINER_NAME, image="i")],
                node_name=pod.get("node"),  # the node that took it, when a test names one
            ),
            status=k8s.V1PodStatus(phase=phase, reason=pod.get("reason"), container_statuses=[status]),
        )

    def list_namespaced_pod(self, namespace, label_selector, **_):
        items = [
            self.read_namespaced_pod(name, namespace)
            for name, pod in self.pods.items()
            if _matches(pod["labels"], label_selector)
        ]
        return SimpleNamespace(items=items)

    def patch_namespaced_pod(self, name, namespace, body, **_):
        self.pods[name]["labels"].update(body["metadata"]["labels"])

    def delete_namespaced_pod(self, name, namespace, body=None, **_):
        pod = self.pods.pop(name)
        if pod["proc"] is not None and pod["proc"].poll() is None:
            pod["proc"].kill()
        self.deleted.append(name)

    def read_namespaced_pod_log(self, name, namespace, container, **_):
        pod = self.pods[name]
        if pod["proc"] is None:
            return [f"{name}: scripted pod\n".encode()]
        pod["log"].seek(0)
        return [line.encode() for line in pod["log"].read().splitlines(keepends=True)[-20:]]

    def read_node(self, name, **_):
        raise _api_error(404)

    # namespaces and service accounts
    def create_namespace(self, body, **_):
        self.sent.append(self.api_client.sanitize_for_serialization(body))
        if body.metadata.name in self.namespaces:
            raise _api_error(409)
        self.namespaces[body.metadata.name] = body

    def create_namespaced_service_account(self, namespace, body, **_):
        self.sent.append(self.api_client.sanitize_for_serialization(body))
        if namespace not in self.namespaces:
            raise _api_error(404)
        if (namespace, body.metadata.name) in self.service_accounts:
            raise _api_error(409)
        self.service_accounts[namespace, body.metadata.name] = body

    def read_namespace(self, name, **_):
        if name not in self.namespaces:
            raise _api_error(404)
        return self.namespaces[name]

    def read_namespaced_service_account(self, name, namespace, **_):
        if (namespace, name) not in self.service_accounts:
            raise _api_error(404)
        return self.service_accounts[namespace, name]

    # services
    def create_namespaced_service(self, namespace, service, **_):
        if namespace not in self.namespaces:
            raise _api_error(404)
        if service.metadata.name in self.services:
            raise _api_error(409)
        self.services[service.metadata.name] = service

    def list_namespaced_service(self, namespace, label_selector, **_):
        items = [s for s in self.services.values() if _matches(dict(s.metadata.labels), label_selector)]
        return SimpleNamespace(items=items)

    def delete_namespaced_service(self, name, namespace, **_):
        del self.services[name]
        self.deleted_services.append(name)


class FakeTaskStateStore:
    """The provider's single persisted pod identity; several pods of one task must not use it."""

    def __init__(self):
        self.used = False

    def get(self, *_):
        self.used = True

    def set(self, *_):
        self.used = True


class FakeTI:
    def __init__(self, run_id: str, try_number: int = 1, max_tries: int = 5):
        self.dag_id, self.task_id, self.run_id, self.map_index = "sailor_train", "train", run_id, -1
        self.try_number, self.max_tries = try_number, max_tries
        self.xcom: dict[str, object] = {}

    def xcom_push(self, key, value, **_):
        self.xcom[key] = value


@pytest.fixture
def gke_env(gcs, settings, one_gpu_vms, monkeypatch, tmp_path):
    """gs:// buckets on the emulator, an in-memory GKE (ClusterManager + Kubernetes API), a demo
    dataset, 1-GPU VMs only (a 2-worker run is a multi-node torchrun); returns a function
    preparing a run up to ``provision`` (as the DAG does)."""
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    for bucket in ("source", REGION):
        gcs(f"{prefix}-{bucket}")
    monkeypatch.setenv("SAILOR_BUCKET_TEMPLATE", f"gs://{prefix}-{{bucket}}")
    monkeypatch.setenv("SAILOR_GCP_PROJECT", "acme-ml")
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
    from sailor_tasks.settings import Settings

    clusters = FakeClusterManager()
    monkeypatch.setattr(gke.GkeBackend, "_client", lambda self: clusters)
    monkeypatch.setattr(gke.GkeBackend, "wait", lambda self, pending: None)
    core = FakeCoreV1(str(tmp_path))
    hooks: list[dict] = []

    def hook_factory(**kwargs):
        hooks.append(kwargs)
        return SimpleNamespace(
            core_v1_client=core,
            is_in_cluster=False,
            get_pod=lambda name, ns: core.read_namespaced_pod(name, ns),
        )

    monkeypatch.setattr(f"{GKE_OPS}.GKEKubernetesHook", hook_factory)
    monkeypatch.setattr(f"{GKE_OPS}.GKEHook", lambda **kwargs: SimpleNamespace(**kwargs))
    monkeypatch.setattr(
        f"{GKE_OPS}.GKEClusterAuthDetails.fetch_cluster_info", lambda self: (CLUSTER_URL, CA_CERT)
    )
    ctx = stages.StageContext(Settings.from_env())
    write_demo_dataset(storage.resolve(DEMO_DATASET, ctx.settings), num_shards=1, shard_bytes=40_000)

    def prepare(run_id: str, **overrides):
        request = stages.validate({**PARAMS, "dataset_uri": DEMO_DATASET, **overrides}, run_id, ctx)
        placement = stages.plan(request, run_id, ctx)
        data = stages.place_data(request, placement, run_id, ctx)
        stages.provision(request, placement, run_id, ctx)
        return request, placement, data

    yield SimpleNamespace(ctx=ctx, core=core, clusters=clusters, hooks=hooks, prepare=prepare)
    for pod in core.pods.values():
        if pod["proc"] is not None and pod["proc"].poll() is None:
            pod["proc"].kill()
    from sailor_tasks import gcp_auth

    gcp_auth.set_provider(None)
    gke.set_pod_runner(None)


def _operator(request, placement, data):
    from sailor_tasks.airflow_glue.operators import SailorTrainOperator

    return SailorTrainOperator(task_id="train", request=request, placement=placement, data=data, retries=5)


def _context(run_id: str, **ti):
    return {
        "ti": FakeTI(run_id, **ti),
        "run_id": run_id,
        "dag": SimpleNamespace(),
        "task_state_store": FakeTaskStateStore(),
    }


class FakeAsyncHook:
    """The provider's async GKE Kubernetes hook as AttemptPodsTrigger uses it, over ``FakeCoreV1``;
    log lines get increasing timestamps, as the API's ``timestamps=True`` gives them."""

    def __init__(self, core: FakeCoreV1):
        self.core = core
        self.log_reads: list[tuple[str, int | None]] = []

    async def get_pod(self, name, namespace):
        return self.core.read_namespaced_pod(name, namespace)

    async def read_logs(self, name, namespace, container_name=None, since_seconds=None):
        self.log_reads.append((name, since_seconds))
        pod = self.core.pods[name]
        if pod["proc"] is None:
            text = pod.get("script_log", "")
        else:
            pod["log"].seek(0)
            text = pod["log"].read()
        return [f"2026-11-23T00:00:00.{i:09d}Z {line}" for i, line in enumerate(text.splitlines())]


def _trigger_event(env, deferred, timeout_s=300, on_poll=None, **overrides) -> dict:
    """Play the triggerer: run the deferred AttemptPodsTrigger (serialised and rebuilt, as the
    triggerer does; ``overrides`` replace some of its kwargs) against the fake cluster until it
    fires; return its event payload."""
    import asyncio

    from sailor_tasks.airflow_glue.triggers import AttemptPodsTrigger

    classpath, kwargs = deferred.trigger.serialize()
    assert classpath == "sailor_tasks.airflow_glue.triggers.AttemptPodsTrigger"
    trigger = AttemptPodsTrigger(**{**kwargs, "poll_interval": 0.02, **overrides})
    hook = FakeAsyncHook(env.core)
    trigger.hook = lambda: hook

    async def first():
        agen = trigger.run()
        task = asyncio.ensure_future(agen.__anext__())
        deadline = time.monotonic() + timeout_s
        while not task.done():
            assert time.monotonic() < deadline, "the trigger did not fire"
            if on_poll is not None:
                on_poll()
            await asyncio.sleep(0.02)
        return task.result().payload

    return asyncio.run(first())


def _ended(env, deferred, **codes) -> dict:
    """The trigger's event once the named pods (node index → exit status) have ended."""
    for name in deferred.trigger.pod_names:
        rank = name.rsplit("-", 1)[1]
        if f"node{rank}" in codes:
            env.core.pods[name]["exit"] = codes[f"node{rank}"]
    return _trigger_event(env, deferred, timeout_s=30)


def test_execute_on_gke_starts_the_pods_and_defers_on_every_pod_at_once(gke_env):
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "manual__defer-1"
    request, placement, data = gke_env.prepare(run_id)
    assert placement["num_nodes"] == 2  # two 1-GPU VMs: a multi-node torchrun
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)

    assert op.template_fields == ("request", "placement", "data")  # XComArgs of validate/plan/place_data
    assert deferred.value.method_name == "resume_train" and deferred.value.timeout is None
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "sailor_tasks.airflow_glue.triggers.AttemptPodsTrigger"
    pool = gke.run_prefix(run_key(run_id))
    names = [f"{pool}-a1-node-0", f"{pool}-a1-node-1"]
    assert kwargs["pod_names"] == names and kwargs["namespace"] == "sailor"
    assert (kwargs["cluster_url"], kwargs["ssl_ca_cert"]) == (CLUSTER_URL, CA_CERT)
    assert kwargs["gcp_conn_id"] == "google_cloud_default"
    assert kwargs["poll_interval"] == 15 and kwargs["startup_timeout"] == 30 * 60
    assert kwargs["state"] == {"attempt": 1}

    # Both nodes' pods exist, labelled for reattachment, with the rendezvous service of attempt 1.
    assert sorted(gke_env.core.pods) == names
    labels = gke_env.core.pods[names[1]]["labels"]
    assert labels["dag_id"] == "sailor_train" and labels["task_id"] == "train" and labels["try_number"] == "1"
    assert labels["sailor.dev/attempt"] == "1" and labels["sailor.dev/node-rank"] == "1"
    assert list(gke_env.core.services) == [f"{pool}-a1-rdzv"]
    cmd = gke_env.core.pods[names[1]]["body"]["spec"]["containers"][0]["command"]
    assert "--nnodes=2" in cmd and "--node-rank=1" in cmd
    assert not context["task_state_store"].used
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "running" and attempt["try_number"] == 1
    # checking the capacity before the launch did not mark the training run provisioned again
    assert gke_env.ctx.ledger.get_run(run_id)["status"] == "running"


def test_the_trigger_streams_every_pods_log_and_fires_when_one_fails(gke_env, capsys):
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "manual__stream-1"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        _operator(request, placement, data).execute(_context(run_id))
    node0, node1 = deferred.value.trigger.pod_names
    gke_env.core.pods[node0]["script_log"] = "step 10 loss 2.31 samples/s 410.0\nstep 20 loss 2.05 samples/s 415.2\n"
    gke_env.core.pods[node1]["script_log"] = "step 10 loss 2.31 samples/s 409.1\n"
    polls = []

    def node1_dies_after_a_few_polls():
        polls.append(1)
        if len(polls) == 5:
            gke_env.core.pods[node1]["exit"] = 137

    capsys.readouterr()
    event = _trigger_event(gke_env, deferred.value, timeout_s=30, on_poll=node1_dies_after_a_few_polls)
    logged = capsys.readouterr().out  # the triggerer's log of this trigger is the task's log
    assert event["status"] == "ended" and event["sailor_train"] == {"attempt": 1}
    assert event["pods"][node1] == {"phase": "Failed", "exit_code": 137}
    assert event["pods"][node0]["phase"] == "Running"  # node 0 did not have to end first
    for pod, line in ((node0, "step 20 loss 2.05 samples/s 415.2"), (node1, "step 10 loss 2.31 samples/s 409.1")):
        assert logged.count(f"[{pod}] {line}") == 1, logged  # streamed once, not repeated per poll


def test_on_kill_deletes_the_running_pods_and_services_and_cancels_the_attempt(gke_env, airflow_task_state):
    """The run marked failed while train runs (sailor cancel): every pod still running and the
    rendezvous service are deleted through the provider's GKE Kubernetes hook, in the region's
    cluster; an ended pod is kept; the attempt is ``cancelled``."""
    from airflow.sdk.exceptions import TaskDeferred

    airflow_task_state("failed")  # marking the run failed marks its running tasks
    run_id = "manual__kill-1"
    request, placement, data = gke_env.prepare(run_id)
    op = _operator(request, placement, data)
    with pytest.raises(TaskDeferred):
        op.execute(_context(run_id))
    pool = gke.run_prefix(run_key(run_id))
    running, ended = f"{pool}-a1-node-0", f"{pool}-a1-node-1"
    gke_env.core.pods[ended]["exit"] = 1
    gke_env.core.pods["someone-else"] = {"labels": {"sailor.dev/run": "other"}, "exit": None, "proc": None}
    gke_env.hooks.clear()

    op.on_kill()
    assert gke_env.core.deleted == [running]
    assert sorted(gke_env.core.pods) == sorted([ended, "someone-else"])
    assert gke_env.core.deleted_services == [f"{pool}-a1-rdzv"] and not gke_env.core.services
    assert gke_env.hooks and {h["cluster_url"] for h in gke_env.hooks} == {CLUSTER_URL}
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "cancelled"
    assert gke_env.ctx.ledger.get_run(run_id)["status"] == "cancelled"
    # teardown (which still runs) finds nothing left to stop, then releases the node pool.
    assert stages.teardown(run_id, gke_env.ctx)["training_stopped"] == 0
    assert "delete_node_pool" in gke_env.clusters.calls
    assert gke_env.ctx.ledger.get_run(run_id)["status"] == "cancelled"


def test_a_train_task_airflow_stops_ends_its_attempt_failed_and_keeps_the_run(gke_env, airflow_task_state):
    """Airflow stops the running train task (a worker's shutdown): the task is still ``running``
    in Airflow. Its pods go, as they would with no task to watch them, but the run is not
    cancelled: the attempt ends ``failed`` and the task's next try begins the next one."""
    from airflow.sdk.exceptions import TaskDeferred

    airflow_task_state("running")
    run_id = "manual__worker-stop"
    request, placement, data = gke_env.prepare(run_id)
    op = _operator(request, placement, data)
    with pytest.raises(TaskDeferred):
        op.execute(_context(run_id))
    op.on_kill()
    assert gke_env.core.deleted  # the attempt's pods
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "failed" and "not by a user" in attempt["detail"]
    assert gke_env.ctx.ledger.get_run(run_id)["status"] not in ("cancelled", "failed")


def test_on_kill_without_an_answer_from_airflow_stops_the_training_but_not_the_run(monkeypatch):
    """Asked in a thread for at most ``STATE_QUERY_S``: a supervisor that cannot answer (a
    failure, or no answer while ``on_kill`` runs in a signal handler) is no user's stop."""
    import threading
    import time

    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    from sailor_tasks.airflow_glue import operators

    op = _operator({}, {}, {})
    monkeypatch.setattr(operators, "STATE_QUERY_S", 0.2)

    def fails(**_):
        raise ConnectionError("the API server is unreachable")

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(fails))
    assert op._stopped_by_user("r") is False
    hang = threading.Event()
    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(lambda **_: hang.wait(5)))
    started = time.monotonic()
    assert op._stopped_by_user("r") is False and time.monotonic() - started < 1.0
    hang.set()
    for state, by_user in (("failed", True), ("success", True), ("running", False), ("restarting", False)):
        monkeypatch.setattr(
            RuntimeTaskInstance,
            "get_task_states",
            staticmethod(
                lambda state=state, **kw: {r: dict.fromkeys(kw["task_ids"], state) for r in kw["run_ids"]}
            ),
        )
        assert op._stopped_by_user("r") is by_user, state


def test_cancelling_a_deferred_run_stops_its_pods_from_the_trigger_and_cancels_its_attempt(gke_env):
    """Cancelled while deferred (no task runs to be killed): the triggerer calls the trigger's
    ``on_kill`` (a user acted on the task), which stops the pods and services and ends the attempt
    as cancelled, not failed or preempted; teardown then finds nothing left to stop."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.airflow_glue.triggers import AttemptPodsTrigger

    run_id = "manual__kill-2"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        _operator(request, placement, data).execute(_context(run_id))
    classpath, kwargs = deferred.value.trigger.serialize()
    asyncio.run(AttemptPodsTrigger(**kwargs).on_kill())  # as the triggerer rebuilt it
    assert sorted(gke_env.core.deleted) == sorted(deferred.value.trigger.pod_names)
    assert not gke_env.core.services
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "cancelled" and gke_env.ctx.ledger.preemptions(run_id) == []
    assert gke_env.ctx.ledger.get_run(run_id)["status"] == "cancelled"
    assert stages.teardown(run_id, gke_env.ctx)["training_stopped"] == 0
    assert gke_env.ctx.ledger.get_run(run_id)["status"] == "cancelled"


def test_clearing_a_deferred_train_task_stops_its_pods_but_not_the_run(gke_env, airflow_task_state):
    """The triggerer calls ``on_kill`` on a clear too: the task is then ``restarting`` (Airflow
    runs it again), so the attempt ends failed and the run goes on; marked failed, it cancels."""
    import asyncio
    import types

    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.airflow_glue.triggers import AttemptPodsTrigger

    for state, outcome in (("restarting", "failed"), ("failed", "cancelled")):
        run_id = f"manual__clear-{state}"
        request, placement, data = gke_env.prepare(run_id)
        with pytest.raises(TaskDeferred) as deferred:
            _operator(request, placement, data).execute(_context(run_id))
        trigger = AttemptPodsTrigger(**deferred.value.trigger.serialize()[1])
        trigger.task_instance = types.SimpleNamespace(dag_id="sailor_train", task_id="train", run_id=run_id)
        airflow_task_state(state)
        asyncio.run(trigger.on_kill())
        assert set(deferred.value.trigger.pod_names) <= set(gke_env.core.deleted)
        (attempt,) = gke_env.ctx.ledger.attempts(run_id)
        assert attempt["outcome"] == outcome, state
        assert (gke_env.ctx.ledger.get_run(run_id)["status"] == "cancelled") == (state == "failed"), state


def test_teardown_of_an_attempt_nothing_ended_stops_its_pods_and_fails_it(gke_env):
    """The deferred train task ended without its attempt being judged (it timed out, its trigger
    errored): teardown stops the pods and services and ends the attempt and the run as failed;
    nobody cancelled them."""
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "manual__kill-3"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred):
        _operator(request, placement, data).execute(_context(run_id))
    out = stages.teardown(run_id, gke_env.ctx)
    assert out["training_stopped"] == 2 and not gke_env.core.services
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "failed" and "without ending it" in attempt["detail"]
    assert gke_env.ctx.ledger.preemptions(run_id) == []
    assert gke_env.ctx.ledger.get_run(run_id)["status"] == "failed"


def test_a_retried_task_reattaches_to_the_running_pods_instead_of_starting_new_ones(gke_env):
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "manual__defer-2"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred):
        _operator(request, placement, data).execute(_context(run_id))
    created = sorted(gke_env.core.pods)
    # The worker died while the task was deferred; Airflow retries the task (try 2).
    with pytest.raises(TaskDeferred) as deferred:
        _operator(request, placement, data).execute(_context(run_id, try_number=2))
    assert sorted(gke_env.core.pods) == created  # the same pods, no duplicates
    assert deferred.value.trigger.pod_names == created
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)  # still one attempt, still running
    assert attempt["outcome"] == "running"


def test_a_failed_pod_stops_its_peers_at_once_and_fails_clearly(gke_env):
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.errors import TrainingFailedError

    run_id = "manual__defer-3"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    node0, node1 = deferred.value.trigger.pod_names

    event = _ended(gke_env, deferred.value, node1=3)  # node 1's command fails; node 0 still runs
    with pytest.raises(TrainingFailedError, match="exit code 3"):
        op.resume_train(context, event=event)
    assert gke_env.core.deleted == [node0]  # not left waiting on a collective with a dead peer
    assert node1 in gke_env.core.pods  # the failed pod is kept for inspection
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "failed" and attempt["detail"] == "exit code 3"
    assert gke_env.ctx.ledger.preemptions(run_id) == []


def test_a_pod_gone_with_its_node_is_a_preemption_that_replans_with_the_zone_blocked(gke_env):
    """No result.json says so (the node took the trainer with it): the pod's absence decides, and
    the next attempt is re-planned away from the zone on a pool of its own placement."""
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "manual__gone-1"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    node0, node1 = deferred.value.trigger.pod_names
    del gke_env.core.pods[node1]  # reclaimed Spot VM: the node and its pod are gone
    event = _trigger_event(gke_env, deferred.value, timeout_s=30)
    assert event["pods"][node1]["phase"] == "Gone"
    with pytest.raises(TaskDeferred) as next_attempt:
        op.resume_train(context, event=event)

    ledger = gke_env.ctx.ledger
    first, second = ledger.attempts(run_id)
    assert (first["outcome"], second["outcome"]) == ("preempted", "running")
    (pre,) = ledger.preemptions(run_id)
    assert pre["zone"] == placement["zone"] and pre["noticed"] is False
    assert second["placement"]["zone"] != placement["zone"]  # blocked, not a retry in place
    assert node0 in gke_env.core.deleted  # the surviving node's pod was stopped
    pools = gke_env.clusters.pools
    assert len(pools) == 2 and {p.locations[0] for p in pools.values()} == {
        placement["zone"],
        second["placement"]["zone"],
    }
    assert next_attempt.value.trigger.state == {"attempt": 2}
    assert all("-a2-node-" in n for n in next_attempt.value.trigger.pod_names)


@pytest.mark.parametrize("on_a_node", [False, True])
def test_a_pod_no_node_came_up_for_is_a_preemption_that_replans(gke_env, on_a_node):
    """A pod still pending at the startup timeout with no node (none came up: a Spot stockout)
    ends the attempt as preempted without notice, and recovery plans the next one. A pod on a
    node whose container does not start is not the zone's capacity: it fails the try (``error``),
    and Airflow's retry reattaches to it."""
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "manual__stockout-1"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    node0, node1 = deferred.value.trigger.pod_names
    gke_env.core.pods[node1]["waiting"] = ("ContainerCreating", "")  # Pending
    if on_a_node:
        gke_env.core.pods[node1]["node"] = "gke-sailor-pool-node-1"  # took it; its container waits
    event = _trigger_event(gke_env, deferred.value, timeout_s=30, startup_timeout=0.2)
    if on_a_node:
        assert event["status"] == "error" and node1 in event["message"]
        with pytest.raises(RuntimeError, match="not started after"):
            op.resume_train(context, event=event)
        return
    assert event["status"] == "unscheduled" and node1 in event["message"]
    with pytest.raises(TaskDeferred) as next_attempt:
        op.resume_train(context, event=event)
    ledger = gke_env.ctx.ledger
    first_attempt, second = ledger.attempts(run_id)
    assert (first_attempt["outcome"], second["outcome"]) == ("preempted", "running")
    (pre,) = ledger.preemptions(run_id)
    assert pre["zone"] == placement["zone"] and pre["noticed"] is False
    assert {node0, node1} <= set(gke_env.core.deleted)  # the pending pods do not linger
    assert next_attempt.value.trigger.state == {"attempt": 2}


def test_resume_without_sailor_state_names_what_it_got(gke_env):
    from airflow.sdk.exceptions import AirflowFailException

    run_id = "manual__defer-4"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(AirflowFailException, match="sailor_train.*'status': 'success'"):
        _operator(request, placement, data).resume_train(_context(run_id), event={"status": "success"})


def _play_triggerer(env, op, context, deferred, preempt_at_step=None, timeout_s=300):
    """Run each deferred trigger until it fires and hand the task its event; SIGTERM (a spot
    preemption notice) to attempt 1's node 0 once the trainer passed ``preempt_at_step``.
    Returns the task's result."""
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.train.progress import read_progress

    sent = []

    def notice():
        name = next(n for n in deferred.trigger.pod_names if n.endswith("-node-0"))
        if preempt_at_step is None or sent or not name.endswith("-a1-node-0"):
            return
        if (read_progress(env.core.progress).get("step") or 0) >= preempt_at_step:
            # The kubelet's graceful node shutdown: SIGTERM, and the pod's reason says why.
            env.core.pods[name]["reason"] = "Terminated"
            env.core.pods[name]["proc"].send_signal(signal.SIGTERM)
            sent.append(name)

    while True:
        event = _trigger_event(env, deferred, timeout_s=timeout_s, on_poll=notice)
        try:
            return op.resume_train(context, event=event)
        except TaskDeferred as again:
            deferred = again.value if hasattr(again, "value") else again


@pytest.mark.slow
def test_deferred_train_runs_the_pods_and_recovers_a_preempted_attempt(gke_env):
    """Attempt 1 gets a preemption notice (SIGTERM) mid-run: the trainer checkpoints, the resumed
    task re-plans through the recovery strategy and defers on attempt 2's pods, which resume from
    the checkpoint and finish; all inside one try, every attempt in the ledger."""
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.train.checkpoint.dcp import CheckpointManager

    gke_env.core.mode = "process"
    run_id = "manual__defer-5"
    request, placement, data = gke_env.prepare(run_id, total_steps=60, checkpoint_every_steps=10)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    result = _play_triggerer(gke_env, op, context, deferred.value, preempt_at_step=12)

    assert result["step"] == 60 and result["final_loss"] < result["initial_loss"]
    ledger = gke_env.ctx.ledger
    first, second = ledger.attempts(run_id)
    assert (first["outcome"], second["outcome"]) == ("preempted", "completed")
    assert first["try_number"] == second["try_number"] == 1  # recovered without an Airflow retry
    (pre,) = ledger.preemptions(run_id)
    assert pre["noticed"] and pre["steps_lost"] == 0 and second["resumed_from_step"] == pre["step"] >= 12
    assert len(result["attempts"]) == 2
    storage.filesystem(result["checkpoint_uri"])[0].invalidate_cache()  # other processes wrote it
    assert CheckpointManager(result["checkpoint_uri"].rsplit("/", 1)[0]).latest_valid_step() == 60
    pods = sorted(gke_env.core.pods) + gke_env.core.deleted
    assert any("-a2-node-0" in p for p in pods) and any("-a2-node-1" in p for p in pods)
    assert sum(s.endswith("-rdzv") for s in gke_env.core.services) == 2
    stages_seen = [t["stage"] for t in ledger.stage_timings(run_id)]
    assert stages_seen.count("train_launch") == 2 and stages_seen.count("train") == 2

    # The try's worker died before it reported success: the retry returns the completed
    # attempt's result and starts no pod.
    pods_before = (sorted(gke_env.core.pods), list(gke_env.core.deleted))
    again = op.execute(_context(run_id, try_number=2))
    assert again["step"] == 60 and again["checkpoint_uri"] == result["checkpoint_uri"]
    assert again["placement"] == result["placement"] and len(again["attempts"]) == 2
    assert (sorted(gke_env.core.pods), list(gke_env.core.deleted)) == pods_before
    assert [a["outcome"] for a in ledger.attempts(run_id)] == ["preempted", "completed"]


def test_a_recoverys_new_pool_is_waited_for_in_the_triggerer(gke_env):
    """After a preemption the train task re-plans and starts the new placement's pool, then defers
    on GKEOperationTrigger while GKE creates it (no worker slot held), and starts the pods after."""
    from airflow.sdk.exceptions import TaskDeferred
    from google.cloud.container_v1 import types

    run_id = "manual__recover-pool"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    ops: dict[str, object] = {}

    def running():  # from here on, GKE operations take a while
        name = f"operation-{len(ops) + 1}"
        ops[name] = types.Operation(name=name, status=types.Operation.Status.RUNNING, location=REGION)
        return ops[name]

    gke_env.clusters._op = running
    gke_env.clusters.get_operation = lambda *, name: ops[name.rsplit("/", 1)[-1]]
    node0, node1 = deferred.value.trigger.pod_names
    del gke_env.core.pods[node0]  # the Spot node went away with its pod
    with pytest.raises(TaskDeferred) as waiting:
        op.resume_train(context, event=_trigger_event(gke_env, deferred.value, timeout_s=30))
    classpath, kwargs = waiting.value.trigger.serialize()
    assert classpath.endswith("LeasedOperationTrigger") and kwargs["operation_name"] == "operation-1"
    assert kwargs["run_id"] == run_id  # the run's lease is renewed while its new pool is created
    assert waiting.value.method_name == "resume_capacity" and waiting.value.kwargs["attempt"] == 2
    assert not any("-a2-" in name for name in gke_env.core.pods)  # no pod before its pool exists
    (_, second) = gke_env.ctx.ledger.attempts(run_id)
    assert second["outcome"] == "running" and second["placement"]["zone"] != placement["zone"]

    # A retried task (the worker died meanwhile) finds the running operation in the run's record.
    with pytest.raises(TaskDeferred) as again:
        _operator(request, placement, data).execute(_context(run_id, try_number=2))
    assert again.value.trigger.operation_name == "operation-1"

    ops["operation-1"] = types.Operation(name="operation-1", status=types.Operation.Status.DONE)
    with pytest.raises(TaskDeferred) as pods:
        op.resume_capacity(context, event={"status": "success"}, **waiting.value.kwargs)
    assert pods.value.method_name == "resume_train" and pods.value.trigger.state == {"attempt": 2}
    assert all("-a2-node-" in name for name in pods.value.trigger.pod_names)
    assert all(name in gke_env.core.pods for name in pods.value.trigger.pod_names)


@pytest.mark.slow
def test_a_runs_own_command_runs_in_its_pods_with_the_contract_env(gke_env):
    """The run's own command (examples/plain_ddp.py, no SAILOR import) in the pods of its image, with
    the run contract's env on gs://, through the deferred train task to a completed attempt."""
    from airflow.sdk.exceptions import TaskDeferred

    gke_env.core.mode = "process"
    script = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "plain_ddp.py"))
    image = "europe-docker.pkg.dev/acme/ml/train:1.2"
    run_id = "manual__own-cmd"
    request, placement, data = gke_env.prepare(
        run_id,
        command=["python", script],
        image=image,
        env={"CHECKPOINT_EVERY": "10"},
        total_steps=20,
        checkpoint_every_steps=10,
    )
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    for name in deferred.value.trigger.pod_names:
        (container,) = gke_env.core.pods[name]["body"]["spec"]["containers"]
        assert container["image"] == image and container["command"][-3:] == ["--no-python", "python", script]
    result = _play_triggerer(gke_env, op, context, deferred.value)

    assert result["step"] == 20 and result["checkpoint_uri"].startswith("gs://")
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "completed"


# --- the run's lease while the attempt is deferred ------------------------------------------------


def _lease(env, run_id):
    return env.ctx.ledger.reservation_leases()[run_id]


def test_the_deferred_lease_is_the_normal_lease_not_the_runs_expected_hours(gke_env):
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "manual__lease-1"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred):
        _operator(request, placement, data).execute(_context(run_id))
    lease = _lease(gke_env, run_id)
    held_s = (lease["expires_at"] - lease["renewed_at"]).total_seconds()
    assert held_s == pytest.approx(gke_env.ctx.settings.lease_s, abs=1.0)  # not lease + hours


def test_the_pods_trigger_renews_the_runs_lease_at_every_poll(gke_env, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.airflow_glue import triggers

    run_id = "manual__lease-2"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        _operator(request, placement, data).execute(_context(run_id))
    assert deferred.value.trigger.serialize()[1]["run_id"] == run_id
    before = _lease(gke_env, run_id)["expires_at"]
    renewals = []
    real = triggers.renew_lease
    monkeypatch.setattr(triggers, "renew_lease", lambda rid, holder: (renewals.append(rid), real(rid, holder))[1])

    def pods_end_after_a_few_polls():
        # once the trigger renewed at three of its polls (counted by its renewals: on a loaded
        # machine it polls less often than this watcher does)
        if len(renewals) >= 3:
            for name in deferred.value.trigger.pod_names:
                gke_env.core.pods[name]["exit"] = 0

    event = _trigger_event(gke_env, deferred.value, timeout_s=30, on_poll=pods_end_after_a_few_polls)
    assert event["status"] == "success"
    assert len(renewals) >= 3 and set(renewals) == {run_id}  # one per poll of the pods
    lease = _lease(gke_env, run_id)
    assert lease["holder"] == "train (deferred)" and lease["expires_at"] > before
    held_s = (lease["expires_at"] - lease["renewed_at"]).total_seconds()
    assert held_s == pytest.approx(gke_env.ctx.settings.lease_s, abs=1.0)


def test_a_transient_ledger_error_while_renewing_is_retried_at_the_next_poll(gke_env, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.airflow_glue import triggers

    run_id = "manual__lease-3"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        _operator(request, placement, data).execute(_context(run_id))
    calls = []
    real = triggers.renew_lease

    def flaky(rid, holder):
        calls.append(rid)
        if len(calls) <= 2:
            raise ConnectionError("ledger unreachable")
        if len(calls) == 4:
            for name in deferred.value.trigger.pod_names:
                gke_env.core.pods[name]["exit"] = 0
        return real(rid, holder)

    monkeypatch.setattr(triggers, "renew_lease", flaky)
    event = _trigger_event(gke_env, deferred.value, timeout_s=30)
    assert event["status"] == "success" and len(calls) >= 4  # it kept following the pods


def test_a_reclaimed_lease_fires_and_the_operator_stops_the_pods_and_fails(gke_env):
    from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

    run_id = "manual__lease-4"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    # The triggerer was down longer than the lease: the reconciler reclaimed the reservation.
    expired = _lease(gke_env, run_id)["expires_at"]
    assert gke_env.ctx.ledger.reclaim(run_id, now=expired + dt.timedelta(seconds=1))
    event = _trigger_event(gke_env, deferred.value, timeout_s=30)
    assert event["status"] == "lease_reclaimed" and event["sailor_train"] == {"attempt": 1}
    assert "reclaimed at" in event["message"]
    assert all(gke_env.core.exit_code(n) is None for n in deferred.value.trigger.pod_names)  # still running

    with pytest.raises(AirflowFailException, match="LeaseReclaimedError: run manual__lease-4: its reservation was reclaimed"):
        op.resume_train(context, event=event)
    assert sorted(gke_env.core.deleted) == sorted(deferred.value.trigger.pod_names)
    assert not gke_env.core.services
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "failed" and "reservation was lost" in attempt["detail"]
    assert gke_env.ctx.ledger.get_run(run_id)["status"] != "cancelled"  # nobody cancelled it


@pytest.mark.parametrize(
    ("reason", "message", "fails"),
    [
        ("ErrImagePull", 'failed to pull "us-docker.pkg.dev/p/r/train:v9": manifest unknown', True),
        ("InvalidImageName", 'couldn\'t parse image name "Train:latest"', True),
        ("ImagePullBackOff", "Back-off pulling image: 429 Too Many Requests", False),  # transient
    ],
)
def test_a_pod_whose_image_cannot_be_pulled_fails_the_run_at_once(gke_env, reason, message, fails):
    """An image that cannot be pulled keeps the pod Pending for ever: the trigger fires at once,
    the operator stops the pods and fails the attempt without a retry (the retry would wait on
    the same pods while the GPU nodes idle). A transient pull error keeps waiting."""
    from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

    run_id = f"manual__pull-{reason.lower()}"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    names = deferred.value.trigger.pod_names
    gke_env.core.pods[names[-1]]["waiting"] = (reason, message)
    if not fails:
        polls = []

        def start_after_a_few_polls():
            polls.append(1)
            if len(polls) == 20:
                gke_env.core.pods[names[-1]]["waiting"] = None
                for name in names:
                    gke_env.core.pods[name]["exit"] = 0

        event = _trigger_event(gke_env, deferred.value, timeout_s=30, on_poll=start_after_a_few_polls)
        assert event["status"] == "success"
        return
    event = _trigger_event(gke_env, deferred.value, timeout_s=30)
    assert event["status"] == "unstartable" and event["message"].startswith(f"{names[-1]}: ")
    why = f"PodUnstartableError: run {run_id}: pod {names[-1]} cannot start"
    with pytest.raises(AirflowFailException, match=why):
        op.resume_train(context, event=event)
    assert sorted(gke_env.core.deleted) == sorted(names)
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "failed" and reason in attempt["detail"]


def test_a_reservation_released_while_deferred_fires_and_the_operator_stops_the_pods(gke_env):
    """The run was torn down (its reservation released) while its attempt ran deferred: the
    trigger's next renewal finds no live reservation and fires at once instead of renewing in
    vain for ever; resume_train stops the pods and fails without a retry."""
    from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

    run_id = "manual__lease-6"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    assert gke_env.ctx.ledger.release(run_id)
    event = _trigger_event(gke_env, deferred.value, timeout_s=30)
    assert event["status"] == "lease_reclaimed" and "reservation was released" in event["message"]
    with pytest.raises(AirflowFailException, match="ReservationReleasedError: run manual__lease-6"):
        op.resume_train(context, event=event)
    assert sorted(gke_env.core.deleted) == sorted(deferred.value.trigger.pod_names)
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "failed"


def test_a_trigger_serialised_before_it_renewed_leases_still_runs_without_renewing(gke_env, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.airflow_glue import triggers

    run_id = "manual__lease-5"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        _operator(request, placement, data).execute(_context(run_id))
    _, kwargs = deferred.value.trigger.serialize()
    old = {k: v for k, v in kwargs.items() if k != "run_id"}  # a row of a triggerer's table before
    trigger = triggers.AttemptPodsTrigger(**old)
    assert trigger.run_id is None
    monkeypatch.setattr(triggers, "renew_lease", lambda rid, holder: pytest.fail("nothing to renew"))
    for name in trigger.pod_names:
        gke_env.core.pods[name]["exit"] = 0
    deferred.value.trigger = trigger
    assert _trigger_event(gke_env, deferred.value, timeout_s=30)["status"] == "success"


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (LedgerSchemaError("the ledger is at revision zz9, unknown to this SAILOR"), False),
        (NoFeasibleOfferError("1x T4", {"gpu_type": 3}), False),
        (ConnectionError("ledger briefly unreachable"), True),
    ],
)
def test_run_stage_fails_at_once_on_what_a_retry_cannot_fix(error, retried):
    from airflow.sdk.exceptions import AirflowFailException

    from sailor_tasks.airflow_glue.stage import run_stage

    def stage():
        raise error

    with pytest.raises(Exception) as raised:
        run_stage(stage)
    assert isinstance(raised.value, AirflowFailException) is not retried


def test_a_stage_result_becomes_an_xcom_postgresql_can_store():
    """A diverged run's loss is NaN; the task's return value is its XCom, which PostgreSQL keeps
    as JSONB, and JSONB has no NaN or infinity: run_stage gives them as null."""
    import json
    import math

    from sailor_tasks.airflow_glue.stage import run_stage

    def stage():
        return {
            "final_loss": math.nan,
            "losses": [1.5, math.inf],
            "attempts": [{"usd": -math.inf}],
            "step": 4,
        }

    out = run_stage(stage)
    assert out == {"final_loss": None, "losses": [1.5, None], "attempts": [{"usd": None}], "step": 4}
    json.dumps(out, allow_nan=False)


def test_cancel_while_a_recoverys_pool_is_created_cancels_the_attempt(gke_env):
    """The train task waits (deferred) for the node pool of a recovery whose attempt has begun:
    cancelling the run ends that attempt, and the run, as cancelled, not failed."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred
    from google.cloud.container_v1 import types

    from sailor_tasks.airflow_glue.triggers import LeasedOperationTrigger

    run_id = "manual__cancel-recover"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    ops: dict[str, object] = {}

    def running():
        name = f"operation-{len(ops) + 1}"
        ops[name] = types.Operation(name=name, status=types.Operation.Status.RUNNING, location=REGION)
        return ops[name]

    gke_env.clusters._op = running
    gke_env.clusters.get_operation = lambda *, name: ops[name.rsplit("/", 1)[-1]]
    node0, _ = deferred.value.trigger.pod_names
    del gke_env.core.pods[node0]  # preempted: the train task recovers and waits for the new pool
    with pytest.raises(TaskDeferred) as waiting:
        op.resume_train(context, event=_trigger_event(gke_env, deferred.value, timeout_s=30))
    classpath, kwargs = waiting.value.trigger.serialize()
    assert classpath.endswith("LeasedOperationTrigger")
    (_, second) = gke_env.ctx.ledger.attempts(run_id)
    assert second["outcome"] == "running"

    # sailor cancel marks the run failed: the triggerer calls the deferred trigger's on_kill
    asyncio.run(LeasedOperationTrigger(**kwargs).on_kill())
    stages.teardown(run_id, gke_env.ctx)
    (_, second) = gke_env.ctx.ledger.attempts(run_id)
    assert second["outcome"] == "cancelled", second
    assert gke_env.ctx.ledger.get_run(run_id)["status"] == "cancelled"


def test_the_pod_trigger_reads_logs_back_to_its_last_line_however_long_ago(monkeypatch):
    """After failed polls the next read reaches back to the last line streamed, not a fixed
    window of two polls (lines written during the gap were lost)."""
    import asyncio

    from sailor_tasks.airflow_glue import triggers

    trigger = triggers.AttemptPodsTrigger(
        pod_names=["p"], namespace="ns", cluster_url="https://x", ssl_ca_cert="", gcp_conn_id="g",
        container="c", poll_interval=15, startup_timeout=60,
    )  # fmt: skip
    asked = []

    class Hook:
        async def read_logs(self, name, namespace, container_name=None, since_seconds=None):
            asked.append(since_seconds)
            return ["2026-11-23T00:00:10.000000001Z step 1", "2026-11-23T00:00:20.5Z step 2"]

    clock = dt.datetime(2026, 11, 23, 0, 2, 0, tzinfo=dt.UTC).timestamp()  # 100 s after the last line
    monkeypatch.setattr(triggers.time, "time", lambda: clock)
    asyncio.run(trigger._stream_logs(Hook(), "p"))
    assert asked == [None] and trigger.log_marks["p"] == "2026-11-23T00:00:20.5Z"
    asyncio.run(trigger._stream_logs(Hook(), "p"))
    assert asked[1] >= 100 + 15  # back to the last line, with a poll to spare


@pytest.mark.parametrize("fails", ["record", "delete"])
def test_a_retry_after_the_pods_were_judged_records_the_preemption_not_new_pods(gke_env, monkeypatch, fails):
    """The try that judged the attempt's pods died before recording its end: its spot node's pod
    was gone, the other pod running. Whether it died writing the pods' ends (``record``: nothing
    deleted yet, judged again) or after (``delete``: the ends recorded), the retry records the
    preemption; it never creates the ended attempt's pods again."""
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.airflow_glue import gcp

    run_id = f"manual__judged-{fails}"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    node0, node1 = deferred.value.trigger.pod_names
    del gke_env.core.pods[node1]  # its spot VM reclaimed: the pod is gone with the node
    event = _trigger_event(gke_env, deferred.value, timeout_s=30)
    if fails == "record":
        real, calls = gcp.report_pod_ends, []

        def flaky(*a, **k):
            calls.append(1)
            if len(calls) == 1:
                raise OSError("GCS 503")
            return real(*a, **k)

        monkeypatch.setattr(gcp, "report_pod_ends", flaky)
    else:
        real_delete = gcp.TrainingPods._delete

        def dies(self, index):
            monkeypatch.setattr(gcp.TrainingPods, "_delete", real_delete)
            raise OSError("the task's worker lost")

        monkeypatch.setattr(gcp.TrainingPods, "_delete", dies)
    with pytest.raises(OSError):
        op.resume_train(context, event=event)
    # Airflow retries the task: it recovers from the preemption (a new attempt's pods, deferred on).
    with pytest.raises(TaskDeferred) as again:
        _operator(request, placement, data).execute(_context(run_id, try_number=2))
    assert again.value.trigger.state == {"attempt": 2}
    assert node1 not in gke_env.core.pods  # the gone pod of attempt 1 was not created again
    [lost] = gke_env.ctx.ledger.preemptions(run_id)
    assert lost["attempt"] == 1
    assert gke_env.ctx.ledger.attempts(run_id)[0]["outcome"] == "preempted"


def test_a_retry_after_a_stop_interrupted_before_it_ended_the_attempt_resumes_it(gke_env):
    """A stop (Airflow stopping the task) marks the attempt's launch report before deleting its
    pods; interrupted before it ended the attempt, the retry resumes the attempt on new pods rather
    than judge the pods it deleted a preemption."""
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks import paths, storage
    from sailor_tasks.stages.train import _mark_stopping

    run_id = "manual__stop-interrupted"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    node0, node1 = deferred.value.trigger.pod_names
    _mark_stopping(gke_env.ctx, run_id)
    report = storage.read_json(paths.launch_report_uri(gke_env.ctx.run_uri(placement["region"], run_id)))
    assert report["stopping"] and report["pods_started"]
    for name in (node0, node1):  # deleted by the stop, which then died
        del gke_env.core.pods[name]
    with pytest.raises(TaskDeferred) as again:
        _operator(request, placement, data).execute(_context(run_id, try_number=2))
    assert again.value.trigger.state == {"attempt": 1} and set(again.value.trigger.pod_names) == {node0, node1}
    assert gke_env.ctx.ledger.preemptions(run_id) == []


def test_a_retry_finding_its_pods_succeeded_follows_them_and_never_runs_them_again(gke_env):
    """The try's worker died while its attempt was deferred, and the pods then succeeded: the
    retry reattaches to the succeeded pods and ends the attempt from them; it deletes none of
    them to create it anew (the run's command would run a second time)."""
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "manual__succeeded-retry"
    request, placement, data = gke_env.prepare(run_id, command=["python", "train.py"])
    with pytest.raises(TaskDeferred) as deferred:
        _operator(request, placement, data).execute(_context(run_id))
    names = deferred.value.trigger.pod_names
    pods = {name: gke_env.core.pods[name] for name in names}
    for pod in pods.values():
        pod["exit"] = 0

    op, context = _operator(request, placement, data), _context(run_id, try_number=2)
    with pytest.raises(TaskDeferred) as again:
        op.execute(context)
    assert gke_env.core.deleted == []  # no succeeded pod deleted to be created again
    assert again.value.trigger.pod_names == names
    assert all(gke_env.core.pods[name] is pods[name] for name in names)
    event = _trigger_event(gke_env, again.value, timeout_s=30)
    assert event["status"] == "success"
    result = op.resume_train(context, event=event)

    assert result["status"] == "completed"
    assert sorted(gke_env.core.deleted) == sorted(names)  # cleaned up once judged
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "completed"


NAMESPACE_MANIFEST = {
    "apiVersion": "v1",
    "kind": "Namespace",
    "metadata": {"name": "sailor", "labels": {"app.kubernetes.io/managed-by": "sailor"}},
}


def _service_account_manifest(google_account: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": "sailor-train",
            "namespace": "sailor",
            "labels": {"app.kubernetes.io/managed-by": "sailor"},
            "annotations": {"iam.gke.io/gcp-service-account": google_account},
        },
    }


def test_the_first_pods_on_a_fresh_cluster_get_their_namespace_and_workload_identity_account(gke_env, caplog):
    """A cluster provision just created has no ``sailor`` namespace and no ``sailor-train``
    service account: the launch creates both (the account annotated with the Google service
    account the pods act as) before the service and the pods. A retry asks again and takes
    AlreadyExists as done."""
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "manual__fresh-cluster"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        _operator(request, placement, data).execute(_context(run_id))
    account = _service_account_manifest("sailor-train@acme-ml.iam.gserviceaccount.com")
    assert gke_env.core.sent == [NAMESPACE_MANIFEST, account]
    assert sorted(gke_env.core.pods) == sorted(deferred.value.trigger.pod_names)
    assert all(
        pod["body"]["spec"]["serviceAccountName"] == "sailor-train" for pod in gke_env.core.pods.values()
    )

    with pytest.raises(TaskDeferred):  # the worker died while deferred: Airflow retries the task
        _operator(request, placement, data).execute(_context(run_id, try_number=2))
    assert gke_env.core.sent == [NAMESPACE_MANIFEST, account] * 2  # asked again: 409, done
    assert list(gke_env.core.namespaces) == ["default", "sailor"]
    assert list(gke_env.core.service_accounts) == [("sailor", "sailor-train")]
    assert not [r for r in caplog.records if r.name.endswith(".gcp") and r.levelname == "WARNING"]


def test_a_service_account_that_exists_is_kept_and_one_acting_as_another_account_is_named(
    gke_env, monkeypatch, caplog
):
    from airflow.sdk.exceptions import TaskDeferred
    from kubernetes.client import models as k8s

    monkeypatch.setenv("SAILOR_GKE_GCP_SERVICE_ACCOUNT", "trainer@acme-ml.iam.gserviceaccount.com")
    mine = k8s.V1ServiceAccount(
        metadata=k8s.V1ObjectMeta(
            name="sailor-train",
            namespace="sailor",
            annotations={"iam.gke.io/gcp-service-account": "legacy@acme-ml.iam.gserviceaccount.com"},
        )
    )
    gke_env.core.namespaces["sailor"] = None
    gke_env.core.service_accounts["sailor", "sailor-train"] = mine
    run_id = "manual__own-account"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred):
        _operator(request, placement, data).execute(_context(run_id))

    assert gke_env.core.sent == [
        NAMESPACE_MANIFEST,
        _service_account_manifest("trainer@acme-ml.iam.gserviceaccount.com"),
    ]
    assert gke_env.core.service_accounts["sailor", "sailor-train"] is mine  # not replaced
    (warning,) = [
        r.getMessage() for r in caplog.records if r.name.endswith(".gcp") and r.levelname == "WARNING"
    ]
    assert "acts as legacy@acme-ml.iam.gserviceaccount.com" in warning
    assert "not as trainer@acme-ml.iam.gserviceaccount.com" in warning


def test_an_identity_that_may_not_create_them_uses_the_namespace_and_account_the_operator_made(gke_env):
    """Namespace-scoped permissions: creating the namespace or the service account is refused
    (403, checked before existence), and both exist: the pods start with them."""
    from airflow.sdk.exceptions import TaskDeferred
    from kubernetes.client import models as k8s

    gke_env.core.namespaces["sailor"] = None
    gke_env.core.service_accounts["sailor", "sailor-train"] = k8s.V1ServiceAccount(
        metadata=k8s.V1ObjectMeta(name="sailor-train", namespace="sailor")
    )

    def forbidden(*_, **__):
        raise _api_error(403)

    gke_env.core.create_namespace = forbidden
    gke_env.core.create_namespaced_service_account = forbidden
    run_id = "manual__namespaced-rbac"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(TaskDeferred) as deferred:
        _operator(request, placement, data).execute(_context(run_id))
    assert all(name in gke_env.core.pods for name in deferred.value.trigger.pod_names)
