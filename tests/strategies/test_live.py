"""Live market choice: the run's strategy decides the market from the planner's estimates."""

from __future__ import annotations

import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.model import ClusterState, JobRequest
from sailor_tasks.strategies.live import decide_market, launch_context


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def request(**kw) -> JobRequest:
    base = dict(
        job_name="j",
        team="t",
        dataset_uri="sailor://source/d",
        model="gpt_25m",
        num_workers=1,
        gpu_type="A100",
        total_steps=2_000_000,
        checkpoint_every_steps=1000,
        max_usd_per_hour=50.0,
    )
    base.update(kw)
    return JobRequest(**base)


def test_context_comes_from_the_planner_estimates_for_the_remaining_steps(catalog):
    ctx, est = launch_context(request(deadline_hours=10.0), catalog, ClusterState())
    assert est["spot"]["market"] == "spot" and est["on_demand"]["market"] == "on_demand"
    assert ctx.remaining_h == pytest.approx(est["spot"]["expected_hours"])
    assert ctx.spot_usd_per_hour < ctx.on_demand_usd_per_hour
    assert ctx.preemption_rate_per_hour > 0
    half, _ = launch_context(request(deadline_hours=10.0), catalog, ClusterState(), steps_done=1_000_000)
    assert half.remaining_h == pytest.approx(ctx.remaining_h / 2)


def test_sailor_picks_spot_with_slack_and_on_demand_when_the_deadline_is_tight(catalog):
    ctx, _ = launch_context(request(), catalog, ClusterState())
    hours = ctx.remaining_h
    assert decide_market(request(deadline_hours=hours * 2), catalog, ClusterState()).market == "spot"
    tight = decide_market(request(deadline_hours=hours * 1.01), catalog, ClusterState())
    assert tight.market == "on_demand" and tight.reason.startswith("sailor: ")
    assert tight.slack_h == pytest.approx(hours * 0.01 - ctx.on_demand_launch_h)
    # the same deadline with most of the time already gone: on-demand too
    late = decide_market(request(deadline_hours=hours * 2), catalog, ClusterState(), elapsed_h=hours * 0.99)
    assert late.market == "on_demand"


def test_other_strategies_and_explicit_markets(catalog):
    state = ClusterState()
    assert decide_market(request(strategy="on_demand"), catalog, state).market == "on_demand"
    assert (
        decide_market(request(strategy="spot_restart", deadline_hours=0.5), catalog, state).market == "spot"
    )
    assert decide_market(request(market="on_demand"), catalog, state).market == "on_demand"


def test_a_market_without_feasible_offers_falls_back_to_the_other(catalog):
    # B200 VMs have 8 GPUs: a 1-GPU B200 run is infeasible on both markets; A100 with a price cap
    # below every on-demand price but above spot leaves only spot.
    d = decide_market(request(max_usd_per_hour=2.0, deadline_hours=1.0), catalog, ClusterState())
    assert d.market == "spot" and "no feasible on_demand offer" in d.reason


def test_the_on_demand_strategy_never_switches_to_spot(catalog):
    # The same cap leaves only spot feasible: the on_demand strategy stays on-demand (the planner
    # then says the cap refuses it) instead of running on preemptible GPUs.
    d = decide_market(
        request(max_usd_per_hour=2.0, deadline_hours=1.0, strategy="on_demand"), catalog, ClusterState()
    )
    assert d.market == "on_demand" and d.reason == "on_demand: never spot"


def test_a_launch_counts_the_data_copy_the_planner_counts():
    """The dataset must be copied into the only region the run allows: the copy takes most of the
    time before the deadline. The strategy's spot slack counts it, as the planner's deadline rule
    does, so the market it picks is one the planner can place (spot had looked 1.6 h slack and
    then been refused by the deadline, a permanent failure on a first launch)."""
    import dataclasses

    from sailor_tasks.catalog.offers import Catalog
    from sailor_tasks.model import Offer
    from sailor_tasks.placement import plan
    from sailor_tasks.placement.context import RESTART_HOURS

    def offer(zone):
        return Offer("gcp", zone.rsplit("-", 1)[0], zone, "V100", 1, "vm-v100-1", 2.0, 0.6, False, None, 0.2)

    catalog = Catalog((offer("europe-west4-a"), offer("us-east1-b")))
    uri = "sailor://us-east1/d"
    req = JobRequest(
        job_name="j", team="t", dataset_uri=uri, model="gpt_25m", num_workers=1, total_steps=20_000,
        checkpoint_every_steps=500, regions=("europe-west4",),
    )  # fmt: skip
    one_gb = launch_context(req, catalog, ClusterState(dataset_bytes={uri: 10**9}))[1]["spot"]
    hours, per_gb = one_gb["expected_hours"], one_gb["data_hours"]
    deadline = 2 * hours + 1.1  # on-demand fits with 1.6 h of copying, spot's expected losses do not
    state = ClusterState(dataset_bytes={uri: int((deadline - hours - 0.11) / per_gb * 1e9)})
    req = dataclasses.replace(req, deadline_hours=deadline)
    ctx, est = launch_context(req, catalog, state)
    assert est["spot"]["data_hours"] > 1
    assert ctx.spot_launch_h == pytest.approx(RESTART_HOURS + est["spot"]["data_hours"])
    decision = decide_market(req, catalog, state)
    placed = plan(dataclasses.replace(req, market=decision.market), catalog, state, "r")
    assert placed.market == decision.market == "on_demand"


def test_validate_accepts_an_auto_run_whose_spot_row_is_under_the_cap():
    """On-demand $1.20, spot $1.00 (often preempted), cap $1.10, market auto: the run's strategy
    picks spot and the planner places it; validate must not refuse it for the on-demand price."""
    import dataclasses

    from sailor_tasks.catalog.offers import Catalog
    from sailor_tasks.model import Offer
    from sailor_tasks.placement import catalog_errors, plan

    catalog = Catalog(
        (Offer("gcp", "us-east1", "us-east1-b", "V100", 1, "vm-v100-1", 1.2, 1.0, False, None, 2.0),)
    )
    req = JobRequest(
        job_name="j", team="t", dataset_uri="sailor://source/d", model="gpt_25m", num_workers=1,
        total_steps=20_000, checkpoint_every_steps=500, max_usd_per_hour=1.1,
    )  # fmt: skip
    assert catalog_errors(req, catalog) == []
    decision = decide_market(req, catalog, ClusterState())
    assert decision.market == "spot"
    assert (
        plan(dataclasses.replace(req, market=decision.market), catalog, ClusterState(), "r").usd_per_hour
        == 1.0
    )
    over = dataclasses.replace(req, max_usd_per_hour=0.9)  # under both rows: still refused
    assert [e.field for e in catalog_errors(over, catalog)] == ["max_usd_per_hour"]


def test_a_cap_under_every_on_demand_offer_is_refused_at_validate_for_the_on_demand_strategy(
    ctx, demo_dataset
):
    """``strategy=on_demand`` never picks spot, so with ``market=auto`` a price cap that only a
    spot offer meets is refused at validate (as planning would refuse it after queueing), and the
    same cap with a strategy that may pick spot is not."""
    from sailor_tasks import stages
    from sailor_tasks.errors import InvalidRequestErrors
    from sailor_tasks.placement import catalog_errors
    from sailor_tasks.strategies.live import as_planned

    def cheapest(market: str) -> float:  # of the 1-GPU VMs of the request's GPU type with capacity
        return min(
            o.usd_per_hour(market)
            for o in ctx.catalog.offers
            if o.gpu_type == "A100"
            and o.gpus_per_node == 1
            and (o.capacity_gpus is None or o.capacity_gpus >= 1)
        )

    cap = (cheapest("spot") + cheapest("on_demand")) / 2
    assert cheapest("spot") < cap < cheapest("on_demand")
    on_demand = request(strategy="on_demand", market="auto", max_usd_per_hour=cap)
    assert catalog_errors(on_demand, ctx.catalog) == []  # either market: spot meets the cap
    assert [e.field for e in catalog_errors(as_planned(on_demand), ctx.catalog)] == ["max_usd_per_hour"]
    params = {"dataset_uri": demo_dataset, "gpu_type": "A100", "num_workers": 1, "max_usd_per_hour": cap}
    with pytest.raises(InvalidRequestErrors) as info:
        stages.validate({**params, "strategy": "on_demand"}, "run-od", ctx)
    assert "max_usd_per_hour" in str(info.value)
    stages.validate({**params, "strategy": "sailor"}, "run-any", ctx)  # may pick spot: accepted


@pytest.mark.parametrize("strategy", ["eager_next_region", "spot_restart", "same_zone_first", "sailor"])
def test_a_market_no_offer_meets_the_deadline_on_gives_way_to_one_that_does(catalog, strategy):
    """200k steps on one L4 with a 6.6 h deadline: only on-demand meets it (the planner's deadline
    rule counts spot's expected preemption loss). Strategies that ignore deadlines picked spot and
    the run's first plan failed; with market=auto each now takes on-demand, which the plan places."""
    from dataclasses import replace

    from sailor_tasks.placement.engine import plan

    req = request(
        gpu_type="L4",
        total_steps=200_000,
        checkpoint_every_steps=20_000,
        deadline_hours=6.6,
        strategy=strategy,
    )
    decision = decide_market(req, catalog, ClusterState())
    assert decision.market == "on_demand"
    assert plan(replace(req, market=decision.market), catalog, ClusterState(), "r").market == "on_demand"
