"""Every availability source → per-zone traces: formats, zone/GPU binding, clear errors."""

from __future__ import annotations

import json

import pytest

from sailor_tasks.traces.sources import catalog_gpu, load_sources


def test_each_format_becomes_traces_bound_to_the_zone_it_names(tmp_path):
    (tmp_path / "V100_us-west1-b.json").write_text(
        json.dumps({"metadata": {"gap_seconds": 60}, "data": [0, 1, 0]})
    )
    (tmp_path / "pool.json").write_text(json.dumps([{"Time": 0, "GPUs": 4}, {"Time": 63, "GPUs": 2}]))
    (tmp_path / "prices.json").write_text(json.dumps({"not": "a trace"}))
    (tmp_path / "gpus.csv").write_text(
        ",Timestamp,A100-40_us-central1-a,V100-16_us-central1-b\n0,100.0,8,4\n1,220.0,0,4\n2,340.0,8,2\n"
    )
    traces = {t.name: t for t in load_sources([str(tmp_path)])}
    assert set(traces) == {
        "V100_us-west1-b",
        "pool",
        "gpus:A100-40_us-central1-a",
        "gpus:V100-16_us-central1-b",
    }
    flag = traces["V100_us-west1-b"]
    assert (flag.zone, flag.gpu_type, flag.trace.kind, flag.trace.data) == (
        "us-west1-b",
        "V100",
        "unavailable_flag",
        (0, 1, 0),
    )
    pool = traces["pool"]
    assert (pool.zone, pool.gpu_type, pool.trace.gap_seconds, pool.trace.data) == (None, None, 63.0, (4, 2))
    a100 = traces["gpus:A100-40_us-central1-a"]
    assert (a100.zone, a100.gpu_type, a100.trace.kind) == ("us-central1-a", "A100", "available_count")
    assert a100.trace.gap_seconds == 120.0 and a100.trace.data == (8, 0, 8)


def test_gcp_2020_logs_become_one_trace_per_zone_and_gpu(tmp_path):
    (tmp_path / "run.out").write_text(
        "[2020-03-01T10:00:00.000Z] Created instance i0 with 1 GPU(s) of type nvidia-tesla-v100 in zone us-west1-b\n"
        "[2020-03-01T10:15:00.000Z] Instance i0 running in zone us-west1-b\n"
        "[2020-03-01T10:30:00.000Z] Instance i0 running in zone us-west1-b\n"
        "[2020-03-01T10:45:00.000Z] Instance i0 not running in zone us-west1-b\n"
    )
    (t,) = load_sources([str(tmp_path / "run.out")])
    assert (t.zone, t.gpu_type, t.trace.gap_seconds) == ("us-west1-b", "V100", 900.0)
    assert t.trace.data == (0, 0, 0)  # alive at 10:00, 10:15 and 10:30 (its last running ping)


def _gcp_log(zone: str) -> str:
    return (
        f"[2020-03-01T10:00:00.000Z] Created instance i0 with 1 GPU(s) of type nvidia-tesla-v100 in zone {zone}\n"
        f"[2020-03-01T10:15:00.000Z] Instance i0 running in zone {zone}\n"
    )


def test_several_gcp_log_files_load_exactly_those_files(tmp_path):
    for folder, zone in (("a", "us-west1-b"), ("b", "us-central1-c"), ("c", "europe-west4-a")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "run.out").write_text(_gcp_log(zone))
    given = [str(tmp_path / "a" / "run.out"), str(tmp_path / "b" / "run.out")]
    assert sorted(t.zone for t in load_sources(given)) == ["us-central1-c", "us-west1-b"]  # not c's zone


def test_missing_paths_and_folders_without_traces_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"--availability '/nope/x': no such file or folder"):
        load_sources(["/nope/x"])
    (tmp_path / "readme.json").write_text("{}")
    with pytest.raises(ValueError, match=r"no availability trace found"):
        load_sources([str(tmp_path)])


def test_gpu_names_map_to_catalog_types():
    assert [catalog_gpu(n) for n in ("nvidia-tesla-v100", "A100-40", "V100-16", "p100", "nvidia-l4")] == [
        "V100",
        "A100",
        "V100",
        "P100",
        "L4",
    ]


def test_irregular_time_points_keep_their_durations(tmp_path):
    """Each count holds until the next Time: points 630 s, 63 s and 189 s apart are sampled every
    63 s, not one slot each (which read 10 GPUs at t=600 where the trace has 16)."""
    points = [
        {"Time": 0, "GPUs": 16},
        {"Time": 630, "GPUs": 10},
        {"Time": 693, "GPUs": 8},
        {"Time": 882, "GPUs": 4},
    ]
    (tmp_path / "A100_us-central1-a.json").write_text(json.dumps(points))
    (trace,) = load_sources([str(tmp_path)])
    t = trace.trace
    assert t.gap_seconds == 63.0 and len(t.data) == 15  # 0 … 882 s
    assert [t.data[t.slot(s)] for s in (0, 600, 650, 700, 881)] == [16, 16, 10, 8, 8]


CSV_HEADER = ",Timestamp,V100-16_us-west1-b\n"


def _csv_trace(tmp_path, rows: str):
    path = tmp_path / "gpus.csv"
    path.write_text(CSV_HEADER + rows)
    (trace,) = load_sources([str(path)])
    return trace.trace


def test_csv_rows_keep_their_durations_by_timestamp(tmp_path):
    """4 GPUs at 0 s, none from 60 s to 3600 s, 4 again from then: sampled every 60 s, not one
    slot per row (which read 4 GPUs from 120 s on)."""
    t = _csv_trace(tmp_path, "0,0,4\n1,60,0\n2,3600,4\n3,3660,4\n")
    assert t.gap_seconds == 60.0 and len(t.data) == 62  # 0 … 3660 s
    assert [t.at(s) for s in (0, 59, 60, 120, 1800, 3599, 3600, 3660)] == [4, 4, 0, 0, 0, 0, 4, 4]


def test_csv_rows_in_any_order_are_read_in_timestamp_order(tmp_path):
    ascending = _csv_trace(tmp_path, "0,0,4\n1,60,0\n2,3600,4\n3,3660,4\n")
    descending = _csv_trace(tmp_path, "0,3660,4\n1,3600,4\n2,60,0\n3,0,4\n")
    assert descending.data == ascending.data and descending.gap_seconds == ascending.gap_seconds


def test_irregular_csv_timestamps_land_on_their_nearest_slot(tmp_path):
    """Rows 123.2 s and 121.3 s apart (as in the Sailor planner's GPU traces): every row's count
    has its slot, the last one included."""
    t = _csv_trace(tmp_path, "0,1712574014.0187,32\n1,1712574137.19241,80\n2,1712574258.52282,128\n")
    assert t.gap_seconds == pytest.approx(121.3304) and t.data == (32, 80, 128)


def test_time_points_whose_spacing_is_inexact_in_floating_point_keep_every_count(tmp_path):
    """0.3 // 0.1 is 2 in floating point: the count at 0.3 s still gets its own slot."""
    points = [{"Time": 0, "GPUs": 1}, {"Time": 0.1, "GPUs": 2}, {"Time": 0.3, "GPUs": 3}]
    (tmp_path / "pool.json").write_text(json.dumps(points))
    (trace,) = load_sources([str(tmp_path)])
    assert trace.trace.gap_seconds == 0.1 and trace.trace.data == (1, 2, 2, 3)


def test_a_timestamp_given_twice_with_the_same_counts_is_read_once(tmp_path):
    t = _csv_trace(tmp_path, "0,0,4\n1,60,0\n2,60,0\n3,120,4\n")
    assert t.gap_seconds == 60.0 and t.data == (4, 0, 4)
