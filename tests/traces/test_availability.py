"""Availability traces: parsing, validation, preemption times and rates."""

from __future__ import annotations

import json

import pytest

from sailor_tasks.traces.availability import load_availability_trace, parse_availability_trace


def test_binary_trace_preemptions_are_available_to_unavailable_edges():
    trace = parse_availability_trace({"metadata": {"gap_seconds": 60}, "data": [0, 0, 1, 1, 0, 1, 0]})
    assert trace.kind == "unavailable_flag"
    assert trace.preemption_times() == (120.0, 300.0)
    assert trace.unavailable_fraction == pytest.approx(3 / 7)
    assert trace.preemptions_per_hour() == pytest.approx(2 / (4 * 60 / 3600))


def test_count_traces_are_inferred_and_drops_are_preemptions():
    trace = parse_availability_trace({"metadata": {"gap_seconds": 10}, "data": [4, 4, 2, 3, 0]})
    assert trace.kind == "available_count"
    assert trace.preemption_times() == (20.0, 40.0)


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ({"data": [0]}, "'metadata' and 'data'"),
        ({"metadata": {"gap_seconds": 0}, "data": [0]}, "gap_seconds=0"),
        ({"metadata": {"gap_seconds": 5}, "data": []}, "non-empty"),
        ({"metadata": {"gap_seconds": 5}, "data": [0, -1]}, r"data\[1\]=-1"),
    ],
)
def test_malformed_traces_are_rejected_naming_the_field(obj, match):
    with pytest.raises(ValueError, match=match):
        parse_availability_trace(obj, source="t.json")


def test_load_from_a_path(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": [0, 1, 0]}))
    trace = load_availability_trace(str(path))
    assert trace.duration_s == 3 * 3600 and trace.source.endswith("trace.json")
