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
    """In-memory pods and services with the CoreV1Api methods the pod operators call."""

    def __init__(self, mode: str = "scripted"):
        from kubernetes.client import ApiClient

        self.api_client = ApiClient()
        self.mode = mode
        self.pods: dict[str, dict] = {}  # name -> {"body": manifest dict, "labels", "exit", "proc", "log"}
        self.services: dict[str, object] = {}
        self.deleted: list[str] = []
        self.deleted_services: list[str] = []
        self.port = free_port()
        self.progress = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"progress-{uuid.uuid4().hex}.json")

    # pods
    def create_namespaced_pod(self, body, namespace, **_):
        name = body["metadata"]["name"]
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
        status = k8s.V1ContainerStatus(
            name=gke.CONTAINER_NAME, image="i", image_id="", ready=code is None, restart_count=0, state=state
        )
        return k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=dict(pod["labels"])),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name=gke.CONTAINER_NAME, image="i")]),
            status=k8s.V1PodStatus(phase=phase, container_statuses=[status]),
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

    # services
    def create_namespaced_service(self, namespace, service, **_):
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
def gke_env(gcs, settings, monkeypatch):
    """gs:// buckets on the emulator, an in-memory GKE (ClusterManager + Kubernetes API), a demo
    dataset; returns a function preparing a run up to ``provision`` (as the DAG does)."""
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
    core = FakeCoreV1()
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


def _event(deferred, status: str) -> dict:
    """What GKEStartPodTrigger sends when its pod ends (KubernetesPodTrigger.run)."""
    trigger = deferred.trigger
    return {
        "status": status,
        "namespace": trigger.pod_namespace,
        "name": trigger.pod_name,
        "message": "pod failed"
        if status == "failed"
        else "All containers inside pod have started successfully.",
        **trigger.trigger_kwargs,
    }


def test_execute_on_gke_starts_the_pods_and_defers_on_the_provider_trigger(gke_env):
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
    assert classpath == "airflow.providers.google.cloud.triggers.kubernetes_engine.GKEStartPodTrigger"
    pool = gke.run_prefix(run_key(run_id))
    names = [f"{pool}-a1-node-0", f"{pool}-a1-node-1"]
    assert kwargs["pod_name"] == names[0] and kwargs["pod_namespace"] == "sailor"
    assert (kwargs["cluster_url"], kwargs["ssl_ca_cert"]) == (CLUSTER_URL, CA_CERT)
    assert kwargs["gcp_conn_id"] == "google_cloud_default"
    assert kwargs["poll_interval"] == 15 and kwargs["startup_timeout"] == 30 * 60
    assert kwargs["on_finish_action"] == "delete_succeeded_pod" and kwargs["get_logs"] is True
    assert kwargs["trigger_kwargs"] == {"sailor_train": {"attempt": 1, "pod": 0, "exit": {}, "ends": {}}}

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


def test_on_kill_deletes_the_running_pods_and_keeps_the_ended_ones(gke_env):
    """The run marked failed while train runs (sailor cancel): every pod still running is deleted
    through the provider's GKE Kubernetes hook, in the region's cluster; an ended pod is kept."""
    from airflow.sdk.exceptions import TaskDeferred

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
    assert gke_env.hooks and {h["cluster_url"] for h in gke_env.hooks} == {CLUSTER_URL}
    # teardown (which still runs) finds nothing left to stop, then releases the node pool.
    assert stages.teardown(run_id, gke_env.ctx)["training_stopped"] == 0
    assert "delete_node_pool" in gke_env.clusters.calls or "set_node_pool_size" in gke_env.clusters.calls


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
    assert deferred.value.trigger.pod_name == created[0]
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)  # still one attempt, still running
    assert attempt["outcome"] == "running"

    # Node 0 is preempted (kept, labelled already_checked by the provider); then the wait on node 1
    # times out and Airflow retries the task (try 3): node 0 is read again, not recreated.
    gke_env.core.pods[created[0]]["exit"] = 1
    op, context = _operator(request, placement, data), _context(run_id, try_number=2)
    with pytest.raises(TaskDeferred) as on_node1:
        op.resume_train(context, event=_event(deferred.value, "failed"))
    assert on_node1.value.trigger.pod_name == created[1]
    assert gke_env.core.pods[created[0]]["labels"]["already_checked"] == "True"
    with pytest.raises(TaskDeferred) as again:
        _operator(request, placement, data).execute(_context(run_id, try_number=3))
    assert sorted(gke_env.core.pods) == created and again.value.trigger.pod_name == created[0]


def test_resume_follows_each_pod_in_turn_then_fails_clearly_on_a_failed_pod(gke_env):
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.errors import TrainingFailedError

    run_id = "manual__defer-3"
    request, placement, data = gke_env.prepare(run_id)
    op, context = _operator(request, placement, data), _context(run_id)
    with pytest.raises(TaskDeferred) as first:
        op.execute(context)
    node0, node1 = sorted(gke_env.core.pods)

    gke_env.core.pods[node0]["exit"] = 0
    with pytest.raises(TaskDeferred) as second:
        op.resume_train(context, event=_event(first.value, "success"))
    assert second.value.trigger.pod_name == node1
    assert second.value.trigger.trigger_kwargs["sailor_train"] ["exit"] == {"0": 0}
    assert node0 in gke_env.core.deleted  # the provider cleans up a succeeded pod

    gke_env.core.pods[node1]["exit"] = 3
    with pytest.raises(TrainingFailedError, match="exit code 3"):
        op.resume_train(context, event=_event(second.value, "failed"))
    assert gke_env.core.pods[node1]["labels"]["already_checked"] == "True"  # kept, never reattached
    (attempt,) = gke_env.ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "failed" and attempt["detail"] == "exit code 3"


def test_resume_without_sailor_state_names_what_it_got(gke_env):
    from airflow.sdk.exceptions import AirflowFailException

    run_id = "manual__defer-4"
    request, placement, data = gke_env.prepare(run_id)
    with pytest.raises(AirflowFailException, match="sailor_train.*'status': 'success'"):
        _operator(request, placement, data).resume_train(_context(run_id), event={"status": "success"})


def _play_triggerer(env, op, context, deferred, preempt_at_step=None, timeout_s=300):
    """Wait for each deferred pod to end, send its event; SIGTERM (a spot preemption notice) to
    attempt 1's node 0 once the trainer passed ``preempt_at_step``. Returns the task's result."""
    from airflow.sdk.exceptions import TaskDeferred

    from sailor_tasks.train.progress import read_progress

    deadline = time.monotonic() + timeout_s
    while True:
        name = deferred.trigger.pod_name
        preempted = False
        while env.core.exit_code(name) is None:
            assert time.monotonic() < deadline, f"pod {name} did not end"
            if preempt_at_step is not None and not preempted and name.endswith("-a1-node-0"):
                if (read_progress(env.core.progress).get("step") or 0) >= preempt_at_step:
                    env.core.pods[name]["proc"].send_signal(signal.SIGTERM)
                    preempted = True
            time.sleep(0.02)
        status = "success" if env.core.exit_code(name) == 0 else "failed"
        try:
            return op.resume_train(context, event=_event(deferred, status))
        except TaskDeferred as again:
            deferred = again


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
