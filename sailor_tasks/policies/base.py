"""Policy inputs and outputs, the policy registry, and the LP plumbing every policy shares.

A policy decides X[u, m], the fraction of wall-clock time that scheduling unit ``u`` (one job, or
two jobs sharing a GPU) should spend on GPU type ``m``. The round mechanism
(``sailor_tasks.policies.mechanism``) turns X into concrete GPU assignments every round.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from sailor_tasks.errors import InfeasibleAllocationError
from sailor_tasks.registry import Registry

if TYPE_CHECKING:
    from scipy.sparse import spmatrix

    from sailor_tasks.catalog.throughput import JobKey, ThroughputTable

JobId = str
GpuType = str
JobToGpuShare = dict[JobId, dict[GpuType, float]]
"""job id → GPU type → fraction of time (the readable form of X)."""


IPM_ABOVE_VARS = 3000
"""Use HiGHS' interior-point solver (with crossover) above this many columns: on the max-min LP
with 2048 distinct jobs × 3 types it took 0.10-0.12 s against dual simplex's 0.11-0.26 s,
depending on the instance (2-core machine, 2026-11-30)."""


@dataclass(frozen=True, slots=True)
class PolicyJob:
    """One job (or ``count`` identical jobs) as a policy sees it."""

    job_id: JobId
    throughput: Mapping[GpuType, float]
    """Steps/s of the whole job (all ``scale_factor`` workers) alone on each GPU type; 0 = cannot run."""
    scale_factor: int = 1
    """GPUs the job needs at once, all of one type."""
    priority_weight: float = 1.0
    steps_remaining: float = 0.0
    """Steps left to train (``ftf``, ``makespan`` and SLO deadlines use it)."""
    elapsed_s: float = 0.0
    """Seconds since the job arrived (``ftf``)."""
    deadline_s: float | None = None
    """SLO: seconds from now by which the job must finish (``min_cost``); None = no deadline."""
    job_type: JobKey | None = None
    """(model, scale factor) key into the throughput table, for space-sharing pair throughputs."""
    arrival_s: float = 0.0
    """Arrival time (``fifo`` order)."""
    count: int = 1
    """Identical jobs this row stands for (symmetric policies merge them; X applies to each)."""
    steps_total: float = 0.0
    """Steps of the whole job (``ftf``: its finish time in isolation); 0 = not known."""

    def __post_init__(self) -> None:
        if self.scale_factor < 1 or self.count < 1 or self.priority_weight <= 0:
            raise ValueError(
                f"job {self.job_id}: scale_factor={self.scale_factor}, count={self.count}, "
                f"priority_weight={self.priority_weight}: need ≥ 1, ≥ 1 and > 0"
            )


@dataclass(frozen=True, slots=True)
class PolicyState:
    """The snapshot a policy allocates over: jobs, GPUs per type, prices, options."""

    jobs: tuple[PolicyJob, ...]
    gpus: Mapping[GpuType, float]
    """GPU type → GPUs available (a POP partition may hold a fractional share)."""
    usd_per_gpu_hour: Mapping[GpuType, float] = field(default_factory=dict)
    """Price per GPU-hour of each type (``min_cost``); from the catalog."""
    space_sharing: bool = False
    """Let two jobs of the same scale factor share one GPU (``las``, ``makespan``)."""
    table: ThroughputTable | None = None
    """Pair throughputs for space sharing (``ThroughputTable.pairs``)."""
    seed: int = 0
    """Seed of any randomised step (POP partitioning)."""
    cluster_gpus: Mapping[GpuType, float] | None = None
    """The whole cluster's GPUs per type when ``gpus`` is a POP partition's share of them."""

    @property
    def gpu_types(self) -> tuple[GpuType, ...]:
        return tuple(sorted(self.gpus))

    @property
    def runnable_gpus(self) -> Mapping[GpuType, float]:
        """The GPUs that decide on which types a job can run at all: the whole cluster's. A
        partition's share of a type may be smaller than a job that can run there (8 GPUs of 36)."""
        return self.gpus if self.cluster_gpus is None else self.cluster_gpus


@dataclass(frozen=True, slots=True, eq=False)
class Allocation:
    """X over scheduling units × GPU types, with the units spelled out.

    ``units[u]`` is a tuple of one job id (the job alone) or two (the jobs sharing a GPU);
    ``matrix[u, i]`` is the time fraction of unit ``u`` on ``gpu_types[i]``;
    ``unit_throughput[u, i, k]`` is the steps/s of the k-th job of unit ``u`` on that type.
    """

    policy: str
    gpu_types: tuple[GpuType, ...]
    units: tuple[tuple[JobId, ...], ...]
    matrix: np.ndarray
    unit_throughput: np.ndarray
    unit_scale: np.ndarray
    solve_s: float = 0.0
    status: str = "optimal"

    def shares(self) -> JobToGpuShare:
        """Per-job time fraction on each GPU type (pairs counted for both jobs)."""
        out: JobToGpuShare = {}
        for u, unit in enumerate(self.units):
            for job in unit:
                per = out.setdefault(job, {g: 0.0 for g in self.gpu_types})
                for i, g in enumerate(self.gpu_types):
                    per[g] += float(self.matrix[u, i])
        return out

    def effective_throughput(self) -> dict[JobId, float]:
        """Steps/s each job makes under X (sum over its units and GPU types)."""
        out: dict[JobId, float] = {}
        for u, unit in enumerate(self.units):
            for k, job in enumerate(unit):
                out[job] = out.get(job, 0.0) + float(self.matrix[u] @ self.unit_throughput[u, :, k])
        return out

    def gpus_used(self) -> dict[GpuType, float]:
        """GPUs of each type the allocation occupies on average (space-shared units count once)."""
        used = (self.matrix * self.unit_scale[:, None]).sum(axis=0)
        return {g: float(used[i]) for i, g in enumerate(self.gpu_types)}

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "gpu_types": list(self.gpu_types),
            "status": self.status,
            "solve_s": round(self.solve_s, 6),
            "units": [
                {
                    "jobs": list(unit),
                    "shares": {g: round(float(self.matrix[u, i]), 6) for i, g in enumerate(self.gpu_types)},
                }
                for u, unit in enumerate(self.units)
            ],
        }


@runtime_checkable
class Policy(Protocol):
    name: str
    symmetric: bool
    """X depends only on each job's throughputs, scale factor and weight (not on its progress), and
    identical jobs get identical rows: callers may cache jobs and merge them (``PolicyJob.count``)."""

    def allocate(self, state: PolicyState) -> Allocation: ...


_POLICIES: Registry[Policy] = Registry("policy", "policies")
register = _POLICIES.register
"""Class decorator: make a policy available to ``get_policy(name)``."""


def policy_names() -> tuple[str, ...]:
    return _POLICIES.names()


def space_sharing_policies() -> tuple[str, ...]:
    """The policies that solve space-sharing units (the others would ignore ``space_sharing``)."""
    return tuple(n for n in policy_names() if getattr(type(get_policy(n)), "supports_space_sharing", False))


def get_policy(name: str) -> Policy:
    """A new instance of the policy called ``name``.

    Raises:
        ValueError: unknown name; the message lists the valid names.
    """
    return _POLICIES.get(name)()


# --- LP plumbing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Units:
    """The flatten/unflatten helper: units (sorted) × GPU types (sorted) ⇄ LP variable vector.

    Variable ``u * M + i`` is X[units[u], gpu_types[i]]. ``member`` is the sparse job × variable
    incidence (1 where the variable's unit contains the job); ``thr[u, i, k]`` the steps/s of the
    unit's k-th job; ``scale[u]`` GPUs the unit occupies; ``count[u]`` jobs it stands for.
    """

    jobs: tuple[PolicyJob, ...]
    gpu_types: tuple[GpuType, ...]
    units: tuple[tuple[int, ...], ...]
    thr: np.ndarray
    scale: np.ndarray
    count: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.units), len(self.gpu_types)

    @property
    def num_vars(self) -> int:
        return len(self.units) * len(self.gpu_types)

    def flatten(self, x: Mapping[tuple[tuple[JobId, ...], GpuType], float]) -> np.ndarray:
        """{(unit job ids, GPU type): fraction} → variable vector (missing keys are 0)."""
        ids = [tuple(self.jobs[j].job_id for j in unit) for unit in self.units]
        vec = np.zeros(self.num_vars)
        for u, key in enumerate(ids):
            for i, g in enumerate(self.gpu_types):
                vec[u * len(self.gpu_types) + i] = x.get((key, g), 0.0)
        return vec

    def unflatten(self, vec: np.ndarray) -> np.ndarray:
        """Variable vector → X as a (units × GPU types) matrix."""
        return np.asarray(vec[: self.num_vars]).reshape(self.shape)

    def job_throughput(self, vec: np.ndarray | None = None) -> spmatrix:
        """Sparse (jobs × variables) matrix E with (E @ x)[j] = steps/s job j makes under x."""
        from scipy.sparse import csr_matrix

        n_units, m = self.shape
        rows, cols, vals = [], [], []
        for k in range(self.thr.shape[2]):
            job_idx = np.array([unit[k] if len(unit) > k else -1 for unit in self.units])
            ok = job_idx >= 0
            u = np.nonzero(ok)[0]
            rows.append(np.repeat(job_idx[ok], m))
            cols.append((u[:, None] * m + np.arange(m)).ravel())
            vals.append(self.thr[u, :, k].ravel())
        return csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(len(self.jobs), n_units * m),
        )

    def membership(self) -> spmatrix:
        """Sparse (jobs × variables) matrix with 1 where the variable's unit contains the job."""
        e = self.job_throughput()
        e.data = np.ones_like(e.data)
        return e


def singles(jobs: Sequence[PolicyJob], gpus: Mapping[GpuType, float] | Sequence[GpuType]) -> Units:
    """One unit per job, jobs sorted by id (the sorted-keys convention).

    ``gpus``: the cluster's GPUs per type, or only its types. With the counts, a job has zero
    throughput on a type with fewer GPUs than its scale factor: it can never run there, so no
    policy may give it time there (the capacity row alone would let an 8-GPU job hold half of
    4 GPUs' time, which no round can grant)."""
    order = sorted(range(len(jobs)), key=lambda j: jobs[j].job_id)
    jobs = tuple(jobs[j] for j in order)
    gpu_types = tuple(sorted(gpus))
    thr = np.array([[job.throughput.get(g, 0.0) for g in gpu_types] for job in jobs], dtype=float)
    if isinstance(gpus, Mapping) and len(jobs):
        counts = np.array([float(gpus[g]) for g in gpu_types])
        scale = np.array([float(job.scale_factor) for job in jobs])
        thr[scale[:, None] > counts[None, :]] = 0.0
    return Units(
        jobs=jobs,
        gpu_types=gpu_types,
        units=tuple((j,) for j in range(len(jobs))),
        thr=thr.reshape(len(jobs), len(gpu_types), 1),
        scale=np.array([job.scale_factor for job in jobs], dtype=float),
        count=np.array([job.count for job in jobs], dtype=float),
    )


def merge_identical(units: Units, extra: np.ndarray | None = None) -> tuple[np.ndarray, Units]:
    """Merge single-job units with equal throughputs, scale factor and ``extra`` key columns.

    Args:
        extra: (jobs × k) further key columns (e.g. priority weight, steps remaining).
    Returns:
        (inverse, merged): ``merged`` has one unit per distinct key (``count`` = jobs merged), and
        ``inverse[u]`` is the merged unit of original unit ``u``. Merged units keep the job of their
        first member (for per-job fields the key covers).
    """
    n = len(units.units)
    cols = [units.thr[:, :, 0], units.scale[:, None]]
    if extra is not None:
        cols.append(np.asarray(extra, dtype=float).reshape(n, -1))
    keys = np.concatenate(cols, axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    counts = np.bincount(inverse, weights=units.count, minlength=len(first))
    merged = Units(
        jobs=tuple(units.jobs[r] for r in first.tolist()),
        gpu_types=units.gpu_types,
        units=tuple((c,) for c in range(len(first))),
        thr=units.thr[first],
        scale=units.scale[first],
        count=counts,
    )
    return inverse, merged


@dataclass
class LinearProgram:
    """min/max c·v subject to A_ub v ≤ b_ub, lb ≤ v ≤ ub (v = X's variables, then any extra ones)."""

    c: np.ndarray
    a_ub: spmatrix
    b_ub: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    maximize: bool = False


def base_constraints(units: Units, gpus: Mapping[GpuType, float], extra_vars: int = 0) -> LinearProgram:
    """The constraints every policy shares, over X's variables plus ``extra_vars`` free columns.

    Constraints:
        0 ≤ X[u, m] ≤ 1, and X[u, m] = 0 where a job of u cannot run on m (zero throughput);
        Σ_{u ∋ j, m} X[u, m] ≤ 1 for every job j (a job is in one place at a time);
        Σ_u count_u · scale_u · X[u, m] ≤ GPUs_m for every GPU type m (capacity);
        the time fractions of jobs that can never share type m in one round add up to ≤ 1
        (``conflict_rows``).
    """
    from scipy.sparse import csr_matrix, hstack, vstack

    n_units, m = units.shape
    nv = units.num_vars
    ub = np.ones(nv)
    runnable = (units.thr > 0).all(axis=2) if units.thr.size else np.zeros((n_units, m), bool)
    # A unit's k-th slot beyond its size has zero throughput; only real members must be runnable.
    sizes = np.array([len(u) for u in units.units])
    if units.thr.shape[2] > 1:
        runnable = np.ones((n_units, m), bool)
        for k in range(units.thr.shape[2]):
            member = (sizes > k)[:, None]
            runnable &= ~member | (units.thr[:, :, k] > 0)
    ub[~runnable.ravel()] = 0.0
    job_rows = units.membership()
    cap_cols = np.arange(nv)
    cap = csr_matrix(
        (np.repeat(units.count * units.scale, m), (np.tile(np.arange(m), n_units), cap_cols)),
        shape=(m, nv),
    )
    blocks = [job_rows, cap]
    conflict = conflict_rows(units, gpus, runnable)
    if conflict is not None:
        blocks.append(conflict)
    a = vstack(blocks).tocsr()
    if extra_vars:
        a = hstack([a, csr_matrix((a.shape[0], extra_vars))]).tocsr()
    b = np.concatenate(
        [
            np.ones(len(units.jobs)),
            np.array([float(gpus[g]) for g in units.gpu_types]),
            np.ones(0 if conflict is None else conflict.shape[0]),
        ]
    )
    lb = np.zeros(nv + extra_vars)
    ubs = np.concatenate([ub, np.full(extra_vars, np.inf)])
    return LinearProgram(c=np.zeros(nv + extra_vars), a_ub=a, b_ub=b, lb=lb, ub=ubs)


def conflict_rows(units: Units, gpus: Mapping[GpuType, float], runnable: np.ndarray) -> spmatrix | None:
    """Rows (≤ 1) over X's variables for jobs that can never share a GPU type in the same round.

    The capacity row of a type m (Σ scale · X ≤ G_m) is only what an average round holds: a job
    of more than G_m / 2 GPUs ("big" on m) leaves fewer GPUs than any other big job needs, and a
    job of s_u GPUs leaves none for a job of more than G_m − s_u. Two such jobs run on m in
    different rounds, so their time fractions there add up to at most 1; without these rows an
    LP may give a 4-GPU job 3/4 of 4 GPUs and a 1-GPU job all of the fourth, which no round can
    grant (the mechanism then lets one of them wait, and both miss their share).

    Rows, for every type m with big jobs: Σ_{u big} count_u · X[u, m] ≤ 1 (big jobs pairwise
    exclude each other, copies of a merged unit included); X[u, m] + X[v, m] ≤ 1 for every big u
    and every other v too large to run beside it (a merged v's copies each exclude u). None when
    no type has a pair of such jobs, or for space-sharing units.
    """
    from scipy.sparse import csr_matrix

    if units.thr.shape[2] > 1:
        return None
    n, m = units.shape
    scale, count = units.scale, units.count
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    k = 0
    for i, g in enumerate(units.gpu_types):
        cap = float(gpus[g])
        on = runnable[:, i]
        big = np.nonzero(on & (scale > cap / 2))[0]
        if not len(big):
            continue
        if count[big].sum() > 1:
            rows += [k] * len(big)
            cols += (big * m + i).tolist()
            vals += count[big].tolist()
            k += 1
        small = on & (scale <= cap / 2)
        for u in big.tolist():
            partners = np.nonzero(small & (scale + scale[u] > cap))[0]
            for v in partners.tolist():
                rows += [k, k]
                cols += [u * m + i, v * m + i]
                vals += [1.0, 1.0]
                k += 1
    if not k:
        return None
    return csr_matrix((vals, (rows, cols)), shape=(k, n * m))


def has_conflicts(jobs: Sequence[PolicyJob], gpus: Mapping[GpuType, float]) -> bool:
    """``conflict_rows`` would add rows for these jobs (a cheaper check, on the jobs)."""
    smallest = min((float(c) for c in gpus.values() if c > 0), default=0.0)
    if not jobs or 2 * max(j.scale_factor for j in jobs) <= smallest:
        return False  # no job is big on any type
    for g, cap in gpus.items():
        cap = float(cap)
        on = [j for j in jobs if j.scale_factor <= cap and j.throughput.get(g, 0.0) > 0]
        big = [j for j in on if j.scale_factor > cap / 2]
        if not big:
            continue
        if sum(j.count for j in big) > 1:
            return True
        s = big[0].scale_factor
        if any(j.scale_factor + s > cap for j in on if j is not big[0]):
            return True
    return False


def add_rows(lp: LinearProgram, rows: spmatrix, rhs: np.ndarray) -> LinearProgram:
    """Append ``rows · v ≤ rhs`` to the program."""
    from scipy.sparse import vstack

    lp.a_ub = vstack([lp.a_ub, rows]).tocsr()
    lp.b_ub = np.concatenate([lp.b_ub, rhs])
    return lp


def solve(lp: LinearProgram, policy: str, *, simplex: bool = False) -> np.ndarray:
    """Solve with HiGHS (highspy); return the variable vector. ``simplex``: dual simplex whatever
    the size (else interior point above ``IPM_ABOVE_VARS`` columns).

    Raises:
        InfeasibleAllocationError: HiGHS did not report an optimal solution.
    """
    return solved_model(lp, policy, simplex=simplex)[0]


def solved_model(lp: LinearProgram, policy: str, *, simplex: bool = False) -> tuple[np.ndarray, Any]:
    """``solve``, and the HiGHS model it solved, which holds the optimal basis: a change of its
    objective or bounds (``resolve``) starts from there.

    Raises:
        InfeasibleAllocationError: HiGHS did not report an optimal solution.
    """
    import highspy

    a = lp.a_ub.tocsc()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    if len(lp.c) > IPM_ABOVE_VARS and not simplex:
        h.setOptionValue("solver", "ipm")
    model = highspy.HighsLp()
    model.num_col_ = len(lp.c)
    model.num_row_ = a.shape[0]
    model.col_cost_ = np.asarray(lp.c, dtype=float)
    model.col_lower_ = lp.lb
    model.col_upper_ = lp.ub
    model.row_lower_ = np.full(a.shape[0], -highspy.kHighsInf)
    model.row_upper_ = np.asarray(lp.b_ub, dtype=float)
    model.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    model.a_matrix_.start_ = a.indptr.astype(np.int32)
    model.a_matrix_.index_ = a.indices.astype(np.int32)
    model.a_matrix_.value_ = a.data.astype(float)
    model.sense_ = highspy.ObjSense.kMaximize if lp.maximize else highspy.ObjSense.kMinimize
    h.passModel(model)
    return _run(h, policy), h


def resolve(h: Any, policy: str, c: np.ndarray, lb: np.ndarray) -> np.ndarray:
    """Solve the model ``solved_model`` returned again with objective ``c`` and column lower bounds
    ``lb``, by simplex from its optimal basis (a primal feasible start when the old optimum
    stays within ``lb``); returns the variable vector.

    Raises:
        InfeasibleAllocationError: HiGHS did not report an optimal solution.
    """
    n = len(c)
    cols = np.arange(n, dtype=np.int32)
    h.setOptionValue("solver", "simplex")
    h.changeColsCost(n, cols, np.asarray(c, dtype=float))
    h.changeColsBounds(n, cols, np.asarray(lb, dtype=float), np.asarray(h.getLp().col_upper_, dtype=float))
    return _run(h, policy)


def _run(h: Any, policy: str) -> np.ndarray:
    import highspy

    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise InfeasibleAllocationError(policy, h.modelStatusToString(status))
    return np.asarray(h.getSolution().col_value)


def make_allocation(
    policy: str,
    units: Units,
    vec: np.ndarray,
    started: float,
    unit_ids: tuple[tuple[JobId, ...], ...] | None = None,
) -> Allocation:
    """Validate the solver's X (bounds, with a 1e-6 tolerance), clip round-off, wrap it.
    ``unit_ids``: the units as job ids, when the caller has them already."""
    x = units.unflatten(vec)
    if x.size and (x.min() < -1e-6 or x.max() > 1 + 1e-6):
        raise InfeasibleAllocationError(policy, f"solution outside [0, 1]: {x.min()}..{x.max()}")
    x = np.clip(x, 0.0, 1.0)
    x.setflags(write=False)
    return Allocation(
        policy=policy,
        gpu_types=units.gpu_types,
        units=unit_ids
        if unit_ids is not None
        else tuple(tuple(units.jobs[j].job_id for j in unit) for unit in units.units),
        matrix=x,
        unit_throughput=units.thr,
        unit_scale=units.scale,
        solve_s=time.perf_counter() - started,
    )


def empty_allocation(policy: str, gpu_types: Sequence[GpuType]) -> Allocation:
    gt = tuple(sorted(gpu_types))
    return Allocation(
        policy=policy,
        gpu_types=gt,
        units=(),
        matrix=np.zeros((0, len(gt))),
        unit_throughput=np.zeros((0, len(gt), 1)),
        unit_scale=np.zeros(0),
    )
