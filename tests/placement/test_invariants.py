"""Invariants of the engine over many seeded requests on the full packaged catalog (Gavel-style):
the winner is the minimum over every feasible candidate and satisfies every hard rule."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from sailor_tasks.catalog import load_catalog
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
