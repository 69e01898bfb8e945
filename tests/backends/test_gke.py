"""GKE backend offline: cluster/node-pool bodies checked by container_v1 types, training pods as
GKEStartPodOperator builds them checked by kubernetes-validate (Kubernetes 1.30), and
provision/teardown idempotency against an in-memory ClusterManager."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import kubernetes_validate
import pytest

from sailor_tasks.backends import TrainLaunch, get_backend
from sailor_tasks.backends.gke import (
    CONTAINER_NAME,
    POD_STARTUP_TIMEOUT_S,
    GkeBackend,
    GkeConfig,
    PendingOperation,
    accelerator_type,
    build_cluster_body,
    build_namespace,
    build_node_pool_body,
    build_rendezvous_service,
    build_service_account,
    build_training_pods,
    node_pool_name,
    run_label,
    serialize,
    validate_cluster_body,
    validate_node_pool_body,
)
from sailor_tasks.catalog import load_catalog
from sailor_tasks.model import Placement
from sailor_tasks.testing.gke_fake import InMemoryClusterManager
from sailor_tasks.train.config import TrainConfig

pytestmark = pytest.mark.gke

K8S = "1.30"
CONFIG = GkeConfig(project="acme-ml")


def _placement(gpu: str, gpus_per_node: int, num_nodes: int, market: str = "spot") -> Placement:
    offer = next(o for o in load_catalog().offers if o.gpu_type == gpu and o.gpus_per_node == gpus_per_node)
    return Placement(
        run_id="manual__2026-11-22T05:00:00+00:00",
        cloud="gcp",
        region=offer.region,
        zone=offer.zone,
        gpu_type=gpu,
        gpus_per_node=gpus_per_node,
        num_nodes=num_nodes,
        num_gpus=gpus_per_node * num_nodes,
        market=market,
        instance_type=offer.instance_type,
        usd_per_hour=offer.usd_per_hour(market) * num_nodes,
    )


def _launch(placement: Placement, image: str = "") -> TrainLaunch:
    key = "manual__2026-11-22T05_00_00_00_00"
    uri = f"gs://acme-ml-sailor-{placement.region}/runs/{key}/train_config.json"
    return TrainLaunch(placement.run_id, key, uri, placement.num_gpus, placement, image=image)


def _train(launch: TrainLaunch, **kw) -> TrainConfig:
    """The attempt's TrainConfig as ``stages.attempts.begin_attempt`` writes it."""
    return TrainConfig(
        run_id=launch.run_id,
        model="tiny_gpt",
        data_uri=f"gs://acme-ml-sailor-{launch.placement.region}/replicas/demo",
        output_uri=launch.config_uri.rsplit("/", 1)[0],
        total_steps=50,
        checkpoint_every_steps=10,
        seed=7,
        **kw,
    )


# --- Google bodies ------------------------------------------------------------------------------


def test_spot_node_pool_body_is_a_valid_gpu_pool_for_the_placement():
    pl = _placement("A100", 4, 2)
    body = build_node_pool_body(CONFIG, "run-1", pl)
    pool = validate_node_pool_body(body)  # raises on unknown fields or wrong types
    assert pool.config.spot is True
    assert pool.config.machine_type == pl.instance_type
    (acc,) = pool.config.accelerators
    assert (acc.accelerator_type, acc.accelerator_count) == ("nvidia-tesla-a100", 4)
    assert acc.gpu_driver_installation_config.gpu_driver_version.name == "DEFAULT"
    assert list(pool.locations) == [pl.zone]
    assert (pool.autoscaling.enabled, pool.autoscaling.min_node_count, pool.autoscaling.max_node_count) == (
        True,
        0,
        2,
    )
    taints = {(t.key, t.value, t.effect.name) for t in pool.config.taints}
    assert taints == {
        ("nvidia.com/gpu", "present", "NO_SCHEDULE"),
        ("cloud.google.com/gke-spot", "true", "NO_SCHEDULE"),
    }
    assert pool.name == node_pool_name("run-1", pl) and len(pool.name) <= 40


def test_pools_of_series_without_persistent_disk_boot_from_hyperdisk():
    disk = {}
    for machine in ("a3-ultragpu-8g", "a4-highgpu-8g", "a2-highgpu-4g", "g2-standard-4"):
        pl = dataclasses.replace(_placement("A100", 4, 1), instance_type=machine)
        disk[machine] = validate_node_pool_body(build_node_pool_body(CONFIG, "run-1", pl)).config.disk_type
    assert disk == {
        "a3-ultragpu-8g": "hyperdisk-balanced",
        "a4-highgpu-8g": "hyperdisk-balanced",
        "a2-highgpu-4g": "pd-balanced",
        "g2-standard-4": "pd-balanced",
    }


def test_on_demand_pool_has_no_spot_flag_or_taint():
    pool = validate_node_pool_body(build_node_pool_body(CONFIG, "run-1", _placement("L4", 1, 1, "on_demand")))
    assert pool.config.spot is False
    assert [t.key for t in pool.config.taints] == ["nvidia.com/gpu"]


def test_cluster_body_is_valid_and_the_validator_rejects_unknown_fields():
    body = build_cluster_body(CONFIG, "us-central1")
    cluster = validate_cluster_body(body)
    assert cluster.name == "sailor-us-central1"
    assert cluster.workload_identity_config.workload_pool == "acme-ml.svc.id.goog"
    (system,) = validate_cluster_body(build_cluster_body(CONFIG, "us-central1", "us-central1-b")).node_pools
    assert list(system.locations) == ["us-central1-b"] and not system.config.accelerators
    with pytest.raises(ValueError):
        validate_cluster_body({**body, "spot_everything": True})


GOOGLE_LABEL_VALUE = r"[a-z0-9_-]{0,63}"
"""Google Cloud label values (labels-overview): lowercase letters, digits, '_' and '-'."""
KUBERNETES_LABEL_VALUE = r"([a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?)?"


def test_cloud_labels_of_a_run_named_by_the_rest_api_hold_only_what_google_accepts():
    import re

    run_key = "manual__2026-11-28T09:08:28.121027+00:00"  # a run triggered through the REST API
    pool = build_node_pool_body(CONFIG, run_key, _placement("A100", 4, 1))
    cluster = build_cluster_body(CONFIG, "europe-west4")
    for value in [*pool["config"]["resource_labels"].values(), *cluster["resource_labels"].values()]:
        assert re.fullmatch(GOOGLE_LABEL_VALUE, value), value
    for value in pool["config"]["labels"].values():  # Kubernetes labels: '.' allowed there
        assert re.fullmatch(KUBERNETES_LABEL_VALUE, value), value
    assert pool["config"]["resource_labels"]["sailor-run"].endswith(run_label(run_key)[-12:])


def test_pools_keep_auto_upgrade_on_as_a_cluster_in_a_release_channel_requires():
    channel = validate_cluster_body(build_cluster_body(CONFIG, "us-central1")).release_channel.channel
    pool = validate_node_pool_body(build_node_pool_body(CONFIG, "run-1", _placement("L4", 1, 1)))
    assert channel.name != "UNSPECIFIED" and pool.management.auto_upgrade is True


def test_every_catalog_gpu_has_an_accelerator_type_and_unknown_ones_are_named():
    for gpu in load_catalog().gpu_types:
        assert accelerator_type(gpu).startswith("nvidia-")
    with pytest.raises(ValueError, match="TPUv9.*valid: A100"):
        accelerator_type("TPUv9")


def test_bad_teardown_mode_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid: delete, scale_to_zero"):
        GkeConfig(project="p", teardown="shred")


# --- training pods ------------------------------------------------------------------------------


def _kpo_render(pod, launch):
    from sailor_tasks.airflow_glue.gcp import training_pod_operator

    op = training_pod_operator(CONFIG, launch, pod, deferrable=True)
    return serialize(op.build_pod_request_obj(context=None, dry_run=True)), op


def test_single_node_pod_targets_the_spot_pool_with_gpu_limits_and_notice_grace():
    launch = _launch(_placement("A100", 4, 1))
    (pod,) = build_training_pods(CONFIG, launch, _train(launch))
    assert build_rendezvous_service(CONFIG, launch) is None
    manifest, op = _kpo_render(pod, launch)
    kubernetes_validate.validate(manifest, K8S, strict=True)
    spec = manifest["spec"]
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-nodepool": node_pool_name(launch.run_key, launch.placement),
        "cloud.google.com/gke-spot": "true",
    }
    assert {t["key"] for t in spec["tolerations"]} == {"nvidia.com/gpu", "cloud.google.com/gke-spot"}
    assert spec["terminationGracePeriodSeconds"] == CONFIG.pod_grace_s() == 105
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    assert container["name"] == CONTAINER_NAME
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert container["command"][:4] == ["python", "-m", "torch.distributed.run", "--nproc-per-node=4"]
    assert "--standalone" in container["command"]
    assert container["command"][-3:] == ["sailor_tasks.train", "--config", launch.config_uri]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SAILOR_CHECKPOINT_DIR"] == launch.config_uri.rsplit("/", 1)[0] + "/checkpoints"
    assert manifest["metadata"]["labels"]["sailor.dev/run"] == run_label(launch.run_key)
    assert op.deferrable is True and op.reattach_on_restart is True
    assert op.termination_grace_period == 105


def test_multi_node_pods_rendezvous_on_node_zero_through_a_headless_service():
    launch = _launch(_placement("H100", 8, 3))
    pods = build_training_pods(CONFIG, launch, _train(launch))
    service = serialize(build_rendezvous_service(CONFIG, launch))
    kubernetes_validate.validate(service, K8S, strict=True)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"]["sailor.dev/node-rank"] == "0"
    host = f"{service['metadata']['name']}.sailor.svc.cluster.local"
    ranks = []
    for pod in pods:
        manifest, _ = _kpo_render(pod, launch)
        kubernetes_validate.validate(manifest, K8S, strict=True)
        cmd = manifest["spec"]["containers"][0]["command"]
        assert "--nnodes=3" in cmd and f"--master-addr={host}" in cmd
        # the nodes wait for each other as long as a pod may take to start, not torchrun's 900 s
        timeout = int(next(a for a in cmd if a.startswith("--rdzv-conf=timeout=")).split("=")[-1])
        assert timeout > POD_STARTUP_TIMEOUT_S > 900
        ranks.append(next(a for a in cmd if a.startswith("--node-rank=")))
    assert ranks == ["--node-rank=0", "--node-rank=1", "--node-rank=2"]
    assert len({p.metadata.name for p in pods}) == 3


def test_a_retried_task_finds_its_own_node_pods_not_the_others():
    """KubernetesPodOperator reattaches by a label selector: dag/task/run (not try) + our labels."""
    launch = _launch(_placement("H100", 8, 2))
    ti = SimpleNamespace(dag_id="sailor_train", task_id="train", map_index=-1, try_number=2)
    context = {"ti": ti, "run_id": launch.run_id, "dag": SimpleNamespace()}
    selectors = [
        _kpo_render(pod, launch)[1]._build_find_pod_label_selector(context)
        for pod in build_training_pods(CONFIG, launch, _train(launch))
    ]
    for rank, selector in enumerate(selectors):
        assert "dag_id=sailor_train" in selector and "task_id=train" in selector
        assert f"sailor.dev/node-rank={rank}" in selector and "try_number" not in selector
        assert "sailor.dev/plan=" in selector
    assert selectors[0] != selectors[1]


def test_the_pods_namespace_and_service_account_are_valid_and_name_the_google_account_they_act_as():
    namespace, account = serialize(build_namespace(CONFIG)), serialize(build_service_account(CONFIG))
    for manifest in (namespace, account):
        kubernetes_validate.validate(manifest, K8S, strict=True)
    assert namespace["metadata"]["name"] == "sailor"
    assert (account["metadata"]["namespace"], account["metadata"]["name"]) == ("sailor", "sailor-train")
    assert account["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "sailor-train@acme-ml.iam.gserviceaccount.com"
    }
    assert CONFIG.workload_identity_member() == "serviceAccount:acme-ml.svc.id.goog[sailor/sailor-train]"

    from sailor_tasks.settings import Settings

    env = {
        "SAILOR_GCP_PROJECT": "acme-ml",
        "SAILOR_GKE_NAMESPACE": "ml",
        "SAILOR_GKE_SERVICE_ACCOUNT": "trainer",
        "SAILOR_GKE_GCP_SERVICE_ACCOUNT": "gpu-jobs@shared-iam.iam.gserviceaccount.com",
    }
    config = GkeConfig.from_env(Settings.from_env(env), env)
    account = serialize(build_service_account(config))
    assert (account["metadata"]["namespace"], account["metadata"]["name"]) == ("ml", "trainer")
    assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == (
        "gpu-jobs@shared-iam.iam.gserviceaccount.com"
    )
    assert config.workload_identity_member() == "serviceAccount:acme-ml.svc.id.goog[ml/trainer]"
    with pytest.raises(ValueError, match="SAILOR_GKE_GCP_SERVICE_ACCOUNT='gpu-jobs' is not.*NAME@PROJECT"):
        GkeConfig(project="acme-ml", gcp_service_account="gpu-jobs")


def test_sailor_render_prints_valid_node_pool_and_manifests(tmp_path, settings):
    params = tmp_path / "params.json"
    params.write_text(
        json.dumps({"num_workers": 16, "gpu_type": "H100", "market": "spot", "max_usd_per_hour": 200})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sailor_tasks.cli", "render", "--backend", "gke", "--params", str(params)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    pool = validate_node_pool_body(out["node_pool"]["node_pool"])
    assert pool.config.spot and pool.config.accelerators[0].accelerator_type == "nvidia-h100-80gb"
    assert pool.autoscaling.max_node_count == out["placement"]["num_nodes"]
    kinds = [m["kind"] for m in out["manifests"]]
    assert kinds[:2] == ["Namespace", "ServiceAccount"]  # created unless they exist, before the pods
    assert kinds.count("Pod") == out["placement"]["num_nodes"]
    for manifest in out["manifests"]:
        kubernetes_validate.validate(manifest, K8S, strict=True)
    pod = next(m for m in out["manifests"] if m["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["command"][-1].startswith("gs://")


@pytest.mark.parametrize(
    ("override", "named"),
    [('gpu_type="TPU"', "A100"), ("num_workers=abc", "integer"), ('dataset_uri=["a"]', "sailor://")],
)
def test_sailor_render_names_a_bad_param_and_makes_no_ledger(tmp_path, settings, override, named):
    """The params are checked before the ledger is read: a bad one is named, and no ledger is
    made for it (nor is its error blamed on the ledger)."""
    proc = subprocess.run(
        [sys.executable, "-m", "sailor_tasks.cli", "render", "--set", override],
        capture_output=True,
        text=True,
        timeout=120,
    )
    key = override.split("=", 1)[0]
    assert proc.returncode == 2 and key in proc.stderr and named in proc.stderr, proc.stderr
    assert "ledger" not in proc.stderr
    assert not os.path.exists(settings.ledger_url.removeprefix("sqlite:///"))


def test_exit_status_of_a_finished_training_container_is_read_from_the_pod():
    from kubernetes.client import models as k8s

    from sailor_tasks.backends.gke import container_exit_code

    def pod(**state):
        status = k8s.V1ContainerStatus(
            name=CONTAINER_NAME,
            image="i",
            image_id="",
            ready=False,
            restart_count=0,
            state=k8s.V1ContainerState(**state),
        )
        return k8s.V1Pod(status=k8s.V1PodStatus(container_statuses=[status]))

    preempted = pod(terminated=k8s.V1ContainerStateTerminated(exit_code=75))
    assert container_exit_code(preempted) == 75
    assert container_exit_code(pod(running=k8s.V1ContainerStateRunning())) is None
    assert container_exit_code(k8s.V1Pod()) is None


# --- provisioning against an in-memory ClusterManager -------------------------------------------


FakeClusterManager = InMemoryClusterManager
"""In-memory ClusterManager: clusters and pools by resource path, GKE's status codes as errors."""


@pytest.fixture
def gke_settings(gcs, settings):
    """Settings whose buckets are on the GCS API server (the backend keeps its records there)."""
    import uuid

    prefix = f"t-{uuid.uuid4().hex[:10]}"
    gcs(f"{prefix}-source")
    return dataclasses.replace(settings, bucket_template=f"gs://{prefix}-{{bucket}}")


def test_gke_backend_refuses_local_buckets(settings):
    settings = dataclasses.replace(settings, gcp_project_override="acme-ml")
    with pytest.raises(ValueError, match="SAILOR_BUCKET_TEMPLATE=gs://"):
        GkeBackend(settings, config=CONFIG, client=FakeClusterManager())
    with pytest.raises(ValueError, match="gs://"):
        get_backend("gke", settings)


@pytest.mark.gcs
def test_provision_is_idempotent_and_teardown_deletes_the_pool(gke_settings):
    fake = FakeClusterManager()
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    pl = _placement("A100", 4, 2)
    first = backend.provision("run-1", pl)
    assert (first["cluster_state"], first["node_pool_state"]) == ("created", "created")
    again = backend.provision("run-1", pl)  # a retried task
    assert (again["cluster_state"], again["node_pool_state"]) == ("exists", "exists")
    assert len(fake.clusters) == 1 and len(fake.pools) == 1
    other = backend.provision("run-2", pl)  # another run in the same region reuses the cluster
    assert other["cluster_state"] == "exists" and len(fake.pools) == 2
    assert backend.teardown("run-1") is True
    assert len(fake.pools) == 1
    assert backend.teardown("run-1") is False  # idempotent


@pytest.mark.gcs
def test_scale_to_zero_teardown_keeps_the_pool_and_provision_scales_it_back(gke_settings):
    fake = FakeClusterManager()
    backend = GkeBackend(
        gke_settings, config=dataclasses.replace(CONFIG, teardown="scale_to_zero"), client=fake, poll_s=0
    )
    pl = _placement("L4", 1, 3)
    backend.provision("run-1", pl)
    assert backend.teardown("run-1") is True
    (pool,) = fake.pools.values()
    assert pool.initial_node_count == 0 and "set_node_pool_size=0" in fake.calls
    backend.provision("run-1", pl)
    assert pool.initial_node_count == 3


def test_train_without_the_airflow_glue_says_how_to_run_it(settings, monkeypatch):
    import sailor_tasks.backends.gke as gke

    monkeypatch.setattr(gke, "_pod_runner", None)
    gs = dataclasses.replace(settings, bucket_template="gs://p-sailor-{bucket}")
    backend = GkeBackend(gs, config=CONFIG, client=FakeClusterManager())
    with pytest.raises(RuntimeError, match="GKEStartPodOperator"):
        backend.train(_launch(_placement("T4", 1, 1)))


class ExistingCluster(FakeClusterManager):
    """The region's cluster exists with ``status``; while it is busy, ``list_operations`` lists
    the operation it runs (another run's creation)."""

    def __init__(self, region: str, status: str, message: str = ""):
        from google.cloud.container_v1 import types

        super().__init__()
        self.path = CONFIG.cluster_path(region)
        self.clusters[self.path] = types.Cluster(
            name=CONFIG.cluster_name(region),
            status=getattr(types.Cluster.Status, status),
            status_message=message,
            current_master_version=self.version,
        )
        self.region = region

    def list_operations(self, *, parent):
        from google.cloud.container_v1 import types

        self.calls.append("list_operations")
        cluster = self.clusters[self.path]
        busy = cluster.status.name in ("PROVISIONING", "RECONCILING")
        other = _running_op("op-other-run", "CREATE_CLUSTER", self.region, self.path)
        return types.ListOperationsResponse(operations=[other] if busy else [])


def _running_op(name: str, kind: str, location: str, target: str):
    """A RUNNING GKE operation of type ``kind`` on the resource path ``target``."""
    from google.cloud.container_v1 import types

    return types.Operation(
        name=name,
        status=types.Operation.Status.RUNNING,
        operation_type=types.Operation.Type[kind],
        location=location,
        target_link=f"https://container.googleapis.com/v1/{target}",
    )


@pytest.mark.gcs
def test_a_pool_waits_for_a_cluster_another_run_is_still_creating(gke_settings):
    """GKE refuses a node pool while its cluster is PROVISIONING (one cluster operation at a
    time): provisioning waits for the cluster's running operation, then creates the pool."""
    pl = _placement("T4", 1, 1)
    fake = ExistingCluster(pl.region, "PROVISIONING")
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    pending = backend.provision_step("run-1", pl)
    assert isinstance(pending, PendingOperation) and pending.phase == "busy"
    assert pending.name == "op-other-run" and "CREATE_CLUSTER" in pending.what
    assert "create_node_pool" not in fake.calls and "create_cluster" not in fake.calls
    fake.clusters[fake.path].status = fake.clusters[fake.path].Status.RUNNING
    record = backend.provision_step("run-1", pl, after=pending.phase)
    assert record["status"] == "ready" and len(fake.pools) == 1


@pytest.mark.gcs
def test_a_pool_waits_for_a_node_upgrade_that_keeps_the_cluster_reconciling(gke_settings):
    """A node-pool operation (a node upgrade, another run's pool) targets
    ``.../clusters/<name>/nodePools/<pool>``: the cluster is RECONCILING and the pool waits for it
    (it raised 'no operation listed' and provisioning failed within its retries)."""
    from google.cloud.container_v1 import types

    pl = _placement("T4", 1, 1)
    fake = ExistingCluster(pl.region, "RECONCILING")

    def list_operations(*, parent):
        upgrade = _running_op(
            "op-upgrade-nodes", "UPGRADE_NODES", pl.region, f"{fake.path}/nodePools/default-gpu-pool"
        )
        # a cluster whose name starts with this one's
        elsewhere = _running_op("op-other-cluster", "UPGRADE_NODES", pl.region, f"{fake.path}-2/nodePools/x")
        return types.ListOperationsResponse(operations=[elsewhere, upgrade])

    fake.list_operations = list_operations
    pending = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0).provision_step("run-1", pl)
    assert isinstance(pending, PendingOperation) and pending.name == "op-upgrade-nodes"
    assert pending.phase == "busy" and "UPGRADE_NODES" in pending.what


@pytest.mark.gcs
def test_a_run_whose_pool_is_up_does_not_wait_for_others_operations_on_the_cluster(gke_settings):
    """A retried train task provisions again: its pool is there, so a node upgrade of another
    pool (which can run for hours) is no reason to wait."""
    from google.cloud.container_v1 import types

    pl = _placement("T4", 1, 1)
    fake = ExistingCluster(pl.region, "RUNNING")
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    assert backend.provision_step("run-1", pl)["status"] == "ready"
    (pool,) = fake.pools.values()
    pool.status = types.NodePool.Status.RUNNING
    fake.clusters[fake.path].status = types.Cluster.Status.RECONCILING  # another pool's upgrade
    record = backend.provision_step("run-1", pl)
    assert record["status"] == "ready" and record["node_pool"] == pool.name
    assert "list_operations" not in fake.calls  # nothing looked for something to wait on


@pytest.mark.gcs
def test_another_operations_failure_does_not_fail_the_run_that_waited_for_it(gke_settings):
    """The operation the run waited for was another run's pool creation, which ran out of GPUs:
    not this run's failure. Its wait goes on to provision (the cluster is free now)."""
    from google.cloud.container_v1 import types

    pl = _placement("T4", 1, 1)
    fake = ExistingCluster(pl.region, "RECONCILING")
    failed = types.Operation(
        name="op-other-run",
        status=types.Operation.Status.DONE,
        error={"message": "ZONE_RESOURCE_POOL_EXHAUSTED (another run's pool)"},
    )
    fake.get_operation = lambda *, name: failed
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    pending = backend.provision_step("run-1", pl)
    assert pending.phase == "busy"
    backend.finish_operation(pending)  # logged, not raised
    fake.clusters[fake.path].status = types.Cluster.Status.RUNNING
    assert backend.provision_step("run-1", pl, after=pending.phase)["status"] == "ready"
    own = PendingOperation(pending.name, pending.location, pending.project, "pool", "create node pool x")
    with pytest.raises(RuntimeError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        backend.finish_operation(own)  # the run's own operation's failure is the run's


@pytest.mark.gcs
def test_a_run_that_waited_for_another_operation_waits_again_when_the_cluster_runs_a_next_one(
    gke_settings,
):
    """The operation the run waited for ended, but the cluster went straight on with the next
    (another pool's upgrade): the run checks the cluster again and waits for that one, instead of
    asking for its pool, which GKE would refuse."""
    from google.cloud.container_v1 import types

    pl = _placement("T4", 1, 1)
    fake = ExistingCluster(pl.region, "RECONCILING")
    running = [_running_op("op-a", "UPGRADE_NODES", pl.region, f"{fake.path}/nodePools/a")]
    fake.list_operations = lambda *, parent: types.ListOperationsResponse(operations=running)
    fake.get_operation = lambda *, name: (
        running[0]
        if name.endswith(running[0].name)
        else types.Operation(name=name.rsplit("/", 1)[-1], status=types.Operation.Status.DONE)
    )
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    first = backend.provision_step("run-1", pl)
    assert (first.phase, first.name) == ("busy", "op-a")
    running[:] = [_running_op("op-b", "UPGRADE_NODES", pl.region, f"{fake.path}/nodePools/b")]
    backend.finish_operation(first)
    second = backend.provision_step("run-1", pl, after=first.phase)
    assert isinstance(second, PendingOperation) and (second.phase, second.name) == ("busy", "op-b")
    assert "create_node_pool" not in fake.calls


@pytest.mark.gcs
def test_a_pool_refused_while_the_cluster_turned_busy_waits_for_that_operation(gke_settings):
    """The cluster was free when checked and started another operation before the pool's
    creation arrived (GKE answers FailedPrecondition): provisioning waits for that operation."""
    from google.api_core.exceptions import FailedPrecondition
    from google.cloud.container_v1 import types

    pl = _placement("T4", 1, 1)
    fake = ExistingCluster(pl.region, "RUNNING")
    real_create = fake.create_node_pool
    refused = []

    def create_node_pool(*, parent, node_pool):
        if not refused:  # another run's operation starts just before the first call
            refused.append(node_pool)
            fake.clusters[fake.path].status = types.Cluster.Status.RECONCILING
            raise FailedPrecondition("Cluster is running incompatible operation op-other-run")
        return real_create(parent=parent, node_pool=node_pool)

    def get_operation(*, name):  # the other operation ends once waited for
        fake.clusters[fake.path].status = types.Cluster.Status.RUNNING
        return types.Operation(name=name.rsplit("/", 1)[-1], status=types.Operation.Status.DONE)

    fake.create_node_pool, fake.get_operation = create_node_pool, get_operation
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    pending = backend.provision_step("run-1", pl)
    assert isinstance(pending, PendingOperation) and (pending.phase, pending.name) == ("busy", "op-other-run")
    backend.finish_operation(pending)
    assert backend.provision_step("run-1", pl, after=pending.phase)["status"] == "ready"


@pytest.mark.gcs
def test_teardown_waits_for_the_operation_a_busy_cluster_runs_then_deletes_the_pool(gke_settings):
    """GKE refuses the deletion while another operation runs on the cluster (FailedPrecondition):
    teardown waits for it, then deletes, instead of failing within its retries."""
    from google.api_core.exceptions import FailedPrecondition
    from google.cloud.container_v1 import types

    pl = _placement("T4", 1, 1)
    fake = ExistingCluster(pl.region, "RUNNING")
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    backend.provision("run-1", pl)
    fake.clusters[fake.path].status = types.Cluster.Status.RECONCILING
    refused = []
    real_delete = fake.delete_node_pool

    def delete_node_pool(*, name):
        if fake.clusters[fake.path].status.name == "RECONCILING":
            refused.append(name)
            raise FailedPrecondition("Cluster is running incompatible operation op-other-run")
        return real_delete(name=name)

    def get_operation(*, name):  # the other operation ends once waited for
        fake.clusters[fake.path].status = types.Cluster.Status.RUNNING
        return types.Operation(name=name.rsplit("/", 1)[-1], status=types.Operation.Status.DONE)

    fake.delete_node_pool, fake.get_operation = delete_node_pool, get_operation
    assert backend.teardown("run-1")
    assert len(refused) == 1 and fake.pools == {}


@pytest.mark.gcs
def test_a_cluster_left_in_error_is_named_with_its_message_and_how_to_remove_it(gke_settings):
    pl = _placement("T4", 1, 1)
    fake = ExistingCluster(pl.region, "ERROR", message="Insufficient regional quota: CPUS")
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    with pytest.raises(RuntimeError) as info:
        backend.provision("run-1", pl)
    assert "is in ERROR (Insufficient regional quota: CPUS)" in str(info.value)
    assert f"gcloud container clusters delete {CONFIG.cluster_name(pl.region)}" in str(info.value)
    assert "create_node_pool" not in fake.calls


@pytest.mark.gcs
def test_a_pool_whose_creation_call_failed_after_gke_took_it_is_still_torn_down(gke_settings):
    """The create call times out although GKE took it: the pool was recorded before it was asked
    for, so the run's teardown deletes it."""
    from google.api_core.exceptions import DeadlineExceeded

    class TimesOut(FakeClusterManager):
        def create_node_pool(self, *, parent, node_pool):
            super().create_node_pool(parent=parent, node_pool=node_pool)
            raise DeadlineExceeded("deadline exceeded while waiting for the response")

    pl = _placement("T4", 1, 1)
    fake = TimesOut()
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    backend.ensure_cluster(pl.region)
    with pytest.raises(DeadlineExceeded):
        backend.provision("run-1", pl)
    assert len(fake.pools) == 1
    assert backend.teardown("run-1") is True and fake.pools == {}


class SlowOperations(FakeClusterManager):
    """Operations that run for a few polls, then end as ``final`` (with an error message if given)."""

    def __init__(self, polls: int, error: str = ""):
        super().__init__()
        self.polls, self.error, self.asked = polls, error, []

    def _op(self):
        from google.cloud.container_v1 import types

        return types.Operation(name="op-7", status=types.Operation.Status.RUNNING, location="europe-west4")

    def get_operation(self, *, name):
        from google.cloud.container_v1 import types

        self.asked.append(name)
        if len(self.asked) < self.polls:
            return types.Operation(name="op-7", status=types.Operation.Status.RUNNING)
        if self.error:
            return types.Operation(
                name="op-7", status=types.Operation.Status.DONE, error={"message": self.error}
            )
        return types.Operation(name="op-7", status=types.Operation.Status.DONE)


@pytest.mark.gcs
def test_provision_waits_for_running_operations_and_reports_their_errors(gke_settings):
    slow = SlowOperations(polls=3)
    backend = GkeBackend(gke_settings, config=CONFIG, client=slow, poll_s=0)
    backend.provision("run-9", _placement("T4", 1, 1))
    assert len(slow.asked) >= 3
    assert slow.asked[0] == "projects/acme-ml/locations/europe-west4/operations/op-7"

    failing = SlowOperations(polls=1, error="Insufficient regional quota to satisfy request: NVIDIA_T4_GPUS")
    backend = GkeBackend(gke_settings, config=CONFIG, client=failing, poll_s=0)
    with pytest.raises(RuntimeError, match="NVIDIA_T4_GPUS"):
        backend.provision("run-10", _placement("T4", 1, 1))


class StockoutOnce(FakeClusterManager):
    """The first node pool creation runs, then fails (a zone stockout) and leaves the pool behind
    (in ERROR); later creations succeed."""

    def __init__(self):
        super().__init__()
        self.pool_ops = 0

    def create_node_pool(self, *, parent, node_pool):
        from google.cloud.container_v1 import types

        super().create_node_pool(parent=parent, node_pool=node_pool)
        self.pool_ops += 1
        return types.Operation(name=f"op-pool-{self.pool_ops}", status=types.Operation.Status.RUNNING)

    def get_operation(self, *, name):
        from google.cloud.container_v1 import types

        if name.endswith("/op-pool-1"):
            error = {"message": "ZONE_RESOURCE_POOL_EXHAUSTED: europe-west4-a"}
            return types.Operation(name="op-pool-1", status=types.Operation.Status.DONE, error=error)
        return types.Operation(name=name.rsplit("/", 1)[-1], status=types.Operation.Status.DONE)


@pytest.mark.gcs
def test_a_retry_after_a_failed_pool_creation_deletes_the_failed_pool_and_creates_it_again(gke_settings):
    fake = StockoutOnce()
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    pl = _placement("T4", 1, 1)
    first = backend.provision_step("run-1", pl)  # the task starts the creation and defers
    assert isinstance(first, PendingOperation) and first.phase == "pool"
    with pytest.raises(RuntimeError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        backend.finish_operation(first)  # the task fails; Airflow retries it
    second = backend.provision_step("run-1", pl)
    assert fake.calls.count("delete_node_pool") == 1 and fake.pool_ops == 2  # a new creation
    assert isinstance(second, PendingOperation) and second.name == "op-pool-2"
    backend.finish_operation(second)
    record = backend.provision_step("run-1", pl, after=second.phase)
    assert record["status"] == "ready" and "pending" not in record
    assert backend.record("run-1")["node_pool"] == node_pool_name("run-1", pl) and len(fake.pools) == 1


class PoolCreationRuns(FakeClusterManager):
    """A node pool's creation runs for ``polls`` reads of its operation; meanwhile GKE refuses
    any other operation on the cluster, as it does."""

    def __init__(self, polls: int):
        super().__init__()
        self.polls, self.reads = polls, 0

    def create_node_pool(self, *, parent, node_pool):
        from google.cloud.container_v1 import types

        super().create_node_pool(parent=parent, node_pool=node_pool)
        return types.Operation(name="op-pool", status=types.Operation.Status.RUNNING)

    def _running(self) -> bool:
        return "create_node_pool" in self.calls and self.reads < self.polls

    def get_operation(self, *, name):
        from google.cloud.container_v1 import types

        if name.endswith("/op-pool"):
            self.reads += 1
            status = types.Operation.Status
            return types.Operation(name="op-pool", status=status.RUNNING if self._running() else status.DONE)
        return super().get_operation(name=name)

    def delete_node_pool(self, *, name):
        from google.api_core.exceptions import FailedPrecondition

        if self._running():
            self.calls.append("delete_node_pool refused")
            raise FailedPrecondition("Cluster is running incompatible operation op-pool.")
        return super().delete_node_pool(name=name)


@pytest.mark.gcs
def test_teardown_during_a_pool_creation_waits_for_it_then_deletes_the_pool(gke_settings):
    """A run cancelled while its pool is being created (the provision task deferred on it)."""
    fake = PoolCreationRuns(polls=3)
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    pl = _placement("T4", 1, 1)
    pending = backend.provision_step("run-1", pl)
    assert isinstance(pending, PendingOperation) and pending.phase == "pool"
    assert backend.teardown("run-1") is True
    assert fake.pools == {} and "delete_node_pool refused" not in fake.calls
    assert backend.record("run-1") is None


def test_gke_run_with_local_buckets_is_rejected_at_validate(ctx, demo_dataset):
    from sailor_tasks import stages
    from sailor_tasks.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="backend=.gke.*SAILOR_BUCKET_TEMPLATE=gs://"):
        stages.validate({"backend": "gke", "dataset_uri": demo_dataset}, "manual__r1", ctx)
    (run,) = ctx.ledger.list_runs()
    assert run["status"] == "rejected" and ctx.ledger.live_reservations() == []


@pytest.mark.gcs
def test_every_attempt_gets_a_pool_of_its_placement_and_teardown_deletes_them_all(gke_settings):
    """A recovery to another zone, GPU or market (or region) must not reuse the preempted Spot pool:
    each placement gets its own pool, and teardown deletes every pool the run created."""
    fake = FakeClusterManager()
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    spot = _placement("A100", 4, 1)
    backend.provision("run-1", spot)
    offers = [o for o in load_catalog().offers if o.region == spot.region and o.gpu_type == "A100"]
    other_zone = next((o.zone for o in offers if o.zone != spot.zone), None)
    moves = [dataclasses.replace(spot, market="on_demand")]  # same zone, on-demand
    if other_zone:
        moves.append(dataclasses.replace(spot, zone=other_zone))  # same region, another zone
    l4 = _placement("L4", 1, 1)
    moves.append(l4)  # another GPU (and region)
    for placement in moves:
        record = backend.provision("run-1", placement)
        assert record["node_pool_state"] == "created"
        pool = fake.pools[record["node_pool_path"]]
        assert list(pool.locations) == [placement.zone]
        assert pool.config.machine_type == placement.instance_type
        assert pool.config.spot is (placement.market == "spot")
        assert pool.config.accelerators[0].accelerator_type == accelerator_type(placement.gpu_type)
    assert len(fake.pools) == 1 + len(moves)
    assert len(backend.record("run-1")["pools"]) == 1 + len(moves)
    # A retry of the last attempt finds its pool instead of making another one.
    assert backend.provision("run-1", l4)["node_pool_state"] == "exists" and len(fake.pools) == 1 + len(moves)
    backend.provision("run-2", spot)  # another run's pool stays
    assert backend.teardown("run-1") is True
    assert [p.name for p in fake.pools.values()] == [node_pool_name("run-2", spot)]
    assert fake.calls.count("delete_node_pool") == 1 + len(moves)
    assert backend.record("run-1") is None and backend.teardown("run-1") is False


# --- the run's own code, the grace window, the notice -------------------------------------------


def test_pods_run_the_runs_image_and_command_under_torchrun_with_the_contract_env():
    from sailor_tasks.runtime import contract

    launch = _launch(_placement("H100", 8, 2), image="europe-docker.pkg.dev/acme/ml/train:1.2")
    train = _train(launch, command=("python", "/app/train.py", "--lr", "0.1"), env={"MY_FLAG": "on"})
    pods = build_training_pods(CONFIG, launch, train)
    for rank, pod in enumerate(pods):
        manifest, _ = _kpo_render(pod, launch)
        kubernetes_validate.validate(manifest, K8S, strict=True)
        (container,) = manifest["spec"]["containers"]
        assert container["image"] == "europe-docker.pkg.dev/acme/ml/train:1.2"
        cmd = container["command"]
        assert cmd[:3] == ["python", "-m", "torch.distributed.run"] and f"--node-rank={rank}" in cmd
        assert cmd[cmd.index("--no-python") + 1 :] == ["python", "/app/train.py", "--lr", "0.1"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["MY_FLAG"] == "on"
        assert env[contract.RUN_ID] == launch.run_id and env[contract.ATTEMPT] == "1"
        assert (
            env[contract.DATA_DIR] == train.data_uri and env[contract.CHECKPOINT_DIR] == train.checkpoint_uri
        )
        assert (env[contract.TOTAL_STEPS], env[contract.SEED]) == ("50", "7")
        assert env[contract.NOTICE_FILE] == "/var/run/sailor/notice.json"
        grace = str(manifest["spec"]["terminationGracePeriodSeconds"])
        assert env["SAILOR_PREEMPTION_NOTICE_S"] == env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == grace
    # Empty command: the built-in trainer in SAILOR's image.
    built_in = _launch(_placement("H100", 8, 1))
    (pod,) = build_training_pods(CONFIG, built_in, _train(built_in))
    (container,) = pod.spec.containers
    assert container.image == CONFIG.image_for(built_in.placement.region)
    assert container.command[-4:] == ["-m", "sailor_tasks.train", "--config", built_in.config_uri]


def test_the_prestop_hook_writes_the_notice_file_with_the_real_window(tmp_path):
    """The kubelet runs the preStop hook before SIGTERM: it writes the run contract's notice file
    (deadline = now + the pod's grace period), which the trainer and runtime.Run read."""
    import time

    from sailor_tasks.backends.gke import NOTICE_PATH
    from sailor_tasks.runtime.contract import read_notice

    launch = _launch(_placement("A100", 4, 1))
    (pod,) = build_training_pods(CONFIG, launch, _train(launch), grace_s=42)
    assert pod.spec.termination_grace_period_seconds == 42
    argv = pod.spec.containers[0].lifecycle.pre_stop._exec.command
    assert argv[:2] == ["/bin/sh", "-c"]
    path = str(tmp_path / "notice.json")
    before = time.time()
    subprocess.run([*argv[:2], argv[2].replace(NOTICE_PATH, path)], check=True, timeout=10)
    notice = read_notice(path)
    assert notice is not None and notice.notice_s == 42 and notice.reason == "preemption"
    assert before + 41 <= notice.deadline <= time.time() + 43
    mounts = {m.mount_path for m in pod.spec.containers[0].volume_mounts}
    assert "/var/run/sailor" in mounts


def test_spot_pools_ask_for_the_extended_shutdown_period_where_the_cluster_supports_it():
    from sailor_tasks.backends.gke import configured_grace_s, supports_extended_grace

    pl = _placement("A100", 4, 1)
    kubelet = validate_node_pool_body(build_node_pool_body(CONFIG, "run-1", pl)).config.kubelet_config
    assert (kubelet.shutdown_grace_period_seconds, kubelet.shutdown_grace_period_critical_pods_seconds) == (
        120,
        15,
    )
    assert CONFIG.pod_grace_s() == configured_grace_s(CONFIG) == 105 >= 15
    old = validate_node_pool_body(build_node_pool_body(CONFIG, "run-1", pl, extended_grace=False))
    assert "kubelet_config" not in old.config and CONFIG.pod_grace_s(extended=False) == 15
    on_demand = build_node_pool_body(CONFIG, "run-1", dataclasses.replace(pl, market="on_demand"))
    assert "kubelet_config" not in on_demand["config"]  # the field is valid for Spot VMs only
    short = GkeConfig(project="p", spot_shutdown_s=30)
    assert (
        "kubelet_config" not in build_node_pool_body(short, "run-1", pl)["config"]
        and short.pod_grace_s() == 15
    )
    assert configured_grace_s(environ={"SAILOR_GKE_SPOT_SHUTDOWN_S": "30"}) == 15
    assert supports_extended_grace("1.35.0-gke.1171000") and supports_extended_grace("1.36.2-gke.100")
    assert not supports_extended_grace("1.35.0-gke.1170999") and not supports_extended_grace(
        "1.34.9-gke.9999999"
    )
    assert not supports_extended_grace("")
    with pytest.raises(ValueError, match="SAILOR_GKE_SPOT_SHUTDOWN_S=60.*valid: 30, 120"):
        GkeConfig(project="p", spot_shutdown_s=60)
    with pytest.raises(ValueError, match="SAILOR_GKE_SPOT_SHUTDOWN_S='2m' is not a whole number"):
        configured_grace_s(environ={"SAILOR_GKE_SPOT_SHUTDOWN_S": "2m"})


@pytest.mark.gcs
def test_the_pods_grace_is_what_the_pool_got_on_its_clusters_version(gke_settings):
    pl = _placement("A100", 4, 1)
    for version, grace, extended in (("1.35.1-gke.1396000", 105, True), ("1.33.5-gke.1000", 15, False)):
        fake = FakeClusterManager(version=version)
        backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
        key = f"run-{grace}"
        record = backend.provision(key, pl)
        assert record["grace_s"] == grace and record["pools"][0]["extended_grace"] is extended
        (pool,) = fake.pools.values()
        assert ("kubelet_config" in pool.config) is extended
        launch = dataclasses.replace(_launch(pl), run_key=key)
        pods, _ = backend.launch_manifests(launch, _train(launch))
        assert pods[0].spec.termination_grace_period_seconds == grace
        env = {e.name: e.value for e in pods[0].spec.containers[0].env}
        assert env["SAILOR_PREEMPTION_NOTICE_S"] == str(grace)


# --- how a pod ended ----------------------------------------------------------------------------


def _ended_pod(code=None, reason=None, message=None, conditions=(), node="gke-node-1", container_reason=None):
    from kubernetes.client import models as k8s

    state = k8s.V1ContainerState(
        terminated=k8s.V1ContainerStateTerminated(exit_code=code, reason=container_reason)
        if code is not None
        else None
    )
    status = k8s.V1ContainerStatus(
        name=CONTAINER_NAME, image="i", image_id="", ready=False, restart_count=0, state=state
    )
    return k8s.V1Pod(
        spec=k8s.V1PodSpec(containers=[], node_name=node),
        status=k8s.V1PodStatus(
            phase="Failed",
            reason=reason,
            message=message,
            conditions=[k8s.V1PodCondition(type=t, status="True", reason=r) for t, r in conditions],
            container_statuses=[status],
        ),
    )


def _node(taints=(), ready="True"):
    from kubernetes.client import models as k8s

    return k8s.V1Node(
        spec=k8s.V1NodeSpec(taints=[k8s.V1Taint(key=k, effect="NoSchedule") for k in taints]),
        status=k8s.V1NodeStatus(conditions=[k8s.V1NodeCondition(type="Ready", status=ready)]),
    )


@pytest.mark.parametrize(
    ("pod", "node", "spot", "node_gone", "outcome", "noticed"),
    [
        (_ended_pod(0), _node(), True, False, "completed", True),
        (
            _ended_pod(1, "Terminated", "Pod was terminated in response to imminent node shutdown."),
            _node(),
            True,
            False,
            "preempted",
            True,
        ),
        (
            _ended_pod(143, conditions=[("DisruptionTarget", "TerminationByKubelet")]),
            _node(),
            True,
            False,
            "preempted",
            True,
        ),
        (  # the pod garbage collector deletes the pods of a node already gone: no notice
            _ended_pod(137, conditions=[("DisruptionTarget", "DeletionByPodGC")]),
            None,
            True,
            True,
            "preempted",
            False,
        ),
        (None, None, True, False, "preempted", False),  # the pod went with its node
        (_ended_pod(137), None, True, True, "preempted", False),  # node deleted
        (
            _ended_pod(1),
            _node(taints=["cloud.google.com/impending-node-termination"]),
            True,
            False,
            "preempted",
            False,
        ),
        (_ended_pod(1), _node(ready="Unknown"), False, False, "preempted", False),
        # The autoscaler removes only a node whose pods ended: the command's own exit decides.
        (_ended_pod(1), _node(taints=["ToBeDeletedByClusterAutoscaler"]), False, False, "failed", True),
        (_ended_pod(1), _node(taints=["ToBeDeletedByClusterAutoscaler"]), True, False, "failed", True),
        (_ended_pod(1), None, False, True, "failed", True),  # an on-demand node gone after a traceback
        (_ended_pod(1), None, True, True, "preempted", False),  # a Spot node gone: reclaimed
        (
            _ended_pod(137),
            _node(),
            True,
            False,
            "preempted",
            False,
        ),  # killed by a signal on Spot: unexplained
        (_ended_pod(None), _node(), True, False, "preempted", False),  # no exit status on Spot
        (_ended_pod(137), _node(), False, False, "failed", True),  # on-demand: a kill is the run's own
        (_ended_pod(1), _node(), True, False, "failed", True),  # a traceback is a failure, even on Spot
        (_ended_pod(3), _node(), False, False, "failed", True),
        # evicted for its node's pressure (the kubelet's DisruptionTarget too), or out of memory:
        # the run's own need, not a preemption to move it for, on Spot too
        (
            _ended_pod(
                137,
                "Evicted",
                "The node was low on resource: memory.",
                conditions=[("DisruptionTarget", "TerminationByKubelet")],
            ),
            _node(),
            True,
            False,
            "failed",
            True,
        ),
        (_ended_pod(137, container_reason="OOMKilled"), _node(), True, False, "failed", True),
    ],
)
def test_a_pods_end_is_judged_by_the_pod_and_its_node(pod, node, spot, node_gone, outcome, noticed):
    from sailor_tasks.backends.gke import classify_pod_end

    end = classify_pod_end(pod, node, spot=spot, node_gone=node_gone)
    assert end.outcome == outcome, end
    if outcome == "preempted":
        assert end.noticed is noticed and end.reason


def test_render_shows_the_runs_own_image_command_and_env(settings):
    """``sailor render`` (render_run) builds the pods as the operator submits them, validated by
    kubernetes-validate: the run's image and command, its env and the contract's, the grace."""
    from sailor_tasks.airflow_glue.gcp import render_run

    params = {
        "num_workers": 2,
        "gpu_type": "L4",
        "market": "spot",
        "image": "us-docker.pkg.dev/acme/ml/train@sha256:" + "a" * 64,
        "command": ["/app/run-training", "--epochs", "3"],
        "env": {"WANDB_MODE": "offline"},
    }
    out = render_run(params, settings)
    pods = [m for m in out["manifests"] if m["kind"] == "Pod"]
    assert len(pods) == out["placement"]["num_nodes"] and out["grace_s"] == 105
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["image"] == params["image"]
        assert container["command"][-4:] == ["--no-python", "/app/run-training", "--epochs", "3"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["WANDB_MODE"] == "offline" and env["SAILOR_DATA_DIR"].startswith("gs://")
        assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "/bin/sh"
        assert pod["spec"]["terminationGracePeriodSeconds"] == 105
    kubelet = out["node_pool"]["node_pool"]["config"]["kubelet_config"]
    assert kubelet["shutdown_grace_period_seconds"] == 120


# A node pool whose creation has already failed when ``create_node_pool`` returns (a stockout: GKE
# answers with a DONE operation carrying the error, and may keep the pool in ERROR) is recorded like
# one that fails later: teardown removes it, and a retried provision deletes it and creates it anew.
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"


class PoolFailsAtOnce(InMemoryClusterManager):
    def __init__(self):
        super().__init__()
        self.failed = False

    def _failed_op(self):
        from google.cloud.container_v1 import types

        return types.Operation(
            name="op-pool",
            status=types.Operation.Status.DONE,
            location="us-central1",
            error={"message": STOCKOUT},
        )

    def create_node_pool(self, *, parent, node_pool):
        super().create_node_pool(parent=parent, node_pool=node_pool)  # kept by GKE, in ERROR
        if not self.failed:
            self.failed = True
            return self._failed_op()
        return self._op()

    def get_operation(self, *, name):
        return self._failed_op() if name.endswith("/op-pool") else self._op()


def test_a_pool_whose_creation_failed_at_once_is_torn_down(gke_settings):
    fake = PoolFailsAtOnce()
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    with pytest.raises(RuntimeError, match=STOCKOUT):
        backend.provision("run-1", _placement("T4", 1, 1))
    backend.teardown("run-1")
    assert fake.pools == {}


def test_a_retry_deletes_the_pool_whose_creation_failed_and_creates_it_anew(gke_settings):
    fake = PoolFailsAtOnce()
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    pl = _placement("T4", 1, 1)
    with pytest.raises(RuntimeError, match=STOCKOUT):
        backend.provision("run-1", pl)
    record = backend.provision("run-1", pl)  # Airflow's retry
    assert record["status"] == "ready"
    calls = [c for c in fake.calls if c != "get_cluster"]
    assert calls == ["create_cluster", "create_node_pool", "delete_node_pool", "create_node_pool"]
    assert len(fake.pools) == 1


class FailedPoolDeletionRuns(PoolFailsAtOnce):
    """The deletion of the pool whose creation failed runs for ``polls`` reads of its operation;
    meanwhile GKE refuses any other operation on the cluster."""

    def __init__(self, polls: int):
        super().__init__()
        self.polls, self.reads, self.deleting = polls, 0, None

    def delete_node_pool(self, *, name):
        from google.api_core.exceptions import FailedPrecondition
        from google.cloud.container_v1 import types

        if self.deleting is None:
            self.calls.append("delete_node_pool")
            self.deleting = name
            return types.Operation(name="op-delete", status=types.Operation.Status.RUNNING)
        if self.reads < self.polls:
            self.calls.append("delete_node_pool refused")
            raise FailedPrecondition("Cluster is running incompatible operation op-delete.")
        return super().delete_node_pool(name=name)

    def get_operation(self, *, name):
        from google.cloud.container_v1 import types

        if name.endswith("/op-delete"):
            self.reads += 1
            if self.reads < self.polls:
                return types.Operation(name="op-delete", status=types.Operation.Status.RUNNING)
            self.pools.pop(self.deleting, None)
            return types.Operation(name="op-delete", status=types.Operation.Status.DONE)
        return super().get_operation(name=name)


def test_teardown_during_the_deletion_of_a_failed_pool_waits_for_it(gke_settings):
    """A run cancelled while a retried provision deletes the pool its failed creation left: GKE
    refuses a second deletion until the first ends, so teardown waits for it."""
    fake = FailedPoolDeletionRuns(polls=3)
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    pl = _placement("T4", 1, 1)
    with pytest.raises(RuntimeError, match=STOCKOUT):
        backend.provision("run-1", pl)
    pending = backend.provision_step("run-1", pl)  # Airflow's retry, deferred on the deletion
    assert isinstance(pending, PendingOperation) and pending.phase == "cluster"
    assert backend.teardown("run-1") is True
    assert fake.pools == {} and "delete_node_pool refused" not in fake.calls
    assert backend.record("run-1") is None


def test_an_aborted_request_is_not_taken_for_one_that_found_the_resource_there():
    from google.api_core import exceptions

    from sailor_tasks.backends.gke import _is_already_exists

    assert _is_already_exists(exceptions.AlreadyExists("pool"))
    assert _is_already_exists(exceptions.Conflict("409 over REST"))
    assert not _is_already_exists(exceptions.Aborted("the operation was aborted"))


@pytest.mark.gcs
def test_a_retry_recreates_a_pool_gke_took_and_left_in_error(gke_settings):
    """The first try's create_node_pool timed out after GKE took it, and the creation then failed
    (a stockout): the retry finds the pool in ERROR, deletes it and creates it again, instead of
    reusing a pool that never gets nodes."""
    from google.api_core.exceptions import DeadlineExceeded
    from google.cloud.container_v1 import types

    from sailor_tasks.testing.gke_fake import InMemoryClusterManager

    class TimesOutOnce(InMemoryClusterManager):
        first = True

        def create_node_pool(self, *, parent, node_pool):
            op = super().create_node_pool(parent=parent, node_pool=node_pool)
            if self.first:
                self.first = False
                node_pool.status = types.NodePool.Status.ERROR
                node_pool.status_message = "ZONE_RESOURCE_POOL_EXHAUSTED"
                raise DeadlineExceeded("create_node_pool timed out")
            return op

    pl = _placement("T4", 1, 1)
    fake = TimesOutOnce()
    backend = GkeBackend(gke_settings, config=CONFIG, client=fake, poll_s=0)
    with pytest.raises(DeadlineExceeded):
        backend.provision("run-1", pl)
    record = backend.provision("run-1", pl)  # Airflow's retry
    assert record["status"] == "ready" and record["node_pool_state"] == "created"
    pool_calls = [c for c in fake.calls if c.endswith("node_pool")]
    assert pool_calls == ["create_node_pool", "create_node_pool", "delete_node_pool", "create_node_pool"]
    assert all(types.NodePool.Status(p.status).name != "ERROR" for p in fake.pools.values())
