"""The strategy interface and registry: where a preempted run goes next, and which market it uses.

A strategy is stateless and answers two questions, each from a context holding everything it may use:

* ``next_constraint(RecoveryContext) -> PlacementConstraint``: after a preemption, the zones/regions
  to avoid (or the one zone to wait for) given the request, the lost placement, the run's preemption
  history and the catalog's zones per region. The stage turns it into ``ClusterState.blocked_zones``
  and hands it to the same planner as the first placement.
* ``choose_market(MarketContext) -> MarketDecision``: at launch, after each preemption and at every
  decision tick, spot or on-demand, with the reason and the slack left. The live ``train`` stage and
  the spot simulator (``sailor_tasks.simulator.spot.engine``) call the same method.

Recovery strategies (``same_zone_first``, ``eager_next_region``) and market strategies
(``on_demand``, ``spot_restart``, ``sailor``) share this interface and registry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from sailor_tasks.model import JobRequest, Placement
from sailor_tasks.registry import Registry


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """One lost attempt of a run (what the ledger's ``preemptions`` table holds)."""

    attempt: int
    region: str
    zone: str
    noticed: bool
    step: int | None = None
    market: str = "spot"


@dataclass(frozen=True, slots=True)
class RecoveryContext:
    request: JobRequest
    current: Placement
    """The placement that was preempted."""
    history: tuple[PreemptionRecord, ...]
    """Every preemption of this run so far, oldest first (the last one is ``current``'s)."""
    zones_by_region: Mapping[str, tuple[str, ...]]
    """Catalog zones of each region (to turn a blocked region into blocked zones)."""


@dataclass(frozen=True, slots=True)
class PlacementConstraint:
    """What the next placement must avoid or use. Empty = plan as for the first attempt."""

    blocked_zones: frozenset[str] = frozenset()
    blocked_regions: frozenset[str] = frozenset()
    market: str | None = None
    """Market to plan in; None keeps the request's market."""
    reason: str = ""
    wait_zone: str | None = None
    """Relaunch only in this zone, waiting for its capacity to come back (``spot_restart``)."""
    until_capacity: bool = False
    """The blocked zones are blocked for want of spot capacity: a caller that sees each zone's
    capacity over time (the spot simulator) lifts a zone's block for spot once the zone has
    capacity again. A live relaunch, planned at once, keeps them blocked."""
    prefer_zone: str | None = None
    """Relaunch in this zone when it can take the run now (an offer there, and its capacity);
    else plan as without it (``same_zone_first``)."""

    def all_blocked_zones(self, zones_by_region: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
        """Blocked zones plus every zone of a blocked region; with ``wait_zone``, every other zone
        too (a planner cannot wait: planning only that zone is how a relaunch waits for it)."""
        zones = set(self.blocked_zones)
        for region in self.blocked_regions:
            zones.update(zones_by_region.get(region, ()))
        if self.wait_zone is not None:
            zones.update(z for zs in zones_by_region.values() for z in zs if z != self.wait_zone)
        return frozenset(zones)


@dataclass(frozen=True, slots=True)
class SpotMove:
    """Another spot zone with capacity now, for a run training on spot elsewhere."""

    usd_per_hour: float
    launch_h: float
    """Hours until training there (restart plus data and checkpoint transfer)."""
    transfer_usd: float
    preemption_rate_per_hour: float
    on_demand_fallback_h: float
    """Hours to get on-demand training once this zone's spot capacity is lost in turn."""


@dataclass(frozen=True, slots=True)
class MarketContext:
    """What a market decision may use, in hours from the run's submission (all figures per run).

    ``remaining_h`` is the work left on the run's GPUs without preemptions. The launch figures are
    the hours from now until an attempt of that market would be training (provisioning plus data and
    checkpoint transfer; 0 for the market the run is training on now; ``inf`` when that market has
    no offer for the run).
    """

    now_h: float
    remaining_h: float
    deadline_h: float | None
    """Deadline in hours from submission; None: no deadline (slack unbounded)."""
    requested_market: str = "auto"
    """The request's ``market`` (spot, on_demand or auto)."""
    current_market: str | None = None
    """Market of the attempt that is running now (None: nothing running)."""
    spot_launch_h: float = 0.0
    on_demand_launch_h: float = 0.0
    on_demand_fallback_h: float | None = None
    """Hours to get on-demand training once the spot attempt is lost (from the spot zone, where the
    data and checkpoint will then be); None: the same as ``on_demand_launch_h``."""
    spot_usd_per_hour: float = 0.0
    on_demand_usd_per_hour: float = 0.0
    preemption_rate_per_hour: float = 0.0
    """Expected spot preemptions per hour of the spot candidate (catalog supply rates)."""
    lost_h_per_preemption: float = 0.0
    """Work lost by one preemption (the notice window when the notice is used to checkpoint, else
    half a checkpoint interval), restart excluded."""
    on_demand_remaining_h: float | None = None
    """The work left on the on-demand candidate's GPUs, when they are another GPU type than the
    spot candidate's (a run that accepts any type); None: ``remaining_h``."""
    spot_move: SpotMove | None = None
    """Training on spot: the placement engine's spot launch now, when it is another zone (None:
    the same zone, none, or the caller does not re-plan a running attempt, as live runs). Callers
    pass it only to strategies whose ``moves_on_spot`` class attribute is true."""

    @property
    def time_left_h(self) -> float:
        return float("inf") if self.deadline_h is None else self.deadline_h - self.now_h

    @property
    def on_demand_work_h(self) -> float:
        """The work left on the on-demand candidate's GPUs."""
        return self.remaining_h if self.on_demand_remaining_h is None else self.on_demand_remaining_h

    @property
    def on_demand_slack_h(self) -> float:
        """Hours to spare if the run switched to (or stayed on) on-demand now."""
        return self.time_left_h - self.on_demand_work_h - self.on_demand_launch_h


@dataclass(frozen=True, slots=True)
class MarketDecision:
    market: str
    """``spot`` or ``on_demand``."""
    reason: str
    slack_h: float | None = None
    """Slack left if the run went on-demand now (None: no deadline)."""
    move: bool = False
    """Training on spot: checkpoint and relaunch spot in ``spot_move``'s zone."""


@runtime_checkable
class Strategy(Protocol):
    name: ClassVar[str]
    checkpoint_on_notice: ClassVar[bool]
    """Whether the run checkpoints when a preemption notice arrives (else only periodically)."""

    def next_constraint(self, ctx: RecoveryContext) -> PlacementConstraint:
        """The constraint for the next placement after the preemption at the end of ``ctx.history``."""

    def choose_market(self, ctx: MarketContext) -> MarketDecision:
        """Spot or on-demand for the next stretch of the run (launch, after a preemption, each tick)."""


def requested_or_spot(ctx: MarketContext, who: str) -> MarketDecision:
    """The request's market, with ``auto`` read as spot (the deadline-unaware strategies)."""
    market = "spot" if ctx.requested_market == "auto" else ctx.requested_market
    return MarketDecision(market, f"{who}: market {ctx.requested_market} → {market}", slack_of(ctx))


def slack_of(ctx: MarketContext) -> float | None:
    """The on-demand slack to record: None without a deadline, or without an on-demand offer."""
    slack = ctx.on_demand_slack_h
    return None if ctx.deadline_h is None or not math.isfinite(slack) else slack


_STRATEGIES: Registry[Strategy] = Registry("strategy", "strategies")
register = _STRATEGIES.register
"""Class decorator: make a strategy selectable by ``name``."""


def strategy_names() -> tuple[str, ...]:
    return _STRATEGIES.names()


def get_strategy(name: str) -> Strategy:
    """A new instance of the strategy called ``name``.

    Raises:
        ValueError: unknown name; the message lists the valid names.
    """
    return _STRATEGIES.get(name)()
