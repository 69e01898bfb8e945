"""Market strategies: spot or on-demand over a run's life, and where to go after a preemption.

Each strategy answers ``choose_market`` at launch, after every preemption and at every decision
tick, and ``next_constraint`` after every preemption (``base`` has the interface). The live
``train`` stage and the spot simulator call them through the registry.

``on_demand`` never uses spot::

    launch on-demand in the cheapest zone → run to completion (never preempted)

``spot_restart`` uses spot and, after a preemption, waits for the same zone (checkpoints only
periodically, so a preemption loses the work since the last checkpoint)::

    launch spot in the cheapest zone with capacity → preempted in z1 → wait until z1 has capacity
    → relaunch in z1 (resume from the last periodic checkpoint) → ...

``eager_next_region`` (in ``recovery``; SkyPilot's managed-job strategy) blocks every region that
preempted the run and relaunches spot in the cheapest zone of another region.

``sailor`` (placement engine + ``market=auto``, Can't-Be-Late style) checkpoints on every notice and
re-decides the market at each decision point from the slack left::

    launch: slack after the spot launch covers the expected preemption loss → spot in the cheapest zone
    notice in z1 → checkpoint (no work lost) → z1 blocked until it has capacity again → slack still
        covers → spot in the cheapest other zone with capacity (same region preferred when cheaper:
        no transfer)
    on spot in z2, a cheaper zone (z1 again, say) has capacity again, finishing there is expected to
        cost less (its launch and transfers included) and the slack after its launch still keeps
        the reserve → checkpoint, move there (asked at each decision tick; live runs decide only
        at launches)
    long stock-out: no zone has capacity → wait, re-checking each tick → slack no longer covers one
        changeover to on-demand plus the expected loss → on-demand
    on on-demand, the remaining work shrinks, so does its expected loss → slack covers a spot launch
        again and spot is cheaper → back to spot
    slack exhausted (deadline closer than the work on spot could guarantee) → on-demand to the end
"""

from __future__ import annotations

import math

from sailor_tasks.strategies.base import (
    MarketContext,
    MarketDecision,
    PlacementConstraint,
    RecoveryContext,
    register,
    requested_or_spot,
    slack_of,
)


@register("on_demand")
class OnDemand:
    """Never spot. Events: launch on-demand in the cheapest zone → run to completion (a preemption
    cannot happen; a failed attempt re-plans on-demand). With ``market=auto`` it stays on-demand
    where only spot has a feasible offer: the planner then explains why on-demand is infeasible."""

    checkpoint_on_notice = True
    only_market = "on_demand"
    """The one market this strategy uses (``live.decide_market`` never switches it)."""

    def choose_market(self, ctx: MarketContext) -> MarketDecision:
        return MarketDecision("on_demand", "on_demand: never spot", slack_of(ctx))

    def next_constraint(self, ctx: RecoveryContext) -> PlacementConstraint:
        return PlacementConstraint(market="on_demand", reason="on_demand: re-plan on-demand")


@register("spot_restart")
class SpotRestart:
    """Spot, deadline-unaware, periodic checkpoints only. Events: launch spot in the cheapest zone
    with capacity → preempted in z1 (work since the last periodic checkpoint lost) → wait until z1
    has capacity again → relaunch in z1 → ... (live runs plan only z1: every other zone blocked)."""

    checkpoint_on_notice = False

    def choose_market(self, ctx: MarketContext) -> MarketDecision:
        return requested_or_spot(ctx, self.name)

    def next_constraint(self, ctx: RecoveryContext) -> PlacementConstraint:
        zone = ctx.current.zone
        return PlacementConstraint(
            wait_zone=zone, reason=f"spot_restart: waiting for {zone} to have capacity"
        )


def expected_overhead_h(ctx: MarketContext, rate_per_hour: float | None = None) -> float:
    """Hours spot preemptions are expected to cost over the remaining work (loss + restart each),
    at the spot candidate's rate or ``rate_per_hour``."""
    from sailor_tasks.placement.context import RESTART_HOURS

    rate = ctx.preemption_rate_per_hour if rate_per_hour is None else rate_per_hour
    return rate * ctx.remaining_h * (ctx.lost_h_per_preemption + RESTART_HOURS)


def _keeps_reserve(ctx: MarketContext, slack_h: float, fallback_h: float, overhead: float) -> tuple[bool, float]:
    """(whether ``slack_h`` left after a spot launch keeps the on-demand reserve and passes the
    placement's slack test, the reserve). The reserve is one changeover to on-demand from the spot
    zone (``fallback_h``, at least a restart) plus the work a preemption loses: whatever happens on
    spot, the run can still finish on-demand by the deadline."""
    # Imported here: the DAG file imports this registry (params' enum), and the placement
    # package pulls in numpy and the engine, which would triple sailor_train's parse time.
    from sailor_tasks.placement.context import RESTART_HOURS
    from sailor_tasks.placement.slack import slack_allows_spot

    # On-demand GPUs slower than spot's need the longer time for the work a lost spot leaves.
    slower = max(0.0, ctx.on_demand_work_h - ctx.remaining_h)
    reserve = max(fallback_h, RESTART_HOURS) + ctx.lost_h_per_preemption + slower
    return slack_h >= reserve and bool(slack_allows_spot(slack_h, ctx.remaining_h, overhead)), reserve


def _move_to_cheaper(ctx: MarketContext, overhead: float) -> str | None:
    """Why the run, training on spot, moves to another spot zone now, or None to stay.

    It moves when finishing there is expected to cost less than finishing here, each side with its
    zone's expected preemption loss and the move with its launch billed and its transfers paid, and
    (with a deadline) when the slack after the move's launch still keeps the on-demand reserve from
    that zone and passes the slack test. The move checkpoints first and loses no work."""
    m = ctx.spot_move
    if ctx.current_market != "spot" or m is None:
        return None
    there_overhead = expected_overhead_h(ctx, m.preemption_rate_per_hour)
    stay = ctx.spot_usd_per_hour * (ctx.remaining_h + overhead)
    move = m.usd_per_hour * (ctx.remaining_h + there_overhead + m.launch_h) + m.transfer_usd
    if not move < stay:
        return None
    why = (
        f"sailor: moving to a spot zone at ${m.usd_per_hour:.2f}/h (${ctx.spot_usd_per_hour:.2f}/h here): "
        f"${move:.2f} expected to finish there vs ${stay:.2f} here"
    )
    if ctx.deadline_h is None:
        return why + " (no deadline)"
    slack = ctx.time_left_h - ctx.remaining_h - m.launch_h
    ok, reserve = _keeps_reserve(ctx, slack, m.on_demand_fallback_h, there_overhead)
    if not ok:
        return None
    return why + f"; {slack:.2f} h slack after the move keeps a {reserve:.2f} h on-demand reserve"


@register("sailor")
class Sailor:
    """Deadline-aware spot: the placement's ``market=auto`` slack rule applied at every decision point.

    Events: launch (slack covers the loss → spot in the cheapest zone) → notice in z1 → checkpoint,
    z1 blocked until it has capacity again → spot in the cheapest other zone with capacity, or wait
    while the reserve holds → a cheaper zone has capacity and finishing there costs less → move →
    slack short → on-demand → remaining work small enough, slack covers a spot launch → spot again.

    Spot is chosen when the slack left after the spot launch passes
    ``placement.slack.slack_allows_spot`` for the expected preemption loss, still holds a reserve
    of one changeover to on-demand (its launch, at least a restart, plus the work a preemption
    loses), and spot stays cheaper once that loss is paid for. While no spot zone has capacity the
    caller passes the next decision plus a launch as the spot launch, so waiting also keeps the
    reserve: the run can always still finish on-demand by the deadline (Can't Be Late's rule).
    With no spot offer at all (an infinite spot launch) it runs on-demand, deadline or not.
    Training on spot, it moves to the spot zone the placement engine would launch in now when that
    is another zone and finishing there is expected to cost less (``_move_to_cheaper``).
    """

    checkpoint_on_notice = True
    moves_on_spot = True
    """Training on spot, it may move to a cheaper spot zone (callers pass ``spot_move``)."""

    def choose_market(self, ctx: MarketContext) -> MarketDecision:
        slack = slack_of(ctx)
        if ctx.requested_market in ("spot", "on_demand"):
            return MarketDecision(
                ctx.requested_market, f"sailor: market {ctx.requested_market} requested", slack
            )
        launch = ctx.spot_launch_h
        if not math.isfinite(launch) and math.isfinite(ctx.on_demand_launch_h):
            return MarketDecision("on_demand", "sailor: no spot offer → on-demand", slack)
        overhead = expected_overhead_h(ctx)
        if ctx.on_demand_usd_per_hour > 0 and math.isfinite(launch):
            spot_usd = ctx.spot_usd_per_hour * (ctx.remaining_h + overhead + launch)
            od_usd = ctx.on_demand_usd_per_hour * (ctx.on_demand_work_h + ctx.on_demand_launch_h)
            if spot_usd >= od_usd:
                return MarketDecision(
                    "on_demand",
                    f"sailor: spot not cheaper (${spot_usd:.2f} with {overhead:.2g} h expected loss "
                    f"vs ${od_usd:.2f} on-demand)",
                    slack,
                )
        if ctx.deadline_h is None:
            move = _move_to_cheaper(ctx, overhead)
            if move is not None:
                return MarketDecision("spot", move, None, move=True)
            return MarketDecision("spot", "sailor: no deadline (slack unbounded) → spot", None)
        fallback = ctx.on_demand_launch_h if ctx.on_demand_fallback_h is None else ctx.on_demand_fallback_h
        spot_slack = ctx.time_left_h - ctx.remaining_h - launch
        ok, reserve = _keeps_reserve(ctx, spot_slack, fallback, overhead)
        if ok:
            move = _move_to_cheaper(ctx, overhead)
            if move is not None:
                return MarketDecision("spot", move, slack, move=True)
            return MarketDecision(
                "spot",
                f"sailor: {spot_slack:.2f} h slack after the spot launch keeps a {reserve:.2f} h "
                f"on-demand reserve and covers {overhead:.2g} h expected preemption loss → spot",
                slack,
            )
        if not math.isfinite(launch):
            why = "no spot offer"
        else:
            why = f"{spot_slack:.2f} h slack after a spot launch of {launch:.2f} h (reserve {reserve:.2f} h)"
        return MarketDecision(
            "on_demand",
            f"sailor: {why} does not cover {overhead:.2g} h expected preemption loss → on-demand",
            slack,
        )

    def next_constraint(self, ctx: RecoveryContext) -> PlacementConstraint:
        zone = ctx.current.zone
        return PlacementConstraint(
            blocked_zones=frozenset({zone}),
            until_capacity=True,
            reason=f"sailor: {zone} just lost its spot capacity: blocked until it has capacity again",
        )
