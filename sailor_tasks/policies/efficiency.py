"""Throughput- and cost-oriented policies: ``max_throughput``, ``min_cost``, ``fifo`` and ``edf``."""

from __future__ import annotations

import math
import time

import numpy as np

from sailor_tasks.policies.base import (
    Allocation,
    PolicyJob,
    PolicyState,
    add_rows,
    base_constraints,
    empty_allocation,
    make_allocation,
    register,
    singles,
    solve,
)


def _best(thr: np.ndarray) -> np.ndarray:
    return thr[:, :, 0].max(axis=1)


@register("max_throughput")
class MaxThroughput:
    """Maximise the cluster's total normalised throughput.

    Notation:
        T[j, m] steps/s; B_j = max_m T[j, m] (steps/s on the job's fastest type); c_j jobs per row.
    Objective:
        maximize Σ_j c_j · Σ_m X[j, m] · T[j, m] / B_j  (GPU-equivalents of useful work).
    Constraints:
        base constraints.
    """

    symmetric = True

    def allocate(self, state: PolicyState) -> Allocation:
        if not state.jobs:
            return empty_allocation(self.name, state.gpus)
        started = time.perf_counter()
        units = singles(state.jobs, state.gpus)
        best = _best(units.thr)
        value = np.divide(
            units.thr[:, :, 0], best[:, None], out=np.zeros(units.shape), where=best[:, None] > 0
        )
        lp = base_constraints(units, state.gpus)
        lp.c = (value * units.count[:, None]).ravel()
        lp.maximize = True
        return make_allocation(self.name, units, solve(lp, self.name), started)


@register("min_cost")
class MinCost:
    """Most normalised work per dollar, subject to SLO deadlines (Gavel's cost policy).

    Notation:
        p_m USD per GPU-hour of type m (catalog prices); s_j scale factor; B_j as ``max_throughput``;
        R_j steps left and D_j seconds to the deadline for jobs with an SLO.
    Objective:
        maximize Σ_j c_j Σ_m X[j, m] · (T[j, m] / B_j) / (s_j · p_m / min_m p_m)  (work per dollar).
    Constraints:
        base constraints; Σ_m T[j, m] X[j, m] ≥ R_j / D_j for every job with a deadline
        (infeasible deadlines raise ``InfeasibleAllocationError``).
    """

    symmetric = False

    def allocate(self, state: PolicyState) -> Allocation:
        from scipy.sparse import csr_matrix

        if not state.jobs:
            return empty_allocation(self.name, state.gpus)
        missing = [g for g in state.gpus if not 0 < state.usd_per_gpu_hour.get(g, 0) < math.inf]
        if missing:
            raise ValueError(
                "min_cost needs a positive, finite price per GPU-hour for "
                + ", ".join(f"{g} (given {state.usd_per_gpu_hour.get(g, 'none')})" for g in sorted(missing))
                + f"; prices given for: {', '.join(sorted(state.usd_per_gpu_hour)) or 'none'}"
            )
        started = time.perf_counter()
        units = singles(state.jobs, state.gpus)
        price = np.array([state.usd_per_gpu_hour[g] for g in units.gpu_types])
        best = _best(units.thr)
        value = np.divide(
            units.thr[:, :, 0], best[:, None], out=np.zeros(units.shape), where=best[:, None] > 0
        )
        per_dollar = value / (units.scale[:, None] * price[None, :] / price.min())
        lp = base_constraints(units, state.gpus)
        lp.c = (per_dollar * units.count[:, None]).ravel()
        lp.maximize = True
        slo = [
            (j, job.steps_remaining / job.deadline_s)
            for j, job in enumerate(units.jobs)
            if job.deadline_s is not None and job.deadline_s > 0 and job.steps_remaining > 0
        ]
        if slo:
            m = len(units.gpu_types)
            rows = np.repeat(np.arange(len(slo)), m)
            cols = np.concatenate([j * m + np.arange(m) for j, _ in slo])
            vals = -np.concatenate([units.thr[j, :, 0] for j, _ in slo])
            add_rows(
                lp,
                csr_matrix((vals, (rows, cols)), shape=(len(slo), units.num_vars)),
                -np.array([need for _, need in slo]),
            )
        return make_allocation(self.name, units, solve(lp, self.name), started)


@register("fifo")
class Fifo:
    """First in, first out, heterogeneity-aware (Gavel's FIFO with perf): in arrival order each job
    takes its fastest GPU type that still has ``scale_factor`` free GPUs, for the whole round.

    Notation / Objective / Constraints: not an LP; X[j, m] ∈ {0, 1} and the base constraints hold
    by construction (one type per job, capacity checked before each grant).
    """

    symmetric = False

    def allocate(self, state: PolicyState) -> Allocation:
        if not state.jobs:
            return empty_allocation(self.name, state.gpus)
        started = time.perf_counter()
        units = singles(state.jobs, state.gpus)
        free = np.array([float(state.gpus[g]) for g in units.gpu_types])
        x = np.zeros(units.shape)
        order = sorted(range(len(units.jobs)), key=lambda j: self.order_key(units.jobs[j]))
        for j in order:
            need = units.scale[j] * units.count[j]
            for i in np.argsort(-units.thr[j, :, 0], kind="stable"):
                if units.thr[j, i, 0] > 0 and free[i] >= need:
                    x[j, i] = 1.0
                    free[i] -= need
                    break
        return make_allocation(self.name, units, x.ravel(), started)

    @staticmethod
    def order_key(job: PolicyJob) -> tuple:
        """The order in which jobs take GPUs: arrival."""
        return (job.arrival_s, job.job_id)


@register("edf")
class EarliestDeadlineFirst(Fifo):
    """Earliest deadline first: as ``fifo``, but jobs take GPUs in order of their deadline
    (``deadline_s``; jobs without one after every job with one, in arrival order).

    Notation / Objective / Constraints: as ``fifo`` (X[j, m] ∈ {0, 1}, capacity checked per grant).
    """

    @staticmethod
    def order_key(job: PolicyJob) -> tuple:
        """The order in which jobs take GPUs: deadline, then arrival."""
        no_deadline = job.deadline_s is None
        return (no_deadline, 0.0 if no_deadline else job.deadline_s, job.arrival_s, job.job_id)
