"""Market and recovery strategies behind one interface and a name registry (see ``base``)."""

from __future__ import annotations

from sailor_tasks.strategies import market as _market  # noqa: F401  (registers the market strategies)
from sailor_tasks.strategies import recovery as _recovery  # noqa: F401  (registers the recovery strategies)
from sailor_tasks.strategies.base import (
    MarketContext,
    MarketDecision,
    PlacementConstraint,
    PreemptionRecord,
    RecoveryContext,
    SpotMove,
    Strategy,
    get_strategy,
    register,
    strategy_names,
)

RECOVERY_STRATEGIES: tuple[str, ...] = ("same_zone_first", "eager_next_region")
"""Strategies that only decide where to recover (the ``recovery_strategy`` param's choices)."""
MARKET_STRATEGIES: tuple[str, ...] = ("on_demand", "spot_restart", "eager_next_region", "sailor")
"""Strategies compared by the spot simulator (the ``strategy`` param's choices)."""

__all__ = [
    "MARKET_STRATEGIES",
    "RECOVERY_STRATEGIES",
    "MarketContext",
    "MarketDecision",
    "PlacementConstraint",
    "PreemptionRecord",
    "RecoveryContext",
    "SpotMove",
    "Strategy",
    "get_strategy",
    "register",
    "strategy_names",
]
