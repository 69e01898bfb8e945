"""Availability traces: parsing, validation, preemption times and rates."""

from __future__ import annotations

import json

import pytest

from sailor_tasks.traces.availability import (
    FORMAT,
    AvailabilityTrace,
    load_availability_trace,
    parse_availability_trace,
)


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


def test_the_trace_repeats_past_its_end():
    trace = AvailabilityTrace(60.0, (0, 1, 0))
    assert [trace.slot(t) for t in (0, 59.9, 60, 179, 180, 245)] == [0, 0, 1, 2, 0, 1]
    assert [trace.at(t) for t in (0, 60, 130, 180, 240)] == [0, 1, 0, 0, 1]


def test_integral_floats_are_read_as_integers():
    trace = parse_availability_trace({"metadata": {"gap_seconds": 60}, "data": [0.0, 3.0, 1]})
    assert trace.data == (0, 3, 1) and all(type(v) is int for v in trace.data)
    assert trace.kind == "available_count"
    with pytest.raises(ValueError, match=r"data\[0\]=0\.5"):
        parse_availability_trace({"metadata": {"gap_seconds": 60}, "data": [0.5]})


def test_load_errors_name_the_file_and_the_expected_format(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"metadata": {}, "data": [0]}))
    with pytest.raises(ValueError, match="bad.json") as err:
        load_availability_trace(str(bad))
    assert FORMAT in str(err.value) and "gap_seconds=None" in str(err.value)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json.*not JSON") as err:
        load_availability_trace(str(broken))
    assert FORMAT in str(err.value)


def test_kind_can_be_forced(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [0, 1, 1]}))
    assert load_availability_trace(str(path)).kind == "unavailable_flag"
    assert load_availability_trace(str(path), kind="available_count").kind == "available_count"
