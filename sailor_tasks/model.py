"""Frozen dataclasses shared by every part of SAILOR: offers, requests, placements, assignments.

They carry no behaviour beyond cheap derived values and (de)serialisation to small JSON, which is
what crosses Airflow task boundaries (XCom) and what the ledger stores.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

Market = Literal["spot", "on_demand"]
MarketChoice = Literal["spot", "on_demand", "auto"]
MARKETS: tuple[str, ...] = ("spot", "on_demand")
MARKET_CHOICES: tuple[str, ...] = ("spot", "on_demand", "auto")
ANY_GPU = "any"
DEFAULT_MAX_QUEUE_HOURS = 24.0
"""Hours a run may wait in SAILOR's queue unless its ``max_queue_hours`` param says otherwise."""
DEFAULT_BATCH_SIZE = 16
"""Sequences per worker per step unless a run's ``batch_size`` says otherwise: the batch size a
built-in model's speeds (steps/s) stand for, so the only one whose runs' measured speeds are
learned (``Ledger.measured_throughputs``)."""
RUN_STATUSES = (
    "validated",
    "rejected",
    "planned",
    "provisioned",
    "running",
    "preempted",
    "success",
    "failed",
    "cancelled",
)
"""Every value of a run's status in the ledger (``runs.status``), in pipeline order."""
RUN_STATUSES_DONE = ("success", "failed", "rejected", "cancelled")
"""Ledger statuses after which a run changes no more."""
RUN_STATUSES_LIVE = tuple(s for s in RUN_STATUSES if s not in RUN_STATUSES_DONE)
"""Ledger statuses of a run that has not ended."""

T = TypeVar("T")


def to_dict(obj: Any) -> dict[str, Any]:
    """Dataclass → plain JSON-able dict (tuples become lists)."""
    return dataclasses.asdict(obj)


def json_default(value: Any) -> Any:
    """``json.dumps``'s ``default`` for dates and times (ISO 8601)."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None: JSON has no such numbers (a diverged run's loss
    is NaN in the ledger)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """Plain dict → dataclass, turning lists back into tuples and ignoring unknown keys."""
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            value = data[f.name]
            kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


@dataclass(frozen=True, slots=True)
class Offer:
    """One way to buy GPUs: a VM shape in a zone, with on-demand and spot prices per VM-hour."""

    cloud: str
    region: str
    zone: str
    gpu_type: str
    gpus_per_node: int
    instance_type: str
    ondemand_usd_per_hour: float
    """Price of one VM (host + GPUs) per hour, on-demand."""
    spot_usd_per_hour: float
    """Price of one VM per hour on the spot market."""
    spot_above_ondemand: bool = False
    """Source data quirk: the catalog's spot price exceeds on-demand (kept, but never preferred)."""
    capacity_gpus: int | None = None
    """GPUs of this type the organisation may use in this zone (None: not limited by the supply file)."""
    preemption_rate_per_hour: float = 0.0
    """Expected spot preemptions per VM-hour in this zone."""

    def usd_per_hour(self, market: str) -> float:
        return self.spot_usd_per_hour if market == "spot" else self.ondemand_usd_per_hour

    def usd_per_gpu_hour(self, market: str) -> float:
        return self.usd_per_hour(market) / self.gpus_per_node

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.zone, self.gpu_type, self.gpus_per_node)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A training run as the user asked for it (Airflow params converted once, validated)."""

    job_name: str
    team: str
    dataset_uri: str
    model: str
    num_workers: int
    gpu_type: str = ANY_GPU
    regions: tuple[str, ...] = ()
    """Allowed regions; empty means every region in the catalog."""
    market: str = "auto"
    max_usd_per_hour: float | None = None
    """Cap on the whole run's price per hour (all workers); None: no cap."""
    total_steps: int = 200
    checkpoint_every_steps: int = 50
    seed: int = 0
    backend: str = "local"
    gpus_per_worker: int = 1
    batch_size: int = DEFAULT_BATCH_SIZE
    learning_rate: float = 3e-3
    deadline_hours: float | None = None
    """Hours from planning by which the run should finish (None: no deadline); drives market=auto
    and, when the run waits in the queue, its latest start."""
    priority: str = "normal"
    """Queue priority (low, normal, high): a waiting run of higher priority is admitted first."""
    max_queue_hours: float = DEFAULT_MAX_QUEUE_HOURS
    """Hours the run may wait in SAILOR's queue for capacity before it fails."""
    data_residency: tuple[str, ...] = ()
    """Continents (``NA``, ``EU``, ``ASIA``, ...) the dataset may be copied to; empty: anywhere."""
    exclude_regions: tuple[str, ...] = ()
    """Regions the run must not use (deny list, applied after ``regions``)."""
    # Spot resilience (see sailor_tasks.stages.attempts and backends.preemption)
    strategy: str = "sailor"
    """Market strategy (``sailor_tasks.strategies``): spot or on-demand at each launch, and where a
    preempted run resumes unless ``recovery_strategy`` overrides it."""
    recovery_strategy: str | None = None
    """Recovery strategy overriding the market strategy's choice of where to resume (None: none)."""
    inject_preemptions: tuple[int, ...] = ()
    """Steps at which the local backend delivers a preemption notice (SIGTERM, then SIGKILL)."""
    inject_kills: tuple[int, ...] = ()
    """Steps at which the local backend kills the workers without notice (SIGKILL)."""
    preemption_rate_per_hour: float = 0.0
    """Noticed preemptions injected as a seeded Poisson process (per hour of training)."""
    preemption_trace_uri: str = ""
    """Availability trace (JSON, 1 = unavailable) replayed as noticed preemptions; empty: none."""
    preemption_trace_time_scale: float = 1.0
    """Trace seconds replayed per wall second (3600: one trace hour per second)."""
    preemption_notice_s: float = 30.0
    """Seconds between the preemption notice (SIGTERM) and the hard kill (GCE: 30 s)."""
    async_checkpoint: bool = False
    """Write periodic checkpoints in the background (training stalls only for the copy to CPU)."""
    # The run's own code (empty: the built-in trainer); see docs/run-contract.md
    command: tuple[str, ...] = ()
    """argv run under torchrun with the run contract's environment; empty: the built-in model."""
    image: str = ""
    """OCI image reference the command runs in (container backends); empty: SAILOR's image."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment of every worker as sorted (name, value) pairs, so the request stays
    hashable (``dict(req.env)`` for a mapping); a mapping or JSON pairs given here are normalised.
    Names are validated by the request (SAILOR_* and torchrun's reserved)."""

    def __post_init__(self) -> None:
        pairs = self.env.items() if isinstance(self.env, Mapping) else self.env
        object.__setattr__(self, "env", tuple(sorted((str(k), str(v)) for k, v in pairs)))

    @property
    def num_gpus(self) -> int:
        return self.num_workers * self.gpus_per_worker

    def summary(self) -> str:
        cap = f" under ${self.max_usd_per_hour:g}/h" if self.max_usd_per_hour is not None else ""
        if not self.regions:
            where = "any region"
        elif len(self.regions) <= 3:
            where = ",".join(self.regions)
        else:
            where = f"{len(self.regions)} allowed regions"
        return f"{self.num_gpus}x {self.gpu_type} GPU ({self.market}) in {where}{cap}"


@dataclass(frozen=True, slots=True)
class Reservation:
    """Capacity held for a run between ``plan`` and ``teardown``."""

    run_id: str
    region: str
    zone: str
    gpu_type: str
    gpus: int
    market: str


@dataclass(frozen=True, slots=True)
class Assignment:
    """Versioned region shares per team, written by the nightly rebalance and read by ``plan``."""

    version: int
    shares: Mapping[str, Mapping[str, float]]
    """team → region → share of that team's demand (each team's shares sum to 1)."""
    region_load: Mapping[str, float] = field(default_factory=dict)
    """region → projected demand/supply ratio under these shares (> 1 means overloaded)."""
    created_at: str = ""
    source: str = ""
    gpu_shares: Mapping[str, Mapping[str, Mapping[str, float]]] = field(default_factory=dict)
    """team → GPU type → region → share of the team's demand for that GPU type (each sums to 1):
    where the rebalance moves a team's demand of each GPU type (``shares`` sums over the types)."""


@dataclass(frozen=True, slots=True)
class ClusterState:
    """What the planner sees besides the catalog: a snapshot, possibly stale (ParSync)."""

    reservations: tuple[Reservation, ...] = ()
    held_gpus: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(zone, GPU type) → GPUs held by live reservations besides ``reservations``, as the ledger
    keeps their sums (``Ledger.held_gpus``: a snapshot from the ledger reads the sums, not every row).
    The planner counts both; clearing what is held means clearing both."""
    assignment: Assignment | None = None
    replicas: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """dataset URI → regions holding a complete replica."""
    blocked_zones: frozenset[str] = frozenset()
    """Zones the planner must not use (e.g. just preempted there)."""
    dataset_bytes: Mapping[str, int] = field(default_factory=dict)
    """dataset URI → size in bytes (from its manifest or replicas), for the data transfer rule."""
    checkpoint: tuple[str, int] | None = None
    """(region whose bucket holds the run's newest checkpoint, its bytes) when a relaunch resumes
    from it: a placement in another region copies it there first, so the copy's hours and USD
    count as the dataset's do. None: nothing to bring (a first launch)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a run goes, what it costs, and why."""

    run_id: str
    cloud: str
    region: str
    zone: str
    gpu_type: str
    gpus_per_node: int
    num_nodes: int
    num_gpus: int
    market: str
    instance_type: str
    usd_per_hour: float
    """Price of the whole placement per hour (all nodes)."""
    explanation: tuple[str, ...] = ()
    assignment_version: int | None = None
    score: float = 0.0


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    path: str
    """Path relative to the dataset root."""
    size: int
    sha256: str
    crc32c: str | None = None
    """Hex crc32c of the same bytes (None in manifests written before it was recorded): what an
    object-store copy, which never reads the bytes, is checked against."""


@dataclass(frozen=True, slots=True)
class DatasetManifest:
    """Checksummed list of a dataset's files, written last when a copy completes."""

    dataset_uri: str
    files: tuple[ManifestEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"dataset_uri": self.dataset_uri, "files": [to_dict(f) for f in self.files]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DatasetManifest:
        return cls(
            dataset_uri=data["dataset_uri"],
            files=tuple(ManifestEntry(**f) for f in data["files"]),
        )


def run_key(run_id: str) -> str:
    """Path-safe, one-to-one form of an Airflow run_id, the name of the run's folder and records.

    The readable part keeps letters, digits, ``.``, ``_`` and ``-`` and replaces the rest with ``_``
    (at most 100 characters); a ``-`` and 12 hex digits of the run id's SHA-256 follow, so run ids
    that differ only in case or in replaced characters never share a folder or a Kubernetes label,
    and no key is ``.`` or ``..`` (``manual__2026-...+00:00`` → ``manual__2026-..._00_00-3f9a...``).
    """
    import hashlib
    import re

    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', run_id)[:100]}-{digest}"
