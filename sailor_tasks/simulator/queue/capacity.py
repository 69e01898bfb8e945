"""Simulated spot and on-demand capacity behind the placement engine: the queue simulator's
``Reserver`` (``sailor_tasks.queue.admit``), in place of the ledger the live queue reserves in.

The capacity is two simulated regions of ``simulator.rounds.SimPlacement``: ``spot`` (one zone
selling only spot, the GPUs the queue shares) and ``on-demand`` (one zone selling only
on-demand, capped or not). Every run a pass admits is planned by ``placement.engine.plan`` (the
function the live ``plan_and_reserve`` calls) on a ``ClusterState`` whose reservations are the
GPUs the running runs hold, so the engine's capacity validator and its deadline rule decide
exactly as they do live, and its preferences pick the GPU type (compute cost at the region's
prices). A run holds its GPUs, without preemption, for its training hours on the placement (the
engine's throughput table, unconsolidated on more than one VM) plus one launch.

A run's own market is the one it asks for, spot for ``auto`` (the market strategies' choice,
``strategies.live.decide_market``, is not simulated: it takes its estimates from the engine's
``explain``, which knows only the built-in models' names, not the simulator's job types). At its
latest start admission forces on-demand, as live.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sailor_tasks.catalog.throughput import ThroughputTable
from sailor_tasks.model import ClusterState, JobRequest, Placement, Reservation
from sailor_tasks.placement.context import RESTART_HOURS
from sailor_tasks.placement.engine import plan
from sailor_tasks.placement.index import UNLIMITED_GPUS
from sailor_tasks.policies.mechanism import GPUS_PER_SERVER
from sailor_tasks.queue.admission import HeldRun, QueuedRun
from sailor_tasks.queue.estimate import estimate_hours
from sailor_tasks.simulator.queue.workload import QueueJob
from sailor_tasks.simulator.rounds.hooks import Region
from sailor_tasks.simulator.rounds.routing import NO_PRICE_CAP, SimPlacement, model_name

SPOT_REGION = "spot"
ON_DEMAND_REGION = "on-demand"
LAUNCH_S = RESTART_HOURS * 3600.0
"""Seconds from admission to training (one launch), the planning value the live queue's expected
hours add (``placement.context.RESTART_HOURS``)."""


def catalog_prices(gpu_types: Iterable[str], market: str) -> dict[str, float]:
    """Cheapest USD per GPU-hour of each type in the packaged catalog on ``market`` (types it does
    not sell are left out)."""
    from sailor_tasks.catalog import load_catalog

    wanted = set(gpu_types)
    prices: dict[str, float] = {}
    for offer in load_catalog().offers:
        if offer.gpu_type in wanted:
            p = offer.usd_per_gpu_hour(market)
            if math.isfinite(p):
                prices[offer.gpu_type] = min(p, prices.get(offer.gpu_type, p))
    return prices


@dataclass(frozen=True, slots=True)
class Hold:
    """GPUs a run holds from admission to its end."""

    run_id: str
    team: str
    placement: Placement
    start_s: float
    end_s: float

    @property
    def market(self) -> str:
        return self.placement.market

    @property
    def gpus(self) -> int:
        return self.placement.num_gpus

    @property
    def reservation(self) -> Reservation:
        p = self.placement
        return Reservation(self.run_id, p.region, p.zone, p.gpu_type, p.num_gpus, p.market)


class SimCapacity:
    """Spot GPUs (the pool the queue's policy divides) and on-demand GPUs (``None``: not capped),
    planned through the placement engine; see the module.

    Args:
        prices: market → GPU type → USD per GPU-hour (default: the packaged catalog's cheapest;
            a type without a price is priced as ``rounds.routing`` prices it).
    """

    def __init__(
        self,
        table: ThroughputTable,
        spot_gpus: Mapping[str, int],
        on_demand_gpus: Mapping[str, int] | None = None,
        prices: Mapping[str, Mapping[str, float]] | None = None,
        gpus_per_server: int = GPUS_PER_SERVER,
    ):
        if not any(n > 0 for n in spot_gpus.values()):
            raise ValueError(f"spot capacity {dict(spot_gpus)}: no GPUs")
        self.table = table
        self.spot_gpus = {g: int(n) for g, n in spot_gpus.items() if n > 0}
        self.capped = on_demand_gpus is not None
        od = (
            dict(on_demand_gpus)
            if on_demand_gpus is not None
            else dict.fromkeys(self.spot_gpus, UNLIMITED_GPUS)
        )
        self.on_demand_gpus = {g: int(n) for g, n in od.items() if n > 0}
        types = set(self.spot_gpus) | set(self.on_demand_gpus)
        if prices is None:
            prices = {m: catalog_prices(types, m) for m in ("spot", "on_demand")}
        regions = [Region(SPOT_REGION, self.spot_gpus, dict(prices.get("spot", {})), spot=True)]
        if self.on_demand_gpus:
            regions.append(Region(ON_DEMAND_REGION, self.on_demand_gpus, dict(prices.get("on_demand", {}))))
        self.placement = SimPlacement(regions, table, gpus_per_server)
        self.now_s = 0.0
        """The simulated clock, set by the simulator before each pass."""
        self.jobs: dict[str, QueueJob] = {}
        self.holds: dict[str, Hold] = {}
        self.ended: dict[str, tuple[str, str]] = {}
        """run → (state, reason) of runs the queue turned away (timed_out, failed)."""
        self.admitted: list[Hold] = []
        """Every hold, in admission order."""

    # --- the run as the engine sees it -----------------------------------------------------------

    def request(self, job: QueueJob, market: str, deadline_hours: float | None = None) -> JobRequest:
        """``job`` as the fast path's request: its job type as the model, its GPUs as workers."""
        return JobRequest(
            job_name=job.run_id,
            team=job.team,
            dataset_uri="",
            model=model_name(job.job_type),
            num_workers=job.gpus,
            market=market,
            max_usd_per_hour=NO_PRICE_CAP,
            total_steps=max(1, math.ceil(job.total_steps)),
            deadline_hours=deadline_hours,
            priority=job.priority,
            max_queue_hours=job.max_queue_hours,
        )

    def hold_s(self, job: QueueJob, placement: Placement) -> float:
        """Seconds ``job`` holds ``placement``: training at the engine's speed plus one launch."""
        speed = self.table.throughput(job.job_type, placement.gpu_type, consolidated=placement.num_nodes == 1)
        if speed <= 0:
            raise ValueError(f"run {job.run_id}: {job.job_type} has no throughput on {placement.gpu_type}")
        return job.total_steps / speed + LAUNCH_S

    def expected_s(self, job: QueueJob) -> float | None:
        """Seconds the run is expected to hold capacity, as the live queue estimates it
        (``queue.estimate_hours``: its best on-demand offer, its fastest with a deadline) plus
        one launch. None: no offer can run it."""
        req = self.request(job, job.market, job.deadline_hours)
        est = estimate_hours(req, self.placement.catalog, ClusterState(), self.placement.index)
        return None if est is None else (est.hours + est.data_hours) * 3600.0 + LAUNCH_S

    def throughput(self, job: QueueJob) -> dict[str, float]:
        """Steps/s of the run on each GPU type of the shared (spot) pool: the policies' matrix."""
        return {g: self.table.throughput(job.job_type, g) for g in self.spot_gpus}

    # --- the Reserver ----------------------------------------------------------------------------

    def state(self) -> ClusterState:
        """The engine's view: every GPU a running run holds is reserved."""
        return ClusterState(reservations=tuple(h.reservation for h in self.holds.values()))

    def reserve(self, run: QueuedRun, market: str | None, deadline_hours: float | None) -> bool | None:
        job = self.jobs[run.run_id]
        if run.run_id in self.holds or run.run_id in self.ended:
            return None
        chosen = market or ("on_demand" if job.market == "on_demand" else "spot")
        req = self.request(job, chosen, deadline_hours)  # the engine's deadline rule counts one launch
        placement = plan(req, self.placement.catalog, self.state(), run.run_id, index=self.placement.index)
        placement = dataclasses.replace(placement, explanation=())
        hold = Hold(run.run_id, job.team, placement, self.now_s, self.now_s + self.hold_s(job, placement))
        self.holds[run.run_id] = hold
        self.admitted.append(hold)
        return True

    def end(self, run: QueuedRun, state: str, reason: str) -> bool:
        if run.run_id in self.ended or run.run_id in self.holds:
            return False
        self.ended[run.run_id] = (state, reason)
        return True

    def release(self, run_id: str) -> Hold:
        """The run ended: its GPUs are free."""
        return self.holds.pop(run_id)

    def held(self) -> list[HeldRun]:
        """The runs holding GPUs of the shared (spot) pool, as admission sees them."""
        out = []
        for h in self.holds.values():
            if h.placement.region != SPOT_REGION:
                continue
            job = self.jobs[h.run_id]
            left = max(0.0, (h.end_s - self.now_s) / max(h.end_s - h.start_s, 1e-9))
            out.append(
                HeldRun(
                    run_id=h.run_id,
                    team=h.team,
                    gpus=h.gpus,
                    gpu_type=h.placement.gpu_type,
                    throughput=self.throughput(job),
                    started_s=h.start_s,
                    expected_end_s=h.end_s,
                    steps_remaining=job.total_steps * left,
                )
            )
        return out

    def used(self) -> dict[tuple[str, str], int]:
        """(zone, GPU type) → GPUs held now."""
        out: dict[tuple[str, str], int] = {}
        for h in self.holds.values():
            key = (h.placement.zone, h.placement.gpu_type)
            out[key] = out.get(key, 0) + h.gpus
        return out

    def capacity_of(self) -> dict[tuple[str, str], int]:
        """(zone, GPU type) → GPUs (each zone's capacity group)."""
        return {(o.zone, o.gpu_type): int(o.capacity_gpus or 0) for o in self.placement.catalog.offers}
