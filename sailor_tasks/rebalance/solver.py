"""Region assignment + data replication as a MIP solved by HiGHS (``scipy.optimize.milp``).

Lexicographic objectives (worst demand/supply ratio, then a soft balance that charges overload
three times idleness, then bytes replicated), data locality as a hard constraint, and three
devices that keep thousands of teams and datasets at a few seconds: aggregated locality rows,
greedy rounding of the binaries above ``mip_max_binaries``, and POP-style decomposition above
``team_block`` teams. The model, constraint by constraint, is in ``docs/rebalance.md``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sailor_tasks.errors import RebalanceInfeasibleError
from sailor_tasks.rebalance.problem import (
    Problem,
    Team,
    allocation_rate,
    cell_ratios,
    region_ratios,
)

logger = logging.getLogger(__name__)

OVERLOAD_WEIGHT = 3.0
UNDERLOAD_WEIGHT = 1.0
MOVE_WEIGHT = 0.1
T_TOLERANCE = 1e-6
MIP_REL_GAP = 0.01
CHEAP_CANDIDATES = 4
LP_BOUND_TIME_SHARE = 0.3


@dataclass
class Solution:
    status: str
    placement: dict[str, dict[str, dict[str, float]]]
    """team → region → GPU type → GPUs."""
    shares: dict[str, dict[str, float]]
    """team → region → share of the team's demand (sums to 1)."""
    replicate: list[dict[str, Any]]
    """New replicas: {"dataset_uri", "region", "bytes"}."""
    region_load_before: dict[str, float]
    region_load_after: dict[str, float]
    cell_load_before: dict[str, dict[str, float]]
    cell_load_after: dict[str, dict[str, float]]
    lower_bound: float
    """LP bound on the worst (region, GPU type) ratio, whole problem, data constraints relaxed."""
    region_lower_bound: float
    """LP bound on the worst region ratio (GPU types summed), data constraints relaxed."""
    partition_bound: float | None
    """max over partitions of their LP relaxation (None when one ran out of its time share)."""
    max_ratio_before: float
    max_ratio_after: float
    max_cell_ratio_before: float
    max_cell_ratio_after: float
    allocation_rate_before: float
    allocation_rate_after: float
    bytes_moved: int
    budget_bytes: int
    gpus_moved: float
    cross_region_reads: int
    solve_s: float
    partitions: int
    binaries: int
    stage_status: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    def summary(self) -> dict[str, Any]:
        keys = (
            "status",
            "max_ratio_before",
            "max_ratio_after",
            "lower_bound",
            "region_lower_bound",
            "partition_bound",
            "max_cell_ratio_before",
            "max_cell_ratio_after",
            "allocation_rate_before",
            "allocation_rate_after",
            "bytes_moved",
            "budget_bytes",
            "gpus_moved",
            "cross_region_reads",
            "solve_s",
            "partitions",
            "binaries",
        )
        return {k: getattr(self, k) for k in keys}


# --- checks and bounds -------------------------------------------------------------------------


def check_feasible(problem: Problem) -> None:
    """Cheap necessary conditions, each naming the violated constraint and the bad value."""
    cells = problem.cell_supply()
    regions_with = defaultdict(set)
    for r, g in cells:
        regions_with[g].add(r)
    for team in problem.teams:
        demand = team.demand()
        for gpu in demand:
            if not regions_with.get(gpu):
                raise RebalanceInfeasibleError(
                    "supply",
                    f"team {team.name!r} uses GPU type {gpu!r}, which no region supplies; "
                    f"valid: {', '.join(problem.gpu_types)}",
                )
        for d in team.datasets:
            if d not in problem.datasets:
                raise RebalanceInfeasibleError(
                    "datasets", f"team {team.name!r} reads {d!r}, which is not among the problem's datasets"
                )
        total = sum(demand.values())
        qmin = sum(float(v) for v in team.quota_min.values())
        if qmin > total + 1e-9:
            raise RebalanceInfeasibleError(
                f"quota_min of team {team.name!r}",
                f"minimum quotas sum to {qmin:g} GPUs > the team's demand {total:g} GPUs",
            )
        usable = {r for g in demand for r in regions_with[g]}
        for r in team.quota_min:
            if r not in usable:
                raise RebalanceInfeasibleError(
                    f"quota_min of team {team.name!r}",
                    f"region {r!r} has no supply of the team's GPU types ({', '.join(sorted(demand))})",
                )
        caps = [team.cap(r) for r in usable]
        if all(c is not None for c in caps):
            allowed = sum(caps)  # type: ignore[arg-type]
            if allowed + 1e-9 < total:
                raise RebalanceInfeasibleError(
                    f"quota_max of team {team.name!r}",
                    f"quotas allow at most {allowed:g} GPUs in regions supplying its GPU types "
                    f"< the team's demand {total:g} GPUs",
                )
        for r, lo in team.quota_min.items():
            hi = team.cap(r)
            if hi is not None and lo > hi + 1e-9:
                raise RebalanceInfeasibleError(
                    f"quotas of team {team.name!r}", f"quota_min[{r}]={lo:g} > quota_max={hi:g}"
                )


def _lp_bound(problem: Problem, per_region: bool) -> float:
    """min t: all demand placed, quotas held, data constraints relaxed; teams without quotas pooled."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    cells = problem.cell_supply()
    cell_list = sorted(cells)
    pool: dict[str, float] = defaultdict(float)
    quota_teams: list[Team] = []
    for team in problem.teams:
        if team.quota_max or team.quota_min:
            quota_teams.append(team)
        else:
            for g, n in team.demand().items():
                pool[g] += n
    cols: list[tuple] = [("t",)]
    cols += [("p", r, g) for r, g in cell_list if pool.get(g, 0) > 0]
    for i, team in enumerate(quota_teams):
        for g in team.demand():
            cols += [("x", i, r, gg) for r, gg in cell_list if gg == g]
    index = {c: j for j, c in enumerate(cols)}
    rows: list[int] = []
    cidx: list[int] = []
    vals: list[float] = []
    b_ub: list[float] = []
    b_eq: list[float] = []
    eq_rows: list[int] = []
    eq_cols: list[int] = []
    eq_vals: list[float] = []

    def ub_row(entries: Iterable[tuple[int, float]], rhs: float) -> None:
        n = len(b_ub)
        for j, v in entries:
            rows.append(n)
            cidx.append(j)
            vals.append(v)
        b_ub.append(rhs)

    def eq_row(entries: Iterable[tuple[int, float]], rhs: float) -> None:
        n = len(b_eq)
        for j, v in entries:
            eq_rows.append(n)
            eq_cols.append(j)
            eq_vals.append(v)
        b_eq.append(rhs)

    users: dict[tuple[str, str], list[int]] = defaultdict(list)
    for c, j in index.items():
        if c[0] == "p":
            users[(c[1], c[2])].append(j)
        elif c[0] == "x":
            users[(c[2], c[3])].append(j)
    if per_region:
        by_region: dict[str, list[int]] = defaultdict(list)
        cap: dict[str, float] = defaultdict(float)
        for (r, g), n in cells.items():
            by_region[r] += users[(r, g)]
            cap[r] += n
        for r, js in by_region.items():
            ub_row([*((j, 1.0) for j in js), (0, -cap[r])], 0.0)
    else:
        for cell, js in users.items():
            ub_row([*((j, 1.0) for j in js), (0, -cells[cell])], 0.0)
    for g, n in pool.items():
        eq_row(((index[("p", r, gg)], 1.0) for r, gg in cell_list if gg == g), n)
    for i, team in enumerate(quota_teams):
        for g, n in team.demand().items():
            eq_row(((index[("x", i, r, gg)], 1.0) for r, gg in cell_list if gg == g), n)
        regions = sorted({r for r, _ in cell_list})
        for r in regions:
            js = [index[c] for c in (("x", i, r, g) for g in team.demand()) if c in index]
            hi, lo = team.cap(r), team.quota_min.get(r)
            if hi is not None:
                ub_row(((j, 1.0) for j in js), hi)
            if lo:
                ub_row(((j, -1.0) for j in js), -float(lo))
    n = len(cols)
    c = np.zeros(n)
    c[0] = 1.0
    a_ub = coo_matrix((vals, (rows, cidx)), shape=(len(b_ub), n)).tocsr() if b_ub else None
    a_eq = coo_matrix((eq_vals, (eq_rows, eq_cols)), shape=(len(b_eq), n)).tocsr() if b_eq else None
    res = linprog(
        c,
        A_ub=a_ub,
        b_ub=b_ub or None,
        A_eq=a_eq,
        b_eq=b_eq or None,
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0:
        raise RebalanceInfeasibleError("quotas", f"the balance LP has no solution ({res.message})")
    return float(res.x[0])


# --- partitions ---------------------------------------------------------------------------------


def partition_teams(problem: Problem, team_block: int) -> list[list[int]]:
    """Teams (indices) grouped by dataset clusters, packed into partitions of ≤ team_block teams."""
    n = len(problem.teams)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_reader: dict[str, int] = {}
    for i, team in enumerate(problem.teams):
        for d in team.datasets:
            j = first_reader.setdefault(d, i)
            ri, rj = find(i), find(j)
            if ri != rj:
                parent[ri] = rj
    comps: dict[int, list[int]] = defaultdict(list)
    for i in range(n):
        comps[find(i)].append(i)
    chunks: list[list[int]] = []
    for members in comps.values():
        for s in range(0, len(members), team_block):
            chunks.append(members[s : s + team_block])
    num = max(1, math.ceil(n / team_block))
    demand = [sum(problem.teams[i].demand().values()) for i in range(n)]
    parts: list[list[int]] = [[] for _ in range(num)]
    load = [0.0] * num
    for chunk in sorted(chunks, key=lambda ch: -len(ch)):
        fits = [p for p in range(num) if len(parts[p]) + len(chunk) <= team_block] or list(range(num))
        p = min(fits, key=lambda q: (load[q], len(parts[q])))
        parts[p].extend(chunk)
        load[p] += sum(demand[i] for i in chunk)
    return [sorted(p) for p in parts if p]


# --- the plan that coordinates partitions --------------------------------------------------------


Group = tuple[str, tuple[str, ...]]
"""(GPU type, regions): moving GPUs of that type that may go to any of those regions."""


@dataclass
class _Plan:
    """Who stays and who moves, over all teams, from one LP at the team level (data relaxed)."""

    t: float
    """The plan's worst (region, GPU type) ratio."""
    stay: dict[int, dict[tuple[str, str], float]]
    """team → cell → GPUs of its current load planned to stay there."""
    move: dict[int, dict[Group, float]]
    """team → (GPU type, the regions it may move to) → GPUs planned to move."""
    bytes: dict[int, float]
    """team → bytes its planned moves need (the cheapest region's missing bytes, pro rata)."""


def _missing_bytes(problem: Problem, regions: list[str]) -> np.ndarray:
    """teams × regions: bytes of each team's datasets without a replica in each region."""
    from scipy.sparse import csr_matrix

    uris = list(problem.datasets)
    d_index = {u: i for i, u in enumerate(uris)}
    r_index = {r: i for i, r in enumerate(regions)}
    absent = np.ones((len(uris), len(regions)))
    for i, u in enumerate(uris):
        for r in problem.datasets[u].replicas:
            if r in r_index:
                absent[i, r_index[r]] = 0.0
    sizes = np.array([float(problem.datasets[u].bytes) for u in uris])
    rows, cols = [], []
    for k, team in enumerate(problem.teams):
        for d in sorted(set(team.datasets)):
            rows.append(k)
            cols.append(d_index[d])
    reads = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(problem.teams), len(uris)))
    return np.asarray(reads @ (absent * sizes[:, None]))


def _plan_moves(
    problem: Problem,
    cells: Mapping[tuple[str, str], float],
    comfort_ratio: float,
) -> _Plan:
    """The partitions' common plan, one LP over all teams with the data constraints relaxed: per
    team and current cell, the GPUs that leave it, to the regions the team may use (those with its
    GPU type, that its quotas allow and whose missing bytes the budget affords; teams with the
    same regions are pooled); minimising the worst cell ratio, then the bytes and moves that costs
    (a team's move costs the bytes of the cheapest of its regions, pro rata to the GPUs moved).
    A decomposed solve shares the cells by it instead of by a rule, so each partition keeps room
    for the load it cannot move and for where the others' moving teams can go."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    cell_list = sorted(cells)
    regions = sorted({r for r, _ in cell_list})
    r_index = {r: i for i, r in enumerate(regions)}
    has: dict[str, np.ndarray] = {}
    for r, g in cell_list:
        has.setdefault(g, np.zeros(len(regions), dtype=bool))[r_index[r]] = True
    missing = _missing_bytes(problem, regions)
    budget = float(problem.budget_bytes)
    total_demand = sum(sum(t.demand().values()) for t in problem.teams) or 1.0
    b = _Builder()
    t_col = b.var(("t",), lb=comfort_ratio)
    cost: dict[int, float] = {}
    load: dict[tuple[str, str], float] = defaultdict(float)
    in_cell: dict[tuple[str, str], list[int]] = defaultdict(list)
    leaves: dict[Group, list[int]] = defaultdict(list)
    entries: dict[int, tuple[int, str, str, float, Group, float]] = {}
    for k, team in enumerate(problem.teams):
        size = sum(team.demand().values()) or 1.0
        allowed = np.array([team.cap(r) != 0.0 for r in regions]) & (missing[k] <= budget)
        for r, per in sorted(team.current.items()):
            cap, floor = team.cap(r), float(team.quota_min.get(r, 0.0))
            forced = cap is not None and sum(per.values()) > cap + 1e-9
            js = []
            for g, n in sorted(per.items()):
                if n <= 0:
                    continue
                where = has.get(g, np.zeros(len(regions), dtype=bool)) & allowed
                if r in r_index:
                    where[r_index[r]] = False
                if (r, g) not in cells or forced:  # it must leave: to anywhere with the type if need be
                    where = where if where.any() else has[g].copy()
                    if r in r_index:
                        where[r_index[r]] = False
                if (r, g) in cells:
                    load[(r, g)] += n
                if not where.any():
                    continue  # nowhere it may go: the load stays
                group = (g, tuple(regions[i] for i in np.flatnonzero(where)))
                nbytes = float(missing[k][where].min())
                j = b.var(("m", k, r, g), lb=0.0 if (r, g) in cells else n, ub=n)
                js.append(j)
                leaves[group].append(j)
                if (r, g) in cells:
                    in_cell[(r, g)].append(j)
                entries[j] = (k, r, g, n, group, nbytes / size)
                cost[j] = nbytes / size / max(budget, 1.0) + MOVE_WEIGHT * team.priority / total_demand
            # quotas where the load is now: at least quota_min stays, at most the cap does
            here = sum(per.values())
            if js and floor > 0:
                b.row(((j, 1.0) for j in js), -math.inf, max(0.0, here - floor), "quota_min")
            if js and forced:
                b.row(((j, 1.0) for j in js), here - cap, math.inf, "quota_max")  # type: ignore[operator]
    arrivals: dict[tuple[str, str], list[int]] = defaultdict(list)
    for gi, (group, js) in enumerate(sorted(leaves.items())):
        g, where = group
        arrive = [b.var(("a", gi, r)) for r in where]
        for r, a in zip(where, arrive, strict=True):
            arrivals[(r, g)].append(a)
        b.row([*((a, 1.0) for a in arrive), *((j, -1.0) for j in js)], 0.0, 0.0, "moves arrive")
    for c in cell_list:  # load − leaving + arriving ≤ t · supply
        terms = [*((j, -1.0) for j in in_cell[c]), *((a, 1.0) for a in arrivals[c]), (t_col, -cells[c])]
        b.row(terms, -math.inf, -load.get(c, 0.0), "ratio")
    n = len(b.lb)
    a_mat = coo_matrix((b.v, (b.r, b.c)), shape=(len(b.row_lb), n)).tocsr()
    constraints = LinearConstraint(a_mat, np.array(b.row_lb), np.array(b.row_ub))
    lb, ub = np.array(b.lb), np.array(b.ub)
    c_t = np.zeros(n)
    c_t[t_col] = 1.0
    first = milp(c_t, constraints=constraints, bounds=Bounds(lb, ub))
    if first.x is None:  # quotas the relaxed plan cannot meet: the partitions' models say why
        logger.warning(
            "rebalance: no plan to share the cells by (%s); every team planned to stay", first.message
        )
        stay_all: dict[int, dict[tuple[str, str], float]] = defaultdict(dict)
        for k, team in enumerate(problem.teams):
            for r, per in team.current.items():
                for g, n_cur in per.items():
                    if (r, g) in cells and n_cur > 0:
                        stay_all[k][(r, g)] = n_cur
        return _Plan(math.nan, dict(stay_all), {}, {})
    t = float(first.x[t_col])
    ub[t_col] = max(lb[t_col], t * (1 + T_TOLERANCE) + T_TOLERANCE)
    c_cost = np.zeros(n)
    for j, v in cost.items():
        c_cost[j] = v
    second = milp(c_cost, constraints=constraints, bounds=Bounds(lb, ub))
    x = second.x if second.x is not None else first.x
    stay: dict[int, dict[tuple[str, str], float]] = defaultdict(dict)
    move: dict[int, dict[Group, float]] = defaultdict(lambda: defaultdict(float))
    team_bytes: dict[int, float] = defaultdict(float)
    for k, team in enumerate(problem.teams):
        for r, per in team.current.items():
            for g, n_cur in per.items():
                if (r, g) in cells and n_cur > 0:
                    stay[k][(r, g)] = n_cur
    for j, (k, r, g, n_cur, group, per_gpu_bytes) in entries.items():
        gone = min(n_cur, max(0.0, float(x[j])))
        if (r, g) in cells:
            stay[k][(r, g)] = n_cur - gone
            if stay[k][(r, g)] <= 1e-9:
                del stay[k][(r, g)]
        if gone > 1e-9:
            move[k][group] += gone
            team_bytes[k] += per_gpu_bytes * gone
    return _Plan(t, dict(stay), {k: dict(v) for k, v in move.items()}, dict(team_bytes))


# --- one partition's MIP -------------------------------------------------------------------------


class _Builder:
    def __init__(self) -> None:
        self.cols: dict[tuple, int] = {}
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integer: list[int] = []
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.row_lb: list[float] = []
        self.row_ub: list[float] = []
        self.row_group: list[str] = []

    def var(self, key: tuple, lb: float = 0.0, ub: float = math.inf, integer: bool = False) -> int:
        j = self.cols.get(key)
        if j is None:
            j = self.cols[key] = len(self.lb)
            self.lb.append(lb)
            self.ub.append(ub)
            self.integer.append(1 if integer else 0)
        return j

    def row(self, entries: Iterable[tuple[int, float]], lo: float, hi: float, group: str) -> int:
        n = len(self.row_lb)
        for j, val in entries:
            self.r.append(n)
            self.c.append(j)
            self.v.append(val)
        self.row_lb.append(lo)
        self.row_ub.append(hi)
        self.row_group.append(group)
        return n


@dataclass(frozen=True)
class _Others:
    """The load of the teams outside a partition, as that partition's model sees it."""

    fixed: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """cell → GPUs of other teams there: placed by the partitions solved before, or planned to stay."""
    pooled: Mapping[Group, float] = field(default_factory=dict)
    """(GPU type, regions) → GPUs of teams of later partitions planned to move there: the
    partition's model places them too (on any of those regions), so it leaves them room where
    they may go without deciding where they will."""


@dataclass
class _PartResult:
    x: dict[tuple[int, str, str], float]
    replicas: set[tuple[str, str]]
    status: list[str]
    lp_bound: float
    binaries: int


def _solve_partition(
    problem: Problem,
    teams: list[int],
    cells: Mapping[tuple[str, str], float],
    others: _Others,
    mean_ratio: Mapping[str, float],
    load_before: Mapping[tuple[str, str], float],
    budget: float,
    storage_free: Mapping[str, float],
    candidates: int,
    time_limit: float,
    seed: int,
    mip_max_binaries: int = 0,
    comfort_ratio: float = 0.0,
    skip_groups: frozenset[str] = frozenset(),
) -> _PartResult:
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    # The partition's share of the time budget covers all its work: building the model and the
    # greedy rounding too, not only HiGHS (else a slow partition eats the next ones' shares).
    deadline = time.perf_counter() + time_limit
    b = _Builder()
    t_col = b.var(("t",), lb=comfort_ratio)  # ratios below the comfort level count as balanced
    regions_by_gpu: dict[str, list[str]] = defaultdict(list)
    for r, g in sorted(cells):
        regions_by_gpu[g].append(r)
    spare = {c: mean_ratio[c[1]] * n - load_before.get(c, 0.0) for c, n in cells.items()}
    part_cells: dict[tuple[str, str], float] = {}
    cell_users: dict[tuple[str, str], list[int]] = defaultdict(list)
    move_terms: list[tuple[int, float]] = []
    need: dict[tuple[str, str], list[int]] = defaultdict(list)  # (dataset, region) → w columns
    total_demand = 0.0
    # new regions offered to this partition's mobile teams: shared (so replicas serve several readers
    # of a dataset), sampled by spare capacity with a per-partition seed (partitions spread out)
    rng = np.random.default_rng(seed)
    targets: dict[str, list[str]] = {}
    for g, rs in regions_by_gpu.items():
        pool = [r for r in rs if spare[(r, g)] > 0]
        if pool:
            p = np.array([spare[(r, g)] for r in pool])
            pick = rng.choice(len(pool), size=min(candidates, len(pool)), replace=False, p=p / p.sum())
            targets[g] = [pool[i] for i in pick]
    for k in teams:
        team = problem.teams[k]
        demand = team.demand()
        total_demand += sum(demand.values())
        data = [problem.datasets[d] for d in team.datasets]
        usable = sorted({r for g in demand for r in regions_by_gpu[g]})
        missing = {r: [d for d in data if r not in d.replicas] for r in usable}
        free = {r for r in usable if not missing[r]}
        cand = set(free) | {r for r in team.quota_min if r in missing}
        overloaded = any(
            load_before.get((r, g), 0.0) > mean_ratio[g] * cells.get((r, g), 0.0) + 1e-9
            for r, per in team.current.items()
            for g in per
        )
        current = {r for r in team.current if r in missing}
        if overloaded or not (cand | current):
            for g in demand:
                cand.update(r for r in targets.get(g, ()) if r in missing)
            cheap = sorted(
                (r for r in usable if r not in cand and any(spare.get((r, g), 0.0) > 0 for g in demand)),
                key=lambda r: sum(d.bytes for d in missing[r]),
            )
            cand.update(cheap[:CHEAP_CANDIDATES])
        cand |= current
        if not any((r, g) in cells for r in cand for g in demand):
            cand |= set(usable)
        for r in sorted(cand):
            w = None
            if missing[r]:
                w = b.var(("w", k, r), 0, 1, integer=True)
                # aggregated locality: Σ_d y[d,r] ≥ |missing|·w (one row per pair; with w binary
                # it forces every missing replica, and keeps the LP small at scale)
                ys = [b.var(("y", d.uri, r), 0, 1) for d in missing[r]]
                for d in missing[r]:
                    need[(d.uri, r)].append(w)
                b.row([*((y, 1.0) for y in ys), (w, -float(len(ys)))], 0.0, math.inf, "locality")
            hi, lo = team.cap(r), float(team.quota_min.get(r, 0.0))
            xs = []
            for g, n in demand.items():
                if (r, g) not in cells:
                    continue
                x = b.var(("x", k, r, g))
                xs.append(x)
                cell_users[(r, g)].append(x)
                part_cells[(r, g)] = cells[(r, g)]
                if w is not None:
                    b.row([(x, 1.0), (w, -n)], -math.inf, 0.0, "locality")
                cur = float(team.current.get(r, {}).get(g, 0.0))
                if cur > 0:
                    mv = b.var(("mv", k, r, g))
                    b.row([(mv, 1.0), (x, 1.0)], cur, math.inf, "moves")
                    move_terms.append((mv, team.priority))
            if hi is not None and "quota" not in skip_groups:
                b.row(((x, 1.0) for x in xs), -math.inf, hi, f"quota_max of team {team.name!r} in {r}")
            if lo > 0 and "quota" not in skip_groups:
                b.row(((x, 1.0) for x in xs), lo, math.inf, f"quota_min of team {team.name!r} in {r}")
        for g, n in demand.items():
            xs = [b.cols[("x", k, r, g)] for r in sorted(cand) if ("x", k, r, g) in b.cols]
            b.row(((x, 1.0) for x in xs), n, n, "demand")
    # the later partitions' planned moves, placed on any of the regions they may go to (not
    # assigned: they only keep this partition from taking the room they need)
    for gi, ((g, where), n) in enumerate(sorted(others.pooled.items())):
        if n > 1e-9:
            pooled = []
            for r in where:
                j = b.var(("pool", gi, r))
                pooled.append(j)
                cell_users[(r, g)].append(j)
                part_cells[(r, g)] = cells[(r, g)]
            b.row(((j, 1.0) for j in pooled), n, n, "others' moves")
    # replicas: y ≥ w for every reader enabled in r; bytes within the budget and storage caps
    bytes_terms: list[tuple[int, float]] = []
    storage_terms: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for uri, r in sorted(need):
        y = b.cols[("y", uri, r)]
        size = float(problem.datasets[uri].bytes)
        bytes_terms.append((y, size))
        storage_terms[r].append((y, size))
    if bytes_terms and "budget" not in skip_groups:
        b.row(bytes_terms, -math.inf, budget, "replication byte budget")
    if "storage" not in skip_groups:
        for r, terms in storage_terms.items():
            if r in storage_free:
                b.row(terms, -math.inf, storage_free[r], f"storage cap of {r}")
    # worst ratio and soft balance, over whole cells: the other teams' load there is a constant
    balance_terms: list[tuple[int, float]] = []
    total_cap = sum(part_cells.values()) or 1.0
    for cell, xs in cell_users.items():
        s = part_cells[cell]
        fixed = float(others.fixed.get(cell, 0.0))
        b.row([*((x, 1.0) for x in xs), (t_col, -s)], -math.inf, -fixed, "ratio")
        over, under = b.var(("o", *cell)), b.var(("u", *cell))
        target = s - fixed  # soft balance around supply: GPUs over it cost OVERLOAD_WEIGHT, idle ones 1
        b.row([*((x, 1.0) for x in xs), (over, -s), (under, s)], target, target, "balance")
        balance_terms += [(over, OVERLOAD_WEIGHT * s / total_cap), (under, UNDERLOAD_WEIGHT * s / total_cap)]

    n = len(b.lb)
    a = coo_matrix((b.v, (b.r, b.c)), shape=(len(b.row_lb), n)).tocsr()
    integrality = np.array(b.integer)
    bounds_lb, bounds_ub = np.array(b.lb), np.array(b.ub)
    base = LinearConstraint(a, np.array(b.row_lb), np.array(b.row_ub))
    scale_bytes = max(budget, 1.0)
    scale_gpus = max(total_demand, 1.0)

    def vec(terms: Iterable[tuple[int, float]]) -> np.ndarray:
        out = np.zeros(n)
        for j, v in terms:
            out[j] += v
        return out

    c_a = vec([(t_col, 1.0)])
    c_b = vec(balance_terms)
    c_c = vec(
        [
            *((j, s / scale_bytes) for j, s in bytes_terms),
            *((j, MOVE_WEIGHT * p / scale_gpus) for j, p in move_terms),
        ]
    )

    lp_bound = math.nan
    if int(integrality.sum()) <= mip_max_binaries:  # the MIP path: its LP relaxation is the bound
        lp = milp(
            c_a,
            constraints=[base],
            bounds=Bounds(bounds_lb, bounds_ub),
            options={"time_limit": LP_BOUND_TIME_SHARE * time_limit},
        )
        if lp.status == 2:
            raise _PartitionInfeasible()
        lp_bound = float(lp.fun) if lp.status == 0 else math.nan  # nan: the bound ran out of time
    status: list[str] = []
    best = None
    constraints = [base]
    ub = bounds_ub.copy()
    lb = bounds_lb.copy()
    binaries = int(integrality.sum())
    if binaries > mip_max_binaries:
        # LP-guided greedy rounding + repair: enable (team, region) pairs by GPUs of overflow they
        # can take per byte still missing (shared replicas counted once), within the budget and
        # storage caps; the binaries are then fixed and the stages below are LPs.
        goal = {g: max(m, comfort_ratio) for g, m in mean_ratio.items()}
        # the rounding counts the other teams' fixed load; the pooled moves are left to the LP,
        # which can put them on any cell of their type
        chosen = _greedy_enable(problem, b, part_cells, goal, budget, storage_free, others.fixed)
        rounds = 1
        for key, j in b.cols.items():
            if key[0] == "w":
                ub[j] = 1.0 if (key[1], key[2]) in chosen else 0.0
                lb[j] = 0.0
        status.append(f"rounded in {rounds} LPs: {len(chosen)} of {binaries} pairs")
        integrality = np.zeros_like(integrality)
    for stage, c in (("A", c_a), ("B", c_b), ("C", c_c)):
        left = max(0.5, deadline - time.perf_counter())
        res = milp(
            c,
            constraints=constraints,
            integrality=integrality,
            bounds=Bounds(lb, ub),
            options={"time_limit": left / (1 if stage == "C" else 2), "mip_rel_gap": MIP_REL_GAP},
        )
        if stage == "A" and res.x is None and res.status != 2:
            # Nothing found in what was left of the budget (a loaded machine, or earlier partitions
            # that took long): the budget bounds the search for better assignments, not the first
            # one, so stage A runs again without a time limit; the later stages only improve on it.
            status.append("A:no solution in time, retried without a time limit")
            res = milp(
                c,
                constraints=constraints,
                integrality=integrality,
                bounds=Bounds(lb, ub),
                options={"mip_rel_gap": MIP_REL_GAP},
            )
        if res.x is None:
            if res.status == 2 and best is None:
                raise _PartitionInfeasible()
            status.append(f"{stage}:{'infeasible' if res.status == 2 else 'no solution in time'}")
            break
        best = res.x
        status.append(f"{stage}:{'optimal' if res.status == 0 else 'time limit (feasible)'}")
        value = float(c @ res.x)
        logger.debug("stage %s value %.4f", stage, value)
        if stage == "A":
            ub[t_col] = value * (1 + T_TOLERANCE) + T_TOLERANCE
        elif stage == "B":
            constraints = [base, LinearConstraint(c_b.reshape(1, -1), -np.inf, value * (1 + 1e-4) + 1e-7)]
    if best is None:
        raise TimeoutError(
            f"rebalance: HiGHS found no assignment within this partition's {time_limit:.1f} s of "
            f"time_limit_s ({'; '.join(status)}): raise time_limit_s"
        )
    x_out: dict[tuple[int, str, str], float] = {}
    enabled: set[tuple[int, str]] = set()
    for key, j in b.cols.items():
        if key[0] == "x" and best[j] > 1e-9:
            x_out[(key[1], key[2], key[3])] = float(best[j])
            enabled.add((key[1], key[2]))
    replicas: set[tuple[str, str]] = set()
    for k, r in enabled:
        for d in problem.teams[k].datasets:
            if r not in problem.datasets[d].replicas:
                replicas.add((d, r))
    return _PartResult(x_out, replicas, status, lp_bound, binaries)


def _missing(problem: Problem, k: int, r: str) -> list[str]:
    return [d for d in problem.teams[k].datasets if r not in problem.datasets[d].replicas]


def _greedy_enable(
    problem: Problem,
    b: _Builder,
    part_cells: Mapping[tuple[str, str], float],
    mean_ratio: Mapping[str, float],
    budget: float,
    storage_free: Mapping[str, float],
    background: Mapping[tuple[str, str], float],
) -> set[tuple[int, str]]:
    """Pairs to enable, worst cell first (the min-max objective): repeatedly take the cell with the
    highest projected ratio above its GPU type's mean, and enable the pair of one of its teams that
    sheds the most GPUs per byte still missing (replicas already chosen count as present), within
    the team's quota_max there. ``background``: cell → GPUs of teams outside the partition there (counted, never moved)."""
    # every region a team may use: enabling ones (w) cost their missing bytes, the others are free
    pairs: dict[int, set[str]] = defaultdict(set)
    for key in b.cols:
        if key[0] == "x":
            pairs[key[1]].add(key[2])
    load: dict[tuple[str, str], float] = defaultdict(float, background)
    in_cell: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for key in b.cols:
        if key[0] == "x":
            k, r, g = key[1], key[2], key[3]
            n = float(problem.teams[k].current.get(r, {}).get(g, 0.0))
            if n > 0:
                load[(r, g)] += n
                in_cell[(r, g)][k] = n
    cap = {c: s for c, s in part_cells.items() if s > 0}

    def excess(c: tuple[str, str]) -> float:
        return load.get(c, 0.0) - mean_ratio[c[1]] * cap[c] if c in cap else load.get(c, 0.0)

    have: set[tuple[str, str]] = set()
    spent, stored = 0.0, defaultdict(float)
    chosen: set[tuple[int, str]] = set()
    stuck: set[tuple[str, str]] = set()
    regions_of = {k: sorted(rs) for k, rs in pairs.items()}
    readers: dict[str, list[int]] = defaultdict(list)
    for k in pairs:
        for d in problem.teams[k].datasets:
            readers[d].append(k)
    missing_bytes: dict[tuple[int, str], int] = {}
    """Bytes team k still misses in region r (replicas chosen so far count as present): computed
    once per pair, then lowered as replicas are chosen (integers, so exactly the sum over what is
    still missing)."""

    def cost_of(k: int, r: str) -> int:
        c = missing_bytes.get((k, r))
        if c is None:
            c = missing_bytes[(k, r)] = sum(
                problem.datasets[d].bytes for d in _missing(problem, k, r) if (d, r) not in have
            )
        return c

    quota_left: dict[tuple[int, str], float] = {}
    """GPUs team k may still add in region r under its quota_max (inf: no quota there)."""

    def quota_room(k: int, r: str) -> float:
        q = quota_left.get((k, r))
        if q is None:
            cap_r = problem.teams[k].cap(r)
            here = sum(problem.teams[k].current.get(r, {}).values())
            q = quota_left[(k, r)] = math.inf if cap_r is None else cap_r - here
        return q

    while True:
        over = [
            (load[c] / cap[c] if c in cap else math.inf, c)
            for c in in_cell
            if excess(c) > 1e-6 and c not in stuck
        ]
        if not over:
            break
        _, cell = max(over)
        g = cell[1]
        best = None
        cell_excess = excess(cell)
        room_of: dict[str, float] = {}
        for k, n in in_cell[cell].items():
            for r in regions_of.get(k, ()):
                room = room_of.get(r)
                if room is None:
                    room = room_of[r] = -excess((r, g)) if (r, g) in cap and (r, g) != cell else 0.0
                if room <= 1e-9 or quota_room(k, r) <= 1e-9:
                    continue
                cost = float(cost_of(k, r))
                if spent + cost > budget * (1 - 1e-9) or (
                    r in storage_free and stored[r] + cost > storage_free[r] * (1 - 1e-9)
                ):
                    continue
                moved = min(n, room, cell_excess, quota_room(k, r))
                key = (moved / max(cost, 1.0), moved)
                if best is None or key > best[0]:
                    best = (key, k, r, cost, moved)
        if best is None:
            stuck.add(cell)
            logger.debug(
                "greedy: cell %s stuck at %.3f (spent %.3g of %.3g)",
                cell,
                load[cell] / cap[cell] if cell in cap else math.inf,
                spent,
                budget,
            )
            continue
        _, k, r, cost, moved = best
        spent += cost
        stored[r] += cost
        for d in _missing(problem, k, r):
            if (d, r) not in have:
                have.add((d, r))
                for reader in readers[d]:
                    if (reader, r) in missing_bytes:
                        missing_bytes[(reader, r)] -= problem.datasets[d].bytes
        if ("w", k, r) in b.cols:
            chosen.add((k, r))
        load[cell] -= moved
        load[(r, g)] += moved
        quota_left[(k, r)] = quota_room(k, r) - moved
        quota_left[(k, cell[0])] = quota_room(k, cell[0]) + moved
        in_cell[cell][k] -= moved
        if in_cell[cell][k] <= 1e-9:
            del in_cell[cell][k]
    return chosen


class _PartitionInfeasible(Exception):
    pass


# --- the whole problem ----------------------------------------------------------------------------


def solve(
    problem: Problem,
    *,
    candidates: int = 40,
    team_block: int = 2000,
    time_limit_s: float = 50.0,
    seed: int = 0,
    mip_max_binaries: int = 200,
    comfort_ratio: float = 0.0,
) -> Solution:
    """Solve the rebalance problem (see the module docstring); raises RebalanceInfeasibleError.

    ``comfort_ratio``: stage A minimises ``max(worst ratio, comfort_ratio)``, so regions already
    below it are not spread further (no data is copied just to go from 0.3 to 0.2); 0 is the pure
    lexicographic min-max.

    ``time_limit_s``: the time budget, shared among the partitions (each one's share covers its
    model building and rounding too). It bounds the search for better assignments; a partition
    that found none in its share looks for its first one without a limit.
    """
    started = time.perf_counter()
    check_feasible(problem)
    cells = problem.cell_supply()
    if not cells:
        raise RebalanceInfeasibleError("supply", "no region supplies any GPU")
    lower_bound = _lp_bound(problem, per_region=False)
    region_lower_bound = _lp_bound(problem, per_region=True)

    load_before: dict[tuple[str, str], float] = defaultdict(float)
    demand_by_gpu: dict[str, float] = defaultdict(float)
    for team in problem.teams:
        for r, per in team.current.items():
            for g, n in per.items():
                load_before[(r, g)] += n
                demand_by_gpu[g] += n
    supply_by_gpu: dict[str, float] = defaultdict(float)
    for (_r, g), n in cells.items():
        supply_by_gpu[g] += n
    mean_ratio = {g: demand_by_gpu.get(g, 0.0) / s for g, s in supply_by_gpu.items()}

    parts = partition_teams(problem, team_block)
    used_storage: dict[str, float] = defaultdict(float)
    for d in problem.datasets.values():
        for r in d.replicas:
            used_storage[r] += d.bytes
    storage_free_total = {
        r: max(0.0, float(cap) - used_storage.get(r, 0.0)) for r, cap in problem.storage_cap_bytes.items()
    }

    budget_left = float(problem.budget_bytes)
    storage_left = dict(storage_free_total)
    x_all: dict[tuple[int, str, str], float] = {}
    replicas: set[tuple[str, str]] = set()
    stage_status: list[str] = []
    partition_bound = 0.0  # nan once any partition's LP bound ran out of time
    binaries = 0
    # Partitions are solved one after another against whole cells: the teams of the partitions
    # solved before are where they were placed, those of later ones where the plan puts them
    # (their staying load fixed, their moving load pooled by the regions it may go to).
    plan = _plan_moves(problem, cells, comfort_ratio) if len(parts) > 1 else None
    stays: list[dict[tuple[str, str], float]] = []
    moves: list[dict[Group, float]] = []
    weights: list[tuple[float, float, float]] = []
    for members in parts:
        stay: dict[tuple[str, str], float] = defaultdict(float)
        move: dict[Group, float] = defaultdict(float)
        for k in members:
            for c, n in (plan.stay.get(k, {}) if plan else {}).items():
                stay[c] += n
            for group, n in (plan.move.get(k, {}) if plan else {}).items():
                move[group] += n
        stays.append(stay)
        moves.append(move)
        # the budget is shared by the bytes the plan's moves need, else by GPUs moved, else by demand
        weights.append(
            (
                sum(plan.bytes.get(k, 0.0) for k in members) if plan else 0.0,
                sum(move.values()),
                sum(sum(problem.teams[k].demand().values()) for k in members),
            )
        )
    placed: dict[tuple[str, str], float] = defaultdict(float)
    for pi, members in enumerate(parts):
        fixed: dict[tuple[str, str], float] = defaultdict(float, placed)
        pooled: dict[Group, float] = defaultdict(float)
        for q in range(pi + 1, len(parts)):
            for c, n in stays[q].items():
                fixed[c] += n
            for group, n in moves[q].items():
                pooled[group] += n
        others = _Others(dict(fixed), dict(pooled))
        # budget: this partition's share of what is left (unused bytes flow to later partitions)
        frac = 1.0
        for i in range(3):
            left = sum(w[i] for w in weights[pi:])
            if left > 1e-9:
                frac = min(1.0, weights[pi][i] / left)
                break
        remaining = max(1.0, time_limit_s - (time.perf_counter() - started))
        args = (
            problem,
            members,
            cells,
            others,
            mean_ratio,
            load_before,
            budget_left * frac,
            {r: storage_left[r] * frac for r in storage_left},
            candidates,
            remaining / (len(parts) - pi),
            seed * 1000 + pi,
            mip_max_binaries,
            comfort_ratio,
        )
        try:
            res = _solve_partition(*args)
        except _PartitionInfeasible:
            raise _diagnose(args) from None
        x_all.update(res.x)
        for (_k, r, g), n in res.x.items():
            placed[(r, g)] += n
        for d, r in res.replicas - replicas:
            budget_left -= problem.datasets[d].bytes
            if r in storage_left:
                storage_left[r] -= problem.datasets[d].bytes
        replicas |= res.replicas
        stage_status += [f"p{pi}:{s}" for s in res.status]
        partition_bound = max(partition_bound, res.lp_bound) if not math.isnan(res.lp_bound) else math.nan
        binaries += res.binaries

    placement: dict[str, dict[str, dict[str, float]]] = {}
    for (k, r, g), n in x_all.items():
        placement.setdefault(problem.teams[k].name, {}).setdefault(r, {})[g] = n
    shares: dict[str, dict[str, float]] = {}
    for team, per_region in placement.items():
        total = sum(n for per in per_region.values() for n in per.values())
        shares[team] = {r: round(sum(per.values()) / total, 6) for r, per in sorted(per_region.items())}
    load_after: dict[tuple[str, str], float] = defaultdict(float)
    for (_k, r, g), n in x_all.items():
        load_after[(r, g)] += n
    replicate = [
        {"dataset_uri": d, "region": r, "bytes": problem.datasets[d].bytes} for d, r in sorted(replicas)
    ]
    gpus_moved = sum(
        max(0.0, n - placement.get(team.name, {}).get(r, {}).get(g, 0.0))
        for team in problem.teams
        for r, per in team.current.items()
        for g, n in per.items()
    )
    after_replicas: dict[str, set[str]] = defaultdict(set)
    for d in problem.datasets.values():
        after_replicas[d.uri].update(d.replicas)
    for d, r in replicas:
        after_replicas[d].add(r)
    cross = sum(1 for (k, r, _g) in x_all for d in problem.teams[k].datasets if r not in after_replicas[d])
    before_r, after_r = region_ratios(load_before, cells), region_ratios(load_after, cells)
    before_c, after_c = cell_ratios(load_before, cells), cell_ratios(load_after, cells)

    def nested(load: Mapping[tuple[str, str], float]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (r, g), n in sorted(load.items()):
            if n > 0:
                out.setdefault(r, {})[g] = round(n, 6)
        return out

    optimal = all(s.endswith("optimal") or ":rounded" in s for s in stage_status) and not any(
        ":rounded" in s for s in stage_status
    )
    return Solution(
        status="optimal" if optimal else "feasible",
        placement=placement,
        shares=shares,
        replicate=replicate,
        region_load_before={r: round(v, 6) for r, v in before_r.items()},
        region_load_after={r: round(v, 6) for r, v in after_r.items()},
        cell_load_before=nested(load_before),
        cell_load_after=nested(load_after),
        lower_bound=round(lower_bound, 6),
        region_lower_bound=round(region_lower_bound, 6),
        partition_bound=None if math.isnan(partition_bound) else round(partition_bound, 6),
        max_ratio_before=round(max(before_r.values(), default=0.0), 6),
        max_ratio_after=round(max(after_r.values(), default=0.0), 6),
        max_cell_ratio_before=round(max(before_c.values(), default=0.0), 6),
        max_cell_ratio_after=round(max(after_c.values(), default=0.0), 6),
        allocation_rate_before=round(allocation_rate(load_before, cells), 6),
        allocation_rate_after=round(allocation_rate(load_after, cells), 6),
        bytes_moved=int(sum(c["bytes"] for c in replicate)),
        budget_bytes=int(problem.budget_bytes),
        gpus_moved=round(gpus_moved, 6),
        cross_region_reads=cross,
        solve_s=round(time.perf_counter() - started, 3),
        partitions=len(parts),
        binaries=binaries,
        stage_status=stage_status,
    )


def _diagnose(args: tuple) -> RebalanceInfeasibleError:
    """Elastic check: drop one constraint group at a time; the first whose removal helps is binding."""
    problem, members = args[0], args[1]
    names = ", ".join(repr(problem.teams[k].name) for k in members[:5]) + ("…" if len(members) > 5 else "")
    for group, label, detail in (
        (
            "budget",
            "replication byte budget",
            f"{problem.budget_bytes} bytes cannot bring the data of team(s) {names} to where their quotas allow",
        ),
        ("storage", "storage caps", f"region storage caps leave no room for the replicas of team(s) {names}"),
        ("quota", "quotas", f"quotas of team(s) {names} conflict with where their data can be"),
    ):
        try:
            _solve_partition(*args, skip_groups=frozenset({group}))
        except _PartitionInfeasible:
            continue
        return RebalanceInfeasibleError(label, detail)
    return RebalanceInfeasibleError("locality", f"no region holds (or can receive) the datasets of {names}")
