"""Hard rules (Protean validators): each drops candidates and is named in the explanation.

A validator maps a ``RequestContext`` to a boolean array (True = the candidate passes). They run
in ``VALIDATORS`` order; a rejected candidate is attributed to the first validator it fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sailor_tasks.model import ANY_GPU
from sailor_tasks.placement.context import RESTART_HOURS, RequestContext
from sailor_tasks.placement.index import ON_DEMAND, SPOT
from sailor_tasks.placement.slack import spot_preferred

PRICE_EPSILON_USD = 1e-9


@dataclass(frozen=True, slots=True)
class Validator:
    name: str
    description: str
    passes: Callable[[RequestContext], np.ndarray | None]
    """Boolean per evaluated row (True = passes), or None when the rule cannot reject anything."""


def _gpu_type(ctx: RequestContext) -> np.ndarray | None:
    wanted = ctx.request.gpu_type
    if wanted == ANY_GPU:
        return None
    g = ctx.index.gpu_idx.get(wanted, -1)
    return ctx.c.gpu == g


def _gpu_count(ctx: RequestContext) -> np.ndarray | None:
    return ctx.request.num_gpus % ctx.c.gpn == 0


def _region_allowed(ctx: RequestContext) -> np.ndarray | None:
    if not ctx.request.regions:
        return None
    return ctx.index.region_mask(tuple(ctx.request.regions))[ctx.c.region]


def _region_denied(ctx: RequestContext) -> np.ndarray | None:
    if not ctx.request.exclude_regions:
        return None
    return ~ctx.index.region_mask(tuple(ctx.request.exclude_regions))[ctx.c.region]


def _data_residency(ctx: RequestContext) -> np.ndarray | None:
    allowed = set(ctx.request.data_residency)
    if not allowed:
        return None
    ok_region = np.array([c in allowed for c in ctx.index.region_continent], dtype=bool)
    return ok_region[ctx.c.region]


def _blocked_zone(ctx: RequestContext) -> np.ndarray | None:
    if not ctx.view.blocked_zones:
        return None
    return ~ctx.view.blocked_mask[ctx.c.zone]


def _market(ctx: RequestContext) -> np.ndarray | None:
    market = ctx.request.market
    if market == "spot":
        return ctx.c.market == SPOT
    if market == "on_demand":
        return ctx.c.market == ON_DEMAND
    spot = spot_preferred(ctx)
    return np.where(ctx.c.market == SPOT, spot, ~spot)


def _throughput(ctx: RequestContext) -> np.ndarray | None:
    return ctx.speed > 0


def expected_hours(ctx: RequestContext) -> np.ndarray:
    """Per row: the hours the run is expected to take there, what ``deadline`` compares: one launch
    (VM start, image and checkpoint pull) before training starts, the data transfer, the training
    and its expected preemption overhead."""
    return ctx.hours + ctx.overhead_hours + ctx.data_hours + RESTART_HOURS


def _deadline(ctx: RequestContext) -> np.ndarray | None:
    deadline = ctx.request.deadline_hours
    if deadline is None:
        return None
    return expected_hours(ctx) <= deadline


def _price_cap(ctx: RequestContext) -> np.ndarray | None:
    cap = ctx.request.max_usd_per_hour
    if cap is None:
        return None
    return ctx.usd_per_hour <= cap + PRICE_EPSILON_USD


def _capacity(ctx: RequestContext) -> np.ndarray | None:
    return ctx.free_gpus >= ctx.num_gpus


VALIDATORS: tuple[Validator, ...] = (
    Validator("gpu_type", "the requested GPU type", _gpu_type),
    Validator("gpu_count", "num_gpus is a whole number of this VM shape's GPUs", _gpu_count),
    Validator("region_allowed", "region is in the request's allowed regions", _region_allowed),
    Validator("region_denied", "region is not in the request's excluded regions", _region_denied),
    Validator("data_residency", "region is on a continent the dataset may be copied to", _data_residency),
    Validator("blocked_zone", "zone is not blocked (e.g. just preempted)", _blocked_zone),
    Validator("market", "the requested market (auto: the market rule's choice for this offer)", _market),
    Validator("throughput", "the model has a known throughput on this GPU type", _throughput),
    Validator("deadline", "expected hours (one launch, preemptions and data transfer included) fit the deadline", _deadline),
    Validator("price_cap", "price of the whole placement ≤ max_usd_per_hour", _price_cap),
    Validator("capacity", "free GPUs of this type in the zone, after live reservations", _capacity),
)
VALIDATOR_NAMES: tuple[str, ...] = tuple(v.name for v in VALIDATORS)
CAPACITY = VALIDATOR_NAMES.index("capacity")
PRICE_CAP = VALIDATOR_NAMES.index("price_cap")
DEADLINE = VALIDATOR_NAMES.index("deadline")
BLOCKED_ZONE = VALIDATOR_NAMES.index("blocked_zone")
MARKET = VALIDATOR_NAMES.index("market")


_FIRST_EVALUATED = 2
"""gpu_type and gpu_count are decided per (GPU type, count) by ``CatalogIndex.rows_for``."""


def first_failure(ctx: RequestContext, ignore: frozenset[int] = frozenset()) -> np.ndarray:
    """Per evaluated row (``ctx.rows``): index in ``VALIDATORS`` of the first failed validator, or -1."""
    fail = np.full(ctx.n, -1, dtype=np.int16)
    for i in range(len(VALIDATORS) - 1, _FIRST_EVALUATED - 1, -1):
        if i in ignore:
            continue
        ok = VALIDATORS[i].passes(ctx)
        if ok is not None:
            fail[~ok] = i
    return fail
