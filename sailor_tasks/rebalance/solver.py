"""Region assignment + data replication as a MIP solved by HiGHS (``scipy.optimize.milp``).

Lexicographic objectives (worst demand/supply ratio, then a soft balance that charges overload
three times idleness, then bytes replicated), data locality as a hard constraint, and three
devices that keep thousands of teams and datasets at a few seconds: aggregated locality rows,
greedy rounding of the binaries above ``mip_max_binaries`` (over all teams, within the one
budget), and, above ``team_block`` teams, the LP stages solved per partition against whole cells,
each partition seeing the others' load. The model, constraint by constraint, is in
``docs/rebalance.md``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from functools import partial
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
"""Relative gap at which HiGHS stops a stage with binaries and reports it solved (``optimal``)."""
CHEAP_CANDIDATES = 4
LP_BOUND_TIME_SHARE = 0.3
LEVEL_TOLERANCE = 0.005
"""Bisection step at which ``_enable_pairs`` stops: a demand/supply ratio."""


@dataclass
class Solution:
    status: str
    """``optimal``: the exact MIP, every stage solved to within ``MIP_REL_GAP`` of its optimum
    (HiGHS's relative gap; an LP stage exactly); ``feasible``: the rounding fixed the replica
    binaries, or a stage ran out of time (``stage_status`` says which)."""
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


def team_regions(problem: Problem, team: Team) -> tuple[frozenset[str] | None, tuple[str, ...]]:
    """(the regions every dataset ``team`` reads may be stored in, None when none restricts them;
    the URIs of the datasets that restrict them)."""
    allowed: frozenset[str] | None = None
    restricting = []
    for uri in team.datasets:
        d = problem.datasets.get(uri)
        if d is not None and d.regions is not None:
            restricting.append(uri)
            allowed = frozenset(d.regions) if allowed is None else allowed & frozenset(d.regions)
    return allowed, tuple(restricting)


def _within_residency(problem: Problem) -> Problem:
    """The problem with data residency as quotas: a team whose datasets may be stored only in some
    regions gets ``quota_max`` 0 in every other region (so it can place no GPU there, its model
    offers no such region, and no replica of its data is planned there)."""
    teams = []
    for team in problem.teams:
        allowed, _ = team_regions(problem, team)
        if allowed is not None:
            outside = {r: 0.0 for r in problem.regions if r not in allowed}
            team = replace(team, quota_max={**team.quota_max, **outside})
        teams.append(team)
    return replace(problem, teams=tuple(teams))


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
        allowed, restricting = team_regions(problem, team)
        if allowed is not None:
            where = ", ".join(sorted(allowed)) or "no region (their restrictions do not overlap)"
            reads = f"team {team.name!r} reads {', '.join(map(repr, restricting))}, which may be stored only in {where}"
            for gpu in demand:
                if not regions_with[gpu] & allowed:
                    raise RebalanceInfeasibleError(
                        f"data_residency of team {team.name!r}", f"{reads}: none supplies {gpu!r}"
                    )
            for r, lo in team.quota_min.items():
                if lo > 0 and r not in allowed:
                    raise RebalanceInfeasibleError(
                        f"data_residency of team {team.name!r}",
                        f"{reads}; its quota_min asks for {lo:g} GPUs in {r}",
                    )
        if team.pinned:
            for r, per in sorted(team.current.items()):
                for g, n in sorted(per.items()):
                    if n > 0 and (r, g) not in cells:
                        raise RebalanceInfeasibleError(
                            f"team {team.name!r} kept where it runs",
                            f"it holds {n:g} {g} GPUs in {r}, which supplies no {g}",
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
        if team.quota_max or team.quota_min or team.pinned:
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
        if team.pinned:  # check_feasible: every cell it holds is supplied
            for r, per in team.current.items():
                for g, n in per.items():
                    if n > 0:
                        eq_row([(index[("x", i, r, g)], 1.0)], float(n))
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


# --- candidate regions and the rounding ------------------------------------------------------------


def _candidates(
    problem: Problem,
    cells: Mapping[tuple[str, str], float],
    mean_ratio: Mapping[str, float],
    load_before: Mapping[tuple[str, str], float],
    candidates: int,
    seed: int,
) -> list[dict[str, tuple[str, ...]]]:
    """Per team (by index): region → URIs of the team's datasets without a replica there (empty:
    the region holds all its data), for each region the team's model may use.

    Only teams in overloaded cells get new regions (``candidates`` per GPU type, sampled by spare
    capacity, shared by all teams so that a replica serves several readers, plus the
    ``CHEAP_CANDIDATES`` regions missing the fewest of the team's bytes); the others move only
    between regions that already hold their data."""
    regions_by_gpu: dict[str, list[str]] = defaultdict(list)
    for r, g in sorted(cells):
        regions_by_gpu[g].append(r)
    spare = {c: mean_ratio[c[1]] * n - load_before.get(c, 0.0) for c, n in cells.items()}
    rng = np.random.default_rng(seed)
    targets: dict[str, list[str]] = {}
    for g, rs in regions_by_gpu.items():
        pool = [r for r in rs if spare[(r, g)] > 0]
        if pool:
            p = np.array([spare[(r, g)] for r in pool])
            pick = rng.choice(len(pool), size=min(candidates, len(pool)), replace=False, p=p / p.sum())
            targets[g] = [pool[i] for i in pick]
    out: list[dict[str, tuple[str, ...]]] = []
    for team in problem.teams:
        demand = team.demand()
        data = [problem.datasets[d] for d in team.datasets]
        usable = sorted({r for g in demand for r in regions_by_gpu[g] if team.cap(r) != 0})
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
        out.append({r: tuple(d.uri for d in missing[r]) for r in sorted(cand)})
    return out


_LEAVING = "\0"
"""Prefix of the region of ``_greedy_enable``'s cells for demand that must leave the region it ran
in (no region name holds a NUL)."""


def _greedy_enable(
    problem: Problem,
    cand: list[dict[str, tuple[str, ...]]],
    cells: Mapping[tuple[str, str], float],
    goals: Sequence[Mapping[str, float]],
    budget: float,
    storage_free: Mapping[str, float],
    quotas: bool = True,
    probe: bool = False,
) -> tuple[set[tuple[int, str]], float, bool]:
    """(team, region) pairs to enable among those missing data, over all teams at once (one
    budget, one set of replicas). First the regions a team's quota_min requires; then, for each
    goal in turn (a target ratio per GPU type), worst cell first (the min-max objective):
    repeatedly take the cell with the highest projected ratio above its goal, and enable the pair
    of one of its teams that sheds the most GPUs per byte still missing (replicas already chosen
    count as present) into a cell below its goal, within the team's quota_max there (``quotas``
    False: quotas ignored). A later goal spends what the earlier ones left of the budget.

    Returns the pairs, the excess of the worst cell over the first goal once it is reached (≤ 0:
    every cell projected at or below it), and whether that cell is held above it by the budget or
    the storage caps (a move was there but not affordable). ``probe``: only whether the first
    goal is reached: stop at the first cell stuck above it (its excess is returned; a stuck cell
    never gets lower, since moves only go into cells below their goal)."""
    pairs: dict[int, list[str]] = {}
    load: dict[tuple[str, str], float] = defaultdict(float)
    in_cell: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for k, regions in enumerate(cand):
        team = problem.teams[k]
        gpus = team.demand()
        pairs[k] = [r for r in regions if any((r, g) in cells for g in gpus)]
        for r, per in team.current.items():
            for g, n in per.items():
                if g not in gpus or n <= 0:
                    continue
                if team.pinned:  # its GPUs stay where they are: load, but none to move
                    load[(r, g)] += n
                    continue
                # Demand that cannot stay where it ran (the region no longer supplies its GPU
                # type, or a quota or its data's residency now keeps the team out) must move: it
                # sits in a cell of no capacity of its own, which is over any goal.
                cell = (r, g) if (r, g) in cells and r in pairs[k] else (_LEAVING + r, g)
                load[cell] += n
                in_cell[cell][k] = in_cell[cell].get(k, 0.0) + n

    target: Mapping[str, float] = goals[0]

    def excess(c: tuple[str, str]) -> float:
        return load.get(c, 0.0) - target[c[1]] * cells[c] if c in cells else load.get(c, 0.0)

    have: set[tuple[str, str]] = set()
    spent, stored = 0.0, defaultdict(float)
    chosen: set[tuple[int, str]] = set()
    stuck: dict[tuple[str, str], bool] = {}
    """Cells no move can take further down → whether a move was there but not affordable."""
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
                problem.datasets[d].bytes for d in cand[k][r] if (d, r) not in have
            )
        return c

    def affordable(r: str, cost: float) -> bool:
        return spent + cost <= budget * (1 + 1e-9) and (
            r not in storage_free or stored[r] + cost <= storage_free[r] * (1 + 1e-9)
        )

    def enable(k: int, r: str, cost: float) -> None:
        nonlocal spent
        spent += cost
        stored[r] += cost
        for d in cand[k][r]:
            if (d, r) not in have:
                have.add((d, r))
                for reader in readers[d]:
                    if (reader, r) in missing_bytes:
                        missing_bytes[(reader, r)] -= problem.datasets[d].bytes
        if cand[k][r]:
            chosen.add((k, r))

    quota_left: dict[tuple[int, str], float] = {}
    """GPUs team k may still add in region r under its quota_max (inf: no quota there)."""
    capped = {k for k, team in enumerate(problem.teams) if team.quota_max} if quotas else set()

    def quota_room(k: int, r: str) -> float:
        if k not in capped:
            return math.inf
        q = quota_left.get((k, r))
        if q is None:
            cap_r = problem.teams[k].cap(r)
            here = sum(problem.teams[k].current.get(r, {}).values())
            q = quota_left[(k, r)] = math.inf if cap_r is None else cap_r - here
        return q

    if quotas:  # a region a quota_min requires is enabled whatever the balance
        for k, regions in enumerate(cand):
            for r, lo in sorted(problem.teams[k].quota_min.items()):
                if lo > 0 and regions.get(r) and (k, r) not in chosen and affordable(r, cost_of(k, r)):
                    enable(k, r, cost_of(k, r))
    worst_over_first, budget_bound = 0.0, False
    for phase in range(len(goals)):
        target = goals[phase]  # what ``excess`` measures against
        stuck.clear()
        while True:
            over = [
                (load[c] / cells[c] if c in cells else math.inf, c)
                for c in in_cell
                if excess(c) > 1e-6 and c not in stuck
            ]
            if not over:
                break
            _, cell = max(over)
            g = cell[1]
            best = None
            blocked = False
            cell_excess = excess(cell)
            room_of: dict[str, float] = {}
            # The hot loop of the rounding (every team of the cell × its regions): lookups inlined.
            for k, n in in_cell[cell].items():
                limit = min(n, cell_excess)
                quotas_k = k in capped
                for r in pairs.get(k, ()):
                    room = room_of.get(r)
                    if room is None:
                        room = room_of[r] = -excess((r, g)) if (r, g) in cells and (r, g) != cell else 0.0
                    if room <= 1e-9:
                        continue
                    moved = limit if limit < room else room
                    if quotas_k:
                        quota = quota_room(k, r)
                        if quota <= 1e-9:
                            continue
                        moved = min(moved, quota)
                    cost = missing_bytes.get((k, r))
                    if cost is None:
                        cost = cost_of(k, r)
                    if not affordable(r, cost):
                        blocked = True
                        continue
                    key = (moved / (cost if cost > 1 else 1.0), moved)
                    if best is None or key > best[0]:
                        best = (key, k, r, float(cost), moved)
            if best is None:
                if probe:
                    return chosen, cell_excess / cells[cell] if cell in cells else math.inf, blocked
                stuck[cell] = blocked
                logger.debug(
                    "greedy: cell %s stuck at %.3f (spent %.3g of %.3g)",
                    cell,
                    load[cell] / cells[cell] if cell in cells else math.inf,
                    spent,
                    budget,
                )
                continue
            _, k, r, cost, moved = best
            enable(k, r, cost)
            load[cell] -= moved
            load[(r, g)] += moved
            if k in capped:
                quota_left[(k, r)] = quota_room(k, r) - moved
                quota_left[(k, cell[0])] = quota_room(k, cell[0]) + moved
            in_cell[cell][k] -= moved
            if in_cell[cell][k] <= 1e-9:
                del in_cell[cell][k]
        if phase == 0 and load:
            worst_over_first, worst = max(
                ((excess(c) / cells[c], c) for c in load if c in cells), default=(0.0, None)
            )
            budget_bound = stuck.get(worst, False)
    if not probe:
        _give_every_team_a_region(
            problem, cand, cells, pairs, chosen, load, cost_of, affordable, quota_room, enable
        )
    return chosen, worst_over_first, budget_bound


def _give_every_team_a_region(
    problem: Problem,
    cand: list[dict[str, tuple[str, ...]]],
    cells: Mapping[tuple[str, str], float],
    pairs: Mapping[int, list[str]],
    chosen: set[tuple[int, str]],
    load: Mapping[tuple[str, str], float],
    cost_of: Callable[[int, str], int],
    affordable: Callable[[str, float], bool],
    quota_room: Callable[[int, str], float],
    enable: Callable[[int, str, float], None],
) -> None:
    """After the greedy moves: a team left with no region it may hold one of its GPU types in (its
    demand had to leave a region, and every region it may use was at or over the goal, so no
    move took it there) gets the affordable one it misses the fewest bytes in (then the least
    loaded), whatever the balance. The model then places its demand, moving others' out to make
    room where that helps; without a region the demand would have no place at all."""
    for k, team in enumerate(problem.teams):
        if team.pinned:
            continue
        for g in sorted(team.demand()):
            usable = [r for r in pairs.get(k, ()) if (r, g) in cells]
            if not usable or any(not cand[k][r] or (k, r) in chosen or cost_of(k, r) == 0 for r in usable):
                continue  # none to give (the diagnosis names it), or it has one already
            options = sorted(
                (cost_of(k, r), load.get((r, g), 0.0) / cells[(r, g)], r)
                for r in usable
                if affordable(r, cost_of(k, r)) and quota_room(k, r) > 1e-9
            )
            if options:
                cost, _, r = options[0]
                enable(k, r, float(cost))


def _enable_pairs(
    problem: Problem,
    cand: list[dict[str, tuple[str, ...]]],
    cells: Mapping[tuple[str, str], float],
    goal: Mapping[str, float],
    budget: float,
    storage_free: Mapping[str, float],
    quotas: bool = True,
) -> set[tuple[int, str]]:
    """The (team, region) pairs to enable (``_greedy_enable``) toward ``goal``.

    When the budget or the storage caps hold the worst cell above the goal, worst cell first
    toward the goal itself has spent bytes taking cells well below the ratio the worst one is left
    at, where the min-max objective needs them spent on the worst. Then the cells are first
    brought to the lowest common level a greedy pass reaches (bisection over the level, to within
    ``LEVEL_TOLERANCE``), and what is left of the budget is spent toward the goal."""
    chosen, over, budget_bound = _greedy_enable(problem, cand, cells, [goal], budget, storage_free, quotas)
    if over <= 1e-6 or not budget_bound:
        return _with_covered(cand, chosen)
    lo, hi = min(goal.values()), max(goal.values()) + over
    best: dict[str, float] | None = None
    while hi - lo > LEVEL_TOLERANCE:
        mid = (lo + hi) / 2
        level = {g: max(v, mid) for g, v in goal.items()}
        if _greedy_enable(problem, cand, cells, [level], budget, storage_free, quotas, probe=True)[1] <= 1e-6:
            hi, best = mid, level
        else:
            lo = mid
    if best is None:
        return _with_covered(cand, chosen)
    logger.debug("greedy: every cell brought to %.4f first, then toward the goal", hi)
    chosen = _greedy_enable(problem, cand, cells, [best, goal], budget, storage_free, quotas)[0]
    return _with_covered(cand, chosen)


def _with_covered(
    cand: list[dict[str, tuple[str, ...]]], chosen: set[tuple[int, str]]
) -> set[tuple[int, str]]:
    """``chosen`` plus every candidate pair whose missing datasets the chosen pairs already bring to
    its region: such a pair costs no byte beyond what the rounding charged, and a partition solved
    after the one that made those replicas may use it (``_regions``' ``made``), so leaving it out
    of the model would let a decomposed solve beat the one-partition solve."""
    brought: set[tuple[str, str]] = {(uri, r) for k, r in chosen for uri in cand[k][r]}
    out = set(chosen)
    for k, regions in enumerate(cand):
        for r, missing in regions.items():
            if missing and (k, r) not in out and all((uri, r) in brought for uri in missing):
                out.add((k, r))
    return out


# --- one partition's model -------------------------------------------------------------------------


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


@dataclass
class _PartResult:
    x: dict[tuple[int, str, str], float]
    replicas: set[tuple[str, str]]
    status: list[str]
    lp_bound: float
    binaries: int


def _regions(
    cand: Mapping[str, tuple[str, ...]],
    k: int,
    enabled: set[tuple[int, str]] | None,
    made: Set[tuple[str, str]],
) -> list[str]:
    """The regions team k's model uses: those holding its data (replicas ``made`` by the partitions
    solved before count), and (rounded) the enabled others."""
    return [
        r
        for r, miss in cand.items()
        if enabled is None or (k, r) in enabled or all((uri, r) in made for uri in miss)
    ]


def _solve_partition(
    problem: Problem,
    teams: list[int],
    cells: Mapping[tuple[str, str], float],
    cand: list[dict[str, tuple[str, ...]]],
    enabled: set[tuple[int, str]] | None,
    fixed: Mapping[tuple[str, str], float],
    made: Set[tuple[str, str]],
    later: list[int],
    budget: float,
    storage_free: Mapping[str, float],
    time_limit: float,
    mip_max_binaries: int = 0,
    comfort_ratio: float = 0.0,
    skip_groups: frozenset[str] = frozenset(),
) -> _PartResult:
    """The lexicographic stages A–C for ``teams``, against whole cells.

    ``enabled``: the rounded pairs (the team's model uses the regions holding its data and these);
    None: every candidate pair is a binary (the exact MIP). ``fixed``: cell → GPUs the partitions
    solved before placed there; ``made``: the (dataset, region) replicas they chose. ``later``:
    the teams of the partitions solved after, in the model with their GPUs only (over the regions
    their models use; teams without quotas pooled by GPU type and regions, which is exact for the
    worst ratio), so this partition leaves them the room they need without deciding where they go."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    # The partition's share of the time budget covers all its work, building the model too.
    deadline = time.perf_counter() + time_limit
    b = _Builder()
    t_col = b.var(("t",), lb=comfort_ratio)  # ratios below the comfort level count as balanced
    part_cells: dict[tuple[str, str], float] = {}
    cell_users: dict[tuple[str, str], list[int]] = defaultdict(list)
    move_terms: list[tuple[int, float]] = []
    need: dict[tuple[str, str], list[int]] = defaultdict(list)  # (dataset, region) → w columns
    total_demand = 0.0
    for k in teams:
        team = problem.teams[k]
        demand = team.demand()
        total_demand += sum(demand.values())
        usable = set(_regions(cand[k], k, enabled, made))
        # a region a quota_min requires stays in the model even where it was not enabled (it then
        # cannot hold the team: the partition is infeasible and the diagnosis names why)
        regions = [r for r in cand[k] if r in usable or team.quota_min.get(r, 0.0) > 0]
        for r in regions:
            w = None
            missing = tuple(uri for uri in cand[k][r] if (uri, r) not in made)
            if missing:
                w = b.var(("w", k, r), 0, 1 if r in usable else 0, integer=enabled is None)
                # aggregated locality: Σ_d y[d,r] ≥ |missing|·w (one row per pair; with w binary
                # it forces every missing replica, and keeps the LP small at scale)
                ys = [b.var(("y", uri, r), 0, 1) for uri in missing]
                for uri in missing:
                    need[(uri, r)].append(w)
                b.row([*((y, 1.0) for y in ys), (w, -float(len(ys)))], 0.0, math.inf, "locality")
            hi, lo = team.cap(r), float(team.quota_min.get(r, 0.0))
            xs = []
            for g, n in demand.items():
                if (r, g) not in cells:
                    continue
                cur = float(team.current.get(r, {}).get(g, 0.0))
                x = b.var(("x", k, r, g), cur, cur) if team.pinned else b.var(("x", k, r, g))
                xs.append(x)
                cell_users[(r, g)].append(x)
                part_cells[(r, g)] = cells[(r, g)]
                if w is not None:
                    b.row([(x, 1.0), (w, -n)], -math.inf, 0.0, "locality")
                if cur > 0:
                    mv = b.var(("mv", k, r, g))
                    b.row([(mv, 1.0), (x, 1.0)], cur, math.inf, "moves")
                    move_terms.append((mv, team.priority))
            if hi is not None and "quota" not in skip_groups:
                b.row(((x, 1.0) for x in xs), -math.inf, hi, f"quota_max of team {team.name!r} in {r}")
            if lo > 0 and "quota" not in skip_groups:
                b.row(((x, 1.0) for x in xs), lo, math.inf, f"quota_min of team {team.name!r} in {r}")
        for g, n in demand.items():
            xs = [b.cols[("x", k, r, g)] for r in regions if ("x", k, r, g) in b.cols]
            b.row(((x, 1.0) for x in xs), n, n, "demand")
    # the later partitions' teams, by their GPUs only
    pooled: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
    for k in later:
        team = problem.teams[k]
        regions = _regions(cand[k], k, enabled, made)
        own_rows = team.pinned or (bool(team.quota_max or team.quota_min) and "quota" not in skip_groups)
        for g, n in team.demand().items():
            where = tuple(r for r in regions if (r, g) in cells)
            if not own_rows:
                pooled[(g, where)] += n
                continue
            if team.pinned:  # its GPUs where they are
                held = {r: float(per.get(g, 0.0)) for r, per in team.current.items()}
                where = tuple(r for r, cur in held.items() if cur > 0 and (r, g) in cells)
                xs = [b.var(("lx", k, r, g), held[r], held[r]) for r in where]
            else:
                xs = [b.var(("lx", k, r, g)) for r in where]
            for r, x in zip(where, xs, strict=True):
                cell_users[(r, g)].append(x)
                part_cells[(r, g)] = cells[(r, g)]
            b.row(((x, 1.0) for x in xs), n, n, "later teams")
        if own_rows and "quota" not in skip_groups:
            for r in regions:
                xs = [b.cols[key] for key in (("lx", k, r, g) for g in team.demand()) if key in b.cols]
                hi, lo = team.cap(r), float(team.quota_min.get(r, 0.0))
                if hi is not None:
                    b.row(((x, 1.0) for x in xs), -math.inf, hi, "later teams")
                if lo > 0:
                    b.row(((x, 1.0) for x in xs), lo, math.inf, "later teams")
    for gi, ((g, where), n) in enumerate(sorted(pooled.items())):
        xs = [b.var(("lg", gi, r)) for r in where]
        for r, x in zip(where, xs, strict=True):
            cell_users[(r, g)].append(x)
            part_cells[(r, g)] = cells[(r, g)]
        b.row(((x, 1.0) for x in xs), n, n, "later teams")
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
        other = float(fixed.get(cell, 0.0))
        b.row([*((x, 1.0) for x in xs), (t_col, -s)], -math.inf, -other, "ratio")
        over, under = b.var(("o", *cell)), b.var(("u", *cell))
        target = s - other  # balance around supply: GPUs over it cost OVERLOAD_WEIGHT, idle ones 1
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
    if enabled is None:  # the MIP path: its LP relaxation is the bound
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
        solved = f"optimal within a {MIP_REL_GAP:.0%} gap" if binaries else "optimal"
        status.append(f"{stage}:{solved if res.status == 0 else 'time limit (feasible)'}")
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
    used: set[tuple[int, str]] = set()
    for key, j in b.cols.items():
        if key[0] == "x" and best[j] > 1e-9:
            x_out[(key[1], key[2], key[3])] = float(best[j])
            used.add((key[1], key[2]))
    replicas: set[tuple[str, str]] = set()
    for k, r in used:
        for d in problem.teams[k].datasets:
            if r not in problem.datasets[d].replicas:
                replicas.add((d, r))
    return _PartResult(x_out, replicas, status, lp_bound, binaries)


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
    """Solve the rebalance problem (see the module docstring); raises RebalanceInfeasibleError, and
    ValueError for a ``time_limit_s`` ≤ 0 or a negative ``comfort_ratio``.

    ``comfort_ratio``: stage A minimises ``max(worst ratio, comfort_ratio)``, so regions already
    below it are not spread further (no data is copied just to go from 0.3 to 0.2); 0 is the pure
    lexicographic min-max.

    ``time_limit_s``: the time budget; what the rounding leaves of it is shared among the
    partitions (each one's share covers its model building too). It bounds the search for better
    assignments; a partition that found none in its share looks for its first one without a limit.

    ``team_block``: above this many teams (on the rounding path) the LP stages are solved per
    partition of at most this many teams (dataset clusters kept together), one after another, each
    against whole cells: the partitions solved before are fixed where they placed their teams, the
    later ones are in its model by their GPUs (over the regions their teams may use), so no
    partition takes the room another one needs. Few binaries (≤ ``mip_max_binaries``): one exact
    MIP, however many teams.
    """
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s={time_limit_s!r}: need a number of seconds > 0")
    if not comfort_ratio >= 0:
        raise ValueError(f"comfort_ratio={comfort_ratio!r}: need a demand/supply ratio ≥ 0 (0: pure min-max)")
    started = time.perf_counter()
    check_feasible(problem)
    problem = _within_residency(problem)
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

    used_storage: dict[str, float] = defaultdict(float, problem.storage_held_bytes)
    for d in problem.datasets.values():
        for r in d.replicas:
            used_storage[r] += d.bytes
    storage_free_total = {
        r: max(0.0, float(cap) - used_storage.get(r, 0.0)) for r, cap in problem.storage_cap_bytes.items()
    }
    goal = {g: max(m, comfort_ratio) for g, m in mean_ratio.items()}
    cand = _candidates(problem, cells, mean_ratio, load_before, candidates, seed * 1000)
    binaries = sum(1 for per in cand for missing in per.values() if missing)
    stage_status: list[str] = []
    enabled: set[tuple[int, str]] | None = None
    if binaries <= mip_max_binaries:  # few binaries: one exact MIP, however many teams
        parts = [list(range(len(problem.teams)))]
    else:
        # rounding: the pairs are enabled over all teams at once (one budget, one set of
        # replicas); the stages are then LPs, solved per partition
        enabled = _enable_pairs(problem, cand, cells, goal, float(problem.budget_bytes), storage_free_total)
        stage_status.append(f"rounded: {len(enabled)} of {binaries} pairs enabled")
        parts = partition_teams(problem, team_block)

    budget_left = float(problem.budget_bytes)
    storage_left = dict(storage_free_total)
    x_all: dict[tuple[int, str, str], float] = {}
    replicas: set[tuple[str, str]] = set()
    partition_bound = 0.0  # nan once any partition's LP bound ran out of time
    # Partitions are solved one after another against whole cells: the teams of the partitions
    # solved before are where they were placed, those of later ones in the model by their GPUs.
    placed: dict[tuple[str, str], float] = defaultdict(float)
    for pi, members in enumerate(parts):
        share = max(1.0, time_limit_s - (time.perf_counter() - started)) / (len(parts) - pi)
        later = [k for q in parts[pi + 1 :] for k in q]

        def attempt(
            skip: frozenset[str],
            members: list[int] = members,
            later: list[int] = later,
            budget: float = budget_left,
            share: float = share,
            made: frozenset[tuple[str, str]] = frozenset(replicas),
        ) -> _PartResult:
            pairs = enabled
            if enabled is not None and skip:
                pairs = _enable_pairs(
                    problem,
                    cand,
                    cells,
                    goal,
                    math.inf if "budget" in skip else float(problem.budget_bytes),
                    {} if "storage" in skip else storage_free_total,
                    quotas="quota" not in skip,
                )
            return _solve_partition(
                problem,
                members,
                cells,
                cand,
                pairs,
                dict(placed),
                made,
                later,
                math.inf if "budget" in skip else budget,
                {} if "storage" in skip else dict(storage_left),
                share,
                mip_max_binaries,
                comfort_ratio,
                skip,
            )

        try:
            res = attempt(frozenset())
        except _PartitionInfeasible:
            if not later:
                raise _diagnose(problem, members, attempt) from None
            # a later team that cannot be placed is reported by its own partition
            try:
                res = attempt(frozenset(), later=[])
            except _PartitionInfeasible:
                raise _diagnose(problem, members, partial(attempt, later=[])) from None
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

    optimal = enabled is None and all(":optimal" in s for s in stage_status)
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


def _diagnose(
    problem: Problem, members: list[int], attempt: Callable[[frozenset[str]], _PartResult]
) -> RebalanceInfeasibleError:
    """Elastic check: drop one constraint group at a time; the first whose removal helps is binding."""
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
            attempt(frozenset({group}))
        except _PartitionInfeasible:
            continue
        return RebalanceInfeasibleError(label, detail)
    return RebalanceInfeasibleError("locality", f"no region holds (or can receive) the datasets of {names}")
