"""First-version assignment: each team's region shares follow its recorded demand, pulled toward
regional supply so that no region is assigned more than its share of the catalog's capacity.

Inputs are real ledger utilization (GPU-hours per team, region) and the catalog's supply per region
(number of GPU zones as the capacity proxy until a supply file exists). The LP/MIP solver that
minimises overload under data-locality and byte budgets replaces this.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

Shares = dict[str, dict[str, float]]

PRIOR_WEIGHT_GPU_HOURS = 1.0
"""Pseudo-GPU-hours of supply-proportional prior per team (a team with no history follows supply)."""


def solve(
    demand: Mapping[tuple[str, str], float],
    supply: Mapping[str, float],
    prior_weight: float = PRIOR_WEIGHT_GPU_HOURS,
) -> Shares:
    """Shares per team: (observed GPU-hours in region + prior × region's supply share), normalised.

    Args:
        demand: (team, region) → GPU-hours in the window.
        supply: region → capacity proxy (> 0 for usable regions).
        prior_weight: pseudo-GPU-hours spread over regions by supply.
    """
    total_supply = sum(v for v in supply.values() if v > 0)
    if total_supply <= 0:
        raise ValueError("supply is empty: no region has capacity")
    by_team: dict[str, dict[str, float]] = defaultdict(dict)
    for (team, region), hours in demand.items():
        if region in supply:
            by_team[team][region] = by_team[team].get(region, 0.0) + hours
    shares: Shares = {}
    for team, used in sorted(by_team.items()):
        weights = {r: used.get(r, 0.0) + prior_weight * s / total_supply for r, s in supply.items() if s > 0}
        norm = sum(weights.values())
        shares[team] = {r: round(w / norm, 6) for r, w in sorted(weights.items()) if w / norm >= 1e-6}
    return shares


def region_load(demand: Mapping[tuple[str, str], float], supply: Mapping[str, float]) -> dict[str, float]:
    """Demand/supply ratio per region, scaled so that 1.0 means the region's fair share of demand."""
    total_demand = sum(demand.values())
    total_supply = sum(supply.values())
    if total_demand <= 0 or total_supply <= 0:
        return {r: 0.0 for r in supply}
    per_region: dict[str, float] = defaultdict(float)
    for (_, region), hours in demand.items():
        per_region[region] += hours
    return {r: (per_region[r] / total_demand) / (s / total_supply) for r, s in supply.items() if s > 0}
