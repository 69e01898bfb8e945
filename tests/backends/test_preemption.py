"""Preemption injection schedule: step and time events, seeded rates, traces, fired-once keys."""

from __future__ import annotations

import json

import pytest

from sailor_tasks.backends.preemption import InjectionSpec, due, step_events, time_events


def test_step_events_fire_once_each_at_or_after_their_step():
    spec = InjectionSpec(notice_steps=(10,), kill_steps=(5,))
    events = step_events(spec)
    assert [(e.key, e.noticed) for e in events] == [("kill@step5", False), ("notice@step10", True)]
    fired: set[str] = set()
    assert due(events, fired, step=4, elapsed_s=0) is None
    first = due(events, fired, step=7, elapsed_s=0)
    assert first is not None and first.key == "kill@step5"
    fired.add(first.key)
    assert due(events, fired, step=7, elapsed_s=0) is None  # a restart re-running steps 5..7 is spared
    assert due(events, fired, step=10, elapsed_s=0).key == "notice@step10"


def test_rate_events_are_seeded_per_attempt():
    spec = InjectionSpec(rate_per_hour=3600.0, seed=7)
    a1, a1_again, a2 = (time_events(spec, 1, 0.0), time_events(spec, 1, 0.0), time_events(spec, 2, 5.0))
    assert a1 == a1_again and a1[0].key == "rate@attempt1"
    assert a2[0].at_s >= 5.0 and a2[0].key == "rate@attempt2"


def test_trace_events_are_scaled_and_skip_times_the_run_was_down(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 1, 0, 0, 1, 0]}))
    spec = InjectionSpec(trace_uri=str(path), trace_time_scale=60.0)  # 1 trace minute per wall second
    assert [e.at_s for e in time_events(spec, 1, 0.0)] == [10.0, 40.0]
    assert [e.at_s for e in time_events(spec, 2, 20.0)] == [40.0]


def test_close_times_have_keys_of_their_own():
    """A fired event is remembered by its key: two times must never share one."""
    spec = InjectionSpec(times_s=(1_000_000.0, 1_000_004.0, 2.5, 2.5000001))
    keys = [e.key for e in time_events(spec, 1, 0.0)]
    assert len(set(keys)) == 4 and "time@1000000s" in keys and "time@2.5s" in keys
    fired = {k for k in keys if k != "time@1000004s"}
    assert due(time_events(spec, 1, 0.0), fired, step=None, elapsed_s=1_000_005).key == "time@1000004s"


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"notice_steps": (0,)}, "notice_steps"),
        ({"notice_s": -1}, "notice_s"),
        ({"trace_time_scale": 0}, "scale"),
    ],
)
def test_bad_specs_are_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        InjectionSpec(**kw)


def test_spec_round_trips_through_json():
    spec = InjectionSpec(notice_steps=(3, 9), kill_steps=(4,), notice_s=5.0, seed=1)
    assert InjectionSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert InjectionSpec().empty and not spec.empty
