"""Soft rules (Protean preferences): weighted contributions in USD-equivalent, lower is better.

Each preference maps a ``RequestContext`` to one contribution per candidate; the score is the
weighted sum, and every contribution is kept for the explanation. Region-tier rules depend only on
the region (data transfer, overload, assignment share); zone/pool-tier rules on the offer itself
(compute cost, preemption loss, packing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from sailor_tasks.placement.context import RequestContext

OVERLOAD_WEIGHT = 1.0
"""Per unit of demand/supply above 1 in the region, as a fraction of the run's compute cost."""
UNDERLOAD_CREDIT = 0.25
"""Per unit of demand/supply below 1: a smaller credit (MAST soft balance: overload costs more
than underload)."""
ASSIGNMENT_WEIGHT = 0.1
"""Fraction of compute cost charged in a region the team's assignment gives no share (linear in
the gap to the team's largest share)."""
PACKING_WEIGHT = 0.02
"""Fraction of compute cost per VM beyond the first (Min-Worker-Set: fewest nodes)."""


@dataclass(frozen=True, slots=True)
class Preference:
    name: str
    tier: str
    """``region`` or ``zone``: the level of the tiered search it scores."""
    description: str
    contribution: Callable[[RequestContext], np.ndarray]


def compute_cost(ctx: RequestContext) -> np.ndarray:
    """USD of the placement for the expected training duration (throughput table)."""
    return ctx.usd_per_hour * ctx.hours


def data_transfer(ctx: RequestContext) -> np.ndarray:
    """USD of getting the dataset into the region (``build_context``: verifying the region's own
    copy, else copying from the dataset's origin), and, on a relaunch, the checkpoint from its
    region, plus the copy time valued at the placement's hourly price (the run waits for them)."""
    region = ctx.c.region
    usd = ctx.dataset_gb * ctx.r_data_usd_per_gb[region] + ctx.r_checkpoint_usd[region]
    return usd + ctx.data_hours * ctx.usd_per_hour


def preemption_loss(ctx: RequestContext) -> np.ndarray:
    """Expected USD lost on spot: preemptions (rate × nodes × hours) × work lost per preemption."""
    return ctx.overhead_hours * ctx.usd_per_hour


def overload(ctx: RequestContext) -> np.ndarray:
    """Penalty for adding load to a region the assignment projects overloaded, a smaller credit
    for an underloaded one (0 where the assignment has no load figure)."""
    view = ctx.view
    r_penalty = OVERLOAD_WEIGHT * view.r_over - UNDERLOAD_CREDIT * view.r_under
    return compute_cost(ctx) * r_penalty[ctx.c.region]


def assignment(ctx: RequestContext) -> np.ndarray:
    """Charge for deviating from the team's region shares in the current assignment: its shares for
    the candidate's GPU type, or its shares over every type for a type it has none for."""
    a = ctx.state.assignment
    if a is None:
        return np.zeros(ctx.n)
    team = ctx.request.team
    overall: Mapping[str, float] = a.shares.get(team, {})
    per_gpu: Mapping[str, Mapping[str, float]] = a.gpu_shares.get(team, {})
    if not overall and not per_gpu:
        return np.zeros(ctx.n)

    def gap(shares: Mapping[str, float]) -> np.ndarray:
        """Per region: how far below the team's top share (0 at the top, 1 where it has none)."""
        if not shares:
            return np.zeros(len(ctx.index.regions))
        top = max(shares.values()) or 1.0
        return (top - np.array([shares.get(r, 0.0) for r in ctx.index.regions])) / top

    out = gap(overall)[ctx.c.region]
    for g, shares in per_gpu.items():
        g_i = ctx.index.gpu_idx.get(g)
        if g_i is not None and shares:
            rows = ctx.c.gpu == g_i
            out[rows] = gap(shares)[ctx.c.region[rows]]
    return compute_cost(ctx) * ASSIGNMENT_WEIGHT * out


def packing(ctx: RequestContext) -> np.ndarray:
    """Min-Worker-Set: a small charge per VM beyond the first."""
    return compute_cost(ctx) * PACKING_WEIGHT * (ctx.nodes - 1)


PREFERENCES: tuple[Preference, ...] = (
    Preference("compute_cost", "zone", "USD for the expected duration on this GPU type", compute_cost),
    Preference("data_transfer", "region", "egress USD + copy time of dataset and checkpoint", data_transfer),
    Preference("preemption_loss", "zone", "expected USD of work lost to spot preemptions", preemption_loss),
    Preference("overload", "region", "region load vs the assignment (overload > underload)", overload),
    Preference(
        "assignment", "region", "distance from the team's region shares (for the GPU type)", assignment
    ),
    Preference("packing", "zone", "fewest VMs (Min-Worker-Set)", packing),
)
PREFERENCE_NAMES: tuple[str, ...] = tuple(p.name for p in PREFERENCES)
DEFAULT_WEIGHTS: Mapping[str, float] = {p.name: 1.0 for p in PREFERENCES}


def contributions(ctx: RequestContext) -> np.ndarray:
    """[preference, candidate] contributions (unweighted)."""
    return np.vstack([p.contribution(ctx) for p in PREFERENCES])


_DEFAULT_VECTOR = np.ones(len(PREFERENCES))


def weight_vector(weights: Mapping[str, float] | None) -> np.ndarray:
    if not weights:
        return _DEFAULT_VECTOR
    merged = {**DEFAULT_WEIGHTS, **(weights or {})}
    unknown = sorted(set(merged) - set(PREFERENCE_NAMES))
    if unknown:
        raise ValueError(f"unknown preference weights {unknown}; valid: {', '.join(PREFERENCE_NAMES)}")
    return np.array([merged[n] for n in PREFERENCE_NAMES])
