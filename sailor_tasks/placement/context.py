"""What the rules need to know about one request on every candidate: nodes, expected duration,
preemption overhead, data transfer cost and time, and the snapshot's free capacity.

All arrays are per candidate row of the ``CatalogIndex`` (see ``index.py``) unless named ``r_*``
(per region). Pure numpy; built once per request and shared by validators and preferences.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sailor_tasks.model import ClusterState, JobRequest
from sailor_tasks.placement.index import CatalogIndex, Columns, region_load_array
from sailor_tasks.settings import SOURCE_BUCKET

RESTART_HOURS = 0.1
"""Time to get a replacement spot VM running and the checkpoint loaded after a preemption (6 min;
planning value: GCE VM start plus image/ checkpoint pull, of the order SkyPilot and Can't-Be-Late
(NSDI'24, "changeover delay") use)."""
SECONDS_PER_HOUR = 3600.0
BITS_PER_BYTE = 8.0


@dataclass
class PlanningView:
    """The mutable part of a snapshot the engine plans against: GPUs held per capacity group,
    blocked zones, and the assignment's region loads as an array. ``plan_many`` updates ``used``
    as it places a queue, so later requests see earlier ones."""

    used: np.ndarray
    blocked_zones: frozenset[str]
    blocked_mask: np.ndarray
    """Per zone index: True when blocked."""
    r_load: np.ndarray
    """Per region: projected demand/supply from the assignment (NaN: unknown)."""
    r_over: np.ndarray
    """Per region: max(load - 1, 0), 0 where unknown."""
    r_under: np.ndarray
    """Per region: max(1 - load, 0), 0 where unknown."""

    @classmethod
    def from_state(cls, index: CatalogIndex, state: ClusterState) -> PlanningView:
        blocked = np.zeros(len(index.zones), dtype=bool)
        for z in state.blocked_zones:
            i = index.zone_idx.get(z)
            if i is not None:
                blocked[i] = True
        load = state.assignment.region_load if state.assignment is not None else {}
        r_load = region_load_array(index, load or {})
        # Unknown loads (NaN) count as balanced (1.0): neither overload nor underload.
        balanced = np.where(np.isnan(r_load), 1.0, r_load)
        return cls(
            used=index.used_gpus(state),
            blocked_zones=frozenset(state.blocked_zones),
            blocked_mask=blocked,
            r_load=r_load,
            r_over=np.maximum(balanced - 1.0, 0.0),
            r_under=np.maximum(1.0 - balanced, 0.0),
        )

    def copy(self) -> PlanningView:
        return dataclasses.replace(self, used=self.used.copy())


def dataset_origin(request: JobRequest) -> str | None:
    """The region of the dataset's own URI (``sailor://<region>/...``), which every copy reads
    (``place_data``, the rebalance's replication), whether or not the catalog sells VMs there;
    None when unknown (``sailor://source``, ``gs://``, ``file://``)."""
    scheme, _, rest = request.dataset_uri.partition("://")
    if scheme == "sailor":
        bucket = rest.split("/", 1)[0]
        if bucket and bucket != SOURCE_BUCKET:
            return bucket
    return None


def dataset_sources(
    request: JobRequest, state: ClusterState, index: CatalogIndex, origin: str | None
) -> tuple[str, ...]:
    """Regions of the catalog that hold a complete copy of the dataset: recorded replicas, plus
    its ``origin`` (``dataset_origin``). Empty when unknown."""
    regions = {*state.replicas.get(request.dataset_uri, ()), *([origin] if origin is not None else [])}
    return tuple(sorted(r for r in regions if r in index.region_idx))


@dataclass
class RequestContext:
    """Derived per-candidate quantities for one request against one view.

    Only the rows that pass the GPU type and GPU count rules are evaluated (``rows``, indices into
    the catalog index); every per-candidate array here is aligned with ``rows``.
    """

    index: CatalogIndex
    request: JobRequest
    state: ClusterState
    view: PlanningView
    rows: np.ndarray
    base_fail: np.ndarray
    """First failure over the whole index for the GPU type/count rules (-1: evaluated row)."""
    c: Columns
    num_gpus: int
    nodes: np.ndarray
    speed: np.ndarray
    """Steps/s of the model on the row's GPU type (multi-node rows use unconsolidated throughput)."""
    hours: np.ndarray
    """Expected training hours without preemptions (inf where the model cannot run)."""
    usd_per_hour: np.ndarray
    """Price of the whole placement per hour on the row's market."""
    expected_preemptions: np.ndarray
    """Expected spot preemptions of the row's offer over ``hours`` (also on on-demand rows)."""
    lost_hours_per_preemption: np.ndarray
    spot_overhead_hours: np.ndarray
    """Expected hours a spot placement of this offer loses to preemptions."""
    overhead_hours: np.ndarray
    """The same on the row's market (0 on-demand)."""
    dataset_gb: float
    sources: tuple[str, ...]
    r_data_usd_per_gb: np.ndarray
    r_data_hours: np.ndarray
    """Per region: hours to copy the dataset there, and the run's checkpoint (``ClusterState.checkpoint``)."""
    r_data_source: np.ndarray
    """Per region: index of the region its copy of the dataset reads (itself where it holds one; -1:
    the dataset's origin, ``data_origin``, when that is no region of the catalog or unknown)."""
    data_origin: str | None
    r_checkpoint_usd: np.ndarray
    """Per region: USD of copying the run's checkpoint there (0 without one, or in its region)."""

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def data_hours(self) -> np.ndarray:
        return self.r_data_hours[self.c.region]

    @property
    def free_gpus(self) -> np.ndarray:
        return (self.index.g_capacity - self.view.used)[self.c.group]


def build_context(
    index: CatalogIndex, request: JobRequest, state: ClusterState, view: PlanningView
) -> RequestContext:
    num_gpus = request.num_gpus
    sub = index.subset(request.gpu_type, num_gpus)
    rows, base_fail, c, nodes = sub.rows, sub.base_fail, sub.columns, sub.nodes
    speed = index.subset_speed(request.model, sub)
    with np.errstate(divide="ignore"):
        step_hours = np.where(speed > 0, 1.0 / (np.where(speed > 0, speed, 1.0) * SECONDS_PER_HOUR), np.inf)
    hours = request.total_steps * step_hours
    usd_per_hour = nodes * c.price
    with np.errstate(invalid="ignore"):
        expected_preemptions = c.spot_rate * nodes * hours
        # Work lost per preemption: half a checkpoint interval on average (an unnoticed preemption
        # loses everything since the last checkpoint) plus the restart.
        lost = 0.5 * request.checkpoint_every_steps * step_hours + RESTART_HOURS
        spot_overhead = np.where(c.spot_rate > 0, expected_preemptions * lost, 0.0)
    overhead = np.where(c.rate > 0, spot_overhead, 0.0)

    origin = dataset_origin(request)
    sources = dataset_sources(request, state, index, origin)
    nbytes = state.dataset_bytes.get(request.dataset_uri, 0)
    gb = nbytes / 1e9
    n_r = len(index.regions)
    if (sources or origin is not None) and gb > 0:
        # A region holding a complete copy only verifies it (its own bucket's link); any other
        # copies from the dataset's origin, which every copy reads, not from a replica; with the
        # origin unknown (and some region holding a copy), at the dearest and slowest link into
        # the region from any region. Origin unknown and no copy anywhere: nothing is charged.
        if origin is not None:
            usd_from, gbps_from = index.links_from(origin)
            r_usd, r_gbps = usd_from.copy(), gbps_from.copy()
            r_source = np.full(n_r, index.region_idx.get(origin, -1))
        else:
            r_usd, r_gbps = index.bucket_usd_per_gb.max(axis=0), index.bucket_gbps.min(axis=0)
            r_source = np.full(n_r, -1)
        held = np.array([index.region_idx[r] for r in sources], dtype=np.int64)
        r_usd[held] = index.bucket_usd_per_gb[held, held]
        r_gbps[held] = index.bucket_gbps[held, held]
        r_source[held] = held
        r_hours = gb * BITS_PER_BYTE / r_gbps / SECONDS_PER_HOUR
    else:
        r_usd = np.zeros(n_r)
        r_hours = np.zeros(n_r)
        r_source = np.full(n_r, -1)
    r_ckpt_usd = np.zeros(n_r)
    if state.checkpoint is not None and state.checkpoint[0] in index.region_idx and state.checkpoint[1] > 0:
        # A relaunch in another region copies the checkpoint from its region's bucket first.
        src_c = index.region_idx[state.checkpoint[0]]
        gb_c = state.checkpoint[1] / 1e9
        away = np.arange(n_r) != src_c
        r_ckpt_usd = np.where(away, gb_c * index.bucket_usd_per_gb[src_c], 0.0)
        r_hours = r_hours + np.where(
            away, gb_c * BITS_PER_BYTE / index.bucket_gbps[src_c] / SECONDS_PER_HOUR, 0.0
        )
    return RequestContext(
        index=index,
        request=request,
        state=state,
        view=view,
        rows=rows,
        base_fail=base_fail,
        c=c,
        num_gpus=num_gpus,
        nodes=nodes,
        speed=speed,
        hours=hours,
        usd_per_hour=usd_per_hour,
        expected_preemptions=expected_preemptions,
        lost_hours_per_preemption=lost,
        spot_overhead_hours=spot_overhead,
        overhead_hours=overhead,
        dataset_gb=gb,
        sources=sources,
        r_data_usd_per_gb=r_usd,
        r_data_hours=r_hours,
        r_data_source=r_source,
        data_origin=origin,
        r_checkpoint_usd=r_ckpt_usd,
    )
