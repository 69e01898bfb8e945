"""Routing simulated jobs across regions with the placement engine itself (no second heuristic).

``SimPlacement`` turns the simulated regions into a catalog the fast path understands and each
simulated job into a ``JobRequest``, then plans it with ``placement.plan_many`` on an index built
with the simulator's own throughput table (the matrix the policies allocate with). The simulator's
state is the engine's live view:

* queue load: demand/supply per region (GPUs asked for by the jobs admitted there, this one
  included, over the region's GPUs) is the assignment's ``region_load``, so the engine's
  ``overload`` preference (MAST soft balance) decides where load goes. The simulator's regions
  queue and time-share, so load is not a hard limit: capacity reservations would make a busy
  region infeasible instead of merely less attractive;
* spot availability: GPUs a region has lost right now are held by reservations, so the
  ``capacity`` validator sees only what is usable (recovery re-plans against this view);
* free GPUs: to start a job at once (``PlacementRouter.start_now``), GPUs that no job uses this
  round are all the engine may take (the rest are reservations), as ``plan`` sees the GPUs other
  runs hold; only when no region has room does the job queue where the load view puts it;
* blocked zones and markets come from the recovery strategies' ``PlacementConstraint``
  (``rounds/replan.py``) and stay with the job for its later placements.

A simulated region is one zone (``<region>-a``) with one capacity group per GPU type and VM shapes
of 1, 2, 4, ... GPUs up to the mechanism's server size; it sells one market (spot regions spot,
the others on-demand): the other market has no finite price and the requests carry a finite price
cap, so the ``market``/``price_cap`` validators drop it.

``LeastLoadedRouter`` (``hooks.py``) stays available as the explicitly named ``least_loaded``
baseline.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence

from sailor_tasks.catalog import Catalog
from sailor_tasks.catalog.throughput import JobKey, ThroughputTable
from sailor_tasks.model import Assignment, ClusterState, JobRequest, Offer, Placement, Reservation
from sailor_tasks.placement import QueuedRequest, plan_many
from sailor_tasks.placement.index import CatalogIndex, build_index
from sailor_tasks.policies.mechanism import GPUS_PER_SERVER
from sailor_tasks.simulator.rounds.hooks import LeastLoadedRouter, Region, Router
from sailor_tasks.simulator.rounds.workload import SimJob

SIM_CLOUD = "sim"
SIM_TEAM = "sim"
UNPRICED_USD_PER_GPU_HOUR = 1.0
"""Routing price of a GPU type a simulated region gives no price (e.g. K80, which the catalog no
longer sells, or a bench cluster without prices): the engine's preferences are in USD, so with a
zero price every candidate would score 0 and neither speed nor load could decide. With one price
for all unpriced types the engine ranks them by expected hours (the throughput table) and load.
Only routing sees it: the simulator's cost figure keeps the region's own prices."""
NO_PRICE_CAP = sys.float_info.max
"""Every routed request's ``max_usd_per_hour``: caps nothing real, but rejects the infinite price of
the market a simulated region does not sell."""
UNAVAILABLE_RUN = "sim-unavailable"
"""``run_id`` of the reservations that hold GPUs a region has lost (spot capacity gone)."""


def model_name(key: JobKey) -> str:
    """A simulated job type as a ``JobRequest.model`` name (Gavel's own key format,
    ``"('ResNet-50 (batch size 64)', 4)"``, which ``catalog.throughput.parse_job_key`` reads back)."""
    return repr(key)


def vm_shapes(gpus_per_server: int) -> tuple[int, ...]:
    """GPUs per VM offered in a simulated zone: 1, 2, 4, ... up to the server size."""
    shapes, n = [], 1
    while n <= gpus_per_server:
        shapes.append(n)
        n *= 2
    return tuple(shapes)


def region_offers(region: Region, gpu_types: Sequence[str], gpus_per_server: int) -> list[Offer]:
    """The offers of one simulated region (see the module docstring)."""
    zone = f"{region.name}-a"
    out = []
    for gpu in sorted(gpu_types):
        count = int(region.gpus.get(gpu, 0))
        if count <= 0:
            continue
        per_gpu = region.usd_per_gpu_hour.get(gpu) or UNPRICED_USD_PER_GPU_HOUR
        for gpn in vm_shapes(gpus_per_server):
            price = per_gpu * gpn
            out.append(
                Offer(
                    cloud=SIM_CLOUD,
                    region=region.name,
                    zone=zone,
                    gpu_type=gpu,
                    gpus_per_node=gpn,
                    instance_type=f"sim-{gpu.lower()}-{gpn}g",
                    ondemand_usd_per_hour=math.inf if region.spot else price,
                    spot_usd_per_hour=price if region.spot else math.inf,
                    capacity_gpus=count,
                )
            )
    return out


class SimPlacement:
    """The simulated regions as a placement catalog and index; plans simulated jobs through the
    placement engine (``plan_many``). Shared by the router and the recovery adapter."""

    def __init__(
        self, regions: Sequence[Region], table: ThroughputTable, gpus_per_server: int = GPUS_PER_SERVER
    ):
        names = [r.name for r in regions]
        if len(set(names)) != len(names):
            raise ValueError(f"simulated region names must be unique: {', '.join(names)}")
        self.regions = tuple(regions)
        self.region_index: dict[str, int] = {name: i for i, name in enumerate(names)}
        offers = [o for r in regions for o in region_offers(r, table.gpu_types, gpus_per_server)]
        if not offers:
            raise ValueError("no simulated region has GPUs of a type the throughput table knows")
        self.catalog = Catalog(offers=tuple(offers))
        self.index: CatalogIndex = build_index(
            self.catalog, table, {model_name(k): k for k in table.job_types}
        )
        self.zones_by_region: dict[str, tuple[str, ...]] = {r.name: (f"{r.name}-a",) for r in regions}
        self.placements: dict[str, Placement] = {}
        """Each job's current placement (planned without explanation, to keep 100k jobs small)."""
        self.constraints: dict[str, tuple[frozenset[str], str | None]] = {}
        """Blocked zones and market of each job's last recovery, applied to its later placements
        (a job waiting for GPUs is re-planned under the constraint its strategy set)."""
        self.errors = 0
        """Plans that found no feasible candidate."""
        self.last_error = ""
        self._starts: dict[tuple, Placement | None] = {}
        """``start_region``'s placements under the free-GPU view ``_starts_view``."""
        self._starts_view: tuple = ()
        self._length_free = not any(o.preemption_rate_per_hour > 0 for o in offers)
        """No offer has a preemption rate: the engine's choice does not depend on a job's length."""
        self._nominal = [
            [(gpu, int(n), f"{r.name}-a") for gpu, n in r.gpus.items() if int(n) > 0] for r in regions
        ]
        """Per region: (GPU type, GPUs, zone) of every type it has."""
        self._held: dict[tuple[str, str, int], Reservation] = {}
        """The reservation holding ``lost`` GPUs of a type in a region, by (region, type, lost):
        routing asks for the same few thousand at every call."""

    def pin(self, job: SimJob, region: int) -> None:
        """Keep ``job`` in ``region`` for its later placements: every other region's zone is
        blocked (its market is kept)."""
        name = self.regions[region].name
        blocked = frozenset(z for r, zones in self.zones_by_region.items() if r != name for z in zones)
        self.constraints[job.job_id] = (blocked, self.constraints.get(job.job_id, (frozenset(), None))[1])

    def request(self, job: SimJob, market: str | None = None) -> JobRequest:
        """The job as the fast path's request: its job type as the model, its scale factor as workers."""
        return JobRequest(
            job_name=job.job_id,
            team=SIM_TEAM,
            dataset_uri="",
            model=model_name(job.job_type),
            num_workers=job.scale_factor,
            market=market or "auto",
            max_usd_per_hour=NO_PRICE_CAP,
            total_steps=max(1, math.ceil(job.total_steps)),
        )

    def state(
        self,
        load: Sequence[float],
        available: Sequence[Mapping[str, int]] | None = None,
        blocked_zones: frozenset[str] = frozenset(),
    ) -> ClusterState:
        """The engine's view of the simulator: queue load as the assignment's ``region_load``,
        GPUs unavailable now as reservations, and the blocked zones."""
        held = []
        if available is not None:
            cache = self._held
            for region, nominal, usable in zip(self.regions, self._nominal, available, strict=True):
                for gpu, n, zone in nominal:
                    lost = n - int(usable.get(gpu, 0))
                    if lost > 0:
                        key = (region.name, gpu, lost)
                        r = cache.get(key)
                        if r is None:
                            r = cache[key] = Reservation(UNAVAILABLE_RUN, region.name, zone, gpu, lost, "spot")
                        held.append(r)
        loads = {r.name: float(v) for r, v in zip(self.regions, load, strict=True)}
        return ClusterState(
            reservations=tuple(held),
            assignment=Assignment(version=0, shares={}, region_load=loads, source="simulator"),
            blocked_zones=blocked_zones,
        )

    def place(
        self,
        job: SimJob,
        load: Sequence[float],
        available: Sequence[Mapping[str, int]] | None = None,
        blocked_zones: frozenset[str] = frozenset(),
        market: str | None = None,
        count_error: bool = True,
    ) -> Placement | None:
        """Plan ``job`` with the placement engine on the simulator's view; None when nothing is
        feasible (the engine's error is kept in ``last_error``, and counted in ``errors`` when
        ``count_error``)."""
        outcome = plan_many(
            [QueuedRequest(job.job_id, self.request(job, market))],
            self.catalog,
            self.state(load, available, blocked_zones),
            index=self.index,
            explain=False,
        )[0]
        if outcome.placement is None:
            self.errors += int(count_error)
            self.last_error = outcome.error or ""
            return None
        placement = outcome.placement
        self.placements[job.job_id] = placement
        return placement

    def place_now(
        self,
        job: SimJob,
        load: Sequence[float],
        free: Sequence[Mapping[str, int]],
        exclude: int | None = None,
    ) -> Placement | None:
        """Plan ``job`` on GPUs free now only (``free[r]`` per type), under its recovery
        constraint and never in region ``exclude``; None when no region has room."""
        blocked, market = self.constraints.get(job.job_id, (frozenset(), None))
        if exclude is not None:
            blocked = blocked | frozenset(self.zones_by_region[self.regions[exclude].name])
        s = job.scale_factor
        if not any(
            max(f.values(), default=0) >= s and not blocked.issuperset(self.zones_by_region[r.name])
            for r, f in zip(self.regions, free, strict=True)
        ):
            # The engine's capacity validator would reject every candidate: no region the job
            # may go to has that many GPUs of one type free.
            self.last_error = f"no region open to job {job.job_id} has {s} free GPUs of one type"
            return None
        return self.place(job, load, free, blocked, market, count_error=False)

    def start_region(
        self,
        job: SimJob,
        load: Sequence[float],
        free: Sequence[Mapping[str, int]],
        exclude: int | None = None,
    ) -> tuple[int, str] | None:
        """``place_now``'s (region index, GPU type), asked of the engine once per job type, origin,
        constraint and view while the engine's choice cannot depend on a job's length: without
        preemption rates in the simulated catalog (and no deadlines, no data) every preference
        scales with the job's expected hours, so jobs of one type get the same answer until the
        free GPUs or the loads change. The job's placement is the cached one under its own run id
        (its ``score`` is the first job's)."""
        if not self._length_free:
            p = self.place_now(job, load, free, exclude)
            return None if p is None else (self.region_index[p.region], p.gpu_type)
        view = tuple(tuple(f.items()) for f in free)
        if view != self._starts_view:
            self._starts.clear()
            self._starts_view = view
        key = (job.job_type, exclude, *self.constraints.get(job.job_id, (frozenset(), None)), tuple(load))
        if key in self._starts:
            p = self._starts[key]
            if p is not None:
                self.placements[job.job_id] = dataclasses.replace(p, run_id=job.job_id)
        else:
            p = self._starts[key] = self.place_now(job, load, free, exclude)
        return None if p is None else (self.region_index[p.region], p.gpu_type)

    def current(self, job: SimJob, region: int) -> Placement:
        """The job's placement in ``region``: the one the engine chose, or (a job routed by another
        router) the engine's best placement pinned to that region at nominal capacity."""
        p = self.placements.get(job.job_id)
        name = self.regions[region].name
        if p is not None and p.region == name:
            return p
        pinned = dataclasses.replace(self.request(job), regions=(name,))
        outcome = plan_many(
            [QueuedRequest(job.job_id, pinned)],
            self.catalog,
            self.state([0.0] * len(self.regions)),
            index=self.index,
            explain=False,
        )[0]
        if outcome.placement is None:
            raise ValueError(f"job {job.job_id} cannot run in region {name}: {outcome.error}")
        p = outcome.placement
        self.placements[job.job_id] = p
        return p


class PlacementRouter:
    """Route each arriving job where the placement engine places it (region and GPU type)."""

    name = "placement"

    def __init__(self, sim: SimPlacement):
        self.sim = sim
        self.gpu_types: Counter[str] = Counter()
        """GPU type the engine chose per routed job (the region's policy then time-shares types)."""

    def route(self, job: SimJob, runnable: Sequence[bool], load: Sequence[float]) -> int:
        """The engine's region for ``job`` (``runnable`` is not consulted: the engine's own
        validators decide which regions can run it).

        Raises:
            ValueError: no region can run the job (the engine's error is in the message).
        """
        p = self.sim.place(job, load)
        if p is None:
            raise ValueError(
                f"job {job.job_id} {job.job_type!r}: no region can run it ({self.sim.last_error})"
            )
        self.gpu_types[p.gpu_type] += 1
        return self.sim.region_index[p.region]

    def start_now(
        self,
        job: SimJob,
        load: Sequence[float],
        free: Sequence[Mapping[str, int]],
        exclude: int | None = None,
    ) -> int | None:
        """The engine's region for ``job`` among those with room for it now (``free``), never
        ``exclude``; None when there is none. An arriving job (``exclude`` None) is counted in
        ``summary`` like a routed one."""
        start = self.sim.start_region(job, load, free, exclude)
        if start is None:
            return None
        if exclude is None:
            self.gpu_types[start[1]] += 1
        return start[0]

    def summary(self) -> dict[str, int]:
        return dict(sorted(self.gpu_types.items()))


ROUTERS: tuple[str, ...] = ("placement", "least_loaded")
"""``placement``: the placement engine (default); ``least_loaded``: the lowest demand/supply among
regions that can run the job (the baseline the simulator had before it called the engine)."""


def make_router(name: str, sim: SimPlacement) -> Router:
    """The router called ``name``.

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    if name == "placement":
        return PlacementRouter(sim)
    if name == "least_loaded":
        return LeastLoadedRouter()
    raise ValueError(f"router={name!r} is not a router; valid: {', '.join(ROUTERS)}")
