"""Seeded rebalance scenarios at MAST-like scale (for the CLI, tests and ``bench/rebalance.py``).

- Supply: every region carries most GPU types, capacity log-normal around 200 GPUs per cell.
- Teams: grouped into organisations of ~50; each team's demand (log-normal, median 8 GPUs) runs
  in its home region, and home regions are skewed so that everyone wants the popular regions
  (the busiest region's demand/supply ratio ≈ 2.6, as at MAST before balancing) while total demand
  per GPU type is ``demand_fraction`` of its supply.
- Datasets: log-normal sizes (median 20 GB); readers drawn inside one organisation with the reader
  count distribution of MAST's data partitions (median 3, P90 17, P99 45), weighted by a
  log-normal "data appetite" per team (a few teams read most of their organisation's data); each
  dataset starts replicated in its readers' home regions (where ``place_data`` put it) plus
  ``extra_replicas`` disaster-recovery copies in regions drawn by supply.

The supply can instead be given (``supply``: for example the packaged catalog's regions, of very
different sizes and GPU mixes), and the team demands too (``team_demand``: for example
``philly_team_demand``, the job mix of a real cluster trace).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sailor_tasks.rebalance.problem import Dataset, Problem, Team

GPU_NAMES = ("A100", "H100", "L4", "T4", "V100", "A10G", "P100", "H200")
READER_QUANTILES = ((0.0, 1.0), (0.5, 3.0), (0.9, 17.0), (0.99, 45.0), (1.0, 60.0))
POPULAR_RATIOS = (2.6, 2.2, 1.9, 1.7, 1.5, 1.4)
GB = 1_000_000_000


def reader_counts(rng: np.random.Generator, n: int) -> np.ndarray:
    """Reader counts following READER_QUANTILES (log-linear between the quantile points)."""
    qs = np.array([q for q, _ in READER_QUANTILES])
    logs = np.log([v for _, v in READER_QUANTILES])
    return np.maximum(1, np.round(np.exp(np.interp(rng.random(n), qs, logs)))).astype(int)


def generate(
    regions: int = 40,
    gpu_types: int = 8,
    teams: int = 2000,
    datasets: int = 10000,
    seed: int = 0,
    demand_fraction: float = 0.85,
    budget_fraction: float = 0.1,
    org_size: int = 50,
    quota_fraction: float = 0.01,
    extra_replicas: int = 2,
    appetite_sigma: float = 1.5,
    supply: Mapping[str, Mapping[str, float]] | None = None,
    team_demand: Sequence[float] | None = None,
) -> Problem:
    """A scenario; ``budget_fraction`` of all dataset bytes is the nightly replication budget.

    Args:
        supply: region → GPU type → GPUs to use instead of the generated supply (for example the
            packaged catalog's, ``catalog_supply``); ``regions`` and ``gpu_types`` are then ignored.
        team_demand: each team's total demand (any unit: only the proportions count, every GPU type
            is scaled to ``demand_fraction`` of its supply) instead of the log-normal one; its
            length is the number of teams.
    """
    if team_demand is not None:
        teams = len(team_demand)
        if teams < 1 or not all(float(d) > 0 for d in team_demand):
            raise ValueError(f"team_demand: need at least one team and every demand > 0; got {teams} teams")
    if supply is not None:
        region_names = sorted(r for r, per in supply.items() if any(n > 0 for n in per.values()))
        gpus = sorted({g for r in region_names for g, n in supply[r].items() if n > 0})
        regions, gpu_types = len(region_names), len(gpus)
    if regions < 2 or gpu_types < 1 or teams < 1 or datasets < 1:
        raise ValueError(
            f"need regions>=2, gpu_types>=1, teams>=1, datasets>=1; got {regions}, {gpu_types}, {teams}, {datasets}"
        )
    rng = np.random.default_rng(seed)
    if supply is None:
        region_names = [f"region-{i:02d}" for i in range(regions)]
        gpus = [GPU_NAMES[i] if i < len(GPU_NAMES) else f"GPU{i}" for i in range(gpu_types)]
        cap = np.round(rng.lognormal(np.log(200), 0.5, size=(regions, gpu_types)))
        cap *= rng.random((regions, gpu_types)) < 0.75
        for g in range(gpu_types):  # every GPU type somewhere, in at least two regions
            for r in rng.choice(regions, size=2, replace=False):
                cap[r, g] = cap[r, g] or 100
    else:
        cap = np.array([[max(0.0, float(supply[r].get(g, 0.0))) for g in gpus] for r in region_names])
    region_cap = cap.sum(axis=1)

    # home-region popularity: a few popular regions at POPULAR_RATIOS, the rest share what is left
    popular = rng.choice(regions, size=min(len(POPULAR_RATIOS), regions - 1), replace=False)
    factor = np.zeros(regions)
    factor[popular] = POPULAR_RATIOS[: len(popular)]
    rest = np.setdiff1d(np.arange(regions), popular)
    left = demand_fraction * region_cap.sum() - (factor * region_cap).sum()
    factor[rest] = max(0.05, left / region_cap[rest].sum())
    home_p = factor * region_cap / (factor * region_cap).sum()

    homes = rng.choice(regions, size=teams, p=home_p)
    team_demand = (
        rng.lognormal(np.log(8), 1.0, size=teams)
        if team_demand is None
        else np.asarray(team_demand, dtype=float)
    )
    team_gpus: list[dict[int, float]] = []
    for i in range(teams):
        p = cap[homes[i]] / cap[homes[i]].sum()
        g1 = int(rng.choice(gpu_types, p=p))
        mix = {g1: team_demand[i]}
        if rng.random() < 0.2 and (cap[homes[i]] > 0).sum() > 1:
            g2 = int(rng.choice(gpu_types, p=p))
            if g2 != g1:
                mix = {g1: 0.7 * team_demand[i], g2: 0.3 * team_demand[i]}
        team_gpus.append(mix)
    # home-region demand tracks the popularity factor per region; total per GPU type = fraction × supply
    want = {g: 0.0 for g in range(gpu_types)}
    for mix in team_gpus:
        for g, n in mix.items():
            want[g] += n
    scale = {g: demand_fraction * cap[:, g].sum() / want[g] if want[g] else 0.0 for g in want}

    orgs = np.arange(teams) // org_size
    members: dict[int, list[int]] = {}
    for i, o in enumerate(orgs):
        members.setdefault(int(o), []).append(i)
    org_ids = sorted(members)
    org_p = np.array([len(members[o]) for o in org_ids], dtype=float)
    ds_org = rng.choice(org_ids, size=datasets, p=org_p / org_p.sum())
    counts = reader_counts(rng, datasets)
    sizes = np.round(rng.lognormal(np.log(20 * GB), 1.5, size=datasets)).astype(np.int64)
    reads: list[list[str]] = [[] for _ in range(teams)]
    readers_of: list[np.ndarray] = []
    # data appetite: a few teams of an organisation read most of its datasets, most read a few
    appetite = rng.lognormal(0.0, appetite_sigma, size=teams)
    for d in range(datasets):
        pool = members[int(ds_org[d])]
        w = appetite[pool] / appetite[pool].sum()
        chosen = rng.choice(pool, size=min(int(counts[d]), len(pool)), replace=False, p=w)
        readers_of.append(chosen)
    uris = [f"sailor://source/datasets/part-{d:05d}" for d in range(datasets)]
    for d, chosen in enumerate(readers_of):
        for i in chosen:
            reads[int(i)].append(uris[d])
    for i in range(teams):  # every team reads something of its organisation
        if not reads[i]:
            d = int(rng.integers(datasets))
            reads[i].append(uris[d])
            readers_of[d] = np.append(readers_of[d], i)
    # replicas: where the readers ran (place_data put them there) plus ``extra_replicas`` copies in
    # regions drawn by supply (disaster-recovery copies)
    extra = rng.choice(regions, size=(datasets, extra_replicas), p=region_cap / region_cap.sum())
    ds = {}
    for d in range(datasets):
        where = {region_names[homes[int(i)]] for i in readers_of[d]} | {region_names[r] for r in extra[d]}
        ds[uris[d]] = Dataset(uris[d], int(sizes[d]), tuple(sorted(where)))
    team_list = []
    for i in range(teams):
        home = region_names[homes[i]]
        quota_max = {}
        if rng.random() < quota_fraction:  # a data-sovereignty rule: never in one other region
            other = region_names[int(rng.choice(np.delete(np.arange(regions), homes[i])))]
            quota_max = {other: 0.0}
        team_list.append(
            Team(
                name=f"team-{i:04d}",
                current={home: {gpus[g]: round(n * scale[g], 4) for g, n in team_gpus[i].items()}},
                datasets=tuple(sorted(set(reads[i]))),
                priority=float(rng.choice([1.0, 1.0, 1.0, 2.0, 5.0])),
                quota_max=quota_max,
            )
        )
    total_bytes = int(sizes.sum())
    stored = {r: 0.0 for r in region_names}
    for d in ds.values():
        for r in d.replicas:
            stored[r] += d.bytes
    return Problem(
        supply={
            region_names[r]: {gpus[g]: float(cap[r, g]) for g in range(gpu_types) if cap[r, g] > 0}
            for r in range(regions)
        },
        teams=tuple(team_list),
        datasets=ds,
        budget_bytes=int(budget_fraction * total_bytes),
        storage_cap_bytes={r: 1.2 * stored[r] + 0.3 * total_bytes for r in region_names},
    )


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only (lists, tuples, numbers): no class of any module is loaded."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name}: only plain data is read from a job trace")


PHILLY_MEASURES = ("gpu_seconds", "gpus")


def philly_team_demand(path: str, teams: int, seed: int = 0, measure: str = "gpu_seconds") -> list[float]:
    """Team demands drawn from the Philly job trace as Gavel packages it
    (``philly_job_distribution.pickle``: ``(duration_s, GPUs)`` of 33,192 jobs of Microsoft's Philly
    cluster): ``teams`` jobs drawn without replacement (seeded), each team's demand its job's
    ``measure``: ``"gpu_seconds"`` (the job's GPU-seconds: heavy-tailed, the top 1% of jobs
    above 300 times the median) or ``"gpus"`` (the GPUs it holds while it runs: 1, 2, 4 or 8).

    Raises:
        ValueError: ``measure`` is not one of PHILLY_MEASURES, the file holds no ``(duration_s,
            GPUs)`` pairs, or fewer jobs than ``teams``.
    """
    if measure not in PHILLY_MEASURES:
        raise ValueError(f"measure={measure!r}: valid: {', '.join(PHILLY_MEASURES)}")
    with open(path, "rb") as f:
        jobs = _PlainUnpickler(f).load()
    try:
        pairs = np.array([(float(d), float(g)) for d, g in jobs])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: expected a list of (duration_s, GPUs) pairs ({exc})") from exc
    if pairs.ndim != 2 or not len(pairs):
        raise ValueError(f"{path}: expected a list of (duration_s, GPUs) pairs, found none")
    demand = pairs[:, 0] * pairs[:, 1] if measure == "gpu_seconds" else pairs[:, 1]
    demand = demand[(pairs[:, 0] > 0) & (pairs[:, 1] > 0)]
    if not 1 <= teams <= len(demand):
        raise ValueError(f"teams={teams}: {path} has {len(demand)} jobs with duration and GPUs > 0")
    rng = np.random.default_rng(seed)
    return [float(v) for v in rng.choice(demand, size=teams, replace=False)]
