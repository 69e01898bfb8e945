"""GCP 2020 preemption logs: instance lifetimes, preemptions vs stock-outs, per-zone rates."""

from __future__ import annotations

import pytest

from sailor_tasks.traces.gcp_2020 import load_gcp_logs, parse_gcp_log

LOG = """\
Zone: us-west1-b, GPU type: nvidia-tesla-v100, Number of GPUs: 1, Price per hour: $0.851
[2020-03-01T10:00:00.000Z] Created instance instance0 with 1 GPU(s) of type nvidia-tesla-v100 in zone us-west1-b
[2020-03-01T10:00:01.000Z] Instance instance0 running in zone us-west1-b
[2020-03-01T10:01:00.000Z] Instance instance1 creation failed
[2020-03-01T10:01:01.000Z] Instance instance1 not running in zone us-east1-c
[2020-03-01T11:00:00.000Z] Instance instance0 running in zone us-west1-b
[2020-03-01T11:15:00.000Z] Instance instance0 not running in zone us-west1-b
[2020-03-01T11:15:05.000Z] Successfully deleted instance instance0
[2020-03-01T11:20:00.000Z] Created instance instance0 with 1 GPU(s) of type nvidia-tesla-v100 in zone us-west1-b
[2020-03-01T12:20:00.000Z] Instance instance0 running in zone us-west1-b
[2020-03-01T12:21:00.000Z] Successfully deleted instance instance0
"""


def test_running_then_not_running_is_a_preemption_and_failed_creation_a_stockout():
    log = parse_gcp_log(LOG.splitlines())
    kinds = [(e.kind, e.zone) for e in log.events]
    assert kinds == [
        ("created", "us-west1-b"),
        ("creation_failed", "us-east1-c"),
        ("preempted", "us-west1-b"),
        ("created", "us-west1-b"),
    ]
    stats = log.zone_stats()
    west = stats["us-west1-b"]
    assert west.preemptions == 1 and west.creations == 2
    assert west.instance_hours == pytest.approx(1.0 + 1.0)  # to the last 'running' ping
    assert west.preemptions_per_hour == pytest.approx(0.5)
    assert stats["us-east1-c"].stockout_fraction == 1.0
    assert log.preemption_times("us-west1-b") == (4500.0,)


def test_unknown_event_lines_are_reported_with_their_line():
    with pytest.raises(ValueError, match=r"x.out:1: unrecognised event 'Instance exploded'"):
        parse_gcp_log(["[2020-03-01T10:00:00.000Z] Instance exploded"], source="x.out")


def test_real_logs_give_per_zone_rates(shared_data):
    log = load_gcp_logs(shared_data / "gcp_preemption_2020" / "logs")
    stats = log.zone_stats()
    assert {"us-central1-c", "us-east1-c", "us-west1-b"} <= set(stats)
    for s in stats.values():
        assert s.preemptions > 0 and s.instance_hours > 0
        assert 0.05 < s.preemptions_per_hour < 10  # preemptible VMs of 2020: hours, not minutes or weeks
    assert sum(len(log.preemption_times(z)) for z in stats) == sum(s.preemptions for s in stats.values())


def test_a_zone_becomes_a_replayable_availability_trace():
    from sailor_tasks.traces.gcp_2020 import to_availability_trace

    log = parse_gcp_log(LOG.splitlines())
    trace = to_availability_trace(log, "us-west1-b", gap_seconds=900)
    # alive 10:00-11:00, gone 11:15-11:20 (preempted), alive 11:20-12:20
    assert trace.data == (0, 0, 0, 0, 0, 1, 0, 0, 0, 0)
    assert trace.preemption_times() == (4500.0,) == log.preemption_times("us-west1-b")
    with pytest.raises(ValueError, match=r"zone='mars-1a' has no instances.*us-west1-b"):
        to_availability_trace(log, "mars-1a")


def test_a_zone_without_the_gpu_type_has_no_stats_for_it_and_no_trace_of_it():
    """us-east1-c ran a K80 only: for V100 it has no rate (not 0 preemptions/h) and no trace, and
    the error lists only the zones that ran a V100."""
    from sailor_tasks.traces.gcp_2020 import to_availability_trace

    k80 = """\
[2020-03-01T10:00:00.000Z] Created instance k0 with 1 GPU(s) of type nvidia-tesla-k80 in zone us-east1-c
[2020-03-01T10:15:00.000Z] Instance k0 running in zone us-east1-c
[2020-03-01T10:30:00.000Z] Successfully deleted instance k0
"""
    log = parse_gcp_log((LOG + k80).splitlines())
    assert set(log.zone_stats("nvidia-tesla-v100")) == {"us-west1-b"}
    assert set(log.zone_stats("nvidia-tesla-k80")) == {"us-east1-c"}
    assert log.zone_stats("nvidia-tesla-k80")["us-east1-c"].creations == 1
    with pytest.raises(ValueError) as err:
        to_availability_trace(log, "us-east1-c", "nvidia-tesla-v100")
    assert str(err.value) == (
        "zone='us-east1-c' has no nvidia-tesla-v100 instances in the logs; "
        "zones with nvidia-tesla-v100 instances: us-west1-b"
    )
