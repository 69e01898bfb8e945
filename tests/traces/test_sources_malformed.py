"""Malformed availability sources (``sailor simulate --strategy ... --availability``) must fail with
a ValueError naming the file and the bad value (the CLI reports ValueError as an error message),
not a KeyError/IndexError traceback or a silently accepted negative GPU count."""

from __future__ import annotations

import json

import pytest

from sailor_tasks.traces.sources import load_sources


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("V100_us-west1-b.json", json.dumps([{"Time": 0, "GPUs": 2}, {"Time": 60}]), "GPUs"),
        ("V100_us-west1-b.json", json.dumps([{"Time": 0, "GPUs": 2}, {"Time": 60, "GPUs": -4}]), "-4"),
        ("sailor.csv", ",Timestamp,V100-16_us-west1-b\n0,0,2\n1,60\n", "sailor.csv"),
        ("sailor.csv", ",Timestamp,V100-16_us-west1-b\n0,0,2\n1,60,-1\n", "-1"),
        ("V100_us-west1-b.json", "not json", "not valid JSON"),
        (
            "sailor.csv",
            ",Timestamp,V100-16_us-west1-b\n0,0,2\n1,60,4\n2,60,0\n",
            ":4: Timestamp='60' repeats line 3's time with another count: V100-16_us-west1-b 4 there, 0 here",
        ),
        (
            "V100_us-west1-b.json",
            json.dumps([{"Time": 0, "GPUs": 2}, {"Time": 60, "GPUs": 4}, {"Time": 60, "GPUs": 0}]),
            ": [2].Time=60 repeats [1]'s time with another count: GPUs 4 there, 0 here",
        ),
    ],
)
def test_a_malformed_trace_source_is_a_value_error_naming_the_file(tmp_path, name, text, fragment):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_sources([str(path)])
    assert name in str(info.value) and fragment in str(info.value)


def test_a_file_that_is_not_text_names_the_file(tmp_path):
    path = tmp_path / "V100_us-west1-b.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match="V100_us-west1-b.json: not valid JSON"):
        load_sources([str(tmp_path)])
