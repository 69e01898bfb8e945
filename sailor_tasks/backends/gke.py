"""The GKE backend: a GKE cluster per region, a GPU node pool per run, training pods on that pool.

Every request Google or Kubernetes receives is built by a pure function of this module
(``build_cluster_body``, ``build_node_pool_body``, ``build_training_pods``,
``build_rendezvous_service``), so it can be rendered and validated offline (``sailor render``).
Calls go through the ``ClusterManager`` protocol (the subset of
``google.cloud.container_v1.ClusterManagerClient`` SAILOR uses); creating what already exists is
success, so a retried ``provision`` reuses the cluster and the pool. Pods are submitted by a pod
runner the orchestrator's glue installs (``sailor_tasks.airflow_glue.gcp``: GKEStartPodOperator); this
module never imports Airflow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sailor_tasks import gcp_auth, paths, storage
from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.model import Placement, to_dict
from sailor_tasks.settings import SOURCE_BUCKET, Settings

if TYPE_CHECKING:
    from kubernetes.client import V1Pod, V1Service

logger = logging.getLogger(__name__)

ACCELERATOR_TYPES: Mapping[str, str] = {
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "B200": "nvidia-b200",
    "H100": "nvidia-h100-80gb",
    "H100-MEGA": "nvidia-h100-mega-80gb",
    "H200": "nvidia-h200-141gb",
    "L4": "nvidia-l4",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
}
"""Catalog GPU type → GKE accelerator type (``gcloud container node-pools create --accelerator type=``)."""

PREEMPTION_NOTICE_S = 30
"""Seconds between a spot VM's preemption notice and its hard stop on Compute Engine
(cloud.google.com/compute/docs/instances/spot, "Preemption process"); the pods' grace period."""

RENDEZVOUS_PORT = 29500
"""torchrun's static rendezvous (TCPStore) port on node rank 0."""

TEARDOWN_MODES = ("delete", "scale_to_zero")
GCS_BUCKET_TEMPLATE = "gs://{project}-sailor-{bucket}"
"""Suggested ``SAILOR_BUCKET_TEMPLATE`` on GCP: one bucket per region (and ``source``) per project."""
CONTAINER_NAME = "base"
"""The training container's name: KubernetesPodOperator follows the logs of the container called ``base``."""
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NO_SCHEDULE"}
LABEL_PREFIX = "sailor.dev"
_OPERATION_TIMEOUT_S = 30 * 60  # GKE cluster creation takes 5-10 min; GPU pools a few minutes


def _label_value(value: str) -> str:
    """A Kubernetes/GCE label value: at most 63 of [a-z0-9-_.], starting and ending alphanumeric."""
    value = re.sub(r"[^a-z0-9._-]", "-", value.lower())[:63]
    return value.strip("-_.") or "x"


@dataclass(frozen=True, slots=True)
class GkeConfig:
    """Where and how SAILOR uses GKE. ``from_env`` reads the ``SAILOR_GKE_*`` variables."""

    project: str
    """GCP project of the clusters (``SAILOR_GCP_PROJECT``)."""
    cluster_template: str = "sailor-{region}"
    """Name of the region's cluster; one regional cluster per region is created or reused."""
    namespace: str = "sailor"
    """Kubernetes namespace of the training pods."""
    image: str = ""
    """Training image (docker/train.Dockerfile); default ``{region}-docker.pkg.dev/{project}/sailor/sailor-train:0.1.0``."""
    service_account: str = "sailor-train"
    """Kubernetes service account of the pods, bound to a GCP service account by workload identity."""
    teardown: str = "delete"
    """``delete`` the run's node pool, or ``scale_to_zero`` it (keeps the pool for a quick restart)."""
    gcp_conn_id: str = "google_cloud_default"
    """Airflow connection with the credentials (``SAILOR_GCP_CONN_ID``)."""
    system_machine_type: str = "e2-standard-4"
    """Machine type of the cluster's small CPU pool (system pods, no GPU)."""
    boot_disk_gb: int = 200
    """Boot disk of a GPU node (image + dataset cache)."""
    max_extra_nodes: int = 0
    """Autoscaling headroom above the placement's node count (0: exactly the placement)."""

    def __post_init__(self) -> None:
        if self.teardown not in TEARDOWN_MODES:
            raise ValueError(
                f"SAILOR_GKE_TEARDOWN={self.teardown!r} is not a teardown mode; valid: {', '.join(TEARDOWN_MODES)}"
            )
        if not self.project:
            raise ValueError("SAILOR_GCP_PROJECT is empty; set it to the GCP project of the GKE clusters")

    @classmethod
    def from_env(cls, settings: Settings, environ: Mapping[str, str] | None = None) -> GkeConfig:
        env = os.environ if environ is None else environ
        return cls(
            project=settings.gcp_project,
            cluster_template=env.get("SAILOR_GKE_CLUSTER_TEMPLATE", "sailor-{region}"),
            namespace=env.get("SAILOR_GKE_NAMESPACE", "sailor"),
            image=env.get("SAILOR_GKE_IMAGE", ""),
            service_account=env.get("SAILOR_GKE_SERVICE_ACCOUNT", "sailor-train"),
            teardown=env.get("SAILOR_GKE_TEARDOWN", "delete"),
            gcp_conn_id=env.get("SAILOR_GCP_CONN_ID", "google_cloud_default"),
        )

    def cluster_name(self, region: str) -> str:
        return self.cluster_template.format(region=region, project=self.project)

    def image_for(self, region: str) -> str:
        return self.image or f"{region}-docker.pkg.dev/{self.project}/sailor/sailor-train:0.1.0"

    def cluster_path(self, region: str) -> str:
        return f"projects/{self.project}/locations/{region}/clusters/{self.cluster_name(region)}"


def accelerator_type(gpu_type: str) -> str:
    """GKE accelerator type of a catalog GPU type; the ValueError lists the known types."""
    try:
        return ACCELERATOR_TYPES[gpu_type]
    except KeyError:
        raise ValueError(
            f"gpu_type={gpu_type!r} has no GKE accelerator type; valid: {', '.join(ACCELERATOR_TYPES)}"
        ) from None


def node_pool_name(run_key: str) -> str:
    """The run's node pool: stable per run (a retry finds it), at most 40 characters."""
    return f"sailor-{hashlib.sha256(run_key.encode()).hexdigest()[:12]}"


def plan_hash(placement: Placement) -> str:
    """Short hash of the placement, labelled on every resource of the run (detects a re-plan)."""
    return hashlib.sha256(json.dumps(to_dict(placement), sort_keys=True).encode()).hexdigest()[:12]


# --- Google: cluster and node pool bodies ---------------------------------------------------------


def build_cluster_body(config: GkeConfig, region: str, system_zone: str | None = None) -> dict[str, Any]:
    """Body of ``ClusterManager.create_cluster`` for the region's cluster (regional, workload identity).

    The cluster holds only a small CPU pool for system pods, in one zone (``system_zone``; else
    every zone of the region, one node each); GPU pools are added per run.
    """
    return {
        "name": config.cluster_name(region),
        "description": f"SAILOR training cluster for {region}",
        "release_channel": {"channel": "REGULAR"},
        "workload_identity_config": {"workload_pool": f"{config.project}.svc.id.goog"},
        "resource_labels": {"managed-by": "sailor", "sailor-region": _label_value(region)},
        "node_pools": [
            {
                "name": "system",
                "initial_node_count": 1,
                "config": {
                    "machine_type": config.system_machine_type,
                    "disk_size_gb": 50,
                    "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                    "workload_metadata_config": {"mode": "GKE_METADATA"},
                },
                "autoscaling": {"enabled": True, "min_node_count": 1, "max_node_count": 2},
                "management": {"auto_repair": True, "auto_upgrade": True},
                **({"locations": [system_zone]} if system_zone else {}),
            }
        ],
    }


def build_node_pool_body(config: GkeConfig, run_key: str, placement: Placement) -> dict[str, Any]:
    """Body of ``ClusterManager.create_node_pool``: the placement's GPU VMs in its zone.

    Spot or on-demand from the placement's market; autoscaling 0..num_nodes (+ headroom) so an idle
    pool costs nothing; GPU (and spot) taints keep other pods off; GKE installs the GPU driver.
    """
    spot = placement.market == "spot"
    return {
        "name": node_pool_name(run_key),
        "initial_node_count": placement.num_nodes,
        "locations": [placement.zone],
        "config": {
            "machine_type": placement.instance_type,
            "spot": spot,
            "disk_size_gb": config.boot_disk_gb,
            "disk_type": "pd-balanced",
            "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
            "workload_metadata_config": {"mode": "GKE_METADATA"},
            "accelerators": [
                {
                    "accelerator_count": placement.gpus_per_node,
                    "accelerator_type": accelerator_type(placement.gpu_type),
                    "gpu_driver_installation_config": {"gpu_driver_version": "DEFAULT"},
                }
            ],
            "labels": {
                f"{LABEL_PREFIX}/run": run_label(run_key),
                f"{LABEL_PREFIX}/plan": plan_hash(placement),
            },
            "resource_labels": {"managed-by": "sailor", "sailor-run": run_label(run_key)},
            "taints": [GPU_TAINT, SPOT_TAINT] if spot else [GPU_TAINT],
        },
        "autoscaling": {
            "enabled": True,
            "min_node_count": 0,
            "max_node_count": placement.num_nodes + config.max_extra_nodes,
            "location_policy": "ANY" if spot else "BALANCED",
        },
        "management": {"auto_repair": True, "auto_upgrade": False},
        "max_pods_constraint": {"max_pods_per_node": 32},
    }


def validate_cluster_body(body: Mapping[str, Any]) -> Any:
    """``container_v1.Cluster(body)``: raises on an unknown field or a wrong type."""
    from google.cloud.container_v1 import types

    return types.Cluster(body)


def validate_node_pool_body(body: Mapping[str, Any]) -> Any:
    from google.cloud.container_v1 import types

    return types.NodePool(body)


# --- Kubernetes: training pods -------------------------------------------------------------------


def run_label(run_key: str) -> str:
    """The run's label value: lowercase and at most 63 characters, so a readable prefix and a hash of
    the exact key, which keeps runs apart that lowercasing or truncation alone would merge."""
    digest = hashlib.sha256(run_key.encode()).hexdigest()[:12]
    return f"{_label_value(run_key[:50])}-{digest}"


def run_labels(run_key: str, placement: Placement) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "sailor-train",
        "app.kubernetes.io/managed-by": "sailor",
        f"{LABEL_PREFIX}/run": run_label(run_key),
        f"{LABEL_PREFIX}/plan": plan_hash(placement),
    }


def run_selector(run_key: str) -> str:
    """Kubernetes label selector of every pod of the run (all attempts)."""
    return f"{LABEL_PREFIX}/run={run_label(run_key)}"


def rendezvous_service_name(run_key: str, attempt: int = 1) -> str:
    """Headless service of an attempt's node 0: one per attempt, so a recovered run never resolves
    to a pod of an earlier attempt."""
    return f"{node_pool_name(run_key)}-a{attempt}-rdzv"


def training_pod_name(run_key: str, attempt: int, node_rank: int) -> str:
    """Stable per (run, attempt, node): a retried task finds its pods, a recovery starts new ones
    beside the earlier attempt's (kept when they failed, for inspection)."""
    return f"{node_pool_name(run_key)}-a{attempt}-node-{node_rank}"


def train_command(launch: TrainLaunch, node_rank: int, namespace: str) -> list[str]:
    """torchrun on one node: all its GPUs; static rendezvous on node 0 when the run spans nodes."""
    pl = launch.placement
    nodes = max(1, pl.num_nodes)
    # The run's workers spread evenly over its nodes, at most one per GPU.
    nproc = max(1, min(pl.gpus_per_node, -(-launch.num_workers // nodes)))
    cmd = ["python", "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if pl.num_nodes <= 1:
        cmd.append("--standalone")
    else:
        host = f"{rendezvous_service_name(launch.run_key, launch.attempt)}.{namespace}.svc.cluster.local"
        cmd += [
            f"--nnodes={pl.num_nodes}",
            f"--node-rank={node_rank}",
            f"--master-addr={host}",
            f"--master-port={RENDEZVOUS_PORT}",
        ]
    return [*cmd, "-m", "sailor_tasks.train", "--config", launch.config_uri]


def build_training_pods(config: GkeConfig, launch: TrainLaunch) -> list[V1Pod]:
    """One pod per node of the placement, each running ``python -m sailor_tasks.train`` under torchrun.

    Pods land only on the run's node pool (nodeSelector) and tolerate its GPU/spot taints; the
    grace period equals the spot preemption notice, so the trainer's SIGTERM handler checkpoints
    before the VM stops. Labels carry the run, plan hash, attempt and node rank; the orchestrator
    adds dag/task/run/try labels and reattaches to a pod that already runs instead of starting a
    second one. Pod (and rendezvous service) names carry the attempt: a recovered run's pods never
    collide with the preempted attempt's.
    """
    from kubernetes.client import models as k8s

    pl = launch.placement
    spot = pl.market == "spot"
    pool = node_pool_name(launch.run_key)
    run_uri = launch.config_uri.rsplit("/", 1)[0]
    tolerations = [k8s.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")]
    node_selector = {"cloud.google.com/gke-nodepool": pool}
    if spot:
        tolerations.append(
            k8s.V1Toleration(
                key="cloud.google.com/gke-spot", operator="Equal", value="true", effect="NoSchedule"
            )
        )
        node_selector["cloud.google.com/gke-spot"] = "true"
    pods = []
    for rank in range(max(1, pl.num_nodes)):
        env = {
            "SAILOR_RUN_ID": launch.run_id,
            "SAILOR_CONFIG_URI": launch.config_uri,
            "SAILOR_CHECKPOINT_URI": paths.checkpoint_uri(run_uri),
            "SAILOR_PREEMPTION_NOTICE_S": str(PREEMPTION_NOTICE_S),
            "SAILOR_NODE_RANK": str(rank),
            "SAILOR_NUM_NODES": str(max(1, pl.num_nodes)),
            "PYTHONUNBUFFERED": "1",
        }
        if pl.num_nodes > 1:
            env["MASTER_ADDR"] = (
                f"{rendezvous_service_name(launch.run_key, launch.attempt)}.{config.namespace}.svc.cluster.local"
            )
            env["MASTER_PORT"] = str(RENDEZVOUS_PORT)
        gpus = str(pl.gpus_per_node)
        container = k8s.V1Container(
            name=CONTAINER_NAME,
            image=config.image_for(pl.region),
            image_pull_policy="IfNotPresent",
            command=train_command(launch, rank, config.namespace),
            env=[k8s.V1EnvVar(name=k, value=v) for k, v in env.items()],
            resources=k8s.V1ResourceRequirements(
                limits={"nvidia.com/gpu": gpus}, requests={"nvidia.com/gpu": gpus}
            ),
            ports=[k8s.V1ContainerPort(container_port=RENDEZVOUS_PORT, name="rdzv")],
            volume_mounts=[k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm")],
        )
        pods.append(
            k8s.V1Pod(
                api_version="v1",
                kind="Pod",
                metadata=k8s.V1ObjectMeta(
                    name=training_pod_name(launch.run_key, launch.attempt, rank),
                    namespace=config.namespace,
                    labels={
                        **run_labels(launch.run_key, pl),
                        f"{LABEL_PREFIX}/attempt": str(launch.attempt),
                        f"{LABEL_PREFIX}/node-rank": str(rank),
                    },
                    annotations={
                        f"{LABEL_PREFIX}/run-id": launch.run_id,
                        f"{LABEL_PREFIX}/config-uri": launch.config_uri,
                    },
                ),
                spec=k8s.V1PodSpec(
                    restart_policy="Never",
                    service_account_name=config.service_account,
                    termination_grace_period_seconds=PREEMPTION_NOTICE_S,
                    node_selector=node_selector,
                    tolerations=tolerations,
                    containers=[container],
                    volumes=[
                        k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory"))
                    ],
                ),
            )
        )
    return pods


def build_rendezvous_service(config: GkeConfig, launch: TrainLaunch) -> V1Service | None:
    """Headless service resolving to node rank 0 (torchrun's master) for multi-node runs; else None."""
    if launch.placement.num_nodes <= 1:
        return None
    from kubernetes.client import models as k8s

    labels = {**run_labels(launch.run_key, launch.placement), f"{LABEL_PREFIX}/attempt": str(launch.attempt)}
    return k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=k8s.V1ObjectMeta(
            name=rendezvous_service_name(launch.run_key, launch.attempt),
            namespace=config.namespace,
            labels=labels,
        ),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={
                f"{LABEL_PREFIX}/run": labels[f"{LABEL_PREFIX}/run"],
                f"{LABEL_PREFIX}/attempt": str(launch.attempt),
                f"{LABEL_PREFIX}/node-rank": "0",
            },
            ports=[k8s.V1ServicePort(name="rdzv", port=RENDEZVOUS_PORT, target_port=RENDEZVOUS_PORT)],
        ),
    )


def container_exit_code(pod: Any, container: str = CONTAINER_NAME) -> int | None:
    """Exit status of a finished pod's training container (75: stopped on a preemption notice after
    saving, as on the local backend); None while it has not terminated."""
    for status in getattr(getattr(pod, "status", None), "container_statuses", None) or ():
        terminated = status.state.terminated if status.state else None
        if status.name == container and terminated is not None:
            return int(terminated.exit_code)
    return None


def serialize(obj: Any) -> Any:
    """A kubernetes client model as the JSON the API server receives (camelCase keys)."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


# --- the backend ---------------------------------------------------------------------------------


def require_gcs_buckets(settings: Settings) -> None:
    """Pods on GKE read data and write checkpoints in region buckets they can reach: ``gs://``."""
    probe = settings.bucket_uri("us-central1")
    if storage.scheme_of(probe) != "gs":
        raise ValueError(
            f"backend='gke' needs gs:// region buckets, but SAILOR_BUCKET_TEMPLATE gives {probe!r}; "
            f"set SAILOR_BUCKET_TEMPLATE={GCS_BUCKET_TEMPLATE} (see docs/gke.md)"
        )


class ClusterManager(Protocol):
    """The calls SAILOR makes on ``google.cloud.container_v1.ClusterManagerClient``."""

    def get_cluster(self, *, name: str) -> Any: ...
    def create_cluster(self, *, parent: str, cluster: Any) -> Any: ...
    def get_node_pool(self, *, name: str) -> Any: ...
    def create_node_pool(self, *, parent: str, node_pool: Any) -> Any: ...
    def set_node_pool_size(self, *, name: str, node_count: int) -> Any: ...
    def set_node_pool_autoscaling(self, *, name: str, autoscaling: Any) -> Any: ...
    def delete_node_pool(self, *, name: str) -> Any: ...
    def get_operation(self, *, name: str) -> Any: ...


PodRunner = Callable[[GkeConfig, TrainLaunch, Sequence[Any], Any], int]
"""Submits the pods (and rendezvous service) of a launch, waits for them, returns the exit status."""

_pod_runner: PodRunner | None = None

PodCanceller = Callable[[GkeConfig, str, str], int]
"""Deletes the pods of a run (config, region, run_key) that still run; returns how many."""

_pod_canceller: PodCanceller | None = None


def set_pod_runner(runner: PodRunner | None, canceller: PodCanceller | None = None) -> None:
    """Installed by the orchestrator's glue (``sailor_tasks.airflow_glue.gcp``): how pods are run
    and how a run's pods are stopped."""
    global _pod_runner, _pod_canceller
    _pod_runner, _pod_canceller = runner, canceller


def _status_name(operation: Any) -> str:
    """``Operation.status`` as a name (``RUNNING``, ``DONE``, ...); proto-plus enums print as numbers."""
    status = getattr(operation, "status", "DONE")
    return getattr(status, "name", str(status))


def _is_already_exists(exc: BaseException) -> bool:
    from google.api_core import exceptions

    return isinstance(exc, exceptions.AlreadyExists | exceptions.Conflict)


def _is_not_found(exc: BaseException) -> bool:
    from google.api_core import exceptions

    return isinstance(exc, exceptions.NotFound)


@dataclass
class GkeBackend:
    """``ClusterBackend`` on GKE. ``client`` defaults to a ``ClusterManagerClient`` with ``gcp_auth`` credentials."""

    settings: Settings
    config: GkeConfig | None = None
    client: ClusterManager | None = None
    pod_runner: PodRunner | None = None
    poll_s: float = 5.0
    name: str = field(default="gke", init=False)

    def __post_init__(self) -> None:
        if self.config is None:
            self.config = GkeConfig.from_env(self.settings)
        require_gcs_buckets(self.settings)

    @property
    def cfg(self) -> GkeConfig:
        assert self.config is not None
        return self.config

    def _client(self) -> ClusterManager:
        if self.client is None:
            from google.cloud import container_v1

            self.client = container_v1.ClusterManagerClient(credentials=gcp_auth.current().credentials)
        return self.client

    def _record_uri(self, run_key: str) -> str:
        return storage.resolve(f"sailor://{SOURCE_BUCKET}/_sailor/clusters/{run_key}.json", self.settings)

    def _wait(self, operation: Any, what: str) -> None:
        """Poll a GKE operation until it is DONE; raise with its error message when it failed."""
        name = getattr(operation, "name", "") or ""
        location = getattr(operation, "location", "") or "-"
        deadline = time.monotonic() + _OPERATION_TIMEOUT_S
        op = operation
        while _status_name(op) not in ("DONE", "ABORTING"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"GKE operation {name} ({what}) not done after {_OPERATION_TIMEOUT_S} s")
            time.sleep(self.poll_s)
            op = self._client().get_operation(
                name=f"projects/{self.cfg.project}/locations/{location}/operations/{name}"
            )
        error = getattr(getattr(op, "error", None), "message", "") or (
            getattr(op, "status_message", "") if _status_name(op) == "ABORTING" else ""
        )
        if error or _status_name(op) == "ABORTING":
            raise RuntimeError(f"GKE operation {name} ({what}) failed: {error or 'aborted'}")

    def ensure_cluster(self, region: str, system_zone: str | None = None) -> str:
        """Create the region's cluster unless it exists; "created" or "exists"."""
        body = build_cluster_body(self.cfg, region, system_zone)
        try:
            self._client().get_cluster(name=self.cfg.cluster_path(region))
            return "exists"
        except Exception as exc:
            if not _is_not_found(exc):
                raise
        logger.info("creating GKE cluster %s in %s (takes several minutes)", body["name"], region)
        try:
            op = self._client().create_cluster(
                parent=f"projects/{self.cfg.project}/locations/{region}", cluster=validate_cluster_body(body)
            )
        except Exception as exc:
            if _is_already_exists(exc):
                logger.info("GKE cluster %s already exists (created concurrently); reusing it", body["name"])
                return "exists"
            raise
        self._wait(op, f"create cluster {body['name']}")
        return "created"

    def provision(self, run_key: str, placement: Placement) -> dict[str, Any]:
        cluster_state = self.ensure_cluster(placement.region, placement.zone)
        body = build_node_pool_body(self.cfg, run_key, placement)
        pool_path = f"{self.cfg.cluster_path(placement.region)}/nodePools/{body['name']}"
        pool_state = "created"
        try:
            op = self._client().create_node_pool(
                parent=self.cfg.cluster_path(placement.region), node_pool=validate_node_pool_body(body)
            )
            self._wait(op, f"create node pool {body['name']}")
        except Exception as exc:
            if not _is_already_exists(exc):
                raise
            pool_state = "exists"
            logger.info("node pool %s already exists; reusing it", body["name"])
            # A pool scaled to zero by an earlier teardown gets its nodes back.
            op = self._client().set_node_pool_size(name=pool_path, node_count=placement.num_nodes)
            self._wait(op, f"resize node pool {body['name']}")
        record = {
            "run_key": run_key,
            "backend": self.name,
            "status": "ready",
            "cluster": self.cfg.cluster_name(placement.region),
            "cluster_state": cluster_state,
            "node_pool": body["name"],
            "node_pool_path": pool_path,
            "node_pool_state": pool_state,
            "placement": to_dict(placement),
        }
        storage.write_json(self._record_uri(run_key), record)
        logger.info(
            "GKE node pool %s (%s) in %s: %dx %s (%s), %s",
            body["name"],
            pool_state,
            placement.zone,
            placement.num_nodes,
            placement.instance_type,
            placement.market,
            cluster_state,
        )
        return record

    def launch_manifests(self, launch: TrainLaunch) -> tuple[list[V1Pod], V1Service | None]:
        return build_training_pods(self.cfg, launch), build_rendezvous_service(self.cfg, launch)

    def train(self, launch: TrainLaunch) -> int:
        runner = self.pod_runner or _pod_runner
        if runner is None:
            raise RuntimeError(
                "backend='gke' submits training pods through Airflow's GKEStartPodOperator; run the "
                "sailor_train DAG (or call sailor_tasks.airflow_glue.gcp.install() first)"
            )
        pods, service = self.launch_manifests(launch)
        return runner(self.cfg, launch, pods, service)

    def cancel(self, run_key: str) -> int:
        """Delete the run's pods that still run, in the region of its node pool (each gets its
        termination grace period: the trainer saves on SIGTERM)."""
        uri = self._record_uri(run_key)
        if not storage.exists(uri):
            return 0
        if _pod_canceller is None:
            logger.warning(
                "run %s: no pod canceller installed (sailor_tasks.airflow_glue.gcp.install()); its pods "
                "were not checked",
                run_key,
            )
            return 0
        region = storage.read_json(uri)["placement"]["region"]
        return _pod_canceller(self.cfg, region, run_key)

    def teardown(self, run_key: str) -> bool:
        uri = self._record_uri(run_key)
        if not storage.exists(uri):
            return False
        record = storage.read_json(uri)
        path = record["node_pool_path"]
        try:
            if self.cfg.teardown == "delete":
                op = self._client().delete_node_pool(name=path)
            else:
                op = self._client().set_node_pool_size(name=path, node_count=0)
            self._wait(op, f"{self.cfg.teardown} node pool {record['node_pool']}")
        except Exception as exc:
            if not _is_not_found(exc):
                raise
            logger.info("node pool %s is already gone", record["node_pool"])
        if self.cfg.teardown == "delete":
            storage.remove(uri)
        else:
            storage.write_json(uri, {**record, "status": "scaled_to_zero"})
        logger.info("GKE node pool %s: %s", record["node_pool"], self.cfg.teardown)
        return True
