"""Market strategies: each one's decisions on hand-built timelines (notice, stock-out, slack exhausted)."""

from __future__ import annotations

import inspect
import math
import sys
from dataclasses import replace

import pytest

from sailor_tasks.model import JobRequest, Placement
from sailor_tasks.placement.context import RESTART_HOURS
from sailor_tasks.placement.slack import slack_allows_spot
from sailor_tasks.strategies import (
    MARKET_STRATEGIES,
    MarketContext,
    PreemptionRecord,
    RecoveryContext,
    SpotMove,
    Strategy,
    get_strategy,
    strategy_names,
)
from sailor_tasks.strategies import base as strategies_base
from sailor_tasks.strategies.market import expected_overhead_h

ZONES = {"us-central1": ("us-central1-a", "us-central1-b"), "europe-west4": ("europe-west4-a",)}
TICK_H = 300 / 3600


def placement(zone: str, market: str = "spot") -> Placement:
    return Placement(
        run_id="r",
        cloud="gcp",
        region=zone.rsplit("-", 1)[0],
        zone=zone,
        gpu_type="V100",
        gpus_per_node=1,
        num_nodes=1,
        num_gpus=1,
        market=market,
        instance_type="n1",
        usd_per_hour=1.0,
    )


def recovery(zone: str, *earlier: str) -> RecoveryContext:
    req = JobRequest(job_name="j", team="t", dataset_uri="sailor://source/d", model="tiny_gpt", num_workers=1)
    zones = (*earlier, zone)
    history = tuple(
        PreemptionRecord(attempt=i + 1, region=z.rsplit("-", 1)[0], zone=z, noticed=True)
        for i, z in enumerate(zones)
    )
    return RecoveryContext(req, placement(zone), history, ZONES)


def market_ctx(**kw) -> MarketContext:
    base = dict(
        now_h=0.0,
        remaining_h=8.0,
        deadline_h=1.2 * (8.0 + RESTART_HOURS),
        spot_launch_h=RESTART_HOURS,
        on_demand_launch_h=RESTART_HOURS,
        spot_usd_per_hour=1.0,
        on_demand_usd_per_hour=3.0,
        preemption_rate_per_hour=0.1,
    )
    base.update(kw)
    return MarketContext(**base)


def test_every_market_strategy_is_registered_and_implements_the_interface():
    assert set(MARKET_STRATEGIES) <= set(strategy_names())
    for name in MARKET_STRATEGIES:
        s = get_strategy(name)
        assert isinstance(s, Strategy)
        assert s.name == name


@pytest.mark.parametrize("name", strategy_names())
def test_every_registered_strategy_documents_its_event_sequence(name):
    """Each strategy's class docstring spells out its events as an arrow sequence, and both its
    module's docstring and the interface's (``strategies.base``) name it."""
    cls = type(get_strategy(name))
    doc = inspect.getdoc(cls) or ""
    assert "Events:" in doc, f"{cls.__qualname__} ({name}) has no 'Events:' line in its docstring"
    events = doc.split("Events:", 1)[1]
    assert "→" in events, f"{name}: no arrow sequence after 'Events:': {events!r}"
    module_doc = sys.modules[cls.__module__].__doc__ or ""
    assert f"``{name}``" in module_doc, f"{cls.__module__}'s docstring does not describe {name}"
    assert f"``{name}``" in (strategies_base.__doc__ or ""), f"strategies.base does not list {name}"


def test_on_demand_never_uses_spot_even_with_unbounded_slack():
    s = get_strategy("on_demand")
    for ctx in (market_ctx(), market_ctx(deadline_h=None), market_ctx(requested_market="spot")):
        assert s.choose_market(ctx).market == "on_demand"
    assert s.next_constraint(recovery("us-central1-a")).market == "on_demand"


def test_spot_restart_waits_for_the_preempted_zone():
    s = get_strategy("spot_restart")
    assert s.choose_market(market_ctx(deadline_h=0.5)).market == "spot"  # deadline-unaware
    c = s.next_constraint(recovery("us-central1-a"))
    assert c.wait_zone == "us-central1-a"
    assert not c.blocked_zones and not c.blocked_regions
    assert not s.checkpoint_on_notice


def test_eager_next_region_blocks_every_preempted_region():
    s = get_strategy("eager_next_region")
    assert s.choose_market(market_ctx(deadline_h=0.5)).market == "spot"
    c = s.next_constraint(recovery("europe-west4-a", "us-central1-b"))
    assert c.blocked_regions == {"us-central1", "europe-west4"}
    assert c.all_blocked_zones(ZONES) == {"us-central1-a", "us-central1-b", "europe-west4-a"}
    # an explicit on-demand request is kept
    assert s.choose_market(market_ctx(requested_market="on_demand")).market == "on_demand"


def test_sailor_preemption_with_notice_blocks_the_zone_and_stays_on_spot_while_slack_allows():
    s = get_strategy("sailor")
    assert s.checkpoint_on_notice
    # t=0: 8 h of work, deadline 20% over the on-demand time → spot
    launch = s.choose_market(market_ctx())
    assert launch.market == "spot"
    assert launch.slack_h == pytest.approx(1.2 * 8.1 - 8.0 - RESTART_HOURS)
    # t=3 h: notice in us-central1-a, checkpoint saved (no work lost): zone blocked, spot elsewhere
    c = s.next_constraint(recovery("us-central1-a"))
    assert c.blocked_zones == {"us-central1-a"} and c.wait_zone is None
    assert c.until_capacity  # a caller that sees capacity may use the zone again once it has some
    after = s.choose_market(market_ctx(now_h=3.0, remaining_h=5.0))
    assert after.market == "spot"
    assert "covers" in after.reason


def test_sailor_long_stock_out_waits_then_switches_to_on_demand_then_back():
    s = get_strategy("sailor")
    deadline = 1.2 * (8.0 + RESTART_HOURS)  # 9.72 h
    waiting = dict(remaining_h=8.0, spot_launch_h=TICK_H + RESTART_HOURS, deadline_h=deadline)
    decisions = []
    t = 0.0
    while t < 2.0:  # no spot zone has capacity for two hours; the strategy is asked every tick
        decisions.append((t, s.choose_market(market_ctx(now_h=t, **waiting)).market))
        t += TICK_H
    first_od = next(t for t, m in decisions if m == "on_demand")
    assert decisions[0][1] == "spot"  # waits at first
    assert all(m == "on_demand" for t, m in decisions if t >= first_od)  # once slack is short, it stays
    # when it switched, one on-demand launch still fits before the deadline
    assert deadline - first_od - 8.0 - RESTART_HOURS >= 0
    # on on-demand with most work done: the expected loss is small and slack returns → spot again
    back = s.choose_market(
        market_ctx(
            now_h=5.0,
            remaining_h=3.0,
            deadline_h=deadline,
            current_market="on_demand",
            on_demand_launch_h=0.0,
        )
    )
    assert back.market == "spot"


def test_sailor_slack_exhausted_goes_on_demand_and_says_why():
    s = get_strategy("sailor")
    d = s.choose_market(market_ctx(now_h=1.6, remaining_h=8.0, current_market="spot", spot_launch_h=0.0))
    assert d.market == "on_demand"
    assert d.slack_h == pytest.approx(1.2 * 8.1 - 1.6 - 8.0 - RESTART_HOURS)
    assert "does not cover" in d.reason


def test_sailor_without_deadline_uses_spot_when_cheaper_and_on_demand_when_not():
    s = get_strategy("sailor")
    assert s.choose_market(market_ctx(deadline_h=None)).market == "spot"
    assert s.choose_market(market_ctx(deadline_h=None, spot_usd_per_hour=3.5)).market == "on_demand"


def test_sailor_without_a_spot_offer_goes_on_demand_deadline_or_not():
    s = get_strategy("sailor")
    for deadline_h in (None, 100.0):
        d = s.choose_market(market_ctx(deadline_h=deadline_h, spot_launch_h=math.inf))
        assert d.market == "on_demand"
        assert "no spot offer" in d.reason


def test_sailor_keeps_an_explicit_market_request():
    s = get_strategy("sailor")
    assert s.choose_market(market_ctx(requested_market="on_demand")).market == "on_demand"
    assert s.choose_market(market_ctx(requested_market="spot", deadline_h=0.1)).market == "spot"


def test_sailor_uses_the_placement_slack_rule():
    """The strategy's choice agrees with placement.market.slack_allows_spot on the same numbers."""
    s = get_strategy("sailor")
    for now in (0.0, 0.5, 1.0, 1.3, 1.4, 1.6):
        ctx = market_ctx(now_h=now, current_market="spot", spot_launch_h=0.0)
        spot_slack = ctx.time_left_h - ctx.remaining_h
        expected = spot_slack >= RESTART_HOURS and bool(
            slack_allows_spot(spot_slack, ctx.remaining_h, expected_overhead_h(ctx))
        )
        assert (s.choose_market(ctx).market == "spot") == expected


def test_sailor_on_spot_moves_to_a_cheaper_zone_only_when_finishing_there_costs_less_in_time():
    """On spot at $2/h with 8 h left; another zone sells spot at $1/h. The move pays its launch
    (0.1 h there) and transfers, and needs the slack after its launch to keep the reserve."""
    s = get_strategy("sailor")
    on_spot = dict(current_market="spot", spot_launch_h=0.0, spot_usd_per_hour=2.0)
    cheap = SpotMove(1.0, RESTART_HOURS, 0.0, 0.1, RESTART_HOURS)
    d = s.choose_market(market_ctx(spot_move=cheap, **on_spot))
    assert d.market == "spot" and d.move and "moving" in d.reason
    # without a move on offer, or not running on spot, it stays
    assert not s.choose_market(market_ctx(**on_spot)).move
    assert not s.choose_market(market_ctx(spot_move=cheap, spot_usd_per_hour=2.0)).move
    # transfers that eat the saving: stay (8 h x $1/h saved, $9 to move)
    pricey = SpotMove(1.0, RESTART_HOURS, 9.0, 0.1, RESTART_HOURS)
    assert not s.choose_market(market_ctx(spot_move=pricey, **on_spot)).move
    # the move's launch (1.5 h of transfer) would eat the slack: stay
    far = SpotMove(1.0, 1.5, 0.0, 0.1, RESTART_HOURS)
    d = s.choose_market(market_ctx(spot_move=far, **on_spot))
    assert d.market == "spot" and not d.move
    # the reserve counts the on-demand fallback from the new zone: 1.7 h away > 1.62 h slack
    stranded = SpotMove(1.0, RESTART_HOURS, 0.0, 0.1, 1.7)
    assert not s.choose_market(market_ctx(spot_move=stranded, **on_spot)).move
    assert s.choose_market(market_ctx(spot_move=replace(stranded, on_demand_fallback_h=1.4), **on_spot)).move
    # no deadline: cheaper is enough
    assert s.choose_market(market_ctx(deadline_h=None, spot_move=far, **on_spot)).move


def test_sailor_prices_on_demand_with_the_on_demand_gpus_own_hours():
    """A run of any GPU type: spot's winner is an H100 (1.43 h of work at $2.34/h), on-demand's an L4
    (6.45 h at $1.99/h). Priced with spot's hours, on-demand looked cheaper ($3.06 against $3.64)
    and sailor left spot; with its own hours it costs $13.2, and spot wins."""
    ctx = MarketContext(
        now_h=0.0,
        remaining_h=1.433,
        deadline_h=None,
        spot_launch_h=0.1,
        on_demand_launch_h=0.1,
        spot_usd_per_hour=2.34,
        on_demand_usd_per_hour=1.99,
        preemption_rate_per_hour=0.05,
        lost_h_per_preemption=0.05,
        on_demand_remaining_h=6.45,
    )
    assert get_strategy("sailor").choose_market(ctx).market == "spot"
    assert replace(ctx, on_demand_remaining_h=None).on_demand_slack_h == math.inf
    # with a deadline, the slack recorded is on-demand's own: 8 h − 6.45 h − 0.1 h
    late = replace(ctx, deadline_h=8.0)
    assert late.on_demand_slack_h == pytest.approx(8.0 - 6.45 - 0.1)


def test_no_on_demand_offer_records_no_slack_rather_than_minus_infinity():
    ctx = MarketContext(
        now_h=0.0, remaining_h=2.0, deadline_h=5.0, on_demand_launch_h=math.inf, spot_launch_h=0.1
    )
    assert strategies_base.slack_of(ctx) is None
