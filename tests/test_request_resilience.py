"""Spot-resilience params: defaults, and bad values named with their valid choices."""

from __future__ import annotations

import pytest

from sailor_tasks.errors import InvalidRequestError
from sailor_tasks.request import from_params


def test_defaults_inject_nothing_and_let_the_sailor_strategy_recover():
    req = from_params({})
    assert req.strategy == "sailor" and req.recovery_strategy is None  # null: the strategy decides
    assert (
        from_params({"recovery_strategy": None}).recovery_strategy is None
    )  # the trigger form's empty field
    assert (req.inject_preemptions, req.inject_kills, req.preemption_rate_per_hour) == ((), (), 0.0)
    assert req.preemption_notice_s == 30.0 and not req.async_checkpoint


def test_unknown_recovery_strategy_lists_the_valid_ones():
    with pytest.raises(InvalidRequestError, match=r"recovery_strategy='nope'.*eager_next_region"):
        from_params({"recovery_strategy": "nope"})


def test_unknown_market_strategy_lists_the_valid_ones():
    with pytest.raises(InvalidRequestError, match=r"strategy='cheapest'.*on_demand.*spot_restart.*sailor"):
        from_params({"strategy": "cheapest"})


def test_a_market_strategy_is_not_a_recovery_override():
    with pytest.raises(InvalidRequestError, match=r"recovery_strategy='on_demand'"):
        from_params({"recovery_strategy": "on_demand"})


def test_injection_steps_beyond_the_run_are_rejected():
    with pytest.raises(InvalidRequestError, match=r"inject_kills=\[300\].*below total_steps=300"):
        from_params({"total_steps": 300, "inject_kills": [300]})


def test_injection_lists_are_sorted():
    req = from_params({"inject_preemptions": [50, 10], "inject_kills": [30]})
    assert req.inject_preemptions == (10, 50) and req.inject_kills == (30,)


@pytest.mark.parametrize(
    "param, value",
    [
        ("inject_preemptions", [10]),
        ("inject_kills", [10]),
        ("preemption_rate_per_hour", 2.0),
        ("preemption_trace_uri", "file:///trace.json"),
        ("preemption_notice_s", 60.0),  # on GKE the node's graceful shutdown window sets it
    ],
)
def test_injected_preemption_params_are_refused_off_the_local_backend(param, value):
    gke = {"backend": "gke", "image": "us-docker.pkg.dev/p/r/train:1", "command": ["python", "t.py"]}
    with pytest.raises(InvalidRequestError, match=rf"{param}=.*only the local backend injects preemptions"):
        from_params({**gke, param: value})
    assert from_params(gke).preemption_notice_s == 30.0  # the default is no setting
    assert getattr(from_params({param: value}), param) is not None  # the local backend takes it
