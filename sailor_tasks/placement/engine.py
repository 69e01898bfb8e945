"""The placement engine (MAST-style fast path): exhaustive, tiered, explainable.

For one request: every candidate (region, zone, GPU type, VM shape, market) of the catalog is
checked by the hard validators (``validators.py``), the survivors are scored by the weighted
preferences (``preferences.py``), and the search is tiered the MAST way: regions are ranked by
their region-level rules plus their best pool, then the best zone/pool inside the best region wins
(which is the global optimum: the search is exhaustive, the tiers structure the explanation).
Everything is one numpy pass over arrays precomputed per catalog (``index.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sailor_tasks.catalog import Catalog
from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, ThroughputTable
from sailor_tasks.errors import CapacityUnavailableError, InvalidRequestError, NoFeasibleOfferError
from sailor_tasks.model import ANY_GPU, ClusterState, JobRequest, Placement
from sailor_tasks.placement import preferences as prefs
from sailor_tasks.placement.context import RESTART_HOURS, PlanningView, RequestContext, build_context
from sailor_tasks.placement.index import MARKET_NAMES, CatalogIndex, index_for
from sailor_tasks.placement.slack import describe_choice
from sailor_tasks.placement.validators import (
    BLOCKED_ZONE,
    CAPACITY,
    DEADLINE,
    MARKET,
    PRICE_CAP,
    PRICE_EPSILON_USD,
    VALIDATOR_NAMES,
    expected_hours,
    first_failure,
)

RUNNERS_UP = 3
"""Runners-up listed in an explanation."""

_VIEW_CACHE: dict[int, tuple[ClusterState, CatalogIndex, PlanningView]] = {}


def view_for(index: CatalogIndex, state: ClusterState) -> PlanningView:
    """The planning view of a snapshot; reservations are aggregated once per (catalog, snapshot)."""
    entry = _VIEW_CACHE.get(id(state))
    if entry is not None and entry[0] is state and entry[1] is index:
        return entry[2]
    view = PlanningView.from_state(index, state)
    if len(_VIEW_CACHE) >= 8:
        _VIEW_CACHE.clear()
    _VIEW_CACHE[id(state)] = (state, index, view)
    return view


def check_request(
    request: JobRequest, catalog: Catalog, job_types: Mapping[str, Any] = MODEL_JOB_TYPES
) -> None:
    """Reject names the catalog does not know, listing the valid ones, and numbers no run can
    have (a request built without ``request.from_params``, which refuses them first).

    Args:
        job_types: the models the index has throughputs for (``CatalogIndex.job_types``).

    Raises:
        InvalidRequestError: unknown GPU type, region or model; fewer than one worker, GPU per
            worker, step or step between checkpoints; a price cap or deadline that is not a
            finite number above 0.
    """
    for field_name in ("num_workers", "gpus_per_worker", "total_steps", "checkpoint_every_steps"):
        value = getattr(request, field_name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequestError(field_name, value, "need a whole number >= 1")
    for field_name in ("max_usd_per_hour", "deadline_hours"):
        value = getattr(request, field_name)
        if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise InvalidRequestError(field_name, value, "need a finite number > 0, or none")
    if request.gpu_type != ANY_GPU and request.gpu_type not in catalog.gpu_types:
        raise InvalidRequestError(
            "gpu_type", request.gpu_type, "not in the catalog", (ANY_GPU, *catalog.gpu_types)
        )
    for field_name in ("regions", "exclude_regions"):
        bad = [r for r in getattr(request, field_name) if r not in catalog.regions]
        if bad:
            raise InvalidRequestError(field_name, bad, "not in the catalog", catalog.regions)
    if request.model not in job_types:
        raise InvalidRequestError("model", request.model, "no throughput entry", sorted(job_types))
    if request.data_residency:
        continents = sorted(set(catalog.transfer.continent_of_prefix.values()))
        bad = [c for c in request.data_residency if c not in continents]
        if bad:
            raise InvalidRequestError("data_residency", bad, "unknown continent", continents)


@dataclass
class Evaluation:
    """One request evaluated over every candidate of the catalog."""

    ctx: RequestContext
    fail: np.ndarray
    """Index of the first failed validator per candidate (-1: feasible)."""
    contrib: np.ndarray
    """[preference, candidate] unweighted contributions."""
    weights: np.ndarray
    score: np.ndarray
    """Weighted sum; +inf where infeasible."""
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Feasible candidates, best first (winner and runners-up only)."""

    @property
    def feasible(self) -> np.ndarray:
        return self.fail < 0

    @property
    def index(self) -> CatalogIndex:
        return self.ctx.index


def evaluate(
    request: JobRequest,
    index: CatalogIndex,
    state: ClusterState,
    view: PlanningView,
    weights: Mapping[str, float] | None = None,
) -> Evaluation:
    ctx = build_context(index, request, state, view)
    fail = first_failure(ctx)
    # Infeasible rows may hold inf/NaN (no throughput); they are masked to +inf below.
    with np.errstate(invalid="ignore", over="ignore"):
        contrib = prefs.contributions(ctx)
        w = prefs.weight_vector(weights)
        score = np.where(fail < 0, w @ contrib, np.inf)
    ev = Evaluation(ctx, fail, contrib, w, score)
    feasible = np.flatnonzero(fail < 0)
    if feasible.size:
        k = min(RUNNERS_UP + 1, feasible.size)
        top = feasible[np.argpartition(score[feasible], k - 1)[:k]] if feasible.size > k else feasible
        # Every candidate tied with the best competes for first place, so the tie-break below
        # (fewer VMs, then zone and GPU names) decides among all of them, not an arbitrary few.
        best = float(score[feasible].min())
        tied = feasible[score[feasible] <= best + 1e-9 * max(1.0, abs(best))]
        pool = np.union1d(top, tied) if tied.size > 1 else top
        ranked = sorted(pool, key=lambda i: _tiebreak(ev, int(i)))[:k]
        ev.order = np.array(ranked, dtype=np.int64)
    return ev


def _tiebreak(ev: Evaluation, i: int) -> tuple[Any, ...]:
    idx, c = ev.index, ev.ctx.c
    return (
        round(float(ev.score[i]), 9),
        int(ev.ctx.nodes[i]),
        idx.zones[c.zone[i]],
        idx.gpu_types[c.gpu[i]],
        int(c.market[i]),
        int(c.gpn[i]),
    )


def _describe(ev: Evaluation, i: int) -> str:
    idx, ctx = ev.index, ev.ctx
    o = idx.offers[ctx.c.offer[i]]
    n = int(ctx.nodes[i])
    return (
        f"{o.zone} {n}x {o.instance_type} ({n * o.gpus_per_node}x {o.gpu_type}, "
        f"{MARKET_NAMES[ctx.c.market[i]]}) ${ctx.usd_per_hour[i]:.2f}/h"
    )


def _contrib_text(ev: Evaluation, i: int) -> str:
    return ", ".join(
        f"{name}={ev.weights[k] * ev.contrib[k, i]:.4g}" for k, name in enumerate(prefs.PREFERENCE_NAMES)
    )


def deciding_rule(ev: Evaluation, winner: int, other: int) -> tuple[str, float]:
    """The preference that favours ``winner`` over ``other`` the most, and by how much (USD)."""
    delta = ev.weights * (ev.contrib[:, other] - ev.contrib[:, winner])
    k = int(np.argmax(delta))
    return prefs.PREFERENCE_NAMES[k], float(delta[k])


def best_in_other_region(ev: Evaluation, winner: int) -> int | None:
    """The best feasible candidate outside the winner's region (why not there?), or None."""
    region = ev.ctx.c.region
    others = np.flatnonzero((ev.fail < 0) & (region != region[winner]))
    if others.size == 0:
        return None
    return int(others[np.argmin(ev.score[others])])


def region_ranking(ev: Evaluation) -> list[tuple[str, float]]:
    """Tier 1: regions with a feasible candidate, by their best candidate's score."""
    idx = ev.index
    best = np.full(len(idx.regions), np.inf)
    np.minimum.at(best, ev.ctx.c.region, ev.score)
    ranked = np.argsort(best, kind="stable")
    return [(idx.regions[r], float(best[r])) for r in ranked if np.isfinite(best[r])]


def _rejection_counts(ev: Evaluation) -> dict[str, int]:
    base = ev.ctx.base_fail
    counts = np.bincount(ev.fail[ev.fail >= 0], minlength=len(VALIDATOR_NAMES)) + np.bincount(
        base[base >= 0], minlength=len(VALIDATOR_NAMES)
    )
    return {VALIDATOR_NAMES[i]: int(n) for i, n in enumerate(counts) if n}


def _no_capacity_at_all(ev: Evaluation, rows: np.ndarray) -> bool:
    """No zone of the candidates ``rows`` holds even one VM of its shape: asking for fewer GPUs
    cannot help."""
    ctx = ev.ctx
    return bool(np.all(ev.index.g_capacity[ctx.c.group[rows]] < ctx.c.gpn[rows]))


def _raise_infeasible(ev: Evaluation, request: JobRequest) -> None:
    idx, ctx = ev.index, ev.ctx
    counts = _rejection_counts(ev)
    capacity_only = np.flatnonzero(ev.fail == CAPACITY)
    total = idx.g_capacity[ctx.c.group[capacity_only]]
    never = capacity_only[total < ctx.num_gpus]  # more GPUs than the zone has at all
    capacity_only = capacity_only[total >= ctx.num_gpus]
    if capacity_only.size:
        # Everything else fits: the capacity is taken by live reservations. Transient.
        i = capacity_only[np.argmin(ctx.usd_per_hour[capacity_only])]
        free = int(ctx.free_gpus[i])
        raise CapacityUnavailableError(
            idx.regions[ctx.c.region[i]],
            idx.gpu_types[ctx.c.gpu[i]],
            request.num_gpus,
            [f"best blocked offer {_describe(ev, int(i))}: {free} GPUs free in {idx.zones[ctx.c.zone[i]]}"],
        )
    hints = []
    if idx.num_candidates == 0:
        hints.append("the catalog has no offers")
    elif ctx.n == 0 and counts.get("gpu_count"):  # every VM shape of the GPU type divides it badly
        shapes: dict[str, set[int]] = {}
        for o in idx.offers:
            if request.gpu_type in (ANY_GPU, o.gpu_type):
                shapes.setdefault(o.gpu_type, set()).add(o.gpus_per_node)
        hints.append(
            "the GPUs must be a whole number of VMs; GPUs per VM: "
            + ", ".join(f"{g} {'/'.join(map(str, sorted(n)))}" for g, n in sorted(shapes.items()))
        )
    if never.size and _no_capacity_at_all(ev, never):  # no request size could ever fit
        types = sorted({idx.gpu_types[g] for g in ctx.c.gpu[never]})
        hints.append(
            f"no zone within the request's other limits has capacity for {'/'.join(types)} (the supply "
            "gives it none there, or less than one VM): choose another gpu_type or regions"
        )
    elif never.size:  # waiting cannot help: no zone of these offers ever holds the run
        i = int(never[np.argmax(idx.g_capacity[ctx.c.group[never]])])
        hints.append(
            f"{request.num_gpus} GPUs are more than any zone has (of the offers within the request's other "
            f"limits): the largest, {idx.zones[ctx.c.zone[i]]}, has "
            f"{int(idx.g_capacity[ctx.c.group[i]])} {idx.gpu_types[ctx.c.gpu[i]]} in all; ask for fewer GPUs"
        )
    # Hints name only offers whose zone can hold the run at all: raising the cap or the deadline
    # to one that never fits would not help.
    holds = idx.g_capacity[ctx.c.group] >= ctx.num_gpus
    over_cap = np.flatnonzero((ev.fail == PRICE_CAP) & holds)
    if over_cap.size:
        i = int(over_cap[np.argmin(ctx.usd_per_hour[over_cap])])
        hints.append(
            f"cheapest offer: {_describe(ev, i)}; raise max_usd_per_hour to at least {_hundredths_up(ctx.usd_per_hour[i])}"
        )
    too_slow = np.flatnonzero((ev.fail == DEADLINE) & holds)
    if request.max_usd_per_hour is not None:  # raising the deadline alone must be enough
        too_slow = too_slow[ctx.usd_per_hour[too_slow] <= request.max_usd_per_hour + PRICE_EPSILON_USD]
    if too_slow.size:
        need = expected_hours(ctx)[too_slow]
        i = int(too_slow[np.argmin(need)])
        hours = float(need.min())
        hints.append(
            f"fastest offer: {_describe(ev, i)}, expected to take {hours:.3f} h (launch, data transfer and "
            f"expected preemptions included); raise deadline_hours to at least {_hundredths_up(hours)}"
        )
    raise NoFeasibleOfferError(request.summary(), counts, "; ".join(hints))


def _placement(
    ev: Evaluation, run_id: str, request: JobRequest, state: ClusterState, full: bool | None = True
) -> Placement:
    """The winner as a ``Placement``; ``full=False`` keeps only the winner's lines (batch planning),
    ``None`` no explanation at all."""
    idx, ctx = ev.index, ev.ctx
    w = int(ev.order[0])
    if full is None:
        return _as_placement(ev, w, run_id, request, state, [])
    o = idx.offers[ctx.c.offer[w]]
    source = ctx.r_data_source[ctx.c.region[w]]
    n_feasible = int(np.count_nonzero(ev.feasible))
    if not full:
        lines = [
            f"chose {_describe(ev, w)}: score {ev.score[w]:.4g} USD-eq, best of {n_feasible} feasible "
            f"candidates ({idx.num_candidates} searched)",
            f"winner contributions: {_contrib_text(ev, w)}",
        ]
        return _as_placement(ev, w, run_id, request, state, lines)
    regions = region_ranking(ev)
    lines = [
        f"chose {_describe(ev, w)}: score {ev.score[w]:.4g} USD-eq, best of {n_feasible} feasible "
        f"candidates in {len(regions)} regions ({idx.num_candidates} searched)",
        f"winner contributions: {_contrib_text(ev, w)}",
        f"expected {ctx.hours[w]:.3g} h at {ctx.speed[w]:.3g} steps/s"
        + (
            f"; dataset {ctx.dataset_gb:.3g} GB from {idx.regions[source]}"
            if source >= 0
            else f"; dataset {ctx.dataset_gb:.3g} GB from {ctx.data_origin}"
            if ctx.data_origin is not None and ctx.dataset_gb > 0
            else (
                "; dataset location unknown (no transfer charged)"
                if not ctx.sources
                else "; dataset size unknown (no transfer charged)"
                if ctx.dataset_gb <= 0
                else f"; dataset {ctx.dataset_gb:.3g} GB from its source, location unknown (charged at "
                "the dearest link into the region)"
            )
        )
        + (
            f"; checkpoint {state.checkpoint[1] / 1e9:.3g} GB from {state.checkpoint[0]}"
            if state.checkpoint is not None and state.checkpoint[1] > 0
            else ""
        ),
        "regions ranked: " + ", ".join(f"{r} {s:.4g}" for r, s in regions[:4]),
    ]
    if request.market == "auto":
        lines.append(describe_choice(ctx, w))
    for rank, other in enumerate(ev.order[1:], start=2):
        rule, delta = deciding_rule(ev, w, int(other))
        why = (
            f"decided by {rule} (+{delta:.4g} USD-eq against it)"
            if delta > 1e-12
            else "tied with the winner (tie broken by fewer VMs, then zone name)"
        )
        lines.append(
            f"runner-up #{rank}: {_describe(ev, int(other))} score {ev.score[other]:.4g}; {why}; "
            f"{_contrib_text(ev, int(other))}"
        )
    other_region = best_in_other_region(ev, w)
    if other_region is not None and other_region not in ev.order:
        rule, delta = deciding_rule(ev, w, other_region)
        lines.append(
            f"best in another region: {_describe(ev, other_region)} score {ev.score[other_region]:.4g}; "
            f"decided by {rule} (+{delta:.4g} USD-eq against it); {_contrib_text(ev, other_region)}"
        )
    counts = _rejection_counts(ev)
    lines.append(
        f"rejected {sum(counts.values())} candidates: "
        + (", ".join(f"{k}={n}" for k, n in counts.items()) or "none")
    )
    if state.assignment is not None:
        shares = state.assignment.shares.get(request.team, {})
        load = state.assignment.region_load.get(o.region)
        lines.append(
            f"assignment v{state.assignment.version}: team {request.team} share in {o.region} = "
            f"{shares.get(o.region, 0.0):.2f}" + (f", region load {load:.2f}" if load is not None else "")
        )
    return _as_placement(ev, w, run_id, request, state, lines)


def _as_placement(
    ev: Evaluation, w: int, run_id: str, request: JobRequest, state: ClusterState, lines: list[str]
) -> Placement:
    idx, ctx = ev.index, ev.ctx
    o = idx.offers[ctx.c.offer[w]]
    return Placement(
        run_id=run_id,
        cloud=o.cloud,
        region=o.region,
        zone=o.zone,
        gpu_type=o.gpu_type,
        gpus_per_node=o.gpus_per_node,
        num_nodes=int(ctx.nodes[w]),
        num_gpus=request.num_gpus,
        market=MARKET_NAMES[ctx.c.market[w]],
        instance_type=o.instance_type,
        usd_per_hour=round(float(ctx.usd_per_hour[w]), 5),
        explanation=tuple(lines),
        assignment_version=state.assignment.version if state.assignment else None,
        score=float(ev.score[w]),
    )


def plan(
    request: JobRequest,
    catalog: Catalog,
    state: ClusterState,
    run_id: str,
    weights: Mapping[str, float] | None = None,
    index: CatalogIndex | None = None,
) -> Placement:
    """Choose where ``request`` runs (no side effects; ``reservations.plan_and_reserve`` reserves).

    Args:
        index: the catalog's index built with another throughput table or model map
            (``index.build_index``); default: the cached packaged one (``index_for``).

    Raises:
        InvalidRequestError: a GPU type, region, model or continent the catalog does not know.
        CapacityUnavailableError: feasible but for capacity held by live reservations (transient).
        NoFeasibleOfferError: no candidate survives the validators (counts per rule; the cheapest
            offer when only the price cap stands in the way).
    """
    index = _index(catalog, index)
    check_request(request, catalog, index.job_types)
    return _plan_on_view(request, index, state, view_for(index, state), run_id, weights)


def _index(catalog: Catalog, index: CatalogIndex | None) -> CatalogIndex:
    if index is None:
        return index_for(catalog)
    if index.catalog is not catalog:
        raise ValueError("index was built for another catalog; build it with build_index(catalog, ...)")
    return index


def _plan_on_view(
    request: JobRequest,
    index: CatalogIndex,
    state: ClusterState,
    view: PlanningView,
    run_id: str,
    weights: Mapping[str, float] | None,
    full: bool | None = True,
) -> Placement:
    ev = evaluate(request, index, state, view, weights)
    if ev.order.size == 0:
        _raise_infeasible(ev, request)
    return _placement(ev, run_id, request, state, full)


def explain(
    request: JobRequest,
    catalog: Catalog,
    state: ClusterState,
    run_id: str = "explain",
    weights: Mapping[str, float] | None = None,
    index: CatalogIndex | None = None,
) -> dict[str, Any]:
    """The full decision as JSON: the placement, winner and runners-up with every rule's
    contribution, the region ranking (tier 1), and each rejected candidate with its validator.
    ``index`` as in ``plan``."""
    index = _index(catalog, index)
    check_request(request, catalog, index.job_types)
    ev = evaluate(request, index, state, view_for(index, state), weights)
    idx, ctx = ev.index, ev.ctx

    def candidate(row: int) -> dict[str, Any]:
        """A candidate by its row in the whole index (evaluated or not)."""
        o = idx.offers[idx.c_offer[row]]
        nodes = max(request.num_gpus // o.gpus_per_node, 1)
        return {
            "region": o.region,
            "zone": o.zone,
            "gpu_type": o.gpu_type,
            "instance_type": o.instance_type,
            "gpus_per_node": o.gpus_per_node,
            "num_nodes": nodes,
            "market": MARKET_NAMES[idx.c_market[row]],
            "usd_per_hour": round(float(nodes * idx.c_price[row]), 5),
        }

    def scored(i: int) -> dict[str, Any]:
        return {
            **candidate(int(ctx.rows[i])),
            "score": float(ev.score[i]),
            "expected_hours": float(ctx.hours[i]),
            "data_hours": float(ctx.data_hours[i]),
            "contributions": {
                name: float(ev.weights[k] * ev.contrib[k, i]) for k, name in enumerate(prefs.PREFERENCE_NAMES)
            },
        }

    full_fail = ctx.base_fail.copy()
    full_fail[ctx.rows] = ev.fail
    out: dict[str, Any] = {
        "request": request.summary(),
        "weights": dict(zip(prefs.PREFERENCE_NAMES, map(float, ev.weights), strict=True)),
        "candidates": idx.num_candidates,
        "feasible": int(np.count_nonzero(ev.feasible)),
        "rejected_by_rule": _rejection_counts(ev),
    }
    if ev.order.size:
        w = int(ev.order[0])
        out["placement"] = _as_dict(_placement(ev, run_id, request, state))
        out["winner"] = scored(w)
        out["runners_up"] = []
        for other in ev.order[1:]:
            rule, delta = deciding_rule(ev, w, int(other))
            decided_by = rule if delta > 1e-12 else "tie (fewer VMs, then zone name)"
            out["runners_up"].append(
                {**scored(int(other)), "decided_by": decided_by, "decided_by_usd": delta}
            )
        other = best_in_other_region(ev, w)
        if other is not None:
            rule, delta = deciding_rule(ev, w, other)
            out["best_in_other_region"] = {**scored(other), "decided_by": rule, "decided_by_usd": delta}
        out["regions"] = [{"region": r, "best_score": s} for r, s in region_ranking(ev)]
    else:
        try:
            _raise_infeasible(ev, request)
        except (CapacityUnavailableError, NoFeasibleOfferError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    out["rejected"] = [
        {**candidate(int(row)), "validator": VALIDATOR_NAMES[full_fail[row]]}
        for row in np.flatnonzero(full_fail >= 0)
    ]
    return out


def _as_dict(p: Placement) -> dict[str, Any]:
    from sailor_tasks.model import to_dict

    return to_dict(p)


def _unreserved_context(
    request: JobRequest, catalog: Catalog, throughput: ThroughputTable | None = None
) -> RequestContext:
    """The request's candidates with nothing reserved, at the speeds of ``throughput`` (default:
    the packaged table).

    Raises:
        InvalidRequestError: ``check_request`` refuses the request.
    """
    check_request(request, catalog)
    index = index_for(catalog, throughput)
    return build_context(index, request, _EMPTY_STATE, view_for(index, _EMPTY_STATE))


def _context_or_none(request: JobRequest, catalog: Catalog) -> RequestContext | None:
    """``_unreserved_context``, or None when ``check_request`` refuses the request."""
    try:
        return _unreserved_context(request, catalog)
    except InvalidRequestError:
        return None


def catalog_errors(
    request: JobRequest, catalog: Catalog, throughput: ThroughputTable | None = None
) -> list[InvalidRequestError]:
    """Every way ``request`` can never be placed on ``catalog``, whatever is reserved or blocked:
    a name or number the catalog refuses (``check_request``: a continent the transfer file does
    not have, for one), no offer can run it (``never_feasible_error``), the price cap is below
    every offer that could (``price_cap_error``), the deadline is shorter than any run can take
    (``deadline_error``). The candidates are evaluated once for all three.

    Args:
        throughput: the speeds ``plan`` will use (``StageContext.planning_table``: the packaged
            table with the ledger's measured speeds), so that a deadline validation accepts is
            one planning can meet; default: the packaged table.
    """
    try:
        ctx = _unreserved_context(request, catalog, throughput)
    except InvalidRequestError as exc:
        return [exc]
    errors = []
    never = never_feasible_error(request, catalog, ctx)
    if never is not None:
        field, exc = never
        valid = _residency_choices(ctx) if field == "data_residency" else None
        errors.append(InvalidRequestError(field, getattr(request, field), str(exc), valid))
    if cap := price_cap_error(request, catalog, ctx):
        errors.append(InvalidRequestError("max_usd_per_hour", request.max_usd_per_hour, cap))
    if late := deadline_error(request, catalog, ctx):
        errors.append(InvalidRequestError("deadline_hours", request.deadline_hours, late))
    return errors


def deadline_error(request: JobRequest, catalog: Catalog, ctx: RequestContext | None = None) -> str | None:
    """Why the deadline can never be met (naming the fastest offer), or None: it is shorter than
    the fastest run any allowed offer makes, its training and one launch, with the data already
    there and no preemption. What planning's deadline rule adds to that (a transfer, the expected
    preemption loss, the wait in the queue) depends on when and where the run is planned.

    Args:
        ctx: the request's candidates with nothing reserved (``_unreserved_context``), when the
            caller has them.
    """
    if request.deadline_hours is None:
        return None
    ctx = ctx or _context_or_none(request, catalog)
    if ctx is None:
        return None
    # market=auto picks spot or on-demand by the deadline's slack: either may serve it.
    ignore = {BLOCKED_ZONE, DEADLINE, PRICE_CAP} | ({MARKET} if request.market == "auto" else set())
    fail = first_failure(ctx, ignore=frozenset(ignore))
    ok = np.flatnonzero(fail < 0)
    if ok.size == 0:
        return None  # no offer runs it at all: never_feasible_error says why
    i = int(ok[np.argmin(ctx.hours[ok])])
    fastest = float(ctx.hours[i]) + RESTART_HOURS
    if request.deadline_hours < fastest - 1e-9:
        ev = Evaluation(ctx, fail, np.zeros((0, 0)), np.zeros(0), np.zeros(0))
        return (
            f"shorter than the fastest possible run, {fastest:.2f} h on {_describe(ev, i)}: "
            f"{ctx.hours[i]:.2f} h of training and a {RESTART_HOURS * 60:.0f}-minute launch, with the "
            f"data already there; set at least {_hundredths_up(fastest)}, or no deadline"
        )
    return None


def price_cap_error(request: JobRequest, catalog: Catalog, ctx: RequestContext | None = None) -> str | None:
    """Why the price cap makes the request infeasible (naming the cheapest offer), or None.

    Capacity and blocked zones are ignored: they change over time, the cap is the user's choice.

    Args:
        ctx: the request's candidates with nothing reserved (``_unreserved_context``), when the
            caller has them.
    """
    if request.max_usd_per_hour is None:
        return None
    ctx = ctx or _context_or_none(request, catalog)
    if ctx is None:
        return None
    index = ctx.index
    # market=auto: the run's strategy picks the market before it is placed, so either market's row
    # of an offer may be the one under the cap (as deadline_error).
    ignore = {PRICE_CAP, CAPACITY, BLOCKED_ZONE} | ({MARKET} if request.market == "auto" else set())
    fail = first_failure(ctx, ignore=frozenset(ignore))
    ok = np.flatnonzero(fail < 0)
    # Only offers whose zone can hold the run at all: raising the cap to one that never fits
    # would not help (``never_feasible_error`` says so instead).
    ok = ok[index.g_capacity[ctx.c.group[ok]] >= ctx.num_gpus]
    if ok.size == 0:
        return None
    i = int(ok[np.argmin(ctx.usd_per_hour[ok])])
    cheapest = float(ctx.usd_per_hour[i])
    if cheapest > request.max_usd_per_hour + 1e-9:
        ev = Evaluation(ctx, fail, np.zeros((0, 0)), np.zeros(0), np.zeros(0))
        return f"below the cheapest matching offer {_describe(ev, i)}; raise it to at least {_hundredths_up(cheapest)}"
    return None


def _hundredths_up(value: float) -> str:
    """``value`` rounded up to the hundredth (a price cap in cents, a deadline in hours), as a
    bound to advise: one rounded to the nearest can fall under what it must reach and be refused
    again. The product is rounded first, so float noise (0.3 · 100 = 30.000000000000004) does
    not add a hundredth."""
    return f"{math.ceil(round(value * 100, 6)) / 100:.2f}"


_EMPTY_STATE = ClusterState()

FIELD_OF_RULE = {
    "gpu_type": "gpu_type",
    "gpu_count": "num_workers",
    "region_allowed": "regions",
    "region_denied": "exclude_regions",
    "data_residency": "data_residency",
    "market": "market",
    "throughput": "model",
    "capacity": "num_workers",
}
"""The param a validator's rejection points at (what the user would change)."""


def never_feasible_error(
    request: JobRequest, catalog: Catalog, ctx: RequestContext | None = None
) -> tuple[str, NoFeasibleOfferError] | None:
    """(the param to change, the error) when no offer of the catalog can ever
    run the request, with nothing reserved and no zone blocked: more GPUs than any zone has, a
    ``data_residency`` no allowed region is on, a model no allowed GPU type runs. None when one
    can. The price cap is ``price_cap_error``'s, the deadline ``deadline_error``'s.

    Args:
        ctx: the request's candidates with nothing reserved (``_unreserved_context``), when the
            caller has them.
    """
    ctx = ctx or _context_or_none(request, catalog)
    if ctx is None:
        return None
    fail = first_failure(ctx, ignore=frozenset({BLOCKED_ZONE, DEADLINE, PRICE_CAP}))
    if np.any(fail < 0):
        return None
    ev = Evaluation(ctx, fail, np.zeros((0, 0)), np.zeros(0), np.zeros(0))
    try:
        _raise_infeasible(ev, request)
    except NoFeasibleOfferError as exc:
        # The last rule (in the validators' order) that rejected offers: the offers that passed
        # every rule before it died there, so it names what the user would change.
        hit = [r for r in VALIDATOR_NAMES if exc.rejections.get(r) and r in FIELD_OF_RULE]
        field = FIELD_OF_RULE[hit[-1] if hit else "gpu_type"]
        if field == FIELD_OF_RULE["capacity"] and _no_capacity_at_all(ev, np.flatnonzero(fail == CAPACITY)):
            field = "gpu_type"  # fewer GPUs cannot help: another GPU type (or regions) can
        return field, exc
    except CapacityUnavailableError:  # nothing is reserved: cannot happen, but never a refusal
        return None
    return None


def _residency_choices(ctx: RequestContext) -> list[str] | None:
    """The continents where some of ``ctx``'s offers pass every rule of ``never_feasible_error``
    but ``data_residency`` (the request's regions, GPU type and count, market, ...): what
    ``data_residency`` could name instead; None when there is no such offer."""
    residency = VALIDATOR_NAMES.index("data_residency")
    fine = first_failure(ctx, ignore=frozenset({BLOCKED_ZONE, DEADLINE, PRICE_CAP, residency})) < 0
    continents = sorted({ctx.index.region_continent[r] for r in ctx.c.region[fine]})
    return continents or None


# --- batch planning ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """One request waiting in a queue: higher ``priority`` first, then earlier ``arrival``."""

    run_id: str
    request: JobRequest
    priority: int = 0
    arrival: float = 0.0


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    run_id: str
    placement: Placement | None
    error: str | None = None


def plan_many(
    queue: Sequence[QueuedRequest],
    catalog: Catalog,
    state: ClusterState,
    weights: Mapping[str, float] | None = None,
    full_explanations: bool = False,
    index: CatalogIndex | None = None,
    explain: bool = True,
) -> list[PlanOutcome]:
    """Plan a queue in priority order (then arrival, then queue position) against one snapshot.

    Each placement's GPUs are held in the view before the next request is planned, so the batch
    never overcommits a (zone, GPU type). Requests that cannot be placed get an ``error`` (the
    batch goes on). Returns outcomes in planning order. Nothing is written to the ledger.
    Explanations keep the winner's lines only unless ``full_explanations``; with ``explain=False``
    placements carry none (callers that only read the choice). ``index`` as in ``plan``.
    """
    index = _index(catalog, index)
    view = view_for(index, state).copy()
    order = sorted(range(len(queue)), key=lambda i: (-queue[i].priority, queue[i].arrival, i))
    full = full_explanations if explain else None
    outcomes: list[PlanOutcome] = []
    for i in order:
        q = queue[i]
        try:
            check_request(q.request, catalog, index.job_types)
            p = _plan_on_view(q.request, index, state, view, q.run_id, weights, full)
        except (InvalidRequestError, NoFeasibleOfferError, CapacityUnavailableError) as exc:
            outcomes.append(PlanOutcome(q.run_id, None, f"{type(exc).__name__}: {exc}"))
            continue
        view.used[index.group_idx[(p.zone, p.gpu_type)]] += p.num_gpus
        outcomes.append(PlanOutcome(q.run_id, p))
    return outcomes
