"""Recovery strategies: registry, blocking by value, and re-planning through the real planner."""

from __future__ import annotations

import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.model import ClusterState, JobRequest
from sailor_tasks.placement import plan
from sailor_tasks.strategies import (
    PlacementConstraint,
    PreemptionRecord,
    RecoveryContext,
    get_strategy,
    register,
    strategy_names,
)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def zones_by_region(catalog):
    out: dict[str, tuple[str, ...]] = {}
    for o in catalog.offers:
        if o.zone not in out.get(o.region, ()):
            out[o.region] = (*out.get(o.region, ()), o.zone)
    return out


def request(**kw) -> JobRequest:
    return JobRequest(
        job_name="j",
        team="t",
        dataset_uri="sailor://source/d",
        model="tiny_gpt",
        num_workers=2,
        market="spot",
        max_usd_per_hour=50.0,
        **kw,
    )


def test_unknown_strategy_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"unknown strategy 'nope'; valid strategies: .*eager_next_region"):
        get_strategy("nope")
    assert {"same_zone_first", "eager_next_region"} <= set(strategy_names())


def test_registering_a_second_class_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="already registered"):

        @register("same_zone_first")
        class Impostor:
            def next_constraint(self, ctx):
                return PlacementConstraint()


def replan(strategy: str, rounds: int, catalog, zones_by_region):
    """Preempt the run ``rounds`` times in a row; re-plan each time with the strategy's constraint."""
    req = request()
    placement = plan(req, catalog, ClusterState(), "r")
    history: list[PreemptionRecord] = []
    blocked_each_round = []
    for attempt in range(1, rounds + 1):
        history.append(PreemptionRecord(attempt, placement.region, placement.zone, noticed=True))
        constraint = get_strategy(strategy).next_constraint(
            RecoveryContext(req, placement, tuple(history), zones_by_region)
        )
        blocked = constraint.all_blocked_zones(zones_by_region)
        placement = plan(req, catalog, ClusterState(blocked_zones=blocked), "r")
        blocked_each_round.append((blocked, placement))
    return history, blocked_each_round


def test_eager_next_region_never_replans_into_a_blocked_zone(catalog, zones_by_region):
    history, rounds = replan("eager_next_region", 5, catalog, zones_by_region)
    for (blocked, placement), _ in zip(rounds, history, strict=True):
        assert placement.zone not in blocked
    preempted_regions = [h.region for h in history]
    assert len(set(preempted_regions)) == len(preempted_regions)  # a new region every time
    for i, (_, placement) in enumerate(rounds):
        assert placement.region not in preempted_regions[: i + 1]
        # the whole region is blocked, not only the zone
        assert set(zones_by_region[preempted_regions[i]]) <= rounds[i][0]


def test_same_zone_first_retries_the_zone_then_moves_on(catalog, zones_by_region):
    history, rounds = replan("same_zone_first", 2, catalog, zones_by_region)
    (blocked1, second), (blocked2, third) = rounds
    assert blocked1 == frozenset() and second.zone == history[0].zone  # retried in place
    assert blocked2 == {history[0].zone} and third.zone != history[0].zone  # preempted twice: blocked


def test_constraint_expands_blocked_regions_to_their_zones(zones_by_region):
    region = next(iter(zones_by_region))
    c = PlacementConstraint(blocked_zones=frozenset({"x-zone"}), blocked_regions=frozenset({region}))
    assert c.all_blocked_zones(zones_by_region) == {"x-zone", *zones_by_region[region]}
