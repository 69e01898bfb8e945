"""Fast path: place one run (region, zone, GPU type, market) from the catalog and the cluster state,
explain the decision rule by rule, and reserve the capacity without overcommitting."""

from sailor_tasks.placement.engine import (
    PlanOutcome,
    QueuedRequest,
    catalog_errors,
    explain,
    plan,
    plan_many,
    price_cap_error,
)

__all__ = [
    "PlanOutcome",
    "QueuedRequest",
    "catalog_errors",
    "explain",
    "plan",
    "plan_many",
    "price_cap_error",
]
