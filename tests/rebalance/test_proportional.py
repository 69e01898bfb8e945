from __future__ import annotations

import pytest

from sailor_tasks.rebalance.proportional import region_load, solve


def test_shares_follow_usage_and_sum_to_one():
    shares = solve({("a", "r1"): 9.0, ("a", "r2"): 1.0}, {"r1": 1.0, "r2": 1.0}, prior_weight=0.0)
    assert shares == {"a": {"r1": 0.9, "r2": 0.1}}


def test_prior_spreads_a_small_team_by_supply():
    shares = solve({("b", "r1"): 0.0}, {"r1": 1.0, "r2": 3.0}, prior_weight=1.0)
    assert shares["b"] == pytest.approx({"r1": 0.25, "r2": 0.75})


def test_region_load_flags_the_crowded_region():
    load = region_load({("a", "r1"): 3.0, ("b", "r2"): 1.0}, {"r1": 1.0, "r2": 1.0})
    assert load == pytest.approx({"r1": 1.5, "r2": 0.5})


def test_empty_supply_is_an_error():
    with pytest.raises(ValueError, match="supply is empty"):
        solve({("a", "r1"): 1.0}, {})
