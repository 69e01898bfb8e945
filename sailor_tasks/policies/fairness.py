"""Max-min policies over X: ``las``, ``las_agnostic``, ``makespan`` and finish-time fairness ``ftf``.

Each is one LP (``ftf``: a short bisection of LPs) built from ``base.base_constraints`` plus rows
for the max-min objective, following Gavel (Narayanan et al., OSDI'20, §4).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from sailor_tasks.errors import InfeasibleAllocationError
from sailor_tasks.policies.base import (
    Allocation,
    LinearProgram,
    PolicyJob,
    PolicyState,
    Units,
    add_rows,
    base_constraints,
    empty_allocation,
    has_conflicts,
    make_allocation,
    merge_identical,
    register,
    resolve,
    singles,
    solve,
    solved_model,
)
from sailor_tasks.policies.space_sharing import pair_units, partitioned

logger = logging.getLogger(__name__)

SPARE_FLOOR = 1e-9
"""Relative slack on the fair share t* when the spare capacity is handed out (solver round-off)."""


FILL_TOL = 1e-5
"""Relative tolerance of the progressive filling of spare capacity (``las_agnostic``): a level
that rises less is the solver's round-off; floors that fill a type to within HiGHS's feasibility
tolerance can read as infeasible, and are then held this much below their levels (under 4 ms of a
6-minute round)."""


def spare_weight(units: Units) -> np.ndarray:
    """w_j² per job: the spare stage's objective weights job j's normalised throughput (coef_j ∝
    1/w_j) by w_j², i.e. by w_j overall, so spare capacity goes to the higher priority weights
    (team weights in live admission), as a progressive filling would; with equal weights it is
    the unweighted normalised throughput."""
    w = np.array([j.priority_weight for j in units.jobs], dtype=float)
    return w * w


def max_min(units: Units, gpus, coef: np.ndarray, policy: str, spare: bool = False) -> np.ndarray:
    """Solve max t s.t. t ≤ coef_j · (steps/s of job j under X) for every job with coef_j > 0.

    Notation:
        X[u, m]  time fraction of unit u on GPU type m (variables 0..U·M-1), t the last variable;
        E[j, ·]  steps/s job j makes per unit of each variable (``Units.job_throughput``);
        c_j      jobs row j stands for (``Units.count``).
    Objective:
        maximize t; with ``spare``, then maximize Σ_j c_j · w_j² · coef_j · E[j] · X with t fixed at its
        optimum t*: every job keeps the max-min share, and the capacity the max-min optimum leaves
        unallocated (jobs whose share cannot grow further hold the minimum down) goes where it
        adds the most normalised throughput, instead of to whatever vertex the solver stops at.
    Constraints:
        the base constraints (bounds, one place per job, capacity per type);
        t − coef_j · E[j] · X ≤ 0 for every job j with coef_j > 0 (none: t = 0).
    """
    from scipy.sparse import csr_matrix, diags, hstack

    lp = base_constraints(units, gpus, extra_vars=1)
    active = np.nonzero(coef > 0)[0]
    if not len(active):
        lp.ub[-1] = 0.0
    e = units.job_throughput()[active]
    rows = hstack([-(diags(coef[active]) @ e), csr_matrix(np.ones((len(active), 1)))])
    add_rows(lp, rows, np.zeros(len(active)))
    lp.c[-1] = 1.0
    lp.maximize = True
    if not spare or not len(active):
        return solve(lp, policy)
    vec, model = solved_model(lp, policy)
    count = np.zeros(len(units.jobs))
    for u, unit in enumerate(units.units):
        if len(unit) == 1:
            count[unit[0]] = units.count[u]
    lp.lb[-1] = float(vec[-1]) * (1.0 - SPARE_FLOOR)
    gain = coef * spare_weight(units)
    lp.c = np.concatenate([np.asarray((count[active] * gain[active]) @ e).ravel(), [0.0]])
    # Simplex from the first stage's optimal basis, which stays primal feasible: 0.015 s where
    # dual simplex from scratch took 0.04 s, interior point 0.14 s (2048 distinct jobs × 3
    # types, bench/policy_solve.py). HiGHS may end such a warm start without an optimum
    # ("Unknown"): dual simplex from scratch then.
    try:
        return resolve(model, policy, lp.c, lp.lb)
    except InfeasibleAllocationError as exc:
        logger.debug("%s: the spare stage from the first stage's basis failed (%s); solving it anew", policy, exc)
        return solve(lp, policy, simplex=True)


def equal_share_throughput(units: Units, gpus) -> np.ndarray:
    """Steps/s of each job with an equal time split over the cluster's GPU mix (the normaliser)."""
    total = sum(float(gpus[g]) for g in units.gpu_types)
    mix = np.array([float(gpus[g]) / total for g in units.gpu_types]) if total > 0 else 0.0
    n = len(units.jobs)
    return (units.thr[:n, :, 0] * mix).sum(axis=1)


class _MaxMinPolicy:
    """Shared by ``las`` / ``las_agnostic`` / ``makespan``: singles or space-sharing units, POP."""

    symmetric = True
    agnostic = False
    supports_space_sharing = True
    """Solves space-sharing units (pairs of jobs on one GPU) when ``PolicyState.space_sharing``."""
    hand_out_spare = True
    """Run ``max_min``'s second stage (the capacity the max-min optimum leaves unallocated)."""

    def coefficients(self, units: Units, state: PolicyState) -> np.ndarray:
        raise NotImplementedError

    def allocate(self, state: PolicyState) -> Allocation:
        if not state.jobs:
            return empty_allocation(self.name, state.gpus)
        if state.space_sharing:
            return partitioned(state, self._solve)
        return self._solve(state)

    def merge_columns(self, units: Units) -> np.ndarray:
        """Per-job key columns besides throughputs and scale factor (jobs equal on all of them get
        equal rows of X: the LP is symmetric in them)."""
        return np.array([[j.priority_weight] for j in units.jobs])

    def merge_key(self, job, gpu_types) -> tuple:
        """The same key for one job (``MaxMinSession``)."""
        return (job.scale_factor, job.priority_weight, *(job.throughput.get(g, 0.0) for g in gpu_types))

    def _solve(self, state: PolicyState) -> Allocation:
        started = time.perf_counter()
        if state.space_sharing:
            units = pair_units(state, state.jobs)
            return make_allocation(self.name, units, self._solve_units(units, state), started)
        # Identical jobs (same key) are merged into one row with a count: an exact reduction, since
        # averaging an optimal X over permutations of identical jobs is feasible and optimal too.
        units = singles(state.jobs, state.gpus)
        inverse, merged = merge_identical(units, self.merge_columns(units))
        x = merged.unflatten(self._solve_units(merged, state))[inverse]
        return make_allocation(self.name, units, x.ravel(), started)

    def _solve_units(self, units: Units, state: PolicyState) -> np.ndarray:
        solved_on = self.as_solved(units)
        coef = self.coefficients(solved_on, state)
        return max_min(solved_on, state.gpus, coef, self.name, spare=self.hand_out_spare)

    def as_solved(self, units: Units) -> Units:
        """The units as the LP sees them (``las_agnostic``: every runnable type equally fast)."""
        if self.agnostic:
            return replace(units, thr=(units.thr > 0).astype(float))
        return units

    def session(self, gpus) -> MaxMinSession | None:
        """A stateful solver for repeated calls on one cluster (None: not supported)."""
        return MaxMinSession(self, gpus) if self.symmetric else None


@register("las")
class LeastAttainedService(_MaxMinPolicy):
    """Max-min fairness over normalised effective throughput, weighted by priority (Gavel's LAS).

    Notation:
        T[j, m] steps/s of job j (all its s_j workers) on type m; w_j its priority weight;
        N_j = Σ_m T[j, m] · G_m / Σ G (its throughput when it holds the cluster's mix all the time).
    Objective:
        maximize min_j s_j · (Σ_m T[j, m] X[j, m]) / (w_j · N_j).
        Fairness is per GPU: an equal share of the cluster is the same number of GPU-seconds for
        every job, so an s-GPU job holds its GPUs 1/s as long as a 1-GPU job; N_j / s_j is its
        throughput per GPU of the mix. Without s_j every job would get the same time fraction,
        i.e. an s-GPU job s times the GPU-seconds of a 1-GPU job.
    Constraints:
        base constraints. The round mechanism adds the "least attained service" part: jobs that
        received less than X so far get priority.
    """

    def coefficients(self, units: Units, state: PolicyState) -> np.ndarray:
        norm = equal_share_throughput(units, state.gpus)
        n = len(units.jobs)
        w = np.array([j.priority_weight for j in units.jobs])
        return np.divide(units.scale[:n], w * norm, out=np.zeros_like(norm), where=norm > 0)


def _agnostic_rows(cap: np.ndarray, coef: np.ndarray, jobs: np.ndarray):
    """``las_agnostic``'s rows over x_0..x_{n-1}, t: capacity per type (``cap`` · x ≤ 1), then
    t − coef_j · x_j ≤ 0 for each of ``jobs``; returns (A_ub, b_ub)."""
    from scipy.sparse import csr_matrix, hstack, vstack

    m, n = cap.shape
    k = np.arange(len(jobs))
    fair = csr_matrix(
        (
            np.concatenate([-coef[jobs], np.ones(len(jobs))]),
            (np.tile(k, 2), np.concatenate([jobs, np.full(len(jobs), n)])),
        ),
        shape=(len(jobs), n + 1),
    )
    a = vstack([hstack([csr_matrix(cap), csr_matrix((m, 1))]), fair]).tocsr()
    return a, np.concatenate([np.ones(m), np.zeros(len(jobs))])


def _evened(
    share: np.ndarray, can: np.ndarray, x: np.ndarray, gpus: np.ndarray, pool: np.ndarray
) -> np.ndarray:
    """Each job's split of its time ``x_j`` over the types it can run on (rows of ``share``, the
    split in proportion to the types' GPU counts), moved towards the even split as far as every
    type's capacity allows: split_j = (1 − λ) · share_j + λ · even_j with the largest λ in [0, 1]
    that keeps Σ_j gpus_j · x_j · split_jm ≤ pool_m on every type m (``gpus``: GPUs per job row,
    its scale factor times its count). The proportional split fits whenever the LP's solution
    does (λ = 0), so this never overfills a type; with capacity to spare it gives every type the
    same share of a job's time (λ = 1)."""
    runnable = can.sum(axis=1)[:, None]
    even = np.divide(can, runnable, out=np.zeros(can.shape), where=runnable > 0)
    weight = (gpus * x)[:, None]
    room = pool - (weight * share).sum(axis=0)
    growth = (weight * (even - share)).sum(axis=0)
    grows = growth > 0
    lam = float(np.min(np.maximum(room[grows], 0.0) / growth[grows], initial=1.0))
    return (1.0 - lam) * share + lam * even


@register("las_agnostic")
class LeastAttainedServiceAgnostic(LeastAttainedService):
    """``las`` solved as if every GPU type were equally fast (the heterogeneity-agnostic baseline).

    Notation:
        as ``las`` with T[j, m] = 1 wherever the job can run (S_j: those types); x_j the job's
        total time fraction; G(S) = Σ_{m ∈ S} G_m.
    Objective:
        as ``las``, over x_j: max-min, then the spare capacity by progressive filling
        (``_fill_spare``: the spare stage's objective is flat when every type is equally fast).
    Constraints:
        solved with X[j, m] = x_j · G_m / G(S_j) for m ∈ S_j (a job's time spread over its
        types in proportion to their GPU counts, the split that fits whenever any does); x_j ≤ 1;
        Σ_j c_j s_j x_j / G(S_j) ≤ 1 for every type m (over the jobs with m ∈ S_j: capacity).
    Split:
        every x_j is then spread over S_j as evenly as the types' capacity allows (``_evened``):
        a scheduler that cannot tell the types apart gives each the same share of a job's time
        unless a type is full. Any split of x_j solves the LP alike (its types all look the same);
        Gavel's solver returns a central one (for 6 one-GPU jobs on 4 V100, 8 P100 and 12 K80
        GPUs: 0.23, 0.34 and 0.43 of each job's time, where GPU counts give 0.17, 0.33 and 0.5
        and the even split 1/3 each).
    The resulting X is then executed at the real throughputs.
    """

    agnostic = True

    def _solve_units(self, units: Units, state: PolicyState) -> np.ndarray:
        if units.thr.shape[2] > 1:  # space-sharing units: the general LP
            return super()._solve_units(units, state)
        solved = self.as_solved(units)
        n, m = units.shape
        can = solved.thr[:, :, 0] > 0
        pool = np.array([float(state.gpus[g]) for g in units.gpu_types])
        size = (can * pool).sum(axis=1)
        share = np.divide(can * pool, size[:, None], out=np.zeros((n, m)), where=size[:, None] > 0)
        coef = self.coefficients(solved, state)
        live = np.nonzero((coef > 0) & (size > 0))[0]
        cap = (can * (units.count * units.scale / np.where(size > 0, size, 1.0))[:, None]).T
        a, b = _agnostic_rows(cap, coef, live)
        c = np.zeros(n + 1)
        c[n] = 1.0
        ub = np.concatenate([np.where(size > 0, 1.0, 0.0), [np.inf if len(live) else 0.0]])
        lp = LinearProgram(
            c=c,
            a_ub=a,
            b_ub=b,
            lb=np.zeros(n + 1),
            ub=ub,
            maximize=True,
        )
        vec = solve(lp, self.name)
        t_star = float(vec[n])
        if len(live) and t_star > 0:
            spare_c = np.concatenate([units.count * coef * spare_weight(units), [0.0]])
            vec = self._fill_spare(lp, vec, live, coef, cap, ub[:n], spare_c)
        x = vec[:n, None] * _evened(share, can, vec[:n], units.count * units.scale, pool)
        return np.concatenate([x.ravel(), [t_star]])

    def _fill_spare(self, lp, first, live, coef, cap, x_ub, spare_c) -> np.ndarray:
        """Hand out the capacity the max-min share ``t_star`` leaves over by progressive filling:
        every job keeps at least ``t_star``; the jobs whose share can still grow raise it together
        (max-min again over them) until one reaches its bound (x_j = 1), which then keeps that
        share, and so on until the capacity binds; what a job's types still have free after that
        goes out by ``spare_c``. The spare stage's objective alone is flat here (every GPU-second
        counts the same whatever job gets it): the split would be whatever vertex the solver
        stops at (all of it to one multi-GPU job, say). ``first``: the max-min solution (the last
        step's solution is kept when the solver finds a step's floors, a hair under the capacity,
        infeasible within its tolerances)."""
        n = len(x_ub)
        tol = FILL_TOL
        t_star = float(first[n])
        best = first
        most = coef * x_ub  # the largest share each job can reach
        floor = np.zeros(n)
        floor[live] = t_star
        level = t_star
        growing = [j for j in live if most[j] > level * (1.0 + tol)]

        def x_floor(slack: float) -> np.ndarray:
            x = np.divide(floor, coef, out=np.zeros(n), where=coef > 0) * (1.0 - slack)
            return np.minimum(x, x_ub)

        def floored(build) -> np.ndarray | None:
            """Solve ``build(slack)``, the floors ``slack`` below their levels: the solver's
            round-off first, then ``FILL_TOL``; None when neither solves."""
            for slack in (SPARE_FLOOR, tol):
                try:
                    return solve(build(slack), self.name)
                except InfeasibleAllocationError:
                    continue
            return None

        while growing:
            g = np.array(growing)
            a, b = _agnostic_rows(cap, coef, g)
            vec = floored(
                lambda slack, a=a, b=b, level=level: LinearProgram(
                    c=lp.c,
                    a_ub=a,
                    b_ub=b,
                    lb=np.concatenate([x_floor(slack), [level * (1.0 - slack)]]),
                    ub=lp.ub,
                    maximize=True,
                )
            )
            if vec is None:
                break
            best = vec
            reached = float(vec[n])  # at most every growing job's bound (t ≤ coef_j · x_j)
            if reached <= level * (1.0 + tol):
                break  # the capacity binds
            level = reached
            floor[g] = np.minimum(level, most[g])
            growing = [j for j in growing if most[j] > level * (1.0 + tol)]
        final = floored(
            lambda slack: LinearProgram(
                c=spare_c,
                a_ub=lp.a_ub,
                b_ub=lp.b_ub,
                lb=np.concatenate([x_floor(slack), [0.0]]),
                ub=lp.ub,
                maximize=True,
            )
        )
        return best if final is None else final

    def session(self, gpus) -> None:
        """No kept model: the proportional split is its own LP (see ``_solve_units``)."""
        return None


@register("makespan")
class Makespan(_MaxMinPolicy):
    """Minimise the time until every job has finished.

    Notation:
        R_j steps remaining of job j; T[j, m] steps/s.
    Objective:
        maximize min_j (Σ_m T[j, m] X[j, m]) / R_j  (= minimize max_j R_j / throughput_j).
    Constraints:
        base constraints; jobs with R_j = 0 are ignored.
    """

    symmetric = False  # reads steps_remaining, which changes every round
    hand_out_spare = False
    """The objective is the last finish time: capacity beyond the max-min share, given to the jobs
    that are not the bottleneck, shortens their JCTs but takes rounds from the bottleneck jobs in
    the round mechanism (on gavel_parity's traces: makespan up to 3% longer with it)."""

    def coefficients(self, units: Units, state: PolicyState) -> np.ndarray:
        r = np.array([j.steps_remaining for j in units.jobs])
        return np.divide(1.0, r, out=np.zeros_like(r), where=r > 0)

    def merge_columns(self, units: Units) -> np.ndarray:
        return np.array([[j.priority_weight, j.steps_remaining] for j in units.jobs])

    def merge_key(self, job, gpu_types) -> tuple:
        return (*super().merge_key(job, gpu_types), job.steps_remaining)


@register("ftf")
class FinishTimeFairness:
    """Finish-time fairness (Themis, as in Gavel): minimise the worst ratio ρ_j of a job's finish
    time under X to its finish time on an equal 1/n share of the cluster.

    Notation:
        e_j seconds since arrival, R_j steps left, W_j steps in all, θ_j(X) = Σ_m T[j, m] X[j, m],
        N_j the equal-split throughput (see ``las``), n jobs; isolated throughput
        ι_j = N_j · min(1, Σ_m G_m / (n · s_j)) (its 1/n of the cluster) and isolated finish time
        I_j = W_j / ι_j (Themis: the whole job on its own share from arrival; e_j + R_j / ι_j when
        W_j is not known). ρ_j(X) = (e_j + R_j / θ_j(X)) / I_j: a job that waited without
        progress has a small I_j against its e_j and comes first.
    Objective:
        minimize max_j ρ_j, by bisection on r: ρ_j ≤ r ⟺ θ_j ≥ R_j / (r · I_j − e_j), checked with the
        max-min LP  max t s.t. t ≤ θ_j · (r · I_j − e_j) / R_j  (feasible iff t ≥ 1).
    Constraints:
        base constraints.
    """

    symmetric = False
    iterations = 20

    def allocate(self, state: PolicyState) -> Allocation:
        if not state.jobs:
            return empty_allocation(self.name, state.gpus)
        started = time.perf_counter()
        units = singles(state.jobs, state.gpus)
        e = np.array([j.elapsed_s for j in units.jobs])
        r = np.array([max(j.steps_remaining, 0.0) for j in units.jobs])
        norm = equal_share_throughput(units, state.gpus)
        n = len(units.jobs)
        total_gpus = sum(float(state.gpus[g]) for g in units.gpu_types)
        isolated_thr = norm * np.minimum(1.0, total_gpus / (n * units.scale))
        w = np.array([j.steps_total for j in units.jobs])
        work = np.where(w > 0, np.maximum(w, r), e * isolated_thr + r)
        isolated = np.divide(work, isolated_thr, out=np.full(n, np.inf), where=isolated_thr > 0)
        live = (r > 0) & np.isfinite(isolated)
        if not live.any():
            return make_allocation(
                self.name, units, max_min(units, state.gpus, np.zeros(n), self.name), started
            )

        def coef(rho: float) -> np.ndarray:
            slack = rho * isolated - e
            return np.where(live, np.divide(slack, r, out=np.zeros(n), where=r > 0), 0.0)

        def attained(rho: float) -> tuple[float, np.ndarray]:
            c = coef(rho)
            if (c[live] <= 0).any():
                return 0.0, np.zeros(units.num_vars + 1)
            vec = max_min(units, state.gpus, c, self.name)
            return float(vec[-1]), vec

        lo, hi = 0.0, 2.0
        best = None
        # Grow hi until feasible (ρ ≤ hi). Some finite ρ is: every live job has a positive
        # coefficient once ρ · I_j > e_j, and t grows with ρ. A job that waited days for a few
        # steps has ρ in the thousands, so the doubling is not stopped early.
        for _ in range(64):
            t, vec = attained(hi)
            if t >= 1.0:
                best = vec
                break
            lo, hi = hi, hi * 2
        if best is None:
            raise InfeasibleAllocationError(self.name, "bisection bound not found", f"ρ > {hi}")
        for _ in range(self.iterations):
            mid = (lo + hi) / 2
            t, vec = attained(mid)
            if t >= 1.0:
                hi, best = mid, vec
            else:
                lo = mid
        # The bisection's last feasible X only guarantees ρ ≤ hi; hand the rest of the cluster out
        # too (``max_min``'s spare stage, with the coefficients of that ρ).
        best = max_min(units, state.gpus, coef(hi), self.name, spare=True)
        return make_allocation(self.name, units, best, started)


class MaxMinSession:
    """Repeated max-min solves on one cluster, hot-started: one HiGHS model is kept and only the
    job-class counts change between calls (what a simulator round or a nightly re-run changes).

    Jobs are merged into classes by ``merge_key`` (exact, as in ``allocate``). The model has the
    variable t, then one slot per class in it: X[c, m] for every type; rows: capacity per type,
    then per slot "one place" and "t ≤ coef_c · throughput_c" (deactivated, upper bound +inf,
    while the class has no jobs). HiGHS' work per solve grows with the model even when few
    classes have jobs, so once more than ``COMPACT_ABOVE`` (and more than half) of the slots are
    idle, their columns and rows are deleted; a class that gets jobs again is appended.
    ``allocate`` returns what the policy's own ``allocate`` returns (same LP, same optimum); states
    with space sharing, other GPU counts or jobs that exclude each other on a type
    (``base.conflict_rows``) are passed to the policy unchanged. ``max_min``'s second
    stage (the spare capacity) is a second model with the same rows and columns, its objective the
    classes' normalised throughput and t bounded below by the first model's optimum: each model
    keeps the basis of its own objective.
    """

    COMPACT_ABOVE = 8
    """Idle slots kept before compaction (a class often gets jobs again soon)."""

    def __init__(self, policy: _MaxMinPolicy, gpus):
        import highspy

        self.policy = policy
        self.gpus = {g: float(c) for g, c in gpus.items()}
        self.gpu_types = tuple(sorted(self.gpus))
        self._inf = highspy.kHighsInf
        self.models = []
        for t_cost in (1.0, 0.0):
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
            h.setOptionValue("threads", 1)
            h.setOptionValue("presolve", "off")  # keep the basis between solves
            h.changeObjectiveSense(highspy.ObjSense.kMaximize)
            h.addCol(t_cost, 0.0, self._inf, 0, np.array([], np.int32), np.array([]))
            for g in self.gpu_types:
                h.addRow(-self._inf, self.gpus[g], 0, np.array([], np.int32), np.array([]))
            self.models.append(h)
        self.h, self.h_spare = self.models
        m = len(self.gpu_types)
        self.classes: dict[object, int] = {}
        self.counts = np.zeros(0)
        """Jobs of each class in the model now."""
        self.scale = np.zeros(0)
        self.thr = np.zeros((0, m))
        """Each class's steps/s per type (as the job runs it: X is executed at these)."""
        self._coef_thr = np.zeros((0, m))
        self._spare_thr = np.zeros((0, m))
        """The spare stage's objective per class: ``_coef_thr`` · w² (``spare_weight``)."""
        """coef_c · throughput_c as the LP sees it (``as_solved``), 0 where coef_c = 0."""
        self._ub = np.zeros((0, m))
        self._slot = np.zeros(0, dtype=np.int64)
        """Each class's slot in the model, -1 when it has none."""
        self._slot_class: list[int] = []
        self._job_class: dict[str, tuple[PolicyJob, int]] = {}
        self.solves = 0
        self.compactions = 0

    def _add_class(self, job: PolicyJob, state: PolicyState) -> int:
        c = len(self.counts)
        one = singles((job,), self.gpus)
        solved = self.policy.as_solved(one)
        coef = float(self.policy.coefficients(solved, state)[0])
        thr = one.thr[0, :, 0]
        self.counts = np.append(self.counts, 0.0)
        self.scale = np.append(self.scale, float(job.scale_factor))
        self.thr = np.vstack([self.thr, thr])
        self._coef_thr = np.vstack([self._coef_thr, coef * solved.thr[0, :, 0] if coef > 0 else 0 * thr])
        self._spare_thr = np.vstack([self._spare_thr, self._coef_thr[-1] * float(spare_weight(one)[0])])
        self._ub = np.vstack([self._ub, np.where(thr > 0, 1.0, 0.0)])
        self._slot = np.append(self._slot, -1)
        return c

    def _add_slot(self, c: int) -> None:
        """Append class ``c``'s columns and rows (no jobs yet: capacity coefficients 0, fairness
        row deactivated)."""
        m = len(self.gpu_types)
        slot = len(self._slot_class)
        first_col = 1 + slot * m
        none_i, none_f = np.array([], np.int32), np.array([])
        cols = np.arange(first_col, first_col + m, dtype=np.int32)
        row = np.concatenate([[1.0], -self._coef_thr[c]])
        for h in self.models:
            h.addCols(m, np.zeros(m), np.zeros(m), self._ub[c], 0, none_i, none_i, none_f)
            h.addRow(-self._inf, 1.0, m, cols, np.ones(m))
            h.addRow(-self._inf, self._inf, m + 1, np.concatenate([[0], cols]).astype(np.int32), row)
        self._slot[c] = slot
        self._slot_class.append(c)

    def _compact(self, counts: np.ndarray) -> None:
        """Delete the slots of classes without jobs now and before this call (their columns are
        0 in every row that binds; HiGHS keeps the rest of the basis)."""
        m = len(self.gpu_types)
        in_model = np.array(self._slot_class, dtype=np.int64)
        idle = np.nonzero((counts[in_model] == 0) & (self.counts[in_model] == 0))[0].tolist()
        if len(idle) <= max(self.COMPACT_ABOVE, len(self._slot_class) // 2):
            return
        cols = np.array([1 + s * m + i for s in idle for i in range(m)], dtype=np.int32)
        rows = np.array([m + 2 * s + k for s in idle for k in range(2)], dtype=np.int32)
        for h in self.models:
            h.deleteCols(len(cols), cols)
            h.deleteRows(len(rows), rows)
        gone = set(idle)
        self._slot_class = [c for s, c in enumerate(self._slot_class) if s not in gone]
        self._slot[:] = -1
        self._slot[self._slot_class] = np.arange(len(self._slot_class))
        self.compactions += 1

    def _run(self, h) -> np.ndarray:
        """Solve ``h`` from the kept basis; a solve that ends without an optimum is solved again
        from scratch with presolve (the LP is always feasible: X = 0 is a solution).

        Raises:
            InfeasibleAllocationError: the fresh solve found no optimum either.
        """
        import highspy

        h.run()
        status = h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            # A hot start can end without a verdict ("Unknown": the simplex stopped on the kept
            # basis with infeasibilities its cleanup could not remove). Drop the basis.
            logger.warning(
                "%s: hot-started solve ended %s (%d columns, %d rows); solving it from scratch",
                self.policy.name,
                h.modelStatusToString(status),
                h.getNumCol(),
                h.getNumRow(),
            )
            h.clearSolver()
            h.setOptionValue("presolve", "on")
            try:
                h.run()
            finally:
                h.setOptionValue("presolve", "off")
            status = h.getModelStatus()
            if status != highspy.HighsModelStatus.kOptimal:
                raise InfeasibleAllocationError(self.policy.name, h.modelStatusToString(status))
        return np.asarray(h.getSolution().col_value)

    def allocate(self, state: PolicyState) -> Allocation:
        gpus = {g: float(c) for g, c in state.gpus.items()}
        if state.space_sharing or gpus != self.gpus or has_conflicts(state.jobs, gpus):
            # The kept model has no rows for jobs that exclude each other (``conflict_rows``).
            return self.policy.allocate(state)
        if not state.jobs:
            return empty_allocation(self.policy.name, state.gpus)
        started = time.perf_counter()
        jobs = sorted(state.jobs, key=lambda j: j.job_id)
        m = len(self.gpu_types)
        cls = np.empty(len(jobs), dtype=np.int64)
        count = np.empty(len(jobs))
        for u, job in enumerate(jobs):
            hit = self._job_class.get(job.job_id)
            if hit is not None and hit[0] is job:
                c = hit[1]
            else:
                key = self.policy.merge_key(job, self.gpu_types)
                c = self.classes.get(key)
                if c is None:
                    c = self.classes[key] = self._add_class(job, state)
                self._job_class[job.job_id] = (job, c)
            cls[u] = c
            count[u] = job.count
        counts = np.bincount(cls, weights=count, minlength=len(self.counts))
        self._compact(counts)
        for c in np.nonzero(counts != self.counts)[0].tolist():
            n = float(counts[c])
            if self._slot[c] < 0:
                self._add_slot(c)
            slot = int(self._slot[c])
            coeff = n * float(self.scale[c])
            cols = np.arange(1 + slot * m, 1 + (slot + 1) * m, dtype=np.int32)
            for h in self.models:
                for i in range(m):
                    h.changeCoeff(i, int(cols[i]), coeff)
                if (n > 0) != (self.counts[c] > 0):
                    h.changeRowBounds(m + 2 * slot + 1, -self._inf, 0.0 if n > 0 else self._inf)
            self.h_spare.changeColsCost(m, cols, n * self._spare_thr[c])
        self.counts = counts
        solution = self._run(self.h)
        self.solves += 1
        if solution[0] > 0 and self.policy.hand_out_spare:
            self.h_spare.changeColBounds(0, float(solution[0]) * (1.0 - SPARE_FLOOR), self._inf)
            solution = self._run(self.h_spare)
        x_slot = solution[1:].reshape(len(self._slot_class), m)
        units = Units(
            jobs=tuple(jobs),
            gpu_types=self.gpu_types,
            units=tuple((j,) for j in range(len(jobs))),
            thr=self.thr[cls][:, :, None],
            scale=self.scale[cls],
            count=count,
        )
        return make_allocation(
            self.policy.name,
            units,
            x_slot[self._slot[cls]].ravel(),
            started,
            unit_ids=tuple((j.job_id,) for j in jobs),
        )
