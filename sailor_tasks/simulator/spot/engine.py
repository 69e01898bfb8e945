"""Job-level discrete-event simulator of spot economics: market strategies on real prices and traces.

The world (``SpotMarket``): zones of the catalog with their real spot and on-demand prices per VM
size; spot capacity per zone follows an availability trace (``SpotZone``); on-demand capacity is
always there. Moving a run to another region costs the catalog's transfer model (dataset from its
nearest copy, checkpoint from the region that holds it: hours at the link's Gbit/s, USD per GB).

A job (``SpotJob``) needs ``num_gpus`` GPUs of one type on one VM for ``work_h`` hours and has a
deadline. Its **deadline** is ``arrival + (1 + slack) × on-demand time``, where the on-demand time
is the launch of the best on-demand option at arrival (provisioning + data transfer) plus ``work_h``:
a job run on-demand from arrival always finishes with ``slack × on-demand time`` to spare.

Jobs compete for spot capacity (``compete=True``, the default): a zone's trace is its capacity
(``SpotZone.spot_capacity``: a count trace's GPUs, or for a single-node trace the zone's catalog
capacity while it is available), and the spot GPUs jobs hold there take from it. Jobs are simulated
one after another in arrival order against a ``SpotLedger`` of the spot GPUs earlier arrivals hold
in each zone over time, so capacity goes to jobs in arrival order: a job sees a zone as full while
earlier ones hold its capacity, and is preempted when an earlier arrival claims the GPUs it holds
(``preempted_by_competition``) as well as when the trace takes them away. ``compete=False`` runs
every job alone against the traces. Events, per job: arrival → the strategy's ``choose_market`` → launch where SAILOR's placement
engine puts that market (``place``: the same ``placement.engine.plan`` the live ``plan`` stage
calls, on a catalog made of the job's simulated zones, with the strategy's blocked zones and, for
spot, every zone whose trace has no capacity now), or wait when no spot zone has capacity →
provisioning (``restart_h`` + transfer hours, billed) →
training (1 work-hour per hour, periodic checkpoints every ``checkpoint_every_h`` of work) → at a
trace slot where the zone loses capacity: preemption. A strategy that ``checkpoint_on_notice``
saves at the notice (``notice_s`` before the loss) and loses only the notice window; the others
lose the work since their last periodic checkpoint. The strategy's ``next_constraint`` says where
the run may relaunch (blocked zones/regions, or a zone to wait for; a block ``until_capacity``
holds for spot only while the zone has no capacity), then ``choose_market`` picks the market
again. Every ``tick_s`` the strategy is asked again: it may switch market, or, training on spot,
move to the zone the engine would launch spot in now (``MarketContext.spot_move``); a voluntary
switch or move checkpoints first, loses nothing, and brings that checkpoint from where the run
was. Every launch plans with the checkpoint it resumes from (``ClusterState.checkpoint``). Cost =
billed hours (provisioning and training, per second) × the zone's price for the VM on that
market, plus transfer USD.

Deterministic: the only randomness is the job generator's and the trace offsets', both seeded.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sailor_tasks.catalog.offers import Catalog
from sailor_tasks.catalog.transfer import TransferTable
from sailor_tasks.errors import NoFeasibleOfferError
from sailor_tasks.model import ClusterState, JobRequest, Offer, Placement
from sailor_tasks.placement.context import BITS_PER_BYTE, RESTART_HOURS, SECONDS_PER_HOUR
from sailor_tasks.placement.engine import plan
from sailor_tasks.strategies import (
    MarketContext,
    PlacementConstraint,
    PreemptionRecord,
    RecoveryContext,
    SpotMove,
    get_strategy,
)
from sailor_tasks.traces.availability import AvailabilityTrace

NOTICE_S = 30.0
"""GCE spot preemption notice (ACPI soft-off 30 s before the stop; GCP docs, 2026)."""
CHECKPOINT_SAVE_S = 20.0
"""Time to save a checkpoint at the notice; must fit in ``NOTICE_S`` for the save to count
(bench/checkpoint.py measures the trainer's save)."""
CHECKPOINT_EVERY_H = 0.5
"""Periodic checkpoint interval in work hours (a common 30-minute setting for multi-hour jobs)."""
TICK_S = 300.0
"""How often a run's strategy is asked again when nothing happens (5 minutes)."""
ESTIMATE_SLOT_S = 900.0
"""Between launches the strategy's inputs for the market a run is not on (where and at what price
it would launch) come from one engine placement per job and 15-minute slot (the GCP traces' ping
interval); the blocked zones and data locations are part of the cache key, so only the remaining
work and the time to the deadline are up to one slot old. Launches always plan afresh."""


@dataclass(frozen=True, slots=True)
class SpotParams:
    restart_h: float = RESTART_HOURS
    notice_s: float = NOTICE_S
    checkpoint_save_s: float = CHECKPOINT_SAVE_S
    checkpoint_every_h: float = CHECKPOINT_EVERY_H
    tick_s: float = TICK_S
    horizon_h: float = 24 * 14.0
    """Per job: stop simulating this long after arrival (the job counts as unfinished)."""

    def __post_init__(self) -> None:
        for name in (
            "restart_h",
            "notice_s",
            "checkpoint_save_s",
            "checkpoint_every_h",
            "tick_s",
            "horizon_h",
        ):
            v = getattr(self, name)
            if not v > 0 and not (name in ("notice_s", "checkpoint_save_s", "restart_h") and v == 0):
                raise ValueError(f"SpotParams.{name}={v!r}: need a number > 0")


@dataclass(frozen=True)
class SpotZone:
    """One catalog zone for one GPU type: prices per VM size and its spot availability trace."""

    zone: str
    region: str
    gpu_type: str
    spot_usd: Mapping[int, float]
    """GPUs per VM → spot USD per VM-hour (sizes without a clean spot price are left out)."""
    on_demand_usd: Mapping[int, float]
    preemption_rate_per_hour: float = 0.0
    """The catalog's (supply) expected preemptions per hour: what a live strategy knows."""
    trace: AvailabilityTrace | None = None
    """None: no spot capacity data for this zone, so no spot offer."""
    trace_offset_s: float = 0.0
    trace_name: str = ""
    capacity_gpus: int | None = None
    """The zone's GPUs of this type in the catalog's supply (None: not known): its spot capacity
    while a single-node trace says available."""

    def usd_per_hour(self, market: str, gpus: int) -> float:
        table = self.spot_usd if market == "spot" else self.on_demand_usd
        return table.get(gpus, math.inf)

    def spot_capacity(self, t_s: float) -> float:
        """Spot GPUs the zone has at simulated second ``t_s`` (the trace repeats): a count trace's
        value, or for a single-node (``unavailable_flag``) trace, while available, the zone's
        catalog capacity (unlimited when the catalog gives none); 0 without a trace."""
        if self.trace is None:
            return 0.0
        v = self.trace.at(t_s + self.trace_offset_s)
        if self.trace.kind == "unavailable_flag":
            if v != 0:
                return 0.0
            return math.inf if self.capacity_gpus is None else float(self.capacity_gpus)
        return float(v)

    def spot_available(self, t_s: float, gpus: int) -> bool:
        """Spot capacity for a ``gpus``-GPU VM at simulated second ``t_s``, no other job counted."""
        return gpus in self.spot_usd and self.spot_capacity(t_s) >= gpus

    def next_slot_s(self, t_s: float) -> float:
        """Start of the trace slot after the one holding ``t_s``: the first time after ``t_s`` at
        which ``spot_capacity`` reads the next slot."""
        if self.trace is None:
            return math.inf
        gap, off = self.trace.gap_seconds, self.trace_offset_s
        slot = (t_s + off) // gap  # as ``Trace.slot`` reads it
        nxt = (slot + 1) * gap - off
        # In floating point the boundary so computed can land on or before ``t_s``, or still read
        # the slot of ``t_s`` (a gap such as 15.3 s): step to the first time past it that reads
        # the next slot, so that the simulation always moves on and sees the change.
        while nxt <= t_s or (nxt + off) // gap <= slot:
            # One step of the sum ``nxt + off`` (what the slot is read from), not of ``nxt`` alone,
            # which is far smaller when ``nxt`` is small beside the offset.
            nxt = max(math.nextafter(nxt, math.inf), nxt + math.ulp(nxt + off))
        return nxt


@dataclass(frozen=True)
class SpotMarket:
    zones: tuple[SpotZone, ...]
    transfer: TransferTable
    _catalogs: dict[tuple[str, int], Catalog] = field(default_factory=dict, compare=False, repr=False)

    def zones_for(self, gpu_type: str, gpus: int) -> tuple[SpotZone, ...]:
        return tuple(z for z in self.zones if z.gpu_type == gpu_type and gpus in z.on_demand_usd)

    def engine_catalog(self, gpu_type: str, gpus: int) -> Catalog:
        """The catalog the placement engine plans a ``gpus``-GPU ``gpu_type`` job on: one offer (a
        ``gpus``-GPU VM) per simulated zone that sells it, with the zone's prices and catalog
        preemption rate. A simulated job runs on one VM, so other VM shapes are not offered; capacity
        is left unlimited (the trace and the ``SpotLedger`` are the spot capacity signal: zones
        without free spot GPUs are blocked at planning time). Cached per (GPU type, GPUs) with the transfer table of this market."""
        key = (gpu_type, gpus)
        cat = self._catalogs.get(key)
        if cat is None:
            offers = []
            for z in self.zones_for(gpu_type, gpus):
                od = z.on_demand_usd[gpus]
                spot = z.spot_usd.get(gpus)
                offers.append(
                    Offer(
                        cloud="gcp",
                        region=z.region,
                        zone=z.zone,
                        gpu_type=gpu_type,
                        gpus_per_node=gpus,
                        instance_type=f"sim-{gpu_type.lower()}-{gpus}g",
                        ondemand_usd_per_hour=od,
                        # No clean spot price: never sold on spot (always blocked for spot requests).
                        spot_usd_per_hour=od if spot is None else spot,
                        spot_above_ondemand=spot is None,
                        preemption_rate_per_hour=z.preemption_rate_per_hour,
                    )
                )
            cat = Catalog(offers=tuple(offers))
            # ``Catalog.transfer`` is a cached property loading the packaged table: give it this
            # market's table so the engine prices moves exactly as the simulator charges them.
            cat.__dict__["transfer"] = self.transfer
            self._catalogs[key] = cat
        return cat

    def zones_by_region(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for z in self.zones:
            if z.zone not in out.get(z.region, ()):
                out[z.region] = (*out.get(z.region, ()), z.zone)
        return out


class SpotLedger:
    """Spot GPUs held per (zone, GPU type) over simulated time by the jobs simulated so far."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], list[tuple[float, float, int]]] = {}

    def record(self, zone: SpotZone, start_s: float, end_s: float, gpus: int) -> None:
        if end_s > start_s:
            self._held.setdefault((zone.zone, zone.gpu_type), []).append((start_s, end_s, gpus))

    def held(self, zone: SpotZone, t_s: float) -> int:
        """GPUs held at ``t_s``."""
        return sum(g for s, e, g in self._held.get((zone.zone, zone.gpu_type), ()) if s <= t_s < e)

    def next_claim_s(self, zone: SpotZone, t_s: float) -> float:
        """The next moment after ``t_s`` where a holder starts (the free capacity can drop)."""
        return min(
            (s for s, _, _ in self._held.get((zone.zone, zone.gpu_type), ()) if s > t_s), default=math.inf
        )


@dataclass(frozen=True, slots=True)
class SpotJob:
    job_id: str
    arrival_s: float
    gpu_type: str
    num_gpus: int
    work_h: float
    home_region: str
    """Region whose bucket holds the dataset at arrival."""
    data_gb: float = 0.0
    checkpoint_gb: float = 0.0
    deadline_s: float | None = None
    """Absolute deadline (None: none); ``with_deadline`` sets it from a slack."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One launch of a job: what a live run records per attempt."""

    zone: str
    market: str
    why: str
    start_s: float
    end_s: float
    usd: float
    outcome: str
    """completed | preempted | switched | horizon"""
    slack_h: float | None


@dataclass
class JobOutcome:
    job: SpotJob
    finished: bool = False
    end_s: float | None = None
    usd: float = 0.0
    transfer_usd: float = 0.0
    billed_gpu_h: float = 0.0
    preemptions: int = 0
    preempted_by_competition: int = 0
    """Preemptions where the trace still had the GPUs but earlier arrivals held them."""
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def missed_deadline(self) -> bool:
        if self.job.deadline_s is None:
            return not self.finished
        return not self.finished or (self.end_s or 0.0) > self.job.deadline_s + 1e-6

    @property
    def jct_s(self) -> float | None:
        return None if self.end_s is None or not self.finished else self.end_s - self.job.arrival_s

    @property
    def lost_gpu_h(self) -> float:
        """GPU-hours billed beyond the job's own work (lost work, provisioning, transfer waits)."""
        done = self.job.work_h * self.job.num_gpus if self.finished else 0.0
        return max(0.0, self.billed_gpu_h - done)


@dataclass(frozen=True)
class SpotResult:
    strategy: str
    outcomes: tuple[JobOutcome, ...]

    def to_json(self) -> dict[str, Any]:
        fin = [o for o in self.outcomes if o.finished]
        usd = sum(o.usd for o in self.outcomes)
        jcts = [o.jct_s for o in fin if o.jct_s is not None]
        return {
            "strategy": self.strategy,
            "jobs": len(self.outcomes),
            "finished": len(fin),
            "deadline_misses": sum(o.missed_deadline for o in self.outcomes),
            "usd_total": round(usd, 2),
            "usd_per_finished_job": round(usd / len(fin), 2) if fin else None,
            "avg_jct_s": round(float(np.mean(jcts)), 1) if jcts else None,
            "preemptions": sum(o.preemptions for o in self.outcomes),
            "preempted_by_competition": sum(o.preempted_by_competition for o in self.outcomes),
            "lost_gpu_hours": round(sum(o.lost_gpu_h for o in self.outcomes), 2),
            "spot_share_of_gpu_hours": round(
                sum(a_gpu_h(o, "spot") for o in self.outcomes)
                / max(1e-9, sum(o.billed_gpu_h for o in self.outcomes)),
                3,
            ),
        }


def a_gpu_h(o: JobOutcome, market: str) -> float:
    return sum((a.end_s - a.start_s) / SECONDS_PER_HOUR for a in o.attempts if a.market == market) * (
        o.job.num_gpus
    )


@dataclass(frozen=True, slots=True)
class Option:
    """Where a launch would go: zone, market, hours until training, USD of the transfers."""

    zone: SpotZone
    market: str
    launch_h: float
    transfer_usd: float
    usd_per_hour: float


SIM_MODEL = "small_gpt"
"""Model named in the simulator's placement requests: the engine turns steps into hours with the
throughput table, so a job's remaining hours become ``hours × steps/s`` of this model on the job's
GPU type (it has a throughput entry on every simulated GPU type)."""
SIM_TEAM = "sim"


@functools.lru_cache(maxsize=64)
def steps_per_s(gpu_type: str) -> float:
    """Steps/s of ``SIM_MODEL`` on one VM of ``gpu_type`` in the packaged throughput table (the one
    the placement engine's index uses)."""
    from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, load_packaged

    return load_packaged().throughput(MODEL_JOB_TYPES[SIM_MODEL], gpu_type, True)


def dataset_uri(job: SpotJob) -> str:
    """The job's dataset as a SAILOR URI: its home region's bucket (the engine's first source)."""
    return f"sailor://{job.home_region}/datasets/{job.job_id}"


def launch_request(
    job: SpotJob,
    market_name: str,
    remaining_h: float,
    time_left_h: float | None,
    checkpoint_every_h: float = CHECKPOINT_EVERY_H,
    strategy: str = "sailor",
) -> JobRequest:
    """The ``JobRequest`` a (re)launch of ``job`` plans with: its GPU type and count on one VM, the
    market the strategy chose, the remaining work as steps of ``SIM_MODEL``, its checkpoint interval
    and the hours left to its deadline (None: no deadline)."""
    speed = steps_per_s(job.gpu_type)
    steps = max(1, round(remaining_h * SECONDS_PER_HOUR * speed))
    return JobRequest(
        job_name=job.job_id,
        team=SIM_TEAM,
        dataset_uri=dataset_uri(job),
        model=SIM_MODEL,
        num_workers=1,
        gpus_per_worker=job.num_gpus,
        gpu_type=job.gpu_type,
        market=market_name,
        total_steps=steps,
        checkpoint_every_steps=max(1, min(steps, round(checkpoint_every_h * SECONDS_PER_HOUR * speed))),
        deadline_hours=None if time_left_h is None else max(time_left_h, 1e-9),
        strategy=strategy,
    )


def launch_state(
    job: SpotJob,
    data_regions: Sequence[str],
    blocked_zones: frozenset[str],
    checkpoint_region: str | None = None,
) -> ClusterState:
    """The snapshot a (re)launch plans against: the dataset's replicas and size, the blocked zones,
    and the checkpoint it resumes from (``checkpoint_region``: where it is; None: none).

    The engine knows a copy only in a region of its catalog (the job's simulated zones): a home
    region without a zone for the job is invisible to it, so no transfer is priced there (the
    simulator still charges it). Generated jobs live in a region of their own zones."""
    uri = dataset_uri(job)
    ckpt_bytes = int(round(job.checkpoint_gb * 1e9))
    return ClusterState(
        replicas={uri: tuple(sorted(data_regions))},
        blocked_zones=frozenset(blocked_zones),
        dataset_bytes={uri: int(round(job.data_gb * 1e9))},
        checkpoint=(checkpoint_region, ckpt_bytes) if checkpoint_region and ckpt_bytes > 0 else None,
    )


def place(
    job: SpotJob, market: SpotMarket, request: JobRequest, state: ClusterState, best_effort: bool = True
) -> Placement | None:
    """Where the placement engine puts ``request`` (``placement.engine.plan``, as the live ``plan``
    stage, without the ledger), or None when no candidate is feasible.

    When no candidate fits the deadline and ``best_effort``, the request is planned again without
    it (the job is late whatever it does there): a live first launch would fail with
    ``NoFeasibleOfferError``; the simulated job goes on, late, so that its cost and lateness are
    measured. Without ``best_effort``: None (a relaunch tries looser blocks on the deadline first).
    """
    catalog = market.engine_catalog(job.gpu_type, job.num_gpus)
    if not catalog.offers:
        return None
    try:
        return plan(request, catalog, state, run_id=job.job_id)
    except NoFeasibleOfferError:
        if request.deadline_hours is None or not best_effort:
            return None
    try:
        return plan(replace(request, deadline_hours=None), catalog, state, run_id=job.job_id)
    except NoFeasibleOfferError:
        return None


def on_demand_time_h(job: SpotJob, market: SpotMarket, params: SpotParams = SpotParams()) -> float:
    """Hours from arrival to the end of the job if it ran on-demand in its best zone at once."""
    sim = _JobSim(job, market, get_strategy("on_demand"), params)
    best = sim.best("on_demand", job.work_h, PlacementConstraint(), job.arrival_s)
    if best is None:
        raise ValueError(f"job {job.job_id}: no on-demand offer for {job.num_gpus}× {job.gpu_type}")
    return best.launch_h + job.work_h


def with_deadlines(
    jobs: Sequence[SpotJob], market: SpotMarket, slack: float, params: SpotParams = SpotParams()
) -> list[SpotJob]:
    """Jobs with ``deadline = arrival + (1 + slack) × on-demand time`` (see the module doc)."""
    if not slack >= 0:
        raise ValueError(f"deadline slack={slack!r}: need a number >= 0 (0.2 = 20% over the on-demand time)")
    from dataclasses import replace

    return [
        replace(
            j, deadline_s=j.arrival_s + (1 + slack) * on_demand_time_h(j, market, params) * SECONDS_PER_HOUR
        )
        for j in jobs
    ]


_RESUMED = object()
"""``_JobSim._transfer``'s default: the checkpoint a launch now would resume from."""


class _JobSim:
    """One job's event loop under one strategy."""

    def __init__(
        self,
        job: SpotJob,
        market: SpotMarket,
        strategy: Any,
        params: SpotParams,
        ledger: SpotLedger | None = None,
    ):
        self.job, self.market, self.strategy, self.p = job, market, strategy, params
        self.ledger = ledger
        self.zones = market.zones_for(job.gpu_type, job.num_gpus)
        self.data_regions = {job.home_region}
        self.ckpt_region: str | None = None
        self.progress_h = 0.0
        self.saved_h = 0.0
        self.history: list[PreemptionRecord] = []
        self.constraint = PlacementConstraint()
        self.out = JobOutcome(job)
        self.zbr = market.zones_by_region()
        self._transfers: dict[tuple, tuple[float, float]] = {}
        self.running_region: str | None = None
        """Region of the attempt in progress (None: none): a switch or move saves its checkpoint there."""
        self._fallbacks: dict[tuple, float] = {}
        """``fastest_on_demand_h`` by (lost zone, data regions, checkpoint region)."""
        self.request = launch_request(job, "spot", job.work_h, None, params.checkpoint_every_h)
        self._zone_by_name = {z.zone: z for z in self.zones}
        self._zone_names = frozenset(self._zone_by_name)
        self._placed: dict[tuple, Placement | None] = {}
        """Engine placements of this job by (request, blocked zones, data regions): repeated asks
        (waiting, a tick inside one trace slot with nothing changed) do not plan again."""

    # --- where a launch would go -------------------------------------------------------------
    def _transfer(
        self, region: str, ckpt_from: str | None | object = _RESUMED, data_regions: set[str] | None = None
    ) -> tuple[float, float]:
        """(hours, USD) to bring the dataset and the checkpoint (from ``ckpt_from``; None: there
        is none; by default the one a launch now resumes from) to ``region``. The dataset comes
        from its home region (a copy reads the dataset's own URI, as ``place_data`` does), unless
        ``region`` holds a copy already."""
        if ckpt_from is _RESUMED:
            ckpt_from = self._checkpoint_region()
        data_regions = self.data_regions if data_regions is None else data_regions
        key = (region, frozenset(data_regions), ckpt_from)
        hit = self._transfers.get(key)
        if hit is not None:
            return hit
        hours = usd = 0.0
        if region not in data_regions and self.job.data_gb > 0:
            link = self.market.transfer.bucket_link(self.job.home_region, region)
            hours += self.job.data_gb * BITS_PER_BYTE / link.gbps / SECONDS_PER_HOUR
            usd += self.job.data_gb * link.usd_per_gb
        if ckpt_from and ckpt_from != region and self.job.checkpoint_gb > 0:
            link = self.market.transfer.bucket_link(ckpt_from, region)
            hours += self.job.checkpoint_gb * BITS_PER_BYTE / link.gbps / SECONDS_PER_HOUR
            usd += self.job.checkpoint_gb * link.usd_per_gb
        self._transfers[key] = (hours, usd)
        return hours, usd

    def fastest_on_demand_h(self, lost: SpotZone | None = None) -> float:
        """Hours until on-demand training, now or (``lost``) after a spot attempt in that zone is
        preempted. The relaunch after that loss plans with the zone blocked (``on_demand_choice``
        blocks at least the last preempted zone while any other zone is left), so the zone itself
        counts only when no other zone sells on-demand."""
        data = self.data_regions | {lost.region} if lost else self.data_regions
        # Losing the zone it trains in, the run has saved there (at the notice, or periodically).
        ckpt = lost.region if lost else self._saved_region()
        key = (lost.zone if lost else None, frozenset(data), ckpt)
        hit = self._fallbacks.get(key)
        if hit is not None:
            return hit
        sellers = [z for z in self.zones if math.isfinite(z.usd_per_hour("on_demand", self.job.num_gpus))]
        if lost is not None and any(z.zone != lost.zone for z in sellers):
            sellers = [z for z in sellers if z.zone != lost.zone]
        hours = min(
            (self.p.restart_h + self._transfer(z.region, ckpt, data)[0] for z in sellers),
            default=math.inf,
        )
        self._fallbacks[key] = hours
        return hours

    def best(
        self,
        market: str,
        remaining_h: float,
        c: PlacementConstraint,
        t: float,
        time_left_h: float | None = None,
        exact: bool = True,
        best_effort: bool = True,
    ) -> Option | None:
        """Where the placement engine launches ``market`` now (``place``), or None when nothing is
        feasible. Blocked: the constraint's zones and regions (every zone but ``wait_zone`` when it
        is set, as live recovery plans), and for spot every zone the trace gives no capacity now.
        ``exact=False``: an estimate for the strategy's inputs, planned once per ``ESTIMATE_SLOT_S``.
        ``best_effort=False``: None when no zone meets the deadline (``place``). With ``prefer_zone``
        (not blocked), that zone when it takes the run now, else as without it (as live recovery)."""
        if c.prefer_zone is not None:
            plain = replace(c, prefer_zone=None)
            if c.prefer_zone not in self._blocked(plain, market):
                only = replace(plain, wait_zone=c.prefer_zone)
                if time_left_h is not None:
                    # As live recovery: each tier on the deadline first, then without it.
                    first = self.best(market, remaining_h, only, t, time_left_h, exact, False)
                    if first is not None:
                        return first
                    on_time = self.best(market, remaining_h, plain, t, time_left_h, exact, False)
                    if on_time is not None or not best_effort:
                        return on_time
                first = self.best(market, remaining_h, only, t, time_left_h, exact, best_effort)
                if first is not None:
                    return first
            c = plain
        k = self.job.num_gpus
        blocked = set(self._blocked(c, market))
        if market == "spot":
            blocked.update(z.zone for z in self.zones if not self.spot_free(z, t))
        blocked &= self._zone_names
        late = time_left_h is not None and time_left_h <= 0
        # Past the deadline no candidate fits it, and ``place`` plans without it: so do that now.
        request = launch_request(
            self.job,
            market,
            remaining_h,
            None if late else time_left_h,
            self.p.checkpoint_every_h,
            self.strategy.name,
        )
        ckpt = self._checkpoint_region()
        state_key = (frozenset(blocked), frozenset(self.data_regions), ckpt, best_effort or late)
        if exact or late:
            # late: the request no longer moves with time (a waiting run's remaining work is fixed)
            key: tuple = (request, *state_key)
        else:
            key = (market, int((t - self.job.arrival_s) // ESTIMATE_SLOT_S), *state_key)
        if key in self._placed:
            placed = self._placed[key]
        else:
            if len(blocked) == len(self._zone_names):
                placed = None  # every zone blocked: nothing to ask the engine
            else:
                placed = place(
                    self.job,
                    self.market,
                    request,
                    launch_state(self.job, self.data_regions, frozenset(blocked), ckpt),
                    best_effort,
                )
            if len(self._placed) >= 4096:
                self._placed.clear()
            self._placed[key] = placed
        if placed is None:
            return None
        z = self._zone_by_name[placed.zone]
        hours, usd = self._transfer(z.region, ckpt)
        return Option(z, market, self.p.restart_h + hours, usd, z.usd_per_hour(market, k))

    def _checkpoint_region(self) -> str | None:
        """Where the checkpoint a launch now would resume from is (None: none): the region of the
        attempt that trains (leaving it saves there), else of the last save."""
        if self.running_region and self.progress_h > 0:
            return self.running_region
        return self._saved_region()

    def _saved_region(self) -> str | None:
        """Region of the run's last save (None: it has saved nothing)."""
        return self.ckpt_region if self.saved_h > 0 else None

    def _blocked(self, c: PlacementConstraint, market: str) -> frozenset[str]:
        """Zones ``c`` blocks for ``market``: a block ``until_capacity`` holds for spot only while
        the zone has no capacity, which the spot planning checks anyway (so it is lifted there)."""
        blocked = c.all_blocked_zones(self.zbr)
        if market == "spot" and c.until_capacity:
            blocked = replace(c, blocked_zones=frozenset(), until_capacity=False).all_blocked_zones(self.zbr)
        return blocked

    def spot_free(self, z: SpotZone, t: float) -> bool:
        """Whether ``z`` has spot GPUs for this job at ``t``: the trace's capacity less what the
        jobs simulated before this one hold there (with a ledger)."""
        k = self.job.num_gpus
        if not z.spot_available(t, k):
            return False
        return self.ledger is None or z.spot_capacity(t) - self.ledger.held(z, t) >= k

    def _spot_zone_exists(self, c: PlacementConstraint) -> bool:
        """Whether any zone sells spot to this job under the constraint (capacity or not)."""
        blocked = self._blocked(c, "spot")
        return any(
            z.trace is not None and self.job.num_gpus in z.spot_usd and z.zone not in blocked
            for z in self.zones
        )

    def spot_choice(
        self, t: float, remaining: float, time_left_h: float | None, exact: bool = False
    ) -> tuple[Option | None, bool]:
        """(the engine's spot launch now, whether any spot zone exists at all under the constraint)."""
        if not self._spot_zone_exists(self.constraint) and (
            self.constraint.blocked_zones or self.constraint.blocked_regions
        ):
            # every spot zone is blocked: keep waiting for the last one only, then (when that is
            # the only spot zone) block none, as live recovery does
            last = self.history[-1].zone if self.history else None
            wait_zone = self.constraint.wait_zone
            self.constraint = PlacementConstraint(
                blocked_zones=frozenset({last}) if last else frozenset(),
                wait_zone=wait_zone,
                reason="every zone blocked: only the last preempted one stays blocked",
            )
            if not self._spot_zone_exists(self.constraint):
                self.constraint = PlacementConstraint(
                    wait_zone=wait_zone,
                    reason="every zone blocked, the last preempted one the only spot zone: none stays blocked",
                )
        opt = self.best("spot", remaining, self.constraint, t, time_left_h, exact)
        return opt, opt is not None or self._spot_zone_exists(self.constraint)

    def on_demand_choice(
        self, t: float, remaining: float, time_left_h: float | None, exact: bool = False
    ) -> Option | None:
        """The engine's on-demand launch now under the constraint; as live recovery, when it blocks
        every zone only the last preempted zone stays blocked, then none. With a deadline every
        such tier is tried on it first; only when none meets it, the tiers again without it."""
        last = self.history[-1].zone if self.history else None
        tiers = (
            self.constraint,
            PlacementConstraint(blocked_zones=frozenset({last}) if last else frozenset()),
            PlacementConstraint(),
        )
        passes = (False, True) if time_left_h is not None and time_left_h > 0 else (True,)
        for best_effort in passes:
            for c in tiers:
                opt = self.best("on_demand", remaining, c, t, time_left_h, exact, best_effort)
                if opt is not None:
                    return opt
        return None

    def decide(self, t: float, current: Option | None) -> tuple[str, str, float | None, Option | None]:
        """Ask the strategy; returns (market, why, slack_h, option to launch or None to wait)."""
        job = self.job
        remaining = job.work_h - (self.progress_h if current else self.saved_h)
        time_left_h = None if job.deadline_s is None else (job.deadline_s - t) / SECONDS_PER_HOUR
        running = current.market if current else None
        # The market the run is not on needs a placement (the running one stays where it is, but
        # for a strategy that moves between spot zones: see ``move`` below).
        spot, spot_exists = (None, True) if running == "spot" else self.spot_choice(t, remaining, time_left_h)
        od = current if running == "on_demand" else self.on_demand_choice(t, remaining, time_left_h)
        tick_h = self.p.tick_s / SECONDS_PER_HOUR
        if running == "spot":
            spot_launch = 0.0
            spot_ref = current
        elif spot is not None:
            spot_launch, spot_ref = spot.launch_h, spot
        elif spot_exists:
            spot_launch, spot_ref = tick_h + self.p.restart_h, None  # wait at least until the next check
        else:
            spot_launch, spot_ref = math.inf, None
        ref_zone = spot_ref.zone if spot_ref else (self.zones[0] if self.zones else None)
        move = None
        if running == "spot" and current is not None and getattr(self.strategy, "moves_on_spot", False):
            there = self.spot_choice(t, remaining, time_left_h)[0]
            if there is not None and there.zone.zone != current.zone.zone:
                # The move checkpoints here first: the checkpoint comes from this zone's region.
                hours, usd = self._transfer(there.zone.region, current.zone.region)
                move = SpotMove(
                    there.usd_per_hour,
                    self.p.restart_h + hours,
                    usd,
                    there.zone.preemption_rate_per_hour,
                    self.fastest_on_demand_h(there.zone),
                )
        ctx = MarketContext(
            now_h=(t - job.arrival_s) / SECONDS_PER_HOUR,
            remaining_h=remaining,
            deadline_h=None
            if job.deadline_s is None
            else (job.deadline_s - job.arrival_s) / SECONDS_PER_HOUR,
            requested_market="auto",
            current_market=running,
            spot_launch_h=spot_launch,
            on_demand_launch_h=0.0 if running == "on_demand" else (od.launch_h if od else math.inf),
            on_demand_fallback_h=self.fastest_on_demand_h(spot_ref.zone if spot_ref else None),
            spot_usd_per_hour=spot_ref.usd_per_hour
            if spot_ref
            else (min((z.usd_per_hour("spot", job.num_gpus) for z in self.zones), default=0.0)),
            on_demand_usd_per_hour=od.usd_per_hour if od else 0.0,
            preemption_rate_per_hour=ref_zone.preemption_rate_per_hour if ref_zone else 0.0,
            lost_h_per_preemption=(
                self.p.notice_s / SECONDS_PER_HOUR
                if self.strategy.checkpoint_on_notice
                else self.p.checkpoint_every_h / 2
            ),
            spot_move=move,
        )
        d = self.strategy.choose_market(ctx)
        # A launch (or a switch) goes where the engine places it now, planned afresh.
        if d.market == "spot":
            if running == "spot":
                if d.move:
                    there = self.spot_choice(t, remaining, time_left_h, exact=True)[0]
                    if there is not None and current is not None and there.zone.zone != current.zone.zone:
                        return "spot", d.reason, d.slack_h, there
                return "spot", d.reason, d.slack_h, current
            launch = self.spot_choice(t, remaining, time_left_h, exact=True)[0] if spot else None
            return "spot", d.reason, d.slack_h, launch
        if running == "on_demand":
            return "on_demand", d.reason, d.slack_h, current
        launch = self.on_demand_choice(t, remaining, time_left_h, exact=True) if od else None
        return "on_demand", d.reason, d.slack_h, launch

    # --- the event loop ----------------------------------------------------------------------
    def run(self) -> JobOutcome:
        job, p = self.job, self.p
        out = self.out
        t = job.arrival_s
        end_of_world = job.arrival_s + p.horizon_h * SECONDS_PER_HOUR
        cur: Option | None = None  # the attempt in progress (provisioning or training)
        attempt_start = ready_at = 0.0
        why, slack = "", None
        next_tick = t

        def stop(at: float, outcome: str) -> None:
            nonlocal cur
            assert cur is not None
            hours = (at - attempt_start) / SECONDS_PER_HOUR
            usd = hours * cur.usd_per_hour + cur.transfer_usd
            out.usd += usd
            out.transfer_usd += cur.transfer_usd
            out.billed_gpu_h += hours * job.num_gpus
            out.attempts.append(
                Attempt(cur.zone.zone, cur.market, why, attempt_start, at, usd, outcome, slack)
            )
            if self.ledger is not None and cur.market == "spot":
                self.ledger.record(cur.zone, attempt_start, at, job.num_gpus)
            self.ckpt_region = cur.zone.region if self.saved_h > 0 else self.ckpt_region
            cur = None
            self.running_region = None

        def launch(opt: Option, at: float) -> None:
            nonlocal cur, attempt_start, ready_at
            cur, attempt_start = opt, at
            ready_at = at + opt.launch_h * SECONDS_PER_HOUR
            self.data_regions.add(opt.zone.region)
            self.progress_h = self.saved_h
            self.running_region = opt.zone.region

        while t < end_of_world:
            if t >= next_tick - 1e-9:
                next_tick = t + p.tick_s
                market, reason, s, opt = self.decide(t, cur)
                if cur is None:
                    if opt is not None:
                        why, slack = reason, s
                        launch(opt, t)
                elif opt is not None and opt is not cur:
                    # voluntary switch: checkpoint what training reached, then relaunch
                    if t >= ready_at:
                        self.saved_h = self.progress_h
                    stop(t, "switched")
                    # The checkpoint just saved is where the run was: price the move from there.
                    hours, usd = self._transfer(opt.zone.region)
                    opt = replace(opt, launch_h=p.restart_h + hours, transfer_usd=usd)
                    why, slack = reason, s
                    launch(opt, t)
            # the next event
            candidates = [next_tick, end_of_world]
            if cur is not None:
                if t < ready_at:
                    candidates.append(ready_at)
                else:
                    candidates.append(t + (job.work_h - self.progress_h) * SECONDS_PER_HOUR)
                if cur.market == "spot":
                    candidates.append(cur.zone.next_slot_s(t))
                    if self.ledger is not None:
                        candidates.append(self.ledger.next_claim_s(cur.zone, t))
            t_next = max(min(candidates), t)
            if cur is not None and t_next > ready_at and t < t_next:
                self.progress_h += (t_next - max(t, ready_at)) / SECONDS_PER_HOUR
            t = t_next
            if cur is None:
                continue
            if t >= ready_at and self.progress_h >= job.work_h - 1e-9:
                self.progress_h = self.saved_h = job.work_h
                stop(t, "completed")
                out.finished, out.end_s = True, t
                return out
            if cur.market == "spot" and not self.spot_free(cur.zone, t):
                if cur.zone.spot_available(t, job.num_gpus):
                    out.preempted_by_competition += 1
                self._preempt(t, cur, ready_at)
                stop(t, "preempted")
                next_tick = t  # decide again now
        if cur is not None:
            stop(end_of_world, "horizon")
        return out

    def _preempt(self, t: float, cur: Option, ready_at: float) -> None:
        """Capacity lost at ``t``: save at the notice (strategies that do) or fall back to the last
        periodic checkpoint; record the preemption and ask the strategy where to go next."""
        p = self.p
        self.out.preemptions += 1
        if t > ready_at:
            at_notice = max(self.saved_h, self.progress_h - p.notice_s / SECONDS_PER_HOUR)
            if self.strategy.checkpoint_on_notice and p.checkpoint_save_s <= p.notice_s:
                self.saved_h = max(self.saved_h, at_notice)
            else:
                periodic = math.floor(self.progress_h / p.checkpoint_every_h + 1e-9) * p.checkpoint_every_h
                self.saved_h = max(self.saved_h, min(periodic, self.progress_h))
        self.progress_h = self.saved_h
        z = cur.zone
        self.history.append(
            PreemptionRecord(attempt=len(self.out.attempts) + 1, region=z.region, zone=z.zone, noticed=True)
        )
        lost = Placement(
            run_id=self.job.job_id,
            cloud="gcp",
            region=z.region,
            zone=z.zone,
            gpu_type=self.job.gpu_type,
            gpus_per_node=self.job.num_gpus,
            num_nodes=1,
            num_gpus=self.job.num_gpus,
            market="spot",
            instance_type="",
            usd_per_hour=cur.usd_per_hour,
        )
        self.constraint = self.strategy.next_constraint(
            RecoveryContext(self.request, lost, tuple(self.history), self.zbr)
        )


def simulate_spot(
    jobs: Sequence[SpotJob],
    market: SpotMarket,
    strategy: str,
    params: SpotParams = SpotParams(),
    compete: bool = True,
) -> SpotResult:
    """Run every job under the strategy called ``strategy`` (see the module doc).

    Args:
        compete: jobs take spot capacity from the zones' traces, in arrival order (False: every
            job runs alone against the traces).

    Raises:
        ValueError: unknown strategy (lists the valid names).
    """
    strat = get_strategy(strategy)
    ledger = SpotLedger() if compete else None
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival_s, i))
    outcomes: list[JobOutcome | None] = [None] * len(jobs)
    for i in order:
        outcomes[i] = _JobSim(jobs[i], market, strat, params, ledger).run()
    return SpotResult(strategy, tuple(o for o in outcomes if o is not None))
