"""First-version planner: hard validators, then the cheapest feasible candidate, with an explanation.

A candidate is an offer (VM shape in a zone), a market and the number of VMs that give the run its
GPUs. Validators reject candidates with a named reason; the survivors are ranked by price per hour
(ties broken by the team's region share in the current assignment, then fewer VMs, then name).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sailor_tasks.catalog import Catalog
from sailor_tasks.errors import NoFeasibleOfferError
from sailor_tasks.model import ANY_GPU, ClusterState, JobRequest, Offer, Placement


@dataclass(frozen=True, slots=True)
class Candidate:
    offer: Offer
    market: str
    num_nodes: int

    @property
    def usd_per_hour(self) -> float:
        return self.num_nodes * self.offer.usd_per_hour(self.market)

    def describe(self) -> str:
        o = self.offer
        return (
            f"{o.zone} {self.num_nodes}x {o.instance_type} ({self.num_nodes * o.gpus_per_node}x {o.gpu_type}, "
            f"{self.market}) ${self.usd_per_hour:.2f}/h"
        )


def _markets(request: JobRequest, offer: Offer) -> tuple[str, ...]:
    if request.market == "auto":
        # Until the placement engine weighs preemption risk, auto means the cheaper market;
        # a spot price above on-demand is source-data dirt, so such offers go on-demand.
        return ("on_demand",) if offer.spot_above_ondemand else ("spot",)
    return (request.market,)


def enumerate_candidates(request: JobRequest, catalog: Catalog) -> Iterator[Candidate]:
    """Every (offer, market, VM count) that gives exactly ``request.num_gpus`` GPUs."""
    for offer in catalog.offers:
        if request.num_gpus % offer.gpus_per_node:
            continue
        for market in _markets(request, offer):
            yield Candidate(offer, market, request.num_gpus // offer.gpus_per_node)


Validator = Callable[[Candidate, JobRequest, ClusterState], str | None]


def _gpu_type(c: Candidate, r: JobRequest, s: ClusterState) -> str | None:
    return None if r.gpu_type in (ANY_GPU, c.offer.gpu_type) else "gpu_type"


def _region(c: Candidate, r: JobRequest, s: ClusterState) -> str | None:
    return None if not r.regions or c.offer.region in r.regions else "region_not_allowed"


def _blocked(c: Candidate, r: JobRequest, s: ClusterState) -> str | None:
    return "zone_blocked" if c.offer.zone in s.blocked_zones else None


def _price_cap(c: Candidate, r: JobRequest, s: ClusterState) -> str | None:
    cap = r.max_usd_per_hour
    return "price_cap" if cap is not None and c.usd_per_hour > cap + 1e-9 else None


VALIDATORS: tuple[Validator, ...] = (_gpu_type, _region, _blocked, _price_cap)


def cheapest_candidate(
    request: JobRequest, catalog: Catalog, ignore: tuple[Validator, ...] = ()
) -> Candidate | None:
    """Cheapest candidate passing every validator except those in ``ignore``."""
    state = ClusterState()
    best = None
    for c in enumerate_candidates(request, catalog):
        if all(v(c, request, state) is None for v in VALIDATORS if v not in ignore):
            if best is None or c.usd_per_hour < best.usd_per_hour:
                best = c
    return best


def plan(request: JobRequest, catalog: Catalog, state: ClusterState, run_id: str) -> Placement:
    """Choose where ``request`` runs.

    Raises:
        NoFeasibleOfferError: no candidate survives the validators (counts per rule, and the
            cheapest offer when only the price cap stands in the way).
    """
    rejected: Counter[str] = Counter()
    feasible: list[Candidate] = []
    for c in enumerate_candidates(request, catalog):
        reason = next((why for v in VALIDATORS if (why := v(c, request, state))), None)
        if reason:
            rejected[reason] += 1
        else:
            feasible.append(c)
    if not feasible:
        hint = ""
        cheapest = cheapest_candidate(request, catalog, ignore=(_price_cap,))
        if cheapest is not None and rejected.get("price_cap"):
            hint = f"cheapest offer: {cheapest.describe()}; raise max_usd_per_hour to at least {cheapest.usd_per_hour:.2f}"
        raise NoFeasibleOfferError(request.summary(), dict(rejected), hint)

    shares = state.assignment.shares.get(request.team, {}) if state.assignment else {}
    feasible.sort(
        key=lambda c: (
            round(c.usd_per_hour, 2),  # cents: ties go to packing
            -shares.get(c.offer.region, 0.0),
            c.num_nodes,
            c.offer.zone,
            c.offer.gpu_type,
        )
    )
    best = feasible[0]
    explanation = [
        f"chose {best.describe()}: cheapest of {len(feasible)} feasible candidates",
        *(f"runner-up #{i}: {c.describe()}" for i, c in enumerate(feasible[1:3], start=2)),
        f"rejected {sum(rejected.values())} candidates: "
        + (", ".join(f"{k}={n}" for k, n in sorted(rejected.items())) or "none"),
    ]
    if state.assignment is not None:
        explanation.append(
            f"assignment v{state.assignment.version}: team {request.team} share in "
            f"{best.offer.region} = {shares.get(best.offer.region, 0.0):.2f}"
        )
    return Placement(
        run_id=run_id,
        cloud=best.offer.cloud,
        region=best.offer.region,
        zone=best.offer.zone,
        gpu_type=best.offer.gpu_type,
        gpus_per_node=best.offer.gpus_per_node,
        num_nodes=best.num_nodes,
        num_gpus=request.num_gpus,
        market=best.market,
        instance_type=best.offer.instance_type,
        usd_per_hour=round(best.usd_per_hour, 5),
        explanation=tuple(explanation),
        assignment_version=state.assignment.version if state.assignment else None,
        score=best.usd_per_hour,
    )


def price_cap_error(request: JobRequest, catalog: Catalog) -> str | None:
    """Why the price cap makes the request infeasible (naming the cheapest offer), or None."""
    if request.max_usd_per_hour is None:
        return None
    cheapest = cheapest_candidate(request, catalog, ignore=(_price_cap, _blocked))
    if cheapest is not None and cheapest.usd_per_hour > request.max_usd_per_hour + 1e-9:
        return (
            f"below the cheapest matching offer {cheapest.describe()}; "
            f"raise it to at least {cheapest.usd_per_hour:.2f}"
        )
    return None
