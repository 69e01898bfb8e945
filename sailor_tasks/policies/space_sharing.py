"""Space sharing that scales: candidate pairs restricted to each job's top-k partners, and
POP-style partitioning (random job partitions, each with a proportional share of every GPU type,
solved independently; Narayanan et al., SOSP'21).

Gavel's space-sharing LP has a variable for every pair of jobs (O(n²) · GPU types: 41.8 s at 512
jobs). Here a job may only pair with the ``TOP_K_PARTNERS`` jobs of its scale factor whose
measured co-located throughput helps most, and jobs are split into partitions of at most
``PARTITION_JOBS``; both bound the LP at O(n · k) variables per partition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sailor_tasks.policies.base import Allocation, PolicyJob, PolicyState, Units, singles

TOP_K_PARTNERS = 4
"""Partners considered per job: Gavel reports most of the space-sharing gain from the best few."""
PARTITION_JOBS = 64
"""Jobs per POP partition: POP shows near-optimal allocations from partitions of tens of jobs."""


_GAIN_CACHE: dict[tuple, tuple] = {}


def _pair_gain(table, job_types: tuple, gpu_types: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Per (job type a, job type b, GPU type): steps/s of a and b sharing one GPU (0 = not measured),
    and the best normalised combined throughput of each pair. Cached per table (tables are frozen)."""
    key = (id(table), job_types, gpu_types)
    hit = _GAIN_CACHE.get(key)
    if hit is not None and hit[0] is table:
        return hit[1], hit[2]
    n, m = len(job_types), len(gpu_types)
    pair = np.zeros((n, n, m, 2))
    for a, ka in enumerate(job_types):
        for b, kb in enumerate(job_types):
            for i, g in enumerate(gpu_types):
                p = table.pair(ka, kb, g)
                if p is not None:
                    pair[a, b, i] = p
    alone = np.array([[table.throughput(k, g) for g in gpu_types] for k in job_types])
    safe = np.where(alone > 0, alone, np.inf)
    # Normalised combined throughput of the pair (> 1: sharing beats time-slicing the two jobs).
    gain = (pair[:, :, :, 0] / safe[:, None, :] + pair[:, :, :, 1] / safe[None, :, :]).max(axis=2)
    if len(_GAIN_CACHE) > 16:
        _GAIN_CACHE.clear()
    _GAIN_CACHE[key] = (table, pair, gain)
    return pair, gain


def pair_units(state: PolicyState, jobs: Sequence[PolicyJob], top_k: int = TOP_K_PARTNERS) -> Units:
    """Singles for every job plus the pairs (j, l) where l is among j's top-k partners."""
    base = singles(jobs, state.runnable_gpus)
    table = state.table
    typed = [j for j, job in enumerate(base.jobs) if job.job_type is not None]
    if table is None or not typed or top_k <= 0:
        return base
    job_types = tuple(sorted({base.jobs[j].job_type for j in typed}))
    type_idx = {k: i for i, k in enumerate(job_types)}
    pair, gain = _pair_gain(table, job_types, base.gpu_types)
    ids = np.array(typed)
    t = np.array([type_idx[base.jobs[j].job_type] for j in typed])
    s = np.array([base.jobs[j].scale_factor for j in typed])
    score = gain[t[:, None], t[None, :]]
    score[s[:, None] != s[None, :]] = 0.0
    np.fill_diagonal(score, 0.0)
    k = min(top_k, len(typed) - 1)
    chosen: set[tuple[int, int]] = set()
    if k > 0:
        best = np.argpartition(-score, k - 1, axis=1)[:, :k]
        for a in range(len(typed)):
            for b in best[a]:
                if score[a, b] > 1.0:
                    chosen.add((min(ids[a], ids[b]), max(ids[a], ids[b])))
    if not chosen:
        return base
    pairs = sorted(chosen)
    m = len(base.gpu_types)
    pair_thr = np.zeros((len(pairs), m, 2))
    local = {j: i for i, j in enumerate(typed)}
    for u, (a, b) in enumerate(pairs):
        pair_thr[u] = pair[t[local[a]], t[local[b]]]
    thr = np.concatenate([np.concatenate([base.thr, np.zeros_like(base.thr)], axis=2), pair_thr])
    return Units(
        jobs=base.jobs,
        gpu_types=base.gpu_types,
        units=base.units + tuple(pairs),
        thr=thr,
        scale=np.concatenate([base.scale, [base.jobs[a].scale_factor for a, _ in pairs]]),
        count=np.concatenate([base.count, np.ones(len(pairs))]),
    )


def partitioned(
    state: PolicyState,
    solve_part: Callable[[PolicyState], Allocation],
    partition_jobs: int = PARTITION_JOBS,
) -> Allocation:
    """Solve ``solve_part`` on random job partitions, each with a proportional GPU share (POP).

    A partition's share of GPU type m is GPUs_m · (its jobs' scale factors / all scale factors),
    so the union of partition allocations respects the whole cluster's capacity. Whether a job can
    run on a type at all is judged on the whole cluster (``PolicyState.runnable_gpus``): a share
    smaller than the job's scale factor still bounds its time there, never rules it out.
    """
    from dataclasses import replace

    n = len(state.jobs)
    if n <= partition_jobs:
        return solve_part(state)
    parts = -(-n // partition_jobs)
    order = np.random.default_rng(state.seed).permutation(n)
    total_scale = sum(j.scale_factor * j.count for j in state.jobs)
    allocations = []
    for p in range(parts):
        jobs = tuple(state.jobs[i] for i in order[p::parts])
        share = sum(j.scale_factor * j.count for j in jobs) / total_scale
        allocations.append(
            solve_part(
                replace(
                    state,
                    jobs=jobs,
                    gpus={g: c * share for g, c in state.gpus.items()},
                    cluster_gpus=state.runnable_gpus,
                )
            )
        )
    return concat(allocations)


def concat(allocations: Sequence[Allocation]) -> Allocation:
    """One allocation from several over disjoint jobs and the same GPU types."""
    first = allocations[0]
    width = max(a.unit_throughput.shape[2] for a in allocations)

    def pad(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a, np.zeros((*a.shape[:2], width - a.shape[2]))], axis=2)

    matrix = np.concatenate([a.matrix for a in allocations])
    matrix.setflags(write=False)
    return Allocation(
        policy=first.policy,
        gpu_types=first.gpu_types,
        units=tuple(u for a in allocations for u in a.units),
        matrix=matrix,
        unit_throughput=np.concatenate([pad(a.unit_throughput) for a in allocations]),
        unit_scale=np.concatenate([a.unit_scale for a in allocations]),
        solve_s=sum(a.solve_s for a in allocations),
        status=first.status,
    )
