"""Round-based discrete-event simulator running SAILOR's own policies and round mechanism.

Time advances in rounds (6 minutes by default, as in Gavel). At each round boundary, per region:
jobs that arrived are admitted (routed by a ``Router``: by default the placement engine,
``routing.py``), spot capacity is read from an ``AvailabilityProvider`` (lost capacity preempts the
jobs on it; a ``RecoveryStrategy`` says where they continue: by default a strategy of the registry
re-planned by the same engine, ``replan.py``), the policy is re-solved only if the region's job
set or capacity changed, the ``RoundMechanism`` grants GPUs, and jobs progress at their measured
throughput (consolidated or not, alone or space-shared) with exact completion times inside the
round. Capacity can also go inside a round: a provider that ``ReportsChanges`` (as
``TraceAvailability`` does) says when, and the jobs granted a type whose capacity falls below the
round's stop progressing (and using GPUs) at that time; they are preempted at the next round
start even when the capacity is back by then. A round whose every granted job finishes or stops
ends then, and a round in which nothing runs ends when capacity first comes back, so a job waiting
for it starts at that time. Deterministic for a seed: the only randomness is the workload
generator's and the policies' seeded partitioning.

Across regions the loop keeps the cluster work-conserving, as SAILOR's queue does with runs that
wait for capacity: it knows each region's free GPUs from the last round's grants, a router that
``StartsJobs`` sends an arriving (or preempted) job where it can start at once when some region
has room, and every round the jobs that got no GPUs where they wait are offered the GPUs free in
other regions (``moves``). A job is bound to a region only while that region runs it or no
region has room for it (or, under the ``stay_in_region`` baseline, once it was preempted there).

The per-region work (admission, re-solves, grants, progress) is done by ``RegionShard``s
(``shard.py``); with ``SimConfig.workers`` > 1 they run in worker processes (``workers.py``), in
lock step with this loop, which keeps what crosses regions: routing, recovery and the totals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sailor_tasks.catalog.throughput import ThroughputTable
from sailor_tasks.policies import get_policy
from sailor_tasks.simulator.rounds.config import SimConfig
from sailor_tasks.simulator.rounds.hooks import (
    AlwaysAvailable,
    AvailabilityProvider,
    RecoveryStrategy,
    Region,
    ReportsChanges,
    Router,
    StartsJobs,
)
from sailor_tasks.simulator.rounds.replan import StrategyRecovery, make_recovery
from sailor_tasks.simulator.rounds.routing import SimPlacement, make_router
from sailor_tasks.simulator.rounds.shard import (
    LEAVE,
    MOVE_GAIN_S,
    RegionRound,
    region_gpu_types,
)
from sailor_tasks.simulator.rounds.workers import start_shards
from sailor_tasks.simulator.rounds.workload import SimJob, run_throughput

logger = logging.getLogger(__name__)

DEFAULT_CONFIG = SimConfig()
"""``simulate``'s default configuration (frozen, so one shared instance)."""


@dataclass(frozen=True)
class SimResult:
    policy: str
    jobs: int
    completed: int
    avg_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    makespan_s: float
    utilization: float
    cost_usd: float
    preemptions: int
    rounds: int
    lp_solves: int
    wall_s: float
    regions: int = 1
    space_sharing: bool = False
    router: str = ""
    recovery: str = ""
    recovery_moves: int = 0
    """Preempted jobs that recovery sent to another region."""
    recovery_waits: int = 0
    """Preempted jobs for which recovery found no feasible region (they waited where they were)."""
    waiting_moves: int = 0
    """Jobs that got no GPUs where they waited, moved to GPUs free in another region."""
    faster_moves: int = 0
    """Running jobs moved to GPUs free in another region where they finish sooner."""
    jct_s: tuple[float, ...] = field(default=(), repr=False)
    """JCT of every completed job, in the workload's order."""
    jct_job_ids: tuple[str, ...] = field(default=(), repr=False)
    """The job id of each entry of ``jct_s``."""

    def jct_by_job(self) -> dict[str, float]:
        """Completed job id → its JCT in seconds (to compare two runs job by job)."""
        return dict(zip(self.jct_job_ids, self.jct_s, strict=True))

    def to_json(self) -> dict:
        """The summary figures (per-job JCTs are in ``jct_by_job``)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("jct_s", "jct_job_ids")}
        for k in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "cost_usd", "wall_s"):
            out[k] = round(out[k], 3)
        out["utilization"] = round(out["utilization"], 4)
        return out


def simulate(
    jobs: Sequence[SimJob],
    regions: Sequence[Region],
    table: ThroughputTable,
    config: SimConfig = DEFAULT_CONFIG,
    availability: AvailabilityProvider | None = None,
    router: Router | None = None,
    strategy: RecoveryStrategy | None = None,
) -> SimResult:
    """Run the workload to completion and summarise it.

    Raises:
        ValueError: unknown policy (lists valid ones), or a job no region can run.
    """
    started = time.perf_counter()
    get_policy(config.policy)  # unknown names fail here, listing the valid ones
    availability = availability or AlwaysAvailable()
    if router is None or strategy is None:
        placement = SimPlacement(regions, table, config.gpus_per_server)
        router = router or make_router(config.router, placement)
        strategy = strategy or make_recovery(config.recovery, placement)
    n = len(jobs)
    if len({j.job_id for j in jobs}) != n:
        raise ValueError("job ids must be unique")
    gpu_types = [region_gpu_types(r) for r in regions]
    all_types = sorted({g for types in gpu_types for g in types})
    runnable_in = {}
    # Per job type and region: which of the region's GPU types can run it (the free-GPU checks).
    fits_type: dict = {}
    for key in {j.job_type for j in jobs}:
        fits_type[key] = [
            np.array([table.throughput(key, g) > 0 and r.gpus[g] >= key[1] for g in types], dtype=bool)
            for r, types in zip(regions, gpu_types, strict=True)
        ]
        runnable_in[key] = [bool(f.any()) for f in fits_type[key]]
        if not any(runnable_in[key]):
            raise ValueError(f"job type {key!r} cannot run in any region (GPU types: {', '.join(all_types)})")
    # Per job type and region: steps/s on each of the region's types, and the types that can run
    # it fastest first (where a job sent to free GPUs is counted until the next round's grants).
    speed_in = {
        key: [
            np.array([run_throughput(table, key, g, config.gpus_per_server) for g in types])
            for types in gpu_types
        ]
        for key in fits_type
    }
    by_speed = {
        key: [
            sorted(np.nonzero(f)[0].tolist(), key=lambda m, sp=sp: -sp[m])
            for f, sp in zip(per_region, speed_in[key], strict=True)
        ]
        for key, per_region in fits_type.items()
    }
    order = sorted(range(n), key=lambda i: (jobs[i].arrival_s, i))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    arrival = np.array([j.arrival_s for j in jobs], dtype=float)
    scale = np.array([j.scale_factor for j in jobs], dtype=float)
    finish = np.full(n, np.nan)
    region_of = np.full(n, -1, dtype=np.int64)
    # What routing and recovery see of each region: GPUs asked for by its jobs, and how many.
    n_regions = len(regions)
    demand = [0.0] * n_regions
    active = [0] * n_regions
    capacity = [
        np.array([r.gpus[g] for g in types], dtype=np.int64)
        for r, types in zip(regions, gpu_types, strict=True)
    ]
    total_gpus = [max(float(c.sum()), 1.0) for c in capacity]
    last_cap = [c.copy() for c in capacity]
    # GPUs of each type no job uses in the coming round: the last round's grants, less what the
    # loop has sent since, plus what finishing jobs and returning capacity give back.
    free = [c.copy() for c in capacity]
    starts = isinstance(router, StartsJobs)
    shards = start_shards(jobs, regions, table, config)
    owner = [0] * n_regions
    for k, shard in enumerate(shards):
        for ri in shard.regions:
            owner[ri] = k
    events: list[list[tuple[int, int, float]]] = [[] for _ in shards]

    def admit(i: int, ri: int, remaining: float) -> None:
        demand[ri] += scale[i]
        active[ri] += 1
        region_of[i] = ri
        events[owner[ri]].append((i, ri, remaining))
        # Count the job on its fastest type with room (the next round's grants say exactly).
        s = int(scale[i])
        for m in by_speed[jobs[i].job_type][ri]:
            if free[ri][m] >= s:
                free[ri][m] -= s
                break

    def leave(i: int) -> None:
        ri = region_of[i]
        demand[ri] -= scale[i]
        active[ri] -= 1
        events[owner[ri]].append((i, LEAVE, 0.0))

    def room_for(key, exclude: int = -1) -> bool:
        """Some region (not ``exclude``) has enough free GPUs of a type that runs ``key``."""
        s = key[1]
        return any(ri != exclude and (f & (free[ri] >= s)).any() for ri, f in enumerate(fits_type[key]))

    def free_view() -> list[dict[str, int]]:
        return [dict(zip(types, f.tolist(), strict=True)) for types, f in zip(gpu_types, free, strict=True)]

    def faster_view(key, src: int, remaining: float, rate: float) -> list[dict[str, int]] | None:
        """``free_view`` restricted to the GPUs outside ``src`` on which a job of type ``key``
        running at ``rate`` would finish at least ``MOVE_GAIN_S`` sooner; None when there are none."""
        s = key[1]
        view, any_room = [], False
        for ri, (types, f) in enumerate(zip(gpu_types, free, strict=True)):
            counts = dict.fromkeys(types, 0)
            if ri != src:
                for m in by_speed[key][ri]:
                    speed = float(speed_in[key][ri][m])
                    if speed <= rate or remaining / rate - remaining / speed < MOVE_GAIN_S:
                        break  # the types after it are slower
                    if f[m] >= s:
                        counts[types[m]] = int(f[m])
                        any_room = True
            view.append(counts)
        return view if any_room else None

    def offer_free_gpus(answers: Sequence[RegionRound], round_len: float) -> None:
        """Send jobs to GPUs free in other regions: first those that got none this round (oldest
        arrival first), then running jobs, offered only the free GPUs on which they would finish
        at least ``MOVE_GAIN_S`` sooner; each by the router's ``start_now``, while any GPU is
        free (counted in ``moved``)."""
        candidates = [
            (0, int(rank[j]), j, rr.region, float(rem), 0.0)
            for rr in answers
            for j, rem in zip(rr.waiting.tolist(), rr.remaining.tolist(), strict=True)
        ] + [
            (1, int(rank[j]), j, rr.region, float(rem), float(rate))
            for rr in answers
            for j, rem, rate in zip(
                rr.faster.tolist(), rr.faster_remaining.tolist(), rr.faster_rate.tolist(), strict=True
            )
        ]
        if not candidates or not any(f.any() for f in free):
            return
        # (job type, region) of waiting jobs with no room elsewhere: free GPUs only shrink here.
        no_room: set = set()
        for running, _, j, src, remaining, rate in sorted(candidates):
            key = jobs[j].job_type
            if not np.isnan(finish[j]):
                continue
            if running:
                view = faster_view(key, src, remaining, rate)
                if view is None:
                    continue
            elif (key, src) in no_room or not room_for(key, src):
                no_room.add((key, src))
                continue
            else:
                view = free_view()
            dest = router.start_now(jobs[j], load_for(j, src), view, exclude=src)
            if dest is None or dest == src:
                if not running:
                    no_room.add((key, src))
                continue
            if running:
                # It runs this round where it is (the shard applies the same arithmetic).
                remaining = max(remaining - rate * round_len, 0.0)
            leave(j)
            admit(j, dest, remaining)
            moved[running] += 1
            if not any(f.any() for f in free):
                break

    round_s = config.round_s
    # Rounds start when there is work: at the first arrival, then back to back while jobs are
    # active, and at the next arrival after the cluster went idle (a job arriving at an idle
    # cluster starts at once, as in Gavel).
    t = 0.0 if not n else float(arrival[order[0]])
    next_arrival = 0
    done = 0
    rounds = solves = preemptions = moves = 0
    moved = [0, 0]  # waiting, faster
    busy_gpu_s = cost = 0.0
    static_capacity = type(availability) is AlwaysAvailable
    reports = not static_capacity and isinstance(availability, ReportsChanges)
    # Region → the GPU types whose capacity fell below the round's inside the last round (their
    # jobs stopped then: they are preempted at the next round start, whatever capacity it has).
    cut: dict[int, np.ndarray] = {}
    # True once the shards were sent the last round's ``progress`` and ``prepare``: their answers
    # come first in the next ``call`` (``progress`` only finishes the jobs this loop counted).
    ran = False

    def call(batches: Sequence[Sequence]) -> list[list]:
        """One batch of calls per shard, in lock step; the answers to each shard's batch (after
        those of the ``progress``/``prepare`` batch sent at the end of the last round)."""
        nonlocal ran, busy_gpu_s, cost
        for shard, calls in zip(shards, batches, strict=True):
            shard.submit(calls)
        answers = [shard.result() for shard in shards]
        if ran:
            # GPU time and cost of the round, added region by region (the serial order).
            for _, busy, spent in sorted(used for out in answers for used in out[0]):
                busy_gpu_s += busy
                cost += spent
            answers = [out[2:] for out in answers]
            ran = False
        return answers

    def changes_in_round(
        caps: Sequence[np.ndarray],
    ) -> tuple[dict[int, np.ndarray], float, dict[float, float]]:
        """The capacity changes the provider reports inside the round starting at ``t`` (before
        ``t + round_s``), against ``caps``, the GPUs usable at ``t``: per region where some type
        falls below its ``caps``, the seconds into the round at which each type first does (inf
        where it does not); the seconds until some type first rises above its ``caps``
        (``round_s`` when none does); and each of these offsets → the time it stands for."""
        end = t + round_s
        stops: dict[int, np.ndarray] = {}
        rise = round_s
        at_offset: dict[float, float] = {}
        for ri, (r, types) in enumerate(zip(regions, gpu_types, strict=True)):
            for m, g in enumerate(types):
                dropped = False
                for at, usable in availability.changes(r, g, t, end):
                    offset = at - t
                    if usable < caps[ri][m] and not dropped:
                        stops.setdefault(ri, np.full(len(types), np.inf))[m] = offset
                        at_offset[offset] = at
                        dropped = True
                    elif usable > caps[ri][m] and offset < rise:
                        rise = offset
                        at_offset[offset] = at
        return stops, rise, at_offset

    def load_for(i: int, ri: int = -1) -> list[float]:
        """GPUs demanded / GPUs per region with job ``i`` added (it is in region ``ri`` already)."""
        return [(demand[k] + (0.0 if k == ri else scale[i])) / total_gpus[k] for k in range(n_regions)]

    try:
        while done < n and t <= config.horizon_s:
            if not static_capacity:
                caps = [
                    np.array([availability.capacity(r, g, t) for g in types], dtype=np.int64)
                    for r, types in zip(regions, gpu_types, strict=True)
                ]
                changed = [ri for ri in range(n_regions) if (caps[ri] != last_cap[ri]).any() or ri in cut]
                if changed:
                    lost: dict[int, list[tuple[int, float]]] = {}
                    for (out,) in call(
                        [
                            [
                                (
                                    "revoke",
                                    (
                                        {ri: caps[ri] for ri in changed if owner[ri] == k},
                                        {ri: c for ri, c in cut.items() if owner[ri] == k},
                                    ),
                                )
                            ]
                            for k in range(len(shards))
                        ]
                    ):
                        lost.update(out)
                    for ri in changed:
                        free[ri] = np.clip(free[ri] + caps[ri] - last_cap[ri], 0, caps[ri])
                        last_cap[ri] = caps[ri]
                    available = [
                        dict(zip(types, c.tolist(), strict=True))
                        for types, c in zip(gpu_types, caps, strict=True)
                    ]
                    for ri in changed:
                        for j, remaining in lost.get(ri, ()):
                            if region_of[j] != ri:
                                # Moved away at the end of the last round (offer_free_gpus): the
                                # shard learns it at the next plan; it was not preempted.
                                continue
                            preemptions += 1
                            dest = strategy.on_preemption(
                                jobs[j], ri, t, available, load_for(j, ri), free=free_view()
                            )
                            if dest != ri:
                                moves += 1
                                leave(j)
                                admit(j, dest, remaining)
                    cut = {}
            while next_arrival < n and arrival[order[next_arrival]] <= t:
                i = order[next_arrival]
                job = jobs[i]
                dest = None
                if starts and room_for(job.job_type):
                    dest = router.start_now(job, load_for(i), free_view())
                if dest is None:
                    dest = router.route(job, runnable_in[job.job_type], load_for(i))
                admit(i, dest, job.total_steps)
                next_arrival += 1
            if not any(active):
                t = float(arrival[order[next_arrival]])
                continue
            rounds += 1
            # Capacity the provider says goes inside the round stops the jobs on it then; capacity
            # that comes back ends a round in which nothing runs.
            stops: dict[int, np.ndarray] = {}
            rise, at_offset = round_s, {}
            if reports:
                stops, rise, at_offset = changes_in_round(caps)
            # Every region grants its GPUs; the round lasts until its last unit finishes or stops,
            # at most round_s (as in Gavel).
            offers = [f.copy() for f in free] if starts else None
            own_stops = [{ri: s for ri, s in stops.items() if owner[ri] == k} for k in range(len(shards))]
            planned = call(
                [[("plan", (float(t), events[k], offers, own_stops[k]))] for k in range(len(shards))]
            )
            events = [[] for _ in shards]
            round_len = max((out[0][0] for out in planned), default=0.0)
            solves += sum(out[0][1] for out in planned)
            if round_len <= 0:
                round_len = rise
            cut = {ri: s < round_len for ri, s in stops.items() if (s < round_len).any()}
            for rr in (rr for out in planned for rr in out[0][3]):
                free[rr.region] = rr.free
            # The jobs that finish in this round (the shards run it at their next call).
            for ri, j, need, g, gpus in sorted((e for out in planned for e in out[0][2]), key=lambda e: e[0]):
                if need <= round_len and np.isnan(finish[j]):
                    finish[j] = t + need
                    done += 1
                    demand[ri] -= scale[j]
                    active[ri] -= 1
                    free[ri][g] += gpus
            # A round that ends at a capacity change ends exactly where the provider reads it.
            t = at_offset.get(round_len, t + round_len)
            # Workers run the round and grant the next one while this process offers free GPUs
            # and routes the next arrivals: what that changes reaches the shards as the next
            # ``plan``'s events (a job moved now runs this round where it is, as ``progress``
            # runs it), and ``plan`` does not use a grant made ahead in a region they change.
            for shard in shards:
                shard.submit([("progress", (round_len,)), ("prepare", (float(t),))])
            ran = True
            if starts:
                offer_free_gpus([rr for out in planned for rr in out[0][3]], round_len)
        if ran:
            call([[] for _ in shards])
    finally:
        for shard in shards:
            shard.close()
    completed = ~np.isnan(finish)
    jct = (finish - arrival)[completed]
    makespan = float(np.nanmax(finish) - arrival.min()) if done else 0.0
    return SimResult(
        policy=config.policy,
        jobs=n,
        completed=done,
        avg_jct_s=float(jct.mean()) if done else 0.0,
        p50_jct_s=float(np.percentile(jct, 50)) if done else 0.0,
        p99_jct_s=float(np.percentile(jct, 99)) if done else 0.0,
        makespan_s=makespan,
        utilization=busy_gpu_s / (sum(float(c.sum()) for c in capacity) * makespan) if makespan > 0 else 0.0,
        cost_usd=cost,
        preemptions=preemptions,
        rounds=rounds,
        lp_solves=solves,
        wall_s=time.perf_counter() - started,
        regions=len(regions),
        space_sharing=config.space_sharing,
        router=getattr(router, "name", type(router).__name__),
        recovery=getattr(strategy, "name", type(strategy).__name__),
        recovery_moves=moves,
        recovery_waits=strategy.waits if isinstance(strategy, StrategyRecovery) else 0,
        waiting_moves=moved[0],
        faster_moves=moved[1],
        jct_s=tuple(jct.tolist()),
        jct_job_ids=tuple(jobs[i].job_id for i in np.nonzero(completed)[0].tolist()),
    )
