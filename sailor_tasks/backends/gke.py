"""The GKE backend: a GKE cluster per region, a GPU node pool per run, training pods on that pool.

Every request Google or Kubernetes receives is built by a pure function of this module
(``build_cluster_body``, ``build_node_pool_body``, ``build_namespace``, ``build_service_account``,
``build_training_pods``, ``build_rendezvous_service``), so it can be rendered and validated offline
(``sailor render``).
Calls go through the ``ClusterManager`` protocol (the subset of
``google.cloud.container_v1.ClusterManagerClient`` SAILOR uses); creating what already exists is
success, so a retried ``provision`` reuses the cluster and the pool. Pods are submitted by a pod
runner the orchestrator's glue installs (``sailor_tasks.airflow_glue.gcp``: GKEStartPodOperator); this
module never imports Airflow.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sailor_tasks import gcp_auth, storage
from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.model import Placement, to_dict
from sailor_tasks.runtime.contract import contract_env
from sailor_tasks.settings import SOURCE_BUCKET, Settings
from sailor_tasks.train.config import TrainConfig

if TYPE_CHECKING:
    from kubernetes.client import V1Namespace, V1Pod, V1Service, V1ServiceAccount

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

SPOT_NOTICE_S = 30
"""Seconds between a Spot VM's preemption notice and its hard stop on Compute Engine
(cloud.google.com/compute/docs/instances/spot, "Preemption process")."""
SHUTDOWN_GRACE_CHOICES = (30, 120)
"""Values of a node pool's ``kubelet_config.shutdown_grace_period_seconds`` (GKE's ``NodeKubeletConfig``:
the node's whole graceful-shutdown period on a Spot VM; 30 is GKE's default, 120 the extended one)."""
CRITICAL_PODS_GRACE_S = 15
"""``shutdown_grace_period_critical_pods_seconds``: the end of the shutdown period kept for critical
system pods (logging, networking); regular pods, the training pods among them, get what comes before."""
EXTENDED_GRACE_MIN_VERSION = (1, 35, 0, 1171000)
"""Oldest GKE control plane (1.35.0-gke.1171000) on which a Standard node pool may extend the Spot
graceful termination period beyond 30 s (GKE docs, "Spot VMs": graceful termination)."""

RENDEZVOUS_PORT = 29500
"""torchrun's static rendezvous (TCPStore) port on node rank 0."""
POD_STARTUP_TIMEOUT_S = 30 * 60
"""How long a training pod may take to start: a fresh GPU node (autoscaler scale-up, image pull,
driver install) takes minutes to be ready."""
RENDEZVOUS_TIMEOUT_S = POD_STARTUP_TIMEOUT_S + 5 * 60
"""How long the nodes of a multi-node run wait for each other in torchrun's rendezvous: longer than
a pod may take to start (the 600 s of torchrun's static rendezvous would fail a run whose last
node starts late)."""

TEARDOWN_MODES = ("delete", "scale_to_zero")
GCS_BUCKET_TEMPLATE = "gs://{project}-sailor-{bucket}"
"""Suggested ``SAILOR_BUCKET_TEMPLATE`` on GCP: one bucket per region (and ``source``) per project."""
CONTAINER_NAME = "base"
"""The training container's name: KubernetesPodOperator follows the logs of the container called ``base``."""
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NO_SCHEDULE"}
LABEL_PREFIX = "sailor.dev"
WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"
"""Annotation of a Kubernetes service account naming the Google service account its pods act as
(GKE Workload Identity)."""
_GOOGLE_SERVICE_ACCOUNT = re.compile(r"^[a-z0-9][a-z0-9-]*@[a-z0-9.-]+\.gserviceaccount\.com$")
_OPERATION_TIMEOUT_S = 30 * 60  # GKE cluster creation takes 5-10 min; GPU pools a few minutes


def _label_value(value: str) -> str:
    """A Kubernetes label value: at most 63 of [a-z0-9-_.], starting and ending alphanumeric."""
    value = re.sub(r"[^a-z0-9._-]", "-", value.lower())[:63]
    return value.strip("-_.") or "x"


def _cloud_label_value(value: str) -> str:
    """A Google Cloud label value (``resource_labels`` of clusters and node pools, put on their
    VMs): at most 63 of [a-z0-9_-]; unlike a Kubernetes label value, no '.'."""
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


@dataclass(frozen=True, slots=True)
class GkeConfig:
    """Where and how SAILOR uses GKE. ``from_env`` reads the ``SAILOR_GKE_*`` variables."""

    project: str
    """GCP project of the clusters (``SAILOR_GCP_PROJECT``)."""
    cluster_template: str = "sailor-{region}"
    """Name of the region's cluster; one regional cluster per region is created or reused."""
    namespace: str = "sailor"
    """Kubernetes namespace of the training pods; it and their service account are created unless
    they exist before an attempt's pods start (``build_namespace``, ``build_service_account``)."""
    image: str = ""
    """Training image (docker/train.Dockerfile); default ``{region}-docker.pkg.dev/{project}/sailor/sailor-train:0.1.0``."""
    service_account: str = "sailor-train"
    """Kubernetes service account of the pods (``SAILOR_GKE_SERVICE_ACCOUNT``), bound to the
    Google service account ``gcp_service_account`` by Workload Identity."""
    gcp_service_account: str = ""
    """Google service account the pods act as (``SAILOR_GKE_GCP_SERVICE_ACCOUNT``); default
    ``sailor-train@{project}.iam.gserviceaccount.com``. The pods' Kubernetes service account is
    annotated with it, and it must grant that account ``roles/iam.workloadIdentityUser`` (the
    member ``workload_identity_member()``)."""
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
    spot_shutdown_s: int = 120
    """Graceful-shutdown period requested for Spot node pools (``SAILOR_GKE_SPOT_SHUTDOWN_S``; one
    of ``SHUTDOWN_GRACE_CHOICES``); training pods get it less ``CRITICAL_PODS_GRACE_S``."""
    operation_poll_s: int = 10
    """Seconds between the triggerer's reads of a running cluster or node-pool operation."""

    def __post_init__(self) -> None:
        if self.spot_shutdown_s not in SHUTDOWN_GRACE_CHOICES:
            raise ValueError(
                f"SAILOR_GKE_SPOT_SHUTDOWN_S={self.spot_shutdown_s!r} is not a GKE Spot shutdown grace "
                f"period; valid: {', '.join(map(str, SHUTDOWN_GRACE_CHOICES))}"
            )
        if self.teardown not in TEARDOWN_MODES:
            raise ValueError(
                f"SAILOR_GKE_TEARDOWN={self.teardown!r} is not a teardown mode; valid: {', '.join(TEARDOWN_MODES)}"
            )
        if not self.project:
            raise ValueError("SAILOR_GCP_PROJECT is empty; set it to the GCP project of the GKE clusters")
        if self.gcp_service_account and not _GOOGLE_SERVICE_ACCOUNT.match(self.gcp_service_account):
            raise ValueError(
                f"SAILOR_GKE_GCP_SERVICE_ACCOUNT={self.gcp_service_account!r} is not a Google service "
                "account's email; set it to NAME@PROJECT.iam.gserviceaccount.com (or unset it for "
                f"sailor-train@{self.project}.iam.gserviceaccount.com)"
            )

    @classmethod
    def from_env(cls, settings: Settings, environ: Mapping[str, str] | None = None) -> GkeConfig:
        env = os.environ if environ is None else environ
        return cls(
            project=settings.gcp_project,
            cluster_template=env.get("SAILOR_GKE_CLUSTER_TEMPLATE", "sailor-{region}"),
            namespace=env.get("SAILOR_GKE_NAMESPACE", "sailor"),
            image=env.get("SAILOR_GKE_IMAGE", ""),
            service_account=env.get("SAILOR_GKE_SERVICE_ACCOUNT", "sailor-train"),
            gcp_service_account=env.get("SAILOR_GKE_GCP_SERVICE_ACCOUNT", ""),
            teardown=env.get("SAILOR_GKE_TEARDOWN", "delete"),
            gcp_conn_id=env.get("SAILOR_GCP_CONN_ID", "google_cloud_default"),
            spot_shutdown_s=_int_env(env, "SAILOR_GKE_SPOT_SHUTDOWN_S", 120),
        )

    def pod_grace_s(self, extended: bool = True) -> int:
        """Seconds a training pod gets between SIGTERM and SIGKILL when its Spot node shuts down:
        the node pool's shutdown period less the part kept for critical pods (GKE's default pool:
        30 - 15 = 15 s; extended: 120 - 15 = 105 s). ``extended``: the cluster supports the
        extended period (``supports_extended_grace``)."""
        total = self.spot_shutdown_s if extended else SHUTDOWN_GRACE_CHOICES[0]
        return total - CRITICAL_PODS_GRACE_S

    def cluster_name(self, region: str) -> str:
        return self.cluster_template.format(region=region, project=self.project)

    def image_for(self, region: str) -> str:
        return self.image or f"{region}-docker.pkg.dev/{self.project}/sailor/sailor-train:0.1.0"

    def cluster_path(self, region: str) -> str:
        return f"projects/{self.project}/locations/{region}/clusters/{self.cluster_name(region)}"

    def gcp_service_account_email(self) -> str:
        """The Google service account the training pods act as."""
        return self.gcp_service_account or f"sailor-train@{self.project}.iam.gserviceaccount.com"

    def workload_identity_member(self) -> str:
        """The IAM principal of the pods' Kubernetes service account in the clusters' workload
        pool (``build_cluster_body``): the member the Google service account grants
        ``roles/iam.workloadIdentityUser``."""
        return f"serviceAccount:{self.project}.svc.id.goog[{self.namespace}/{self.service_account}]"


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number of seconds") from None


def configured_grace_s(config: GkeConfig | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The preemption window SAILOR configures for training pods on a Spot node pool of a cluster
    that supports the extended period: what ``terminationGracePeriodSeconds`` and the notice file's
    deadline say (``SAILOR_GKE_SPOT_SHUTDOWN_S`` less ``CRITICAL_PODS_GRACE_S``)."""
    if config is None:
        env = os.environ if environ is None else environ
        config = GkeConfig(project="-", spot_shutdown_s=_int_env(env, "SAILOR_GKE_SPOT_SHUTDOWN_S", 120))
    return config.pod_grace_s(extended=True)


def supports_extended_grace(version: str) -> bool:
    """Whether a GKE control plane version (``1.35.1-gke.1200000``) lets a Standard node pool extend
    the Spot graceful termination period; an unreadable or empty version does not."""
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)(?:-gke\.(\d+))?", version or "")
    if not m:
        return False
    return tuple(int(g or 0) for g in m.groups()) >= EXTENDED_GRACE_MIN_VERSION


def accelerator_type(gpu_type: str) -> str:
    """GKE accelerator type of a catalog GPU type; the ValueError lists the known types."""
    try:
        return ACCELERATOR_TYPES[gpu_type]
    except KeyError:
        raise ValueError(
            f"gpu_type={gpu_type!r} has no GKE accelerator type; valid: {', '.join(ACCELERATOR_TYPES)}"
        ) from None


def run_prefix(run_key: str) -> str:
    """Short name of the run in Kubernetes object names (pods, services): ``sailor-<hash>``."""
    return f"sailor-{hashlib.sha256(run_key.encode()).hexdigest()[:12]}"


def pool_spec(placement: Placement) -> dict[str, Any]:
    """What a node pool is made of: a pool serves a placement when all of these match."""
    return {
        "region": placement.region,
        "zone": placement.zone,
        "instance_type": placement.instance_type,
        "gpu_type": placement.gpu_type,
        "gpus_per_node": placement.gpus_per_node,
        "market": placement.market,
    }


def node_pool_name(run_key: str, placement: Placement) -> str:
    """The node pool of a run's placement: the run and a hash of ``pool_spec``, so a retry finds
    the same pool and a recovery to another zone, machine, GPU or market gets a new one (at most
    40 characters, GKE's limit)."""
    spec = hashlib.sha256(json.dumps(pool_spec(placement), sort_keys=True).encode()).hexdigest()[:8]
    return f"{run_prefix(run_key)}-{spec}"


HYPERDISK_ONLY_SERIES = ("a3-ultragpu-", "a4-", "a4x-")
"""Machine series whose VMs take no Persistent Disk (Compute Engine's accelerator-optimized family:
A3 Ultra, A4 and A4X boot from Hyperdisk)."""


def boot_disk_type(machine_type: str) -> str:
    """The node pool's boot disk type: ``hyperdisk-balanced`` on series without Persistent Disk,
    else ``pd-balanced``."""
    return "hyperdisk-balanced" if machine_type.startswith(HYPERDISK_ONLY_SERIES) else "pd-balanced"


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
        "resource_labels": {"managed-by": "sailor", "sailor-region": _cloud_label_value(region)},
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


def build_node_pool_body(
    config: GkeConfig, run_key: str, placement: Placement, *, extended_grace: bool = True
) -> dict[str, Any]:
    """Body of ``ClusterManager.create_node_pool``: the placement's GPU VMs in its zone.

    Spot or on-demand from the placement's market; autoscaling 0..num_nodes (+ headroom) so an idle
    pool costs nothing; GPU (and spot) taints keep other pods off; GKE installs the GPU driver.
    A Spot pool on a cluster that supports it (``extended_grace``) asks for the configured
    graceful-shutdown period in its node system config (``kubelet_config``), so the training pods
    get ``config.pod_grace_s()`` seconds to save on a preemption instead of GKE's default 15.
    """
    spot = placement.market == "spot"
    kubelet = (
        {
            "kubelet_config": {
                "shutdown_grace_period_seconds": config.spot_shutdown_s,
                "shutdown_grace_period_critical_pods_seconds": CRITICAL_PODS_GRACE_S,
            }
        }
        if spot and extended_grace and config.spot_shutdown_s != SHUTDOWN_GRACE_CHOICES[0]
        else {}
    )
    return {
        "name": node_pool_name(run_key, placement),
        "initial_node_count": placement.num_nodes,
        "locations": [placement.zone],
        "config": {
            "machine_type": placement.instance_type,
            "spot": spot,
            "disk_size_gb": config.boot_disk_gb,
            "disk_type": boot_disk_type(placement.instance_type),
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
            "resource_labels": {"managed-by": "sailor", "sailor-run": _cloud_label_value(run_label(run_key))},
            "taints": [GPU_TAINT, SPOT_TAINT] if spot else [GPU_TAINT],
            **kubelet,
        },
        "autoscaling": {
            "enabled": True,
            "min_node_count": 0,
            "max_node_count": placement.num_nodes + config.max_extra_nodes,
            "location_policy": "ANY" if spot else "BALANCED",
        },
        # A cluster in a release channel (REGULAR above) refuses pools without auto-upgrade. An
        # upgrade drains the nodes: the pods get SIGTERM and the notice as on a preemption.
        "management": {"auto_repair": True, "auto_upgrade": True},
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
    return f"{run_prefix(run_key)}-a{attempt}-rdzv"


def training_pod_name(run_key: str, attempt: int, node_rank: int) -> str:
    """Stable per (run, attempt, node): a retried task finds its pods, a recovery starts new ones
    beside the earlier attempt's (kept when they failed, for inspection)."""
    return f"{run_prefix(run_key)}-a{attempt}-node-{node_rank}"


NOTICE_DIR = "/var/run/sailor"
"""Mount path of the pod's notice volume (an emptyDir shared by the container and its preStop hook)."""
NOTICE_PATH = f"{NOTICE_DIR}/notice.json"
"""``SAILOR_NOTICE_FILE`` inside a training pod."""
COLLECTIVE_TIMEOUT_S = 300
"""``SAILOR_COLLECTIVE_TIMEOUT_S``: how long a collective may wait for a peer before it fails (the
timeout of every process group the built-in trainer and ``Run.init_distributed`` make). Short
next to torch's 30 min, so the peers of a node that died give up by themselves too (SAILOR
already ends the attempt as soon as any pod ends); long enough for a checkpoint save behind a
barrier."""


def train_command(
    launch: TrainLaunch, node_rank: int, namespace: str, command: Sequence[str] = ()
) -> list[str]:
    """torchrun on one node: all its GPUs; static rendezvous on node 0 when the run spans nodes.

    ``command`` (the run's own argv, run in its image) follows ``--no-python``, so torchrun runs
    it as given (``["python", "train.py", ...]`` or an executable); empty: the built-in trainer.
    """
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
            f"--rdzv-conf=timeout={RENDEZVOUS_TIMEOUT_S}",
        ]
    if command:
        return [*cmd, "--no-python", *command]
    return [*cmd, "-m", "sailor_tasks.train", "--config", launch.config_uri]


def notice_hook(grace_s: int) -> list[str]:
    """The preStop hook's argv: write the run contract's notice file (deadline = now + the pod's
    grace period) before the kubelet sends SIGTERM, as the local backend does on an injected
    preemption. A POSIX shell and ``date`` are all it needs from the image."""
    script = (
        "now=$(date +%s); "
        f'printf \'{{"deadline": %s, "notice_s": {grace_s}, "reason": "preemption"}}\' "$((now + {grace_s}))" '
        f'> "{NOTICE_PATH}.tmp" && mv "{NOTICE_PATH}.tmp" "{NOTICE_PATH}"'
    )
    return ["/bin/sh", "-c", script]


def pod_environment(
    launch: TrainLaunch, train: TrainConfig, node_rank: int, grace_s: int, namespace: str
) -> dict[str, str]:
    """One training pod's environment: the run's ``env``, then the run contract's ``SAILOR_*``
    variables (``runtime.contract``), the notice window and the node's place in the run."""
    pl = launch.placement
    env = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        **dict(train.env),
        **contract_env(
            run_id=launch.run_id,
            attempt=launch.attempt,
            data_dir=train.data_uri,
            checkpoint_dir=train.checkpoint_uri,
            total_steps=train.total_steps,
            seed=train.seed,
            notice_file=NOTICE_PATH,
        ),
        "SAILOR_CONFIG_URI": launch.config_uri,
        "SAILOR_PREEMPTION_NOTICE_S": str(grace_s),
        # torchrun (the container's main process) gets the kubelet's SIGTERM and passes it to the
        # workers, then kills them after its own shutdown timeout (30 s by default): give the
        # workers the whole window.
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(grace_s),
        "SAILOR_COLLECTIVE_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S),
        "SAILOR_NODE_RANK": str(node_rank),
        "SAILOR_NUM_NODES": str(max(1, pl.num_nodes)),
        "PYTHONUNBUFFERED": "1",
    }
    if pl.num_nodes > 1:
        env["MASTER_ADDR"] = (
            f"{rendezvous_service_name(launch.run_key, launch.attempt)}.{namespace}.svc.cluster.local"
        )
        env["MASTER_PORT"] = str(RENDEZVOUS_PORT)
    return env


def build_training_pods(
    config: GkeConfig, launch: TrainLaunch, train: TrainConfig, *, grace_s: int | None = None
) -> list[V1Pod]:
    """One pod per node of the placement, running the run's ``command`` in its ``image`` (default:
    the built-in trainer in SAILOR's image) under torchrun, with the run contract's environment.

    Pods land only on the pool of the launch's placement (nodeSelector) and tolerate its GPU/spot
    taints. ``grace_s`` (default: the configured window, ``config.pod_grace_s()``) is the pods'
    ``terminationGracePeriodSeconds`` and the notice window a preStop hook writes into
    ``SAILOR_NOTICE_FILE`` before SIGTERM, so the workers know their real deadline. Labels carry the
    run, plan hash, attempt and node rank; the orchestrator adds dag/task/run/try labels and
    reattaches to a pod that already runs instead of starting a second one. Pod (and rendezvous
    service) names carry the attempt: a recovered run's pods never collide with the preempted
    attempt's.
    """
    from kubernetes.client import models as k8s

    pl = launch.placement
    grace = config.pod_grace_s() if grace_s is None else grace_s
    spot = pl.market == "spot"
    pool = node_pool_name(launch.run_key, pl)
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
        env = pod_environment(launch, train, rank, grace, config.namespace)
        gpus = str(pl.gpus_per_node)
        container = k8s.V1Container(
            name=CONTAINER_NAME,
            image=launch.image or config.image_for(pl.region),
            image_pull_policy="IfNotPresent",
            command=train_command(launch, rank, config.namespace, tuple(train.command)),
            env=[k8s.V1EnvVar(name=k, value=v) for k, v in env.items()],
            resources=k8s.V1ResourceRequirements(
                limits={"nvidia.com/gpu": gpus}, requests={"nvidia.com/gpu": gpus}
            ),
            ports=[k8s.V1ContainerPort(container_port=RENDEZVOUS_PORT, name="rdzv")],
            lifecycle=k8s.V1Lifecycle(
                pre_stop=k8s.V1LifecycleHandler(_exec=k8s.V1ExecAction(command=notice_hook(grace)))
            ),
            volume_mounts=[
                k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
                k8s.V1VolumeMount(name="sailor-notice", mount_path=NOTICE_DIR),
            ],
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
                    termination_grace_period_seconds=grace,
                    node_selector=node_selector,
                    tolerations=tolerations,
                    containers=[container],
                    volumes=[
                        k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory")),
                        k8s.V1Volume(name="sailor-notice", empty_dir=k8s.V1EmptyDirVolumeSource()),
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


def build_namespace(config: GkeConfig) -> V1Namespace:
    """The training pods' namespace, created unless it exists before an attempt's pods start."""
    from kubernetes.client import models as k8s

    return k8s.V1Namespace(
        api_version="v1",
        kind="Namespace",
        metadata=k8s.V1ObjectMeta(name=config.namespace, labels={"app.kubernetes.io/managed-by": "sailor"}),
    )


def build_service_account(config: GkeConfig) -> V1ServiceAccount:
    """The training pods' Kubernetes service account, annotated for Workload Identity with the
    Google service account the pods act as; created with the namespace. The Google service
    account's binding (``roles/iam.workloadIdentityUser`` for ``config.workload_identity_member()``)
    is the operator's to grant (docs/gke.md)."""
    from kubernetes.client import models as k8s

    return k8s.V1ServiceAccount(
        api_version="v1",
        kind="ServiceAccount",
        metadata=k8s.V1ObjectMeta(
            name=config.service_account,
            namespace=config.namespace,
            labels={"app.kubernetes.io/managed-by": "sailor"},
            annotations={WORKLOAD_IDENTITY_ANNOTATION: config.gcp_service_account_email()},
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


def container_end_reason(pod: Any, container: str = CONTAINER_NAME) -> str:
    """The ``reason`` of the training container's termination (``OOMKilled``, ``Error``, ...)."""
    for status in getattr(getattr(pod, "status", None), "container_statuses", None) or ():
        terminated = status.state.terminated if status.state else None
        if status.name == container and terminated is not None:
            return getattr(terminated, "reason", None) or ""
    return ""


NODE_SHUTDOWN_REASONS = ("Terminated", "Shutdown", "NodeShutdown")
"""Pod ``status.reason`` the kubelet's graceful node shutdown sets on the pods it stops ("Pod was
terminated in response to imminent node shutdown")."""
IMPENDING_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"
"""Taint GKE puts on a node whose VM is being reclaimed or shut down."""
SIGNAL_EXIT_MIN = 128
"""A container status above this is death by a signal (137: SIGKILL, 143: SIGTERM)."""


@dataclass(frozen=True, slots=True)
class PodEnd:
    """How a training pod ended, as SAILOR judges it (``classify_pod_end``)."""

    outcome: str
    """``completed``, ``preempted`` or ``failed``."""
    reason: str
    """Why, in words (the pod's or node's termination reason)."""
    exit_code: int | None = None
    """The training container's exit status, None when unreadable (the pod or its node is gone)."""
    noticed: bool = True
    """For a preemption: whether the pod got its grace period (graceful node shutdown, exit 75)."""


SCALE_DOWN_TAINT = "ToBeDeletedByClusterAutoscaler"
"""The cluster autoscaler's taint on a node it removes: one whose pods have ended (a training pod
is a bare pod, which keeps its node from being scaled down while it runs)."""


def _node_reclaimed(node: Any) -> str:
    """Why a node is going away ('' when it is not): a taint of GKE's or the autoscaler's, or Ready
    false/unknown."""
    for taint in getattr(getattr(node, "spec", None), "taints", None) or ():
        if taint.key in (IMPENDING_TERMINATION_TAINT, SCALE_DOWN_TAINT):
            return f"node tainted {taint.key}"
    for cond in getattr(getattr(node, "status", None), "conditions", None) or ():
        if cond.type == "Ready" and cond.status != "True":
            return f"node not ready ({cond.reason or cond.status})"
    return ""


def classify_pod_end(pod: Any, node: Any, *, spot: bool, node_gone: bool = False) -> PodEnd:
    """Judge how a training pod ended from the pod and its node, not only from what the trainer wrote.

    - exit status 0: completed;
    - the pod gone, or its node gone (``node_gone``) or being reclaimed: preempted without notice
      unless the kubelet stopped the pod gracefully;
    - evicted by the kubelet for its node's pressure (pod reason ``Evicted``, which also sets the
      kubelet's ``DisruptionTarget``) or killed for its memory (``OOMKilled``): failed, on Spot
      too (the run needs more than its node gives: moving it elsewhere does not help);
    - the kubelet's graceful node shutdown (pod reason ``Terminated``/``Shutdown``, or a
      ``DisruptionTarget`` condition by the kubelet) or exit status 75 (the trainer saved on a
      notice and stopped): preempted with notice;
    - on Spot, an exit nothing explains (unreadable, or death by a signal): preempted;
    - anything else: failed (the command's own error, e.g. exit status 1 from a traceback), also
      when the node went away after it: the command's own exit status (1-128) with its node being
      scaled down by the autoscaler (which removes only nodes whose pods ended), or on an
      on-demand node now gone, is the command's failure, not a preemption.
    """
    from sailor_tasks.errors import PREEMPTED_EXIT_CODE

    if pod is None:
        return PodEnd("preempted", "pod gone (deleted with its node)", None, noticed=False)
    code = container_exit_code(pod)
    if code == 0:
        return PodEnd("completed", "exit status 0", 0)
    status = getattr(pod, "status", None)
    reason = getattr(status, "reason", None) or ""
    message = getattr(status, "message", None) or ""
    disrupted = [
        c
        for c in getattr(status, "conditions", None) or ()
        if c.type == "DisruptionTarget" and c.status == "True"
    ]
    if reason == "Evicted":
        why = f"evicted by the kubelet ({message or 'node pressure'})"
        return PodEnd("failed", why, 1 if code is None else code)
    if container_end_reason(pod) == "OOMKilled":
        return PodEnd("failed", f"out of memory (OOMKilled, exit status {code})", 1 if code is None else code)
    if reason in NODE_SHUTDOWN_REASONS or "node shutdown" in message.lower():
        return PodEnd("preempted", f"node shutdown ({reason}: {message})".strip(), code)
    if any(c.reason in ("TerminationByKubelet", "DeletionByPodGC") for c in disrupted):
        # The kubelet's termination is the node's graceful shutdown (the notice); the pod garbage
        # collector deletes the pods of a node already gone (none).
        noticed = any(c.reason == "TerminationByKubelet" for c in disrupted)
        return PodEnd("preempted", f"disrupted by {disrupted[0].reason}", code, noticed=noticed)
    if code == PREEMPTED_EXIT_CODE:
        return PodEnd("preempted", "the trainer saved on a notice (exit status 75)", code)
    reclaimed = "node gone" if node_gone else _node_reclaimed(node)
    if (
        reclaimed
        and code is not None
        and 0 < code <= SIGNAL_EXIT_MIN
        and (reclaimed == f"node tainted {SCALE_DOWN_TAINT}" or (node_gone and not spot))
    ):
        reclaimed = ""  # the node went after the command ended on its own
    if reclaimed:
        return PodEnd("preempted", reclaimed, code, noticed=False)
    if spot and (code is None or code > SIGNAL_EXIT_MIN):
        return PodEnd("preempted", f"unexplained end on Spot (exit status {code})", code, noticed=False)
    return PodEnd("failed", f"exit status {code}", 1 if code is None else code)


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
    def list_operations(self, *, parent: str) -> Any: ...


PodRunner = Callable[[GkeConfig, TrainLaunch, Sequence[Any], Any], int]
"""Submits the pods (and rendezvous service) of a launch, waits for them, returns the exit status."""

_pod_runner: PodRunner | None = None

PodCanceller = Callable[[GkeConfig, str, str], int]
"""Deletes the pods (and rendezvous services) of a run (config, region, run_key) that still run;
returns how many pods."""

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
    """409: ``AlreadyExists`` over gRPC, a plain ``Conflict`` over REST; never ``Aborted`` (also a
    ``Conflict``: the request was not carried out)."""
    from google.api_core import exceptions

    return isinstance(exc, exceptions.AlreadyExists | exceptions.Conflict) and not isinstance(
        exc, exceptions.Aborted
    )


def _is_failed_precondition(exc: BaseException) -> bool:
    """400 ``FailedPrecondition``: GKE refuses an operation while the cluster runs another."""
    from google.api_core import exceptions

    return isinstance(exc, exceptions.FailedPrecondition)


BUSY_RETRIES = 3
"""Operations on a busy cluster a node pool's deletion waits for before it gives up."""


def _is_not_found(exc: BaseException) -> bool:
    from google.api_core import exceptions

    return isinstance(exc, exceptions.NotFound)


_waits_deferred: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "sailor_gke_waits_deferred", default=False
)


@contextlib.contextmanager
def operation_waits_deferred() -> Iterator[None]:
    """Within this block ``GkeBackend.provision`` starts GKE operations without waiting for them
    (the caller waits in the triggerer, then calls ``provision_step``)."""
    token = _waits_deferred.set(True)
    try:
        yield
    finally:
        _waits_deferred.reset(token)


PROVISION_PHASES = ("busy", "cluster", "pool")
"""The steps of ``GkeBackend.provision_step``: the region's cluster, then the placement's pool;
``busy``: an operation on the cluster that is not the run's (another run's pool or cluster, a GKE
upgrade), waited for before provisioning starts again, whatever its outcome."""


@dataclass(frozen=True, slots=True)
class PendingOperation:
    """A GKE operation ``provision_step`` started and did not wait for: wait for it (the triggerer:
    ``GKEOperationTrigger``, or ``GkeBackend.wait``), check it, then call ``provision_step`` with
    ``after=phase``."""

    name: str
    """The operation's short name (``operation-1700000000000-...``)."""
    location: str
    """Its region or zone (``operations`` are per location)."""
    project: str
    phase: str
    """Which of ``PROVISION_PHASES`` it belongs to."""
    what: str
    """What it does, in words (for logs and errors)."""

    @property
    def path(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/operations/{self.name}"


@dataclass
class GkeBackend:
    """``ClusterBackend`` on GKE. ``client`` defaults to a ``ClusterManagerClient`` with ``gcp_auth`` credentials."""

    settings: Settings
    config: GkeConfig | None = None
    client: ClusterManager | None = None
    pod_runner: PodRunner | None = None
    poll_s: float = 5.0
    name: str = field(default="gke", init=False)
    detached_attempts: ClassVar[bool] = True

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

    def record(self, run_key: str) -> dict[str, Any] | None:
        """What the run provisioned: every node pool it created (``pools``), the current one first
        named by ``node_pool``; None when it provisioned nothing (or was torn down)."""
        uri = self._record_uri(run_key)
        return storage.read_json(uri) if storage.exists(uri) else None

    # --- operations ---------------------------------------------------------------------------

    def _pending(
        self, operation: Any, phase: str, what: str, fallback_location: str
    ) -> PendingOperation | None:
        """The operation as a ``PendingOperation`` while it runs; None when it is already DONE
        (raising when it failed)."""
        if _status_name(operation) in ("DONE", "ABORTING"):
            self.check_operation(operation, what)
            return None
        return PendingOperation(
            name=getattr(operation, "name", "") or "",
            location=getattr(operation, "location", "") or fallback_location,
            project=self.cfg.project,
            phase=phase,
            what=what,
        )

    def check_operation(self, operation: Any, what: str) -> None:
        """Raise with the operation's error message when it failed or was aborted."""
        name = getattr(operation, "name", "")
        error = getattr(getattr(operation, "error", None), "message", "") or (
            getattr(operation, "status_message", "") if _status_name(operation) == "ABORTING" else ""
        )
        if error or _status_name(operation) == "ABORTING":
            raise RuntimeError(f"GKE operation {name} ({what}) failed: {error or 'aborted'}")

    def finish_operation(self, pending: PendingOperation) -> None:
        """Read a finished operation once and raise when it failed (the provider's trigger reports
        an operation that ended in error as DONE too); another's (phase ``busy``) only logs it."""
        self._finished(self._client().get_operation(name=pending.path), pending)

    def _finished(self, op: Any, pending: PendingOperation) -> None:
        try:
            self.check_operation(op, pending.what)
        except RuntimeError as exc:
            if pending.phase != "busy":
                raise
            logger.warning("%s; not this run's operation: provisioning goes on", exc)

    def wait(self, pending: PendingOperation) -> None:
        """Poll an operation in this process until it is DONE (callers that cannot defer)."""
        deadline = time.monotonic() + _OPERATION_TIMEOUT_S
        while True:
            op = self._client().get_operation(name=pending.path)
            if _status_name(op) in ("DONE", "ABORTING"):
                self._finished(op, pending)
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"GKE operation {pending.name} ({pending.what}) not done after {_OPERATION_TIMEOUT_S} s"
                )
            time.sleep(self.poll_s)

    # --- provision ----------------------------------------------------------------------------

    def provision(self, run_key: str, placement: Placement) -> dict[str, Any]:
        """Create (or reuse) the cluster and the placement's node pool, waiting here for each GKE
        operation. ``sailor_train``'s provision task waits in the triggerer instead
        (``provision_step`` with ``airflow_glue.operators.SailorProvisionOperator``); so does a
        recovery inside the deferrable train task, which calls this under
        ``operation_waits_deferred()``: the first operation is started and recorded, the record
        returned with ``status`` ``provisioning``, and the caller waits for it
        (``provision_step`` finds it in the record)."""
        after: str | None = None
        if _waits_deferred.get():
            step = self.provision_step(run_key, placement)
            return (
                step
                if not isinstance(step, PendingOperation)
                else {**(self.record(run_key) or {}), "status": "provisioning"}
            )
        while True:
            step = self.provision_step(run_key, placement, after=after)
            if not isinstance(step, PendingOperation):
                return step
            self.wait(step)
            after = step.phase

    def provision_step(
        self, run_key: str, placement: Placement, *, after: str | None = None
    ) -> dict[str, Any] | PendingOperation:
        """One step of provisioning, never waiting: a ``PendingOperation`` to wait for, or, once the
        cluster and the pool are there, the run's record.

        The pool is the placement's (``node_pool_name``: run + ``pool_spec`` hash): a recovery to
        another zone, machine, GPU or market creates a new pool; every pool the run creates is
        recorded, and ``teardown`` removes them all. A pool this run scaled to zero is scaled back.

        Args:
            after: the phase whose operation just finished (``PROVISION_PHASES``); None to start.

        Raises:
            ValueError: ``after`` is not a phase (names the valid ones).
        """
        if after is not None and after not in PROVISION_PHASES:
            raise ValueError(
                f"after={after!r} is not a provision phase; valid: {', '.join(PROVISION_PHASES)}"
            )
        if after == "busy":  # another's operation is over: start again
            after = None
        cfg, region = self.cfg, placement.region
        record = self.record(run_key) or {"run_key": run_key, "backend": self.name, "pools": []}
        started = record.pop("pending", None)
        if (
            after is None
            and started is not None
            and started.get("pool") == node_pool_name(run_key, placement)
        ):
            # An operation an earlier call started (a retried task, or a caller that did not wait).
            earlier = PendingOperation(
                **{k: started[k] for k in ("name", "location", "project", "phase", "what")}
            )
            op = self._client().get_operation(name=earlier.path)
            if _status_name(op) not in ("DONE", "ABORTING"):
                return earlier
            storage.write_json(self._record_uri(run_key), record)  # the operation is over
            try:
                self.check_operation(op, earlier.what)
                # Another run's operation that this run waited for: the cluster is checked again
                # (it may have gone on with a next operation meanwhile).
                after = None if earlier.phase == "busy" else earlier.phase
            except RuntimeError as exc:
                # The try that waited for it failed with this error; this one provisions again
                # (a stockout or a quota may be over) instead of failing on the same operation.
                logger.warning("%s; provisioning again", exc)
                if earlier.phase == "pool":
                    pending = self._delete_failed_pool(run_key, placement)
                    if pending is not None:
                        return self._started(run_key, record, pending, placement)
                    after = "cluster"
        pool_name = node_pool_name(run_key, placement)
        pool_path = f"{cfg.cluster_path(region)}/nodePools/{pool_name}"
        known = next((p for p in record["pools"] if p["name"] == pool_name), None)
        cluster_state = record.get("cluster_state", "exists")
        if after is None and known is not None and known.get("state") in ("created", "exists"):
            if self._pool_up(pool_path):  # its pool is there: nothing on the cluster to wait for
                after = "pool"
        if after is None:
            cluster_state, pending = self._ensure_cluster(region, placement.zone)
            record["cluster_state"] = cluster_state
            if pending is not None:
                return self._started(run_key, record, pending, placement)
        cluster = self._client().get_cluster(name=cfg.cluster_path(region))
        version = getattr(cluster, "current_master_version", "") or ""
        extended = supports_extended_grace(version)
        body = build_node_pool_body(cfg, run_key, placement, extended_grace=extended)
        spot = placement.market == "spot"
        entry = known or {
            "name": pool_name,
            "path": pool_path,
            **pool_spec(placement),
            "grace_s": cfg.pod_grace_s(extended) if spot else cfg.pod_grace_s(True),
            "extended_grace": bool(spot and extended and "kubelet_config" in body["config"]),
            "state": "creating",
        }
        if after != "pool":
            if spot and not extended and cfg.spot_shutdown_s != SHUTDOWN_GRACE_CHOICES[0]:
                logger.warning(
                    "cluster %s runs GKE %s, older than %s: Spot pool %s keeps GKE's default shutdown "
                    "period; training pods get %d s to save on a preemption",
                    cfg.cluster_name(region),
                    version or "(unknown)",
                    ".".join(map(str, EXTENDED_GRACE_MIN_VERSION[:3]))
                    + f"-gke.{EXTENDED_GRACE_MIN_VERSION[3]}",
                    pool_name,
                    entry["grace_s"],
                )
            if known is None:
                # Recorded before it is asked for: a call that fails after GKE took it (a timeout,
                # a lost worker) leaves a pool the run's teardown still deletes.
                record = {**record, "pools": [*record["pools"], entry]}
                storage.write_json(self._record_uri(run_key), record)
            def create() -> Any:
                return self._client().create_node_pool(
                    parent=cfg.cluster_path(region), node_pool=validate_node_pool_body(body)
                )

            what = f"create node pool {pool_name}"
            try:
                op = create()
                entry["state"] = "created"
            except Exception as exc:
                if _is_failed_precondition(exc):
                    # The cluster went on with another operation since it was checked: wait for it.
                    cluster = self._client().get_cluster(name=cfg.cluster_path(region))
                    busy = self._cluster_busy(cluster, region)
                    if busy is None:
                        raise
                    logger.info("%s: refused while the cluster is busy; waiting for %s", exc, busy.what)
                    return self._started(run_key, record, busy, placement)
                if not _is_already_exists(exc):
                    raise
                existing = self._client().get_node_pool(name=pool_path)
                if _status_name(existing) == "ERROR":
                    # GKE took an earlier try's creation (its call timed out) and it then failed
                    # (a stockout): a pool that gets no nodes is deleted and created anew.
                    logger.warning(
                        "node pool %s exists in ERROR (%s); deleting it to create it again",
                        pool_name,
                        getattr(existing, "status_message", "") or "no message",
                    )
                    pending = self._delete_failed_pool(run_key, placement)
                    if pending is not None:
                        return self._started(run_key, record, pending, placement)
                    op = create()  # deleted at once
                    entry["state"] = "created"
                else:
                    logger.info("node pool %s already exists; reusing it", pool_name)
                    op = None
                    if entry["state"] == "scaled_to_zero":
                        # A pool scaled to zero by an earlier teardown gets its nodes back.
                        op = self._client().set_node_pool_size(name=pool_path, node_count=placement.num_nodes)
                        what = f"resize node pool {pool_name}"
                    entry["state"] = "exists"
            pools = [p for p in record["pools"] if p["name"] != pool_name] + [entry]
            record = {**record, "pools": pools}
            if op is not None:
                try:
                    pending = self._pending(op, "pool", what, region)
                except RuntimeError:
                    # Failed at once; GKE may keep the pool (in ERROR). Recorded as an operation
                    # an earlier try started, the pool is removed by teardown, and a retry deletes
                    # it and creates it anew instead of reusing it.
                    failed = PendingOperation(
                        name=getattr(op, "name", "") or "",
                        location=getattr(op, "location", "") or region,
                        project=cfg.project,
                        phase="pool",
                        what=what,
                    )
                    self._started(run_key, record, failed, placement)
                    raise
                if pending is not None:
                    return self._started(run_key, record, pending, placement)
        record.update(
            status="ready",
            cluster=cfg.cluster_name(region),
            cluster_state=cluster_state,
            node_pool=pool_name,
            node_pool_path=pool_path,
            node_pool_state=entry["state"],
            grace_s=entry["grace_s"],
            placement=to_dict(placement),
        )
        storage.write_json(self._record_uri(run_key), record)
        logger.info(
            "GKE node pool %s (%s) in %s: %dx %s (%s), cluster %s; pods get %d s to save on a preemption",
            pool_name,
            entry["state"],
            placement.zone,
            placement.num_nodes,
            placement.instance_type,
            placement.market,
            cluster_state,
            entry["grace_s"],
        )
        return record

    def _pool_up(self, pool_path: str) -> bool:
        """The node pool exists and takes pods (RUNNING, or RECONCILING: resized or upgraded)."""
        try:
            pool = self._client().get_node_pool(name=pool_path)
        except Exception as exc:
            if _is_not_found(exc):
                return False
            raise
        return _status_name(pool) in ("RUNNING", "RECONCILING")

    def _started(
        self, run_key: str, record: dict[str, Any], pending: PendingOperation, placement: Placement
    ) -> PendingOperation:
        """Record the operation just started (``pending`` in the record) and return it."""
        started = {**dataclasses.asdict(pending), "pool": node_pool_name(run_key, placement)}
        storage.write_json(
            self._record_uri(run_key), {**record, "status": "provisioning", "pending": started}
        )
        return pending

    def _delete_failed_pool(self, run_key: str, placement: Placement) -> PendingOperation | None:
        """Delete what a failed creation of the placement's pool left (GKE may keep the pool, in
        ERROR), so that it is created anew rather than reused. The deletion's operation while it
        runs (its phase ``cluster``: the pool is created once it is done); None when no pool is
        left."""
        pool_path = f"{self.cfg.cluster_path(placement.region)}/nodePools/{node_pool_name(run_key, placement)}"
        try:
            op = self._client().delete_node_pool(name=pool_path)
        except Exception as exc:
            if _is_not_found(exc):
                return None
            raise
        logger.info("deleting node pool %s, left by its failed creation", pool_path)
        return self._pending(op, "cluster", f"delete failed node pool {pool_path}", placement.region)

    def _ensure_cluster(self, region: str, system_zone: str | None) -> tuple[str, PendingOperation | None]:
        """The region's cluster: ("exists", None) when it takes node pools now, ("exists", the
        operation it is busy with) while another run creates it or GKE upgrades it, or ("created",
        its creation still running).

        Raises:
            RuntimeError: the cluster is in ERROR (a creation that failed: its message and the
                command that deletes it) or being deleted.
        """
        body = build_cluster_body(self.cfg, region, system_zone)
        try:
            cluster = self._client().get_cluster(name=self.cfg.cluster_path(region))
        except Exception as exc:
            if not _is_not_found(exc):
                raise
            cluster = None
        if cluster is not None:
            return "exists", self._cluster_busy(cluster, region)
        logger.info("creating GKE cluster %s in %s (takes several minutes)", body["name"], region)
        try:
            op = self._client().create_cluster(
                parent=f"projects/{self.cfg.project}/locations/{region}", cluster=validate_cluster_body(body)
            )
        except Exception as exc:
            if _is_already_exists(exc):
                logger.info("GKE cluster %s already exists (created concurrently); reusing it", body["name"])
                cluster = self._client().get_cluster(name=self.cfg.cluster_path(region))
                return "exists", self._cluster_busy(cluster, region)
            raise
        return "created", self._pending(op, "cluster", f"create cluster {body['name']}", region)

    def _cluster_busy(self, cluster: Any, region: str) -> PendingOperation | None:
        """What an existing cluster must finish before it takes a node pool (GKE runs one cluster
        operation at a time and refuses others meanwhile): its running operation while it is
        PROVISIONING or RECONCILING, None when it takes one now.

        Raises:
            RuntimeError: the cluster is in ERROR or STOPPING, or busy with no operation listed.
        """
        status = _status_name(cluster)
        name = self.cfg.cluster_name(region)
        if status == "ERROR":
            message = getattr(cluster, "status_message", "") or "no message"
            raise RuntimeError(
                f"GKE cluster {name} in {region} is in ERROR ({message}): a creation that failed "
                f"leaves it so; delete it (gcloud container clusters delete {name} --region {region} "
                f"--project {self.cfg.project}) and SAILOR creates it anew"
            )
        if status == "STOPPING":
            raise RuntimeError(f"GKE cluster {name} in {region} is being deleted; provision once it is gone")
        if status not in ("PROVISIONING", "RECONCILING"):
            return None
        listed = self._client().list_operations(parent=f"projects/{self.cfg.project}/locations/{region}")
        running = [
            op
            for op in getattr(listed, "operations", ())
            # the cluster's own operations and its node pools' (``.../clusters/<name>/nodePools/<pool>``:
            # a node upgrade keeps the cluster RECONCILING too)
            if re.search(rf"/clusters/{re.escape(name)}(/|$)", str(getattr(op, "target_link", "")))
            and _status_name(op) not in ("DONE", "ABORTING")
        ]
        if not running:  # between operations: a retry finds it RUNNING or busy with the next one
            raise RuntimeError(f"GKE cluster {name} in {region} is {status} with no operation listed; retry")
        op = running[0]
        kind = getattr(getattr(op, "operation_type", None), "name", "") or "an operation"
        logger.info("GKE cluster %s is %s (%s): a node pool waits for it", name, status, kind)
        return self._pending(op, "busy", f"cluster {name} {status.lower()} ({kind})", region)

    def ensure_cluster(self, region: str, system_zone: str | None = None) -> str:
        """Create the region's cluster unless it exists, waiting here; "created" or "exists"."""
        state, pending = self._ensure_cluster(region, system_zone)
        if pending is not None:
            self.wait(pending)
        return state

    # --- train --------------------------------------------------------------------------------

    def grace_s(self, run_key: str, placement: Placement) -> int:
        """Seconds the pods of ``placement`` get to save on a preemption, as provisioned (the
        configured window when the run's record does not say)."""
        record = self.record(run_key) or {}
        name = node_pool_name(run_key, placement)
        pool = next((p for p in record.get("pools", ()) if p["name"] == name), None)
        return int(pool["grace_s"]) if pool else self.cfg.pod_grace_s()

    def launch_manifests(
        self, launch: TrainLaunch, train: TrainConfig | None = None
    ) -> tuple[list[V1Pod], V1Service | None]:
        """The launch's pods (the run's image, command and env, the contract's variables, the
        pool's real grace period) and its rendezvous service."""
        if train is None:
            train = TrainConfig.from_json(storage.read_bytes(launch.config_uri).decode())
        grace = self.grace_s(launch.run_key, launch.placement)
        return (
            build_training_pods(self.cfg, launch, train, grace_s=grace),
            build_rendezvous_service(self.cfg, launch),
        )

    def train(self, launch: TrainLaunch) -> int:
        runner = self.pod_runner or _pod_runner
        if runner is None:
            raise RuntimeError(
                "backend='gke' submits training pods through Airflow's GKEStartPodOperator; run the "
                "sailor_train DAG (or call sailor_tasks.airflow_glue.gcp.install() first)"
            )
        pods, service = self.launch_manifests(launch)
        return runner(self.cfg, launch, pods, service)

    def cancel(self, run_key: str, *, for_good: bool = True) -> int:
        """Delete the run's pods that still run and its rendezvous services, in the region of its
        node pool (each pod gets its termination grace period: the trainer saves on SIGTERM).
        ``for_good`` changes nothing here: the caller ends the detached attempt
        (``stages.stop_training``)."""
        record = self.record(run_key)
        if record is None or "placement" not in record:
            return 0
        if _pod_canceller is None:
            logger.warning(
                "run %s: no pod canceller installed (sailor_tasks.airflow_glue.gcp.install()); its pods "
                "were not checked",
                run_key,
            )
            return 0
        regions = dict.fromkeys([record["placement"]["region"], *(p["region"] for p in record["pools"])])
        return sum(_pod_canceller(self.cfg, region, run_key) for region in regions)

    def _when_free(self, region: str, call: Callable[[], Any]) -> Any:
        """``call()`` (an operation on a node pool of the region's cluster), waiting first for
        the operation the cluster is busy with each time GKE refuses it meanwhile
        (``FailedPrecondition``: one cluster operation at a time)."""
        for _ in range(BUSY_RETRIES):
            try:
                return call()
            except Exception as exc:
                if not _is_failed_precondition(exc):
                    raise
                cluster = self._client().get_cluster(name=self.cfg.cluster_path(region))
                busy = self._cluster_busy(cluster, region)
                if busy is None:
                    raise
                logger.info("%s: refused while the cluster is busy; waiting for %s", exc, busy.what)
                self._wait_until_over(busy)
        return call()

    def _wait_until_over(self, pending: PendingOperation) -> None:
        """Wait for an operation provisioning started, whatever its outcome (teardown removes
        what it left either way); one GKE no longer knows is over."""
        try:
            self.wait(pending)
        except RuntimeError as exc:  # it failed: what it left is torn down like the rest
            logger.info("%s; tearing down what it left", exc)
        except Exception as exc:
            if not _is_not_found(exc):
                raise

    def teardown(self, run_key: str) -> bool:
        """Delete (or scale to zero) every node pool the run created, in every region it ran,
        once an operation provisioning started and recorded is over."""
        record = self.record(run_key)
        if record is None:
            return False
        uri = self._record_uri(run_key)
        started = record.pop("pending", None)
        pools = record.get("pools", [])
        if started is not None and (
            started.get("phase") == "pool"
            or started.get("pool") in {p.get("name") for p in pools}
            or started.get("location") in {p.get("region") for p in pools}
        ):
            # Provisioning may still be creating (or resizing) the run's pool, or deleting the pool
            # a failed creation left, or the cluster may be busy (a node upgrade) where the run has
            # a pool (a run cancelled meanwhile): GKE refuses another operation on the cluster
            # until it ends. A cluster's creation holds no pool of the run: nothing waits for it.
            self._wait_until_over(
                PendingOperation(**{k: started[k] for k in ("name", "location", "project", "phase", "what")})
            )
            storage.write_json(uri, record)
        for pool in pools:
            if pool.get("state") in ("deleted", "scaled_to_zero") and self.cfg.teardown != "delete":
                continue
            try:
                client = self._client()
                if self.cfg.teardown == "delete":
                    call = functools.partial(client.delete_node_pool, name=pool["path"])
                else:
                    call = functools.partial(client.set_node_pool_size, name=pool["path"], node_count=0)
                op = self._when_free(pool["region"], call)
                pending = self._pending(
                    op, "pool", f"{self.cfg.teardown} node pool {pool['name']}", pool["region"]
                )
                if pending is not None:
                    self.wait(pending)
            except Exception as exc:
                if not _is_not_found(exc):
                    raise
                logger.info("node pool %s is already gone", pool["name"])
            pool["state"] = "deleted" if self.cfg.teardown == "delete" else "scaled_to_zero"
            storage.write_json(uri, record)  # what is done stays done if a later pool fails
            logger.info("GKE node pool %s: %s", pool["name"], self.cfg.teardown)
        if self.cfg.teardown == "delete":
            storage.remove(uri)
        else:
            storage.write_json(uri, {**record, "status": "scaled_to_zero"})
        return True
