"""Per-catalog arrays the placement engine evaluates in one vectorised pass (built once per catalog).

A *candidate* is one offer (VM shape in a zone) on one market. Row ``i < M`` is offer ``i`` on spot,
row ``M + i`` the same offer on-demand; both rows also carry the offer's spot and on-demand prices
and spot preemption rate, so per-offer decisions (market=auto) are made row by row.
Capacity is per *group* = (zone, GPU type), shared by every VM shape and both markets.
Reservations are aggregated per group once per ``ClusterState`` snapshot (``used_gpus``), not per
offer, so a snapshot with 10,000 live reservations costs one pass.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from sailor_tasks.catalog import Catalog
from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, JobKey, ThroughputTable, packaged_with_measured
from sailor_tasks.model import ClusterState, Offer

UNLIMITED_GPUS = 1 << 40
"""Capacity of an offer with no supply entry (capacity_gpus None): not limited by the organisation."""

SPOT, ON_DEMAND = 0, 1
MARKET_NAMES = ("spot", "on_demand")


@dataclass(frozen=True)
class Columns:
    """The index's per-candidate arrays restricted to the rows a request evaluates."""

    offer: np.ndarray
    market: np.ndarray
    region: np.ndarray
    zone: np.ndarray
    gpu: np.ndarray
    group: np.ndarray
    gpn: np.ndarray
    price: np.ndarray
    rate: np.ndarray
    spot_price: np.ndarray
    od_price: np.ndarray
    spot_rate: np.ndarray
    spot_dirty: np.ndarray

    @classmethod
    def take(cls, index: CatalogIndex, rows: np.ndarray) -> Columns:
        return cls(
            offer=index.c_offer[rows],
            market=index.c_market[rows],
            region=index.c_region[rows],
            zone=index.c_zone[rows],
            gpu=index.c_gpu[rows],
            group=index.c_group[rows],
            gpn=index.c_gpn[rows],
            price=index.c_price[rows],
            rate=index.c_rate[rows],
            spot_price=index.c_spot_price[rows],
            od_price=index.c_od_price[rows],
            spot_rate=index.c_spot_rate[rows],
            spot_dirty=index.c_spot_dirty[rows],
        )


@dataclass(frozen=True)
class Subset:
    """The rows a (GPU type, GPU count) request evaluates, cached per index."""

    key: tuple[str, int]
    rows: np.ndarray
    base_fail: np.ndarray
    columns: Columns
    nodes: np.ndarray


@dataclass
class CatalogIndex:
    """Numpy arrays over the catalog's candidates plus name ↔ index maps."""

    catalog: Catalog
    throughput: ThroughputTable
    offers: tuple[Offer, ...]
    regions: tuple[str, ...]
    zones: tuple[str, ...]
    gpu_types: tuple[str, ...]
    groups: tuple[tuple[str, str], ...]
    """(zone, gpu_type) per capacity group."""
    region_idx: dict[str, int]
    zone_idx: dict[str, int]
    gpu_idx: dict[str, int]
    group_idx: dict[tuple[str, str], int]
    # per candidate row (2 × offers)
    c_offer: np.ndarray
    c_market: np.ndarray
    c_region: np.ndarray
    c_zone: np.ndarray
    c_gpu: np.ndarray
    c_group: np.ndarray
    c_gpn: np.ndarray
    c_price: np.ndarray
    """USD per VM-hour on the row's market."""
    c_rate: np.ndarray
    """Preemptions per VM-hour (0 on-demand)."""
    g_capacity: np.ndarray
    """GPUs per group the organisation may use."""
    region_continent: tuple[str, ...]
    bucket_usd_per_gb: np.ndarray
    """[src region, dst region] price of copying from a regional bucket."""
    bucket_gbps: np.ndarray
    c_spot_price: np.ndarray
    """The row's offer's spot price per VM-hour (same on both rows of an offer)."""
    c_od_price: np.ndarray
    c_spot_rate: np.ndarray
    """The row's offer's spot preemption rate (same on both rows of an offer)."""
    c_spot_dirty: np.ndarray
    job_types: Mapping[str, JobKey] = field(default_factory=lambda: dict(MODEL_JOB_TYPES))
    """Model name (``JobRequest.model``) → the throughput table's job key: SAILOR's built-in models
    by default; the simulator names each simulated job type (``simulator/routing.py``)."""
    _speed_cache: dict[tuple[str, bool], np.ndarray] = field(default_factory=dict)
    _subset_cache: dict[tuple[str, int], Subset] = field(default_factory=dict)
    _subset_speed_cache: dict[tuple[str, str, int], np.ndarray] = field(default_factory=dict)
    _regions_cache: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict)
    _origin_cache: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def links_from(self, region: str) -> tuple[np.ndarray, np.ndarray]:
        """(USD/GB, Gbit/s) of copying from ``region``'s bucket into each region's: the catalog's
        rows for one of its regions, else from the transfer file (a region with a bucket and no
        offer of the catalog)."""
        i = self.region_idx.get(region)
        if i is not None:
            return self.bucket_usd_per_gb[i], self.bucket_gbps[i]
        cached = self._origin_cache.get(region)
        if cached is None:
            links = [self.catalog.transfer.bucket_link(region, dst) for dst in self.regions]
            cached = (np.array([k.usd_per_gb for k in links]), np.array([k.gbps for k in links]))
            if len(self._origin_cache) < 1024:
                self._origin_cache[region] = cached
        return cached

    @property
    def num_candidates(self) -> int:
        return len(self.c_offer)

    def speed(self, model: str, consolidated: bool) -> np.ndarray:
        """Steps/s per candidate row for ``model`` (0 where the GPU type cannot run it)."""
        key = (model, consolidated)
        cached = self._speed_cache.get(key)
        if cached is None:
            job = self.job_types[model]
            per_gpu = np.array([self.throughput.throughput(job, g, consolidated) for g in self.gpu_types])
            cached = per_gpu[self.c_gpu]
            self._speed_cache[key] = cached
        return cached

    def subset(self, gpu_type: str, num_gpus: int) -> Subset:
        """The rows passing the first two validators, with their columns and VM counts.

        The gpu_type and gpu_count validators depend only on (GPU type, GPU count), so the rows
        they reject are computed once per pair; the engine evaluates the remaining rows only.
        ``base_fail`` holds 0 (gpu_type), 1 (gpu_count) or -1 (evaluated) for every row.
        """
        key = (gpu_type, num_gpus)
        cached = self._subset_cache.get(key)
        if cached is None:
            base = np.full(self.num_candidates, -1, dtype=np.int16)
            base[num_gpus % self.c_gpn != 0] = 1
            if gpu_type != "any":
                base[self.c_gpu != self.gpu_idx.get(gpu_type, -1)] = 0
            rows = np.flatnonzero(base < 0)
            columns = Columns.take(self, rows)
            cached = Subset(key, rows, base, columns, np.maximum(num_gpus // columns.gpn, 1))
            if len(self._subset_cache) < 4096:
                self._subset_cache[key] = cached
        return cached

    def spread(self, model: str, num_gpus: int) -> np.ndarray:
        """Per GPU type, the share of its speed a ``num_gpus``-GPU run of ``model`` keeps with its
        workers on several VMs: Gavel's unconsolidated / consolidated throughput of the model's job
        at the largest scale factor the table has up to ``num_gpus`` (1.0 where either is unknown).
        A scale factor of 1 measures one GPU, where spreading cannot show: a multi-VM run of a
        built-in model (``MODEL_JOB_TYPES``, scale 1) would otherwise never be slowed down."""
        name, _ = self.job_types[model]
        scales = [k for (n, k) in self.throughput.alone if n == name and 1 < k <= num_gpus]
        factor = np.ones(len(self.gpu_types))
        if scales:
            job = (name, max(scales))
            for i, g in enumerate(self.gpu_types):
                alone = self.throughput.throughput(job, g, consolidated=True)
                spread = self.throughput.throughput(job, g, consolidated=False)
                if alone > 0 and spread > 0 and job in self.throughput.unconsolidated:
                    factor[i] = spread / alone
        return factor

    def subset_speed(self, model: str, sub: Subset) -> np.ndarray:
        """Steps/s of ``model`` on each row of ``sub``. Multi-VM rows run at Gavel's unconsolidated
        throughput: the job's own for a job type of several GPUs (the simulator's), else the
        model's speed times its ``spread`` at the run's GPU count."""
        key = (model, *sub.key)
        cached = self._subset_speed_cache.get(key)
        if cached is None:
            alone = self.speed(model, consolidated=True)[sub.rows]
            if self.job_types[model][1] > 1:
                spread = self.speed(model, consolidated=False)[sub.rows]
            else:
                spread = alone * self.spread(model, sub.key[1])[self.c_gpu[sub.rows]]
            cached = np.where(sub.nodes > 1, spread, alone)
            if len(self._subset_speed_cache) < 16384:
                self._subset_speed_cache[key] = cached
        return cached

    def region_mask(self, regions: tuple[str, ...]) -> np.ndarray:
        """Boolean per region index: True for the named regions."""
        cached = self._regions_cache.get(regions)
        if cached is None:
            cached = np.zeros(len(self.regions), dtype=bool)
            for r in regions:
                i = self.region_idx.get(r)
                if i is not None:
                    cached[i] = True
            if len(self._regions_cache) < 4096:
                self._regions_cache[regions] = cached
        return cached

    def used_gpus(self, state: ClusterState) -> np.ndarray:
        """GPUs held by live reservations per group: the snapshot's sums (``held_gpus``) and its
        reservations (those outside the catalog are ignored)."""
        used = np.zeros(len(self.groups), dtype=np.int64)
        gi = self.group_idx
        for key, gpus in state.held_gpus.items():
            g = gi.get(key)
            if g is not None:
                used[g] += gpus
        for r in state.reservations:
            g = gi.get((r.zone, r.gpu_type))
            if g is not None:
                used[g] += r.gpus
        return used


def build_index(
    catalog: Catalog,
    throughput: ThroughputTable | None = None,
    job_types: Mapping[str, JobKey] | None = None,
) -> CatalogIndex:
    """Arrays over ``catalog``'s candidates; speeds from ``throughput`` (default: the packaged table)
    for the models named in ``job_types`` (default: SAILOR's built-in models)."""
    offers = catalog.offers
    regions = tuple(sorted({o.region for o in offers}))
    zones = tuple(sorted({o.zone for o in offers}))
    gpu_types = tuple(sorted({o.gpu_type for o in offers}))
    region_idx = {r: i for i, r in enumerate(regions)}
    zone_idx = {z: i for i, z in enumerate(zones)}
    gpu_idx = {g: i for i, g in enumerate(gpu_types)}
    group_idx: dict[tuple[str, str], int] = {}
    capacity: list[int] = []
    for o in offers:
        key = (o.zone, o.gpu_type)
        if key not in group_idx:
            group_idx[key] = len(group_idx)
            capacity.append(UNLIMITED_GPUS if o.capacity_gpus is None else int(o.capacity_gpus))
    m = len(offers)

    def both(values: list, dtype) -> np.ndarray:
        return np.array(values + values, dtype=dtype)

    transfer = catalog.transfer
    n_r = len(regions)
    usd = np.zeros((n_r, n_r))
    gbps = np.ones((n_r, n_r))
    for i, src in enumerate(regions):
        for j, dst in enumerate(regions):
            link = transfer.bucket_link(src, dst)
            usd[i, j], gbps[i, j] = link.usd_per_gb, link.gbps
    return CatalogIndex(
        catalog=catalog,
        throughput=throughput or _packaged_throughput(),
        offers=offers,
        regions=regions,
        zones=zones,
        gpu_types=gpu_types,
        groups=tuple(group_idx),
        region_idx=region_idx,
        zone_idx=zone_idx,
        gpu_idx=gpu_idx,
        group_idx=group_idx,
        c_offer=np.concatenate([np.arange(m), np.arange(m)]),
        c_market=np.array([SPOT] * m + [ON_DEMAND] * m, dtype=np.int8),
        c_region=both([region_idx[o.region] for o in offers], np.int32),
        c_zone=both([zone_idx[o.zone] for o in offers], np.int32),
        c_gpu=both([gpu_idx[o.gpu_type] for o in offers], np.int32),
        c_group=both([group_idx[(o.zone, o.gpu_type)] for o in offers], np.int32),
        c_gpn=both([o.gpus_per_node for o in offers], np.int64),
        c_price=np.array(
            [o.spot_usd_per_hour for o in offers] + [o.ondemand_usd_per_hour for o in offers], dtype=float
        ),
        c_rate=np.array([o.preemption_rate_per_hour for o in offers] + [0.0] * m, dtype=float),
        c_spot_price=both([o.spot_usd_per_hour for o in offers], float),
        c_od_price=both([o.ondemand_usd_per_hour for o in offers], float),
        c_spot_rate=both([o.preemption_rate_per_hour for o in offers], float),
        c_spot_dirty=both([o.spot_above_ondemand for o in offers], bool),
        g_capacity=np.array(capacity, dtype=np.int64),
        region_continent=tuple(transfer.continent(r) for r in regions),
        bucket_usd_per_gb=usd,
        bucket_gbps=gbps,
        job_types=dict(MODEL_JOB_TYPES if job_types is None else job_types),
    )


_LOCK = threading.Lock()
_INDEXES: dict[tuple[int, int], tuple[Catalog, ThroughputTable | None, CatalogIndex]] = {}


def _packaged_throughput() -> ThroughputTable:
    """The packaged table without measurements: the same object as ``packaged_with_measured(())``,
    so a planner with no measured speeds shares the default index."""
    return packaged_with_measured(())


def index_for(catalog: Catalog, throughput: ThroughputTable | None = None) -> CatalogIndex:
    """The (cached) index of ``catalog`` with speeds from ``throughput`` (default: the packaged
    table); built on first use, keyed by the identity of both."""
    throughput = throughput if throughput is not None else _packaged_throughput()
    key = (id(catalog), id(throughput))
    entry = _INDEXES.get(key)
    if entry is not None and entry[0] is catalog and entry[1] is throughput:
        return entry[2]
    with _LOCK:
        index = build_index(catalog, throughput)
        if len(_INDEXES) >= 16:
            _INDEXES.clear()
        _INDEXES[key] = (catalog, throughput, index)
    return index


def region_load_array(index: CatalogIndex, load: Mapping[str, float]) -> np.ndarray:
    """Per region index: projected demand/supply (NaN where the assignment says nothing)."""
    out = np.full(len(index.regions), np.nan)
    for r, v in load.items():
        i = index.region_idx.get(r)
        if i is not None:
            out[i] = float(v)
    return out
