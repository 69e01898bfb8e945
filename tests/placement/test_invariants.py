"""Invariants of the engine over many seeded requests on the full packaged catalog (Gavel-style):
the winner is the minimum over every feasible candidate and satisfies every hard rule, and agrees
with an independent brute-force scorer written from the placement docs."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections import Counter

import numpy as np
import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, packaged_with_measured
from sailor_tasks.errors import CapacityUnavailableError, NoFeasibleOfferError
from sailor_tasks.model import Assignment, ClusterState, JobRequest, Reservation
from sailor_tasks.placement import plan
from sailor_tasks.placement.engine import evaluate, view_for
from sailor_tasks.placement.index import index_for

GPUS = ("any", "H100", "L4", "A100")
WORKERS = (1, 2, 8)
MARKETS = ("auto", "spot", "on_demand")
DEADLINES = (None, 3.0)


@pytest.fixture(scope="module")
def world():
    cat = load_catalog()
    rng = random.Random(7)
    offers = cat.offers
    state = ClusterState(
        reservations=tuple(
            Reservation(f"r{i}", o.region, o.zone, o.gpu_type, rng.choice((1, 2, 4)), "spot")
            for i, o in enumerate(rng.choice(offers) for _ in range(2000))
        ),
        assignment=Assignment(
            1, {"t": {"us-central1": 1.0}}, {r: rng.uniform(0.5, 2.0) for r in cat.regions}
        ),
        replicas={"sailor://source/d": ("europe-west4",)},
        dataset_bytes={"sailor://source/d": 50 * 10**9},
    )
    return cat, state


@pytest.mark.parametrize(
    ("gpu", "workers", "market", "deadline"), list(itertools.product(GPUS, WORKERS, MARKETS, DEADLINES))
)
def test_winner_is_the_feasible_minimum_and_obeys_every_rule(world, gpu, workers, market, deadline):
    cat, state = world
    request = JobRequest(
        job_name="j",
        team="t",
        dataset_uri="sailor://source/d",
        model="gpt_25m",
        num_workers=workers,
        gpu_type=gpu,
        market=market,
        max_usd_per_hour=60.0,
        total_steps=50_000,
        deadline_hours=deadline,
    )
    index = index_for(cat)
    ev = evaluate(request, index, state, view_for(index, state))
    feasible = ev.fail < 0
    try:
        p = plan(request, cat, state, "r")
    except (NoFeasibleOfferError, CapacityUnavailableError):
        assert not feasible.any()
        return
    assert ev.score[ev.order[0]] == pytest.approx(float(np.min(ev.score[feasible])))
    assert p.num_gpus == workers and p.num_nodes * p.gpus_per_node == workers
    assert gpu in ("any", p.gpu_type)
    assert p.usd_per_hour <= 60.0 + 1e-9
    if market != "auto":
        assert p.market == market
    held = sum(r.gpus for r in state.reservations if (r.zone, r.gpu_type) == (p.zone, p.gpu_type))
    capacity = next(o.capacity_gpus for o in cat.offers if (o.zone, o.gpu_type) == (p.zone, p.gpu_type))
    assert held + workers <= capacity
    assert plan(request, cat, state, "r") == p  # deterministic


# --- an independent brute-force scorer ----------------------------------------------------------
# Written from docs/placement.md (hard rules, preference table, market rule) over the catalog's
# offers and the raw ClusterState, without the engine's index, context, validators or preferences:
# the engine must find the same feasible candidates with the same scores, and pick their minimum.

RESTART_H = 0.1  # "half a checkpoint interval + 0.1 h restart"
SLACK_SAFETY, SHORT_JOB_H = 2.0, 1.0  # market=auto: slack ≥ 2× overhead + restart, or ≤ 1 h and covers it
OVERLOAD, UNDERLOAD, ASSIGNMENT, PACKING = 1.0, 0.25, 0.1, 0.02


@dataclasses.dataclass(frozen=True)
class Scored:
    key: tuple  # (zone, gpu_type, instance_type, gpus_per_node, market)
    nodes: int
    usd_per_hour: float
    score: float


def brute_force(request: JobRequest, catalog, state: ClusterState) -> tuple[list[Scored], bool]:
    """Every feasible candidate (offer × market) with its score, and whether some candidate fails
    the capacity rule only (then no placement is a retryable CapacityUnavailableError)."""
    table = packaged_with_measured(())
    job = MODEL_JOB_TYPES[request.model]
    transfer = catalog.transfer
    n = request.num_gpus
    held: Counter = Counter()
    for r in state.reservations:
        held[(r.zone, r.gpu_type)] += r.gpus
    sources = set(state.replicas.get(request.dataset_uri, ()))
    scheme, _, rest = request.dataset_uri.partition("://")
    bucket = rest.split("/", 1)[0]
    origin = bucket if scheme == "sailor" and bucket != "source" else None  # a region, VMs sold there or not
    if origin in catalog.regions:
        sources.add(origin)
    gb = state.dataset_bytes.get(request.dataset_uri, 0) / 1e9

    def data(region: str) -> tuple[float, float]:
        """(USD, hours) to get the dataset there: verify the region's own copy, else copy it from
        its origin, else (origin unknown) at the dearest and slowest link from any region."""
        if (not sources and origin is None) or gb <= 0:
            return 0.0, 0.0
        if region in sources or origin is not None:
            link = transfer.bucket_link(region if region in sources else origin, region)
            usd, gbps = link.usd_per_gb, link.gbps
        else:
            links = [transfer.bucket_link(s, region) for s in catalog.regions]
            usd, gbps = max(k.usd_per_gb for k in links), min(k.gbps for k in links)
        return gb * usd, gb * 8 / gbps / 3600

    a = state.assignment
    shares = a.shares.get(request.team, {}) if a else {}
    top = max(shares.values(), default=0.0) or 1.0
    loads = a.region_load if a else {}
    out: list[Scored] = []
    capacity_only = False
    for o in catalog.offers:
        if request.gpu_type not in ("any", o.gpu_type) or n % o.gpus_per_node:
            continue
        if request.regions and o.region not in request.regions:
            continue
        if o.region in request.exclude_regions or o.zone in state.blocked_zones:
            continue
        if request.data_residency and transfer.continent(o.region) not in request.data_residency:
            continue
        nodes = max(n // o.gpus_per_node, 1)
        speed = table.throughput(job, o.gpu_type)
        if nodes > 1:  # workers on several VMs: Gavel's spread/packed ratio at the largest scale <= n
            k = max(s for (name, s) in table.alone if name == job[0] and s <= n)
            alone, spread = (table.throughput((job[0], k), o.gpu_type, consolidated=c) for c in (True, False))
            speed *= spread / alone if alone > 0 and spread > 0 else 1.0
        if speed <= 0:
            continue
        step_h = 1 / (speed * 3600)
        hours = request.total_steps * step_h
        spot_overhead = (
            o.preemption_rate_per_hour
            * nodes
            * hours
            * (0.5 * request.checkpoint_every_steps * step_h + RESTART_H)
        )
        data_usd, data_h = data(o.region)
        auto_spot = not o.spot_above_ondemand and (
            o.spot_usd_per_hour * (hours + spot_overhead) < o.ondemand_usd_per_hour * hours
        )
        if request.deadline_hours is not None:
            slack = request.deadline_hours - RESTART_H - hours - data_h  # the launch, as the deadline counts it
            auto_spot = auto_spot and (
                slack >= SLACK_SAFETY * spot_overhead + RESTART_H
                or (hours <= SHORT_JOB_H and slack >= spot_overhead)
            )
        free = math.inf if o.capacity_gpus is None else o.capacity_gpus - held[(o.zone, o.gpu_type)]
        for market in ("spot", "on_demand"):
            wanted = ("spot" if auto_spot else "on_demand") if request.market == "auto" else request.market
            if market != wanted:
                continue
            overhead = spot_overhead if market == "spot" else 0.0
            price = nodes * o.usd_per_hour(market)
            # The deadline counts one launch before training.
            if request.deadline_hours is not None and RESTART_H + hours + overhead + data_h > request.deadline_hours:
                continue
            if request.max_usd_per_hour is not None and price > request.max_usd_per_hour + 1e-9:
                continue
            if free < n:
                capacity_only = True
                continue
            compute = price * hours
            load = loads.get(o.region, 1.0)
            score = (
                compute
                + data_usd
                + data_h * price
                + overhead * price
                + compute * (OVERLOAD * max(load - 1, 0) - UNDERLOAD * max(1 - load, 0))
                + (compute * ASSIGNMENT * (top - shares.get(o.region, 0.0)) / top if shares else 0.0)
                + compute * PACKING * (nodes - 1)
            )
            key = (o.zone, o.gpu_type, o.instance_type, o.gpus_per_node, market)
            out.append(Scored(key, nodes, price, score))
    return out, capacity_only


BIG_DATASET = "sailor://source/big"


def _full(catalog, region: str, gpu: str) -> tuple[Reservation, ...]:
    """Reservations holding every GPU of ``gpu`` in ``region``'s zones."""
    groups = {
        (o.zone, o.gpu_type): o.capacity_gpus
        for o in catalog.offers
        if (o.region, o.gpu_type) == (region, gpu)
    }
    return tuple(Reservation(f"full-{z}", region, z, g, cap, "on_demand") for (z, g), cap in groups.items())


def _requests() -> list[tuple[str, JobRequest, frozenset[str]]]:
    base = dict(
        job_name="j",
        team="t",
        dataset_uri="sailor://source/d",
        model="gpt_25m",
        max_usd_per_hour=60.0,
        total_steps=50_000,
    )
    out = []
    for gpu, workers, market, deadline in itertools.product(GPUS, WORKERS, MARKETS, DEADLINES):
        kw = dict(gpu_type=gpu, num_workers=workers, market=market, deadline_hours=deadline)
        out.append((f"{gpu}-{workers}-{market}-{deadline}", JobRequest(**{**base, **kw}), frozenset()))
    extra = [
        ("eu-residency", dict(num_workers=4, data_residency=("EU",)), frozenset()),
        ("regions", dict(num_workers=2, regions=("us-central1", "us-east1", "asia-east1")), frozenset()),
        ("exclude-eu-west4", dict(num_workers=8, exclude_regions=("europe-west4",)), frozenset()),
        ("blocked", dict(num_workers=1, gpu_type="L4"), frozenset({"europe-west4-a", "us-central1-a"})),
        ("other-team", dict(num_workers=2, team="nobody", market="spot"), frozenset()),
        ("sailor-bucket", dict(num_workers=2, dataset_uri="sailor://asia-east1/d"), frozenset()),
        ("tight-deadline", dict(num_workers=1, total_steps=400_000, deadline_hours=1.0), frozenset()),
        ("long-spot", dict(num_workers=2, total_steps=2_000_000, checkpoint_every_steps=20_000), frozenset()),
        ("cheap-cap", dict(num_workers=1, max_usd_per_hour=0.5), frozenset()),
        ("impossible-cap", dict(num_workers=8, gpu_type="H100", max_usd_per_hour=1.0), frozenset()),
        ("full-region", dict(num_workers=1, gpu_type="L4", regions=("us-central1",)), frozenset()),
        (
            "full-region-or-other",
            dict(num_workers=1, gpu_type="L4", regions=("us-central1", "us-east4")),
            frozenset(),
        ),
    ]
    for name, kw, blocked in extra:
        out.append((name, JobRequest(**{**base, **kw}), blocked))
    # market=auto and the deadline rule near their boundaries: a 2 TB dataset held in one region
    # (copy hours count against the deadline), deadlines from hopeless to generous
    for steps, workers, deadline in itertools.product(
        (20_000, 100_000, 400_000), (1, 4), (0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 48)
    ):
        kw = dict(dataset_uri=BIG_DATASET, total_steps=steps, num_workers=workers, deadline_hours=deadline)
        out.append((f"big-{steps}-{workers}-{deadline}", JobRequest(**{**base, **kw}), frozenset()))
    return out


def test_winner_matches_an_independent_brute_force_scorer(world):
    cat, state = world
    state = dataclasses.replace(
        state,
        reservations=state.reservations + _full(cat, "us-central1", "L4"),
        replicas={**state.replicas, BIG_DATASET: ("europe-west4",)},
        dataset_bytes={**state.dataset_bytes, "sailor://asia-east1/d": 2 * 10**9, BIG_DATASET: 2 * 10**12},
    )
    index = index_for(cat)
    outcomes: Counter = Counter()
    for name, request, blocked in _requests():
        st = dataclasses.replace(state, blocked_zones=blocked) if blocked else state
        expected, capacity_only = brute_force(request, cat, st)
        # every feasible candidate, not only the winner: same count and the same scores
        ev = evaluate(request, index, st, view_for(index, st))
        assert np.count_nonzero(ev.feasible) == len(expected), name
        np.testing.assert_allclose(
            np.sort(ev.score[ev.feasible]),
            sorted(s.score for s in expected),
            rtol=1e-9,
            atol=1e-12,
            err_msg=name,
        )
        try:
            p = plan(request, cat, st, "r")
        except CapacityUnavailableError:
            assert not expected and capacity_only, name
            outcomes["capacity"] += 1
            continue
        except NoFeasibleOfferError:
            assert not expected and not capacity_only, name
            outcomes["infeasible"] += 1
            continue
        assert expected, f"{name}: placed in {p.zone} ({p.gpu_type}, {p.market}), brute force finds nothing"
        best = min(s.score for s in expected)
        assert p.score == pytest.approx(best, rel=1e-9, abs=1e-12), name
        tied = [s for s in expected if s.score <= best + 1e-9 * max(1.0, abs(best))]
        chosen = (p.zone, p.gpu_type, p.instance_type, p.gpus_per_node, p.market)
        match = [s for s in tied if s.key == chosen]
        assert match, f"{name}: {chosen} is not among the brute-force optima {[s.key for s in tied]}"
        # ties go to fewer VMs, then zone name
        assert p.num_nodes == match[0].nodes == min(s.nodes for s in tied), name
        assert p.zone == min(s.key[0] for s in tied if s.nodes == p.num_nodes), name
        outcomes["tied"] += len({s.key[0] for s in tied}) > 1
        assert p.usd_per_hour == pytest.approx(match[0].usd_per_hour, abs=1e-5), name
        outcomes[p.market] += 1
    # the requests exercise both markets and the infeasible path, not only one branch
    assert outcomes["spot"] >= 10 and outcomes["on_demand"] >= 10, outcomes
    assert outcomes["infeasible"] >= 1 and outcomes["capacity"] == 1 and outcomes["tied"] >= 1, outcomes
