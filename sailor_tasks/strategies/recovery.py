"""Recovery strategies: where a preempted run goes next (after SkyPilot's recovery strategies).

``same_zone_first``: the preempted zone usually has capacity again within minutes and keeps the
data and checkpoint local, so retry it; a zone that preempted the run twice is blocked.

    preempted in z1 → retry z1 → preempted in z1 again → z1 blocked → cheapest other zone z2 → ...

``eager_next_region``: a preemption signals a capacity crunch that tends to hit a whole region, so
block every region the run was preempted in and move to the cheapest other region (data and
checkpoint follow).

    preempted in r1/z1 → r1 blocked → cheapest zone of r2 → preempted → r1, r2 blocked → r3 → ...

Both block by value (zone/region names), never by position, and leave the market as requested
(``auto`` read as spot). ``eager_next_region`` is also the SkyPilot baseline of the spot simulator:
there it checkpoints only periodically (SkyPilot managed jobs do not act on the preemption notice),
while ``same_zone_first`` runs SAILOR's trainer, which saves on the notice.
"""

from __future__ import annotations

from collections import Counter

from sailor_tasks.strategies.base import (
    MarketContext,
    MarketDecision,
    PlacementConstraint,
    RecoveryContext,
    register,
    requested_or_spot,
)

SAME_ZONE_MAX_PREEMPTIONS = 2
"""Preemptions in one zone after which ``same_zone_first`` stops retrying it."""


@register("same_zone_first")
class SameZoneFirst:
    """Events: preempted in z1 → retry z1 → preempted in z1 again → z1 blocked → cheapest other zone."""

    checkpoint_on_notice = True

    def choose_market(self, ctx: MarketContext) -> MarketDecision:
        return requested_or_spot(ctx, self.name)

    def next_constraint(self, ctx: RecoveryContext) -> PlacementConstraint:
        counts = Counter(p.zone for p in ctx.history)
        blocked = frozenset(z for z, n in counts.items() if n >= SAME_ZONE_MAX_PREEMPTIONS)
        zone = ctx.current.zone
        if zone in blocked:
            reason = f"{zone} preempted the run {counts[zone]} times: blocked, re-planning elsewhere"
            return PlacementConstraint(blocked_zones=blocked, reason=reason)
        reason = f"retrying {zone} first (preempted there {counts[zone]} time(s)), elsewhere if it cannot take the run"
        return PlacementConstraint(blocked_zones=blocked, prefer_zone=zone, reason=reason)


@register("eager_next_region")
class EagerNextRegion:
    """Spot (the request's market, ``auto`` read as spot). Events: preempted in r1/z1 → r1 blocked →
    cheapest zone of r2 with capacity (data and checkpoint follow) → preempted → r1, r2 blocked →
    r3 → ...; when every region is blocked, only the last zone stays blocked, then none."""

    checkpoint_on_notice = False

    def choose_market(self, ctx: MarketContext) -> MarketDecision:
        return requested_or_spot(ctx, self.name)

    def next_constraint(self, ctx: RecoveryContext) -> PlacementConstraint:
        regions = frozenset(p.region for p in ctx.history)
        zones = frozenset(p.zone for p in ctx.history)
        return PlacementConstraint(
            blocked_zones=zones,
            blocked_regions=regions,
            reason=f"blocking preempted region(s) {', '.join(sorted(regions))}; moving to the next region",
        )
