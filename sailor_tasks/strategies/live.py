"""Live market choice: before each placement of a run, its strategy picks spot or on-demand.

The run's market strategy (``JobRequest.strategy``) is asked through the same
``Strategy.choose_market`` the spot simulator calls. Its ``MarketContext`` comes from the placement
engine's estimate for the remaining work on each market (the best spot and the best on-demand
candidate: expected hours, price, the catalog's preemption rate of that zone), the deadline, and
the hours since the run was submitted. Before the first placement nothing has run (elapsed 0);
after a preemption, ``stages.attempts`` passes the elapsed hours and the checkpointed step.

A launch on a market takes one ``RESTART_HOURS`` plus the data transfer its best candidate needs
(dataset and checkpoint copies into that region), as the planner's deadline rule counts them: a
market the strategy picks is one the planner can place before the deadline. A preemption is taken
to lose half a checkpoint interval (the trainer saves on the notice, but an unnoticed kill loses
that much on average).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from sailor_tasks.catalog.offers import Catalog
from sailor_tasks.model import ClusterState, JobRequest
from sailor_tasks.placement.context import RESTART_HOURS
from sailor_tasks.strategies import MarketContext, MarketDecision, get_strategy


def as_planned(req: JobRequest) -> JobRequest:
    """``req`` with the markets its strategy may pick: ``market=auto`` narrowed to the one market
    of a strategy that uses one (``on_demand``), so that what validation refuses as never
    feasible (a price cap under every offer of that market) is what planning will refuse."""
    only = getattr(get_strategy(req.strategy), "only_market", None)
    return replace(req, market=only) if only is not None and req.market == "auto" else req


def _estimate(
    req: JobRequest, market: str, catalog: Catalog, state: ClusterState, index: Any = None
) -> dict[str, Any] | None:
    """The placement engine's best candidate on ``market`` (None: no feasible offer)."""
    from sailor_tasks.placement.engine import explain

    try:
        winner = explain(replace(req, market=market), catalog, state, index=index).get("winner")
    except ValueError:
        return None
    if winner is None or not math.isfinite(winner["expected_hours"]):
        return None
    return winner


def rest_of(req: JobRequest, steps_done: int, deadline_hours: float | None) -> JobRequest:
    """The request for the steps left after ``steps_done``, with ``deadline_hours`` left."""
    remaining = max(1, req.total_steps - steps_done)
    return replace(
        req,
        total_steps=remaining,
        checkpoint_every_steps=min(req.checkpoint_every_steps, remaining),
        deadline_hours=deadline_hours,
    )


def launch_context(
    req: JobRequest,
    catalog: Catalog,
    state: ClusterState,
    *,
    elapsed_h: float = 0.0,
    steps_done: int = 0,
    index: Any = None,
) -> tuple[MarketContext, dict[str, dict[str, Any] | None]]:
    """The strategy's inputs for the next launch, and the placement estimates they came from
    (``index``: the catalog index the planner uses, i.e. the same throughput matrix)."""
    # Estimates without the deadline validator: the strategy weighs the deadline itself.
    rest = rest_of(req, steps_done, deadline_hours=None)
    remaining_steps = rest.total_steps
    est = {m: _estimate(rest, m, catalog, state, index) for m in ("spot", "on_demand")}
    spot, od = est["spot"], est["on_demand"]
    ref = spot or od
    hours = ref["expected_hours"] if ref else 0.0
    rate = 0.0
    if spot is not None:
        rate = max(
            (
                o.preemption_rate_per_hour * spot["num_nodes"]
                for o in catalog.offers
                if o.zone == spot["zone"] and o.gpu_type == spot["gpu_type"]
            ),
            default=0.0,
        )
    ctx = MarketContext(
        now_h=elapsed_h,
        remaining_h=hours,
        deadline_h=req.deadline_hours,
        requested_market=req.market,
        spot_launch_h=RESTART_HOURS + spot["data_hours"] if spot else math.inf,
        on_demand_launch_h=RESTART_HOURS + od["data_hours"] if od else math.inf,
        spot_usd_per_hour=spot["usd_per_hour"] if spot else 0.0,
        on_demand_usd_per_hour=od["usd_per_hour"] if od else 0.0,
        preemption_rate_per_hour=rate,
        lost_h_per_preemption=0.5 * rest.checkpoint_every_steps / remaining_steps * hours,
        # Each market's own GPUs: with gpu_type any, on-demand's winner may be another, slower type.
        on_demand_remaining_h=od["expected_hours"] if od and spot else None,
    )
    return ctx, est


def decide_market(
    req: JobRequest,
    catalog: Catalog,
    state: ClusterState,
    *,
    elapsed_h: float = 0.0,
    steps_done: int = 0,
    index: Any = None,
) -> MarketDecision:
    """Spot or on-demand for the run's next attempt, by its strategy (see the module doc).

    When only one market has a feasible offer (price cap, GPU type, regions), that market is used
    and the reason says so, except by a strategy with one market (``on_demand``); the planner then
    explains any further infeasibility.
    """
    strategy = get_strategy(req.strategy)
    ctx, est = launch_context(req, catalog, state, elapsed_h=elapsed_h, steps_done=steps_done, index=index)
    decision = strategy.choose_market(ctx)
    other = "on_demand" if decision.market == "spot" else "spot"
    switches = getattr(strategy, "only_market", None) is None
    if req.market != "auto" or not switches:
        return decision
    if est[decision.market] is None and est[other] is not None:
        return MarketDecision(
            other, f"{strategy.name}: no feasible {decision.market} offer; {other} instead", decision.slack_h
        )
    if req.deadline_hours is not None and req.deadline_hours > elapsed_h:
        # A strategy that ignores deadlines may pick the market no offer meets it on, where the
        # planner's deadline rule then refuses every offer: the other market, if one meets it.
        timed = rest_of(req, steps_done, deadline_hours=req.deadline_hours - elapsed_h)
        if _estimate(timed, decision.market, catalog, state, index) is None:
            if _estimate(timed, other, catalog, state, index) is not None:
                return MarketDecision(
                    other,
                    f"{strategy.name}: no {decision.market} offer meets the deadline; {other} instead",
                    decision.slack_h,
                )
    return decision
