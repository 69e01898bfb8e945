"""Round-based discrete-event simulator running SAILOR's own policies and round mechanism.

Time advances in rounds (6 minutes by default, as in Gavel). At each round boundary, per region:
jobs that arrived are admitted (routed by a ``Router``: by default the placement engine,
``routing.py``), spot capacity is read from an ``AvailabilityProvider`` (lost capacity preempts the
jobs on it; a ``RecoveryStrategy`` says where they continue: by default a strategy of the registry
re-planned by the same engine, ``replan.py``), the policy is re-solved only if the region's job
set or capacity changed, the ``RoundMechanism`` grants GPUs, and jobs progress at their measured
throughput (consolidated or not, alone or space-shared) with exact completion times inside the
round. Deterministic for a seed: the only randomness is the workload generator's and the
policies' seeded partitioning.

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
    Router,
)
from sailor_tasks.simulator.rounds.replan import StrategyRecovery, make_recovery
from sailor_tasks.simulator.rounds.routing import SimPlacement, make_router
from sailor_tasks.simulator.rounds.shard import LEAVE, region_gpu_types
from sailor_tasks.simulator.rounds.workers import start_shards
from sailor_tasks.simulator.rounds.workload import SimJob

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
    for key in {j.job_type for j in jobs}:
        runnable_in[key] = [
            any(table.throughput(key, g) > 0 and r.gpus[g] >= key[1] for g in types)
            for r, types in zip(regions, gpu_types, strict=True)
        ]
        if not any(runnable_in[key]):
            raise ValueError(f"job type {key!r} cannot run in any region (GPU types: {', '.join(all_types)})")
    order = sorted(range(n), key=lambda i: (jobs[i].arrival_s, i))
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

    def leave(i: int) -> None:
        ri = region_of[i]
        demand[ri] -= scale[i]
        active[ri] -= 1
        events[owner[ri]].append((i, LEAVE, 0.0))

    round_s = config.round_s
    # Rounds start when there is work: at the first arrival, then back to back while jobs are
    # active, and at the next arrival after the cluster went idle (a job arriving at an idle
    # cluster starts at once, as in Gavel).
    t = 0.0 if not n else float(arrival[order[0]])
    next_arrival = 0
    done = 0
    rounds = solves = preemptions = moves = 0
    busy_gpu_s = cost = 0.0
    static_capacity = type(availability) is AlwaysAvailable
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

    try:
        while done < n and t <= config.horizon_s:
            while next_arrival < n and arrival[order[next_arrival]] <= t:
                i = order[next_arrival]
                load = [(demand[k] + scale[i]) / total_gpus[k] for k in range(n_regions)]
                admit(i, router.route(jobs[i], runnable_in[jobs[i].job_type], load), jobs[i].total_steps)
                next_arrival += 1
            if not any(active):
                t = float(arrival[order[next_arrival]])
                continue
            rounds += 1
            if not static_capacity:
                caps = [
                    np.array([availability.capacity(r, g, t) for g in types], dtype=np.int64)
                    for r, types in zip(regions, gpu_types, strict=True)
                ]
                changed = [ri for ri in range(n_regions) if (caps[ri] != last_cap[ri]).any()]
                if changed:
                    lost: dict[int, list[tuple[int, float]]] = {}
                    for (out,) in call(
                        [
                            [("revoke", ({ri: caps[ri] for ri in changed if owner[ri] == k},))]
                            for k in range(len(shards))
                        ]
                    ):
                        lost.update(out)
                    available = [
                        dict(zip(types, c.tolist(), strict=True))
                        for types, c in zip(gpu_types, caps, strict=True)
                    ]
                    for ri in changed:
                        for j, remaining in lost.get(ri, ()):
                            preemptions += 1
                            load = [
                                (demand[k] + (0.0 if k == ri else scale[j])) / total_gpus[k]
                                for k in range(n_regions)
                            ]
                            dest = strategy.on_preemption(jobs[j], ri, t, available, load)
                            if dest != ri:
                                moves += 1
                                leave(j)
                                admit(j, dest, remaining)
                        last_cap[ri] = caps[ri]
            # Every region grants its GPUs; the round lasts until its last unit finishes, at most
            # round_s (as in Gavel).
            planned = call([[("plan", (float(t), events[k]))] for k in range(len(shards))])
            events = [[] for _ in shards]
            round_len = max((out[0][0] for out in planned), default=0.0)
            solves += sum(out[0][1] for out in planned)
            if round_len <= 0:
                round_len = round_s
            # The jobs that finish in this round (the shards run it at their next call).
            for ri, j, need in sorted((e for out in planned for e in out[0][2]), key=lambda e: e[0]):
                if need <= round_len and np.isnan(finish[j]):
                    finish[j] = t + need
                    done += 1
                    demand[ri] -= scale[j]
                    active[ri] -= 1
            t += round_len
            # Workers run the round and grant the next one while this process routes.
            for shard in shards:
                shard.submit([("progress", (round_len,)), ("prepare", (float(t),))])
            ran = True
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
        jct_s=tuple(jct.tolist()),
        jct_job_ids=tuple(jobs[i].job_id for i in np.nonzero(completed)[0].tolist()),
    )
