"""Round-based discrete-event simulator running SAILOR's own policies and round mechanism.

Time advances in rounds (6 minutes by default, as in Gavel). At each round boundary, per region:
jobs that arrived are admitted (routed by a ``Router``: by default the placement engine,
``routing.py``), spot capacity is read from an ``AvailabilityProvider`` (lost capacity preempts the
jobs on it; a ``RecoveryStrategy`` says where they continue: by default a strategy of the registry
re-planned by the same engine, ``recovery.py``), the policy is re-solved only if the region's job
set or capacity changed, the ``RoundMechanism`` grants GPUs, and jobs progress at their measured
throughput (consolidated or not, alone or space-shared) with exact completion times inside the
round. Deterministic for a seed: the only randomness is the workload generator's and the
policies' seeded partitioning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sailor_tasks.catalog.throughput import ThroughputTable
from sailor_tasks.policies import PolicyJob, PolicyState, get_policy
from sailor_tasks.policies.mechanism import GPUS_PER_SERVER, RoundMechanism
from sailor_tasks.simulator.hooks import (
    AlwaysAvailable,
    AvailabilityProvider,
    RecoveryStrategy,
    Region,
    Router,
)
from sailor_tasks.simulator.recovery import DEFAULT_RECOVERY, StrategyRecovery, make_recovery
from sailor_tasks.simulator.routing import SimPlacement, make_router
from sailor_tasks.simulator.workload import SimJob

logger = logging.getLogger(__name__)

ROUND_S = 360.0
"""Gavel's round length (OSDI'20 §7: 6-minute rounds)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy: str = "las"
    round_s: float = ROUND_S
    seed: int = 0
    space_sharing: bool = False
    gpus_per_server: int = GPUS_PER_SERVER
    reuse_stable_rounds: bool = True
    """Reuse last round's grants when they provably repeat (a speed-up with identical results)."""
    horizon_s: float = 10 * 365 * 86400.0
    """Stop here even if jobs remain (e.g. spot capacity that never comes back); they count as
    not completed and are left out of the JCT statistics."""
    router: str = "placement"
    """``placement`` (the placement engine) or the ``least_loaded`` baseline (``routing.ROUTERS``)."""
    recovery: str = DEFAULT_RECOVERY
    """A strategy of ``sailor_tasks.strategies`` or the ``stay_in_region`` baseline."""

    def __post_init__(self) -> None:
        if self.round_s <= 0 or self.gpus_per_server < 1:
            raise ValueError(f"round_s={self.round_s}, gpus_per_server={self.gpus_per_server}: need > 0, ≥ 1")


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

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "jct_s"}
        for k in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "cost_usd", "wall_s"):
            out[k] = round(out[k], 3)
        out["utilization"] = round(out["utilization"], 4)
        return out


class _RegionSim:
    """Per-region state: admitted jobs, the cached allocation's unit arrays, the mechanism."""

    def __init__(self, region: Region, gpus_per_server: int):
        self.region = region
        self.gpu_types = tuple(sorted(g for g, c in region.gpus.items() if c > 0))
        self.capacity = np.array([region.gpus[g] for g in self.gpu_types], dtype=np.int64)
        self.price = np.array([region.usd_per_gpu_hour.get(g, 0.0) for g in self.gpu_types])
        self.priced = bool((self.price > 0).any())
        self.total_gpus = max(float(self.capacity.sum()), 1.0)
        self.n_alive = 0
        """Units whose jobs are all still here."""
        self.active: set[int] = set()
        self.demand = 0.0
        self.dirty = False
        self.mech = RoundMechanism(list(self.capacity), gpus_per_server)
        self.unit_jobs: list[tuple[int, ...]] = []
        self.first = np.zeros(0, dtype=np.int64)
        """The (first) job of each unit."""
        self.singles = True
        """Every unit is one job (no space sharing): the round's arrays are built without loops."""
        self.x = np.zeros((0, len(self.gpu_types)))
        self.scale = np.zeros(0)
        self.thr = np.zeros((0, len(self.gpu_types), 2))
        self.thr_unc = self.thr
        self.runnable = np.zeros((0, len(self.gpu_types)), bool)
        self.alive = np.zeros(0, bool)
        self.ok = self.runnable
        """``runnable`` of units whose jobs are all still here, on types with enough GPUs for them
        (what the mechanism may grant)."""
        self.job_units: dict[int, Sequence[int]] = {}
        self.gcols = np.zeros(0, dtype=np.int64)
        self.session = None
        self.frozen: tuple | None = None
        """Last round's grants and work when they are sure to repeat (see the round loop)."""


def _granted_work(
    r: _RegionSim, grants: Sequence, units: np.ndarray, types: np.ndarray, consolidated: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(job, steps/s, unit) of every job the grants run: units on one server (or of one GPU) at
    their consolidated throughput, units spread over servers at the unconsolidated one."""
    whole = consolidated | (r.scale[units] <= 1)
    if r.singles:
        rate = np.where(whole, r.thr[units, types, 0], r.thr_unc[units, types, 0])
        return r.first[units], rate, units
    js, rates, unit_of = [], [], []
    for gr, w in zip(grants, whole.tolist(), strict=True):
        source = r.thr if w else r.thr_unc
        for k, j in enumerate(r.unit_jobs[gr.unit]):
            js.append(j)
            rates.append(source[gr.unit, gr.gpu_type, k])
            unit_of.append(gr.unit)
    return np.array(js), np.array(rates), np.array(unit_of)


def simulate(
    jobs: Sequence[SimJob],
    regions: Sequence[Region],
    table: ThroughputTable,
    config: SimConfig = SimConfig(),
    availability: AvailabilityProvider | None = None,
    router: Router | None = None,
    strategy: RecoveryStrategy | None = None,
) -> SimResult:
    """Run the workload to completion and summarise it.

    Raises:
        ValueError: unknown policy (lists valid ones), or a job no region can run.
    """
    started = time.perf_counter()
    policy = get_policy(config.policy)
    availability = availability or AlwaysAvailable()
    if router is None or strategy is None:
        placement = SimPlacement(regions, table, config.gpus_per_server)
        router = router or make_router(config.router, placement)
        strategy = strategy or make_recovery(config.recovery, placement)
    sims = [_RegionSim(r, config.gpus_per_server) for r in regions]
    n = len(jobs)
    order = sorted(range(n), key=lambda i: (jobs[i].arrival_s, i))
    arrival = np.array([j.arrival_s for j in jobs], dtype=float)
    remaining = np.array([j.total_steps for j in jobs], dtype=float)
    scale = np.array([j.scale_factor for j in jobs], dtype=float)
    finish = np.full(n, np.nan)
    region_of = np.full(n, -1, dtype=np.int64)
    ids = [j.job_id for j in jobs]
    index = {jid: i for i, jid in enumerate(ids)}
    if len(index) != n:
        raise ValueError("job ids must be unique")
    type_cache: dict = {}

    def type_thr(key) -> tuple[dict[str, float], dict[str, float]]:
        hit = type_cache.get(key)
        if hit is None:
            alone = {g: table.throughput(key, g) for r in sims for g in r.gpu_types}
            unc = {g: table.throughput(key, g, consolidated=False) or alone[g] for g in alone}
            hit = type_cache[key] = (alone, unc)
        return hit

    gpu_names = sorted({g for r in sims for g in r.gpu_types})
    for r in sims:
        r.gcols = np.array([gpu_names.index(g) for g in r.gpu_types], dtype=np.int64)
        r.session = (
            None
            if config.space_sharing or not hasattr(policy, "session")
            else policy.session({g: int(c) for g, c in zip(r.gpu_types, r.capacity, strict=True)})
        )
    # Unconsolidated / consolidated throughput per job and GPU type (1 where not measured).
    unc_ratio = np.ones((n, len(gpu_names)))
    for i, job in enumerate(jobs):
        alone, unc = type_thr(job.job_type)
        for gi, g in enumerate(gpu_names):
            if alone.get(g, 0) > 0:
                unc_ratio[i, gi] = unc[g] / alone[g]
    runnable_in = {}
    for key in {j.job_type for j in jobs}:
        alone, _ = type_thr(key)
        runnable_in[key] = [
            any(alone.get(g, 0) > 0 and r.region.gpus[g] >= key[1] for g in r.gpu_types) for r in sims
        ]
        if not any(runnable_in[key]):
            raise ValueError(
                f"job type {key!r} cannot run in any region (GPU types: "
                f"{', '.join(sorted({g for r in sims for g in r.gpu_types}))})"
            )
    base_jobs: dict[int, PolicyJob] = {}

    def policy_job(i: int, now: float) -> PolicyJob:
        job = jobs[i]
        if policy.symmetric:
            pj = base_jobs.get(i)
            if pj is None:
                pj = base_jobs[i] = PolicyJob(
                    ids[i],
                    type_thr(job.job_type)[0],
                    job.scale_factor,
                    job.priority_weight,
                    job_type=job.job_type,
                )
            return pj
        return PolicyJob(
            ids[i],
            type_thr(job.job_type)[0],
            job.scale_factor,
            job.priority_weight,
            steps_remaining=float(remaining[i]),
            elapsed_s=now - job.arrival_s,
            deadline_s=(job.arrival_s + job.slo_s - now) if job.slo_s else None,
            job_type=job.job_type,
            arrival_s=job.arrival_s,
        )

    def resolve(r: _RegionSim, now: float, cap: np.ndarray) -> None:
        members = sorted(r.active)
        state = PolicyState(
            jobs=tuple(policy_job(i, now) for i in members),
            gpus={g: int(c) for g, c in zip(r.gpu_types, cap, strict=True)},
            usd_per_gpu_hour=dict(zip(r.gpu_types, r.price.tolist(), strict=True)),
            space_sharing=config.space_sharing,
            table=table,
            seed=config.seed,
        )
        alloc = (r.session or policy).allocate(state)
        n_units, m = len(alloc.units), len(r.gpu_types)
        thr = np.zeros((n_units, m, 2))
        thr[:, :, : alloc.unit_throughput.shape[2]] = alloc.unit_throughput[:, :, :2]
        thr_unc = thr.copy()
        singles = all(len(unit) == 1 for unit in alloc.units)
        if singles:
            first = np.fromiter((index[unit[0]] for unit in alloc.units), dtype=np.int64, count=n_units)
            first_l = first.tolist()
            unit_jobs = [(j,) for j in first_l]
            thr_unc[:, :, 0] *= unc_ratio[first][:, r.gcols]
            runnable = thr[:, :, 0] > 0
            r.job_units = {j: (u,) for u, j in enumerate(first_l)}
        else:
            unit_jobs = [tuple(index[j] for j in unit) for unit in alloc.units]
            sizes = np.fromiter((len(u) for u in unit_jobs), dtype=np.int64, count=n_units)
            for k in range(2):
                has = sizes > k
                members = np.fromiter(
                    (u[k] if len(u) > k else 0 for u in unit_jobs), dtype=np.int64, count=n_units
                )
                ratio = unc_ratio[members][:, r.gcols]
                thr_unc[:, :, k] = np.where(has[:, None], thr[:, :, k] * ratio, thr[:, :, k])
            runnable = (thr[:, :, 0] > 0) & ((sizes[:, None] < 2) | (thr[:, :, 1] > 0))
            first = np.fromiter((u[0] for u in unit_jobs), dtype=np.int64, count=n_units)
            r.job_units = {}
            for u, unit in enumerate(unit_jobs):
                for j in unit:
                    r.job_units.setdefault(j, []).append(u)
        r.unit_jobs, r.x, r.scale, r.thr, r.thr_unc = unit_jobs, alloc.matrix, alloc.unit_scale, thr, thr_unc
        r.first, r.singles = first, singles
        # The capacity check is the mechanism's own (its GPUs are this round's: a capacity
        # change re-solves the region).
        r.runnable, r.alive = runnable, np.ones(n_units, bool)
        r.ok = r.mech.fits(runnable, alloc.unit_scale)
        r.n_alive = n_units
        r.mech.set_units(unit_jobs, now)
        r.frozen = None
        r.dirty = False

    def admit(i: int, ri: int) -> None:
        r = sims[ri]
        r.active.add(i)
        r.demand += scale[i]
        r.dirty = True
        region_of[i] = ri

    def leave(i: int) -> None:
        r = sims[region_of[i]]
        r.active.discard(i)
        r.demand -= scale[i]
        r.dirty = True
        for u in r.job_units.get(i, ()):
            r.n_alive -= int(r.alive[u])
            r.alive[u] = False
            r.ok[u] = False

    round_s = config.round_s
    t = 0.0 if not n else np.floor(arrival[order[0]] / round_s) * round_s
    next_arrival = 0
    done = 0
    rounds = solves = preemptions = reused = moves = 0
    busy_gpu_s = cost = 0.0
    last_cap = [r.capacity.copy() for r in sims]
    static_capacity = type(availability) is AlwaysAvailable
    total_gpus = float(sum(r.capacity.sum() for r in sims))
    while done < n and t <= config.horizon_s:
        while next_arrival < n and arrival[order[next_arrival]] <= t:
            i = order[next_arrival]
            load = [(r.demand + scale[i]) / r.total_gpus for r in sims]
            admit(i, router.route(jobs[i], runnable_in[jobs[i].job_type], load))
            next_arrival += 1
        if not any(r.active for r in sims):
            t = np.ceil(arrival[order[next_arrival]] / round_s) * round_s
            continue
        rounds += 1
        if static_capacity:
            caps = last_cap
        else:
            caps = [
                np.array([availability.capacity(r.region, g, t) for g in r.gpu_types], dtype=np.int64)
                for r in sims
            ]
        for ri, r in enumerate(() if static_capacity else sims):
            cap = caps[ri]
            if (cap != last_cap[ri]).any():
                if (cap < last_cap[ri]).any() and r.mech.leases:
                    lost = [
                        u for u, gr in r.mech.leases.items() if cap[gr.gpu_type] < last_cap[ri][gr.gpu_type]
                    ]
                    # effectful: capacity shrank, so every lease on the shrunk types is revoked.
                    r.mech.leases = {u: v for u, v in r.mech.leases.items() if u not in lost}
                    available = [
                        dict(zip(s.gpu_types, c.tolist(), strict=True))
                        for s, c in zip(sims, caps, strict=True)
                    ]
                    for u in lost:
                        for j in r.unit_jobs[u]:
                            preemptions += 1
                            load = [(s.demand + (0.0 if s is r else scale[j])) / s.total_gpus for s in sims]
                            dest = strategy.on_preemption(jobs[j], ri, t, available, load)
                            if dest != ri:
                                moves += 1
                                leave(j)
                                admit(j, dest)
                r.mech.gpus = {g: int(c) for g, c in enumerate(cap)}
                r.dirty = True
                r.frozen = None
                last_cap[ri] = cap
        # Phase 1: grants per region and how long each granted unit would run.
        planned = []
        round_len = 0.0
        for ri, r in enumerate(sims):
            if not r.active:
                continue
            if r.dirty:
                resolve(r, t, caps[ri])
                solves += 1
            if r.frozen is not None and not r.dirty:
                # Nothing changed and every unit ran on the only type X gives it: the greedy would
                # grant the same units the same leased GPUs again, so reuse last round's grants.
                grants, (js_a, rate, unit_a, units, types) = r.frozen
                reused += 1
            else:
                grants = r.mech.schedule(t, r.x, r.unit_jobs, r.scale, r.ok, r.x, r.singles, fits=True)
                if not grants:
                    planned.append((r, grants, None))
                    continue
                # Grant fields: unit, gpu_type, servers, extended, consolidated.
                cols = list(zip(*grants, strict=True))
                units, types = np.array(cols[0]), np.array(cols[1])
                js_a, rate, unit_a = _granted_work(r, grants, units, types, np.array(cols[4]))
                r.frozen = None
                if config.reuse_stable_rounds and len(grants) == r.n_alive:
                    support = r.x[units] > 0
                    if support[np.arange(len(units)), types].all() and (support.sum(axis=1) == 1).all():
                        r.frozen = (grants, (js_a, rate, unit_a, units, types))
            need = remaining[js_a] / np.maximum(rate, 1e-12)
            round_len = max(round_len, float(min(need.max(), round_s)))
            planned.append((r, grants, (js_a, rate, unit_a, need, units, types)))
        # Phase 2: the round lasts until its last unit finishes, at most round_s (as in Gavel).
        if round_len <= 0:
            round_len = round_s
        for r, grants, work in planned:
            r.mech.record(grants, round_len)
            if work is None:
                continue
            js_a, rate, unit_a, need, units, types = work
            run_s = np.minimum(need, round_len)
            finished = need <= round_len
            remaining[js_a] = np.maximum(remaining[js_a] - rate * round_len, 0.0)
            # A unit occupies its GPUs until its last job finishes (or the round ends).
            if r.singles:  # one job per granted unit: the grants' own order
                used, used_run, used_gpu = units, run_s, types
            else:
                unit_run = np.zeros(len(r.unit_jobs))
                np.maximum.at(unit_run, unit_a, run_s)
                unit_gpu = np.zeros(len(r.unit_jobs), dtype=np.int64)
                unit_gpu[units] = types
                used = np.unique(unit_a)
                used_run, used_gpu = unit_run[used], unit_gpu[used]
            gpu_s = r.scale[used] * used_run
            busy_gpu_s += float(gpu_s.sum())
            if r.priced:
                cost += float((gpu_s * r.price[used_gpu]).sum()) / 3600.0
            for j, dt_s in zip(js_a[finished].tolist(), need[finished].tolist(), strict=True):
                if np.isnan(finish[j]):
                    finish[j] = t + dt_s
                    done += 1
                    leave(j)
        t += round_len
    jct = (finish - arrival)[~np.isnan(finish)]
    makespan = float(np.nanmax(finish) - arrival.min()) if done else 0.0
    return SimResult(
        policy=config.policy,
        jobs=n,
        completed=done,
        avg_jct_s=float(jct.mean()) if done else 0.0,
        p50_jct_s=float(np.percentile(jct, 50)) if done else 0.0,
        p99_jct_s=float(np.percentile(jct, 99)) if done else 0.0,
        makespan_s=makespan,
        utilization=busy_gpu_s / (total_gpus * makespan) if makespan > 0 else 0.0,
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
    )
