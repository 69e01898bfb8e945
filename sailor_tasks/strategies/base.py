"""The strategy interface: preemption history in, the next placement constraint out; and a registry.

A strategy is stateless: everything it may use is in ``RecoveryContext`` (the request, the
placement that was just lost, the run's preemption history, the catalog's zones per region). It
answers with a ``PlacementConstraint`` (zones/regions to avoid, market to use) that the stage turns
into ``ClusterState.blocked_zones`` (and a market override) and hands to the same planner as the
first placement. Recovery strategies (``same_zone_first``, ``eager_next_region``) and market
strategies (``on_demand``, ``spot_restart``, ``sailor``) share this interface and registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from sailor_tasks.model import JobRequest, Placement


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

    def all_blocked_zones(self, zones_by_region: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
        """Blocked zones plus every zone of a blocked region."""
        zones = set(self.blocked_zones)
        for region in self.blocked_regions:
            zones.update(zones_by_region.get(region, ()))
        return frozenset(zones)


@runtime_checkable
class Strategy(Protocol):
    name: ClassVar[str]

    def next_constraint(self, ctx: RecoveryContext) -> PlacementConstraint:
        """The constraint for the next placement after the preemption at the end of ``ctx.history``."""


_REGISTRY: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a strategy selectable by ``name``."""

    def deco(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"strategy {name!r} is already registered by {_REGISTRY[name].__name__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def strategy_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def get_strategy(name: str) -> Strategy:
    """A new instance of the strategy called ``name``.

    Raises:
        ValueError: unknown name; the message lists the valid names.
    """
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"strategy={name!r} is not a strategy; valid: {', '.join(strategy_names())}"
        ) from None
    return cls()
