"""Spot capacity that goes or comes back inside a round (``ReportsChanges``): jobs progress only
while their GPUs are there, and are preempted at the next round start."""

from __future__ import annotations

import pytest

from sailor_tasks.catalog.throughput import load_packaged
from sailor_tasks.simulator import AvailabilityTrace, Region, SimConfig, SimJob, TraceAvailability, simulate

KEY = ("ResNet-50 (batch size 64)", 1)


def _job(job_id: str, seconds: float, table) -> SimJob:
    """A 1-GPU job that runs ``seconds`` alone on a V100."""
    return SimJob(job_id, KEY, total_steps=table.throughput(KEY, "V100") * seconds, arrival_s=0.0)


class _ByName:
    """Routes job ``jN`` to region N (no moves to free GPUs: no ``start_now``)."""

    def route(self, job, runnable, load):
        return int(job.job_id[1:])


def _run(jobs, regions, traces, table, round_s=360.0, **kwargs):
    return simulate(
        jobs,
        regions,
        table,
        SimConfig(policy="fifo", round_s=round_s, recovery="stay_in_region"),
        availability=TraceAvailability(traces),
        **kwargs,
    )


def test_capacity_lost_inside_a_round_stops_the_job_then_and_returning_capacity_restarts_it():
    """Available 0-900 s, gone 900-1800 s. The 2000 s job runs 900 s (rounds at 0, 360, 720: the
    third stops at 900), waits, and runs its last 1100 s from 1800 s: JCT 2900 s, 2000 GPU-s."""
    table = load_packaged()
    region = Region("r0", {"V100": 1}, {"V100": 1.0}, spot=True)
    trace = AvailabilityTrace(900.0, (0, 1) + (0,) * 50)
    result = _run([_job("j0", 2000, table)], [region], {"r0": trace}, table)
    assert result.jct_by_job() == {"j0": pytest.approx(2900.0)}
    assert result.preemptions == 1
    assert result.cost_usd == pytest.approx(2000 / 3600)  # no GPU time after the capacity went
    assert result.utilization * result.makespan_s == pytest.approx(2000.0)


def test_a_gap_shorter_than_a_round_preempts_and_the_job_restarts_when_capacity_returns():
    """Gone 400-500 s only, inside the round starting at 360 s: the job stops at 400 s (that round
    ends then, nothing else runs), the round in which nothing runs ends at 500 s, and the job's last
    1600 s run from there: JCT 2100 s."""
    table = load_packaged()
    region = Region("r0", {"V100": 1}, spot=True)
    trace = AvailabilityTrace(100.0, (0, 0, 0, 0, 1) + (0,) * 50)
    result = _run([_job("j0", 2000, table)], [region], {"r0": trace}, table)
    assert result.jct_by_job() == {"j0": pytest.approx(2100.0)}
    assert result.preemptions == 1


def test_a_job_stopped_inside_a_round_is_preempted_even_when_capacity_is_back_at_the_next_round():
    """j1 keeps the rounds 360 s long in an on-demand region; j0's spot capacity is gone 400-500 s
    only. j0 runs 0-400 s, is preempted at the round start at 720 s (capacity back by then) and
    runs its last 1600 s from there: JCT 2320 s."""
    table = load_packaged()
    regions = [Region("r0", {"V100": 1}, spot=True), Region("r1", {"V100": 1})]
    trace = AvailabilityTrace(100.0, (0, 0, 0, 0, 1) + (0,) * 50)
    jobs = [_job("j0", 2000, table), _job("j1", 5000, table)]
    for workers in (1, 2):
        result = simulate(
            jobs,
            regions,
            table,
            SimConfig(policy="fifo", recovery="stay_in_region", workers=workers),
            availability=TraceAvailability({"r0": trace}),
            router=_ByName(),
        )
        assert result.jct_by_job() == {"j0": pytest.approx(2320.0), "j1": pytest.approx(5000.0)}
        assert result.preemptions == 1
        assert result.utilization * result.makespan_s * 2 == pytest.approx(7000.0)  # GPU-s on 2 GPUs


def test_a_count_that_drops_inside_a_round_stops_every_job_on_the_type():
    """2 V100, but 1 from 200 s to 300 s. Both 1000 s jobs stop at 200 s (every lease on a shrunk
    type is revoked) and are preempted; fifo runs j0 alone from 200 s for a whole round (capacity
    that comes back ends only a round in which nothing runs), then both from 560 s: j0 finishes at
    1000 s, j1 runs its last 800 s from 560 s (1360 s)."""
    table = load_packaged()
    region = Region("r0", {"V100": 2}, spot=True)
    trace = AvailabilityTrace(100.0, (2, 2, 1) + (2,) * 50, "available_count")
    jobs = [_job("j0", 1000, table), _job("j1", 1000, table)]
    result = _run(jobs, [region], {"r0": trace}, table)
    assert result.jct_by_job() == {"j0": pytest.approx(1000.0), "j1": pytest.approx(1360.0)}
    assert result.preemptions == 2


def test_trace_changes_are_the_first_times_the_new_slot_is_read():
    region = Region("r", {"V100": 4}, spot=True)
    counts = TraceAvailability({"r": AvailabilityTrace(60.0, (4, 2, 2, 6, 0), "available_count")})
    # Capped at the region's 4 GPUs; the trace repeats past its 300 s.
    assert counts.changes(region, "V100", 30.0, 400.0) == [
        (60.0, 2),
        (180.0, 4),
        (240.0, 0),
        (300.0, 4),
        (360.0, 2),
    ]
    assert counts.changes(region, "V100", 60.0, 180.0) == []  # the end is excluded
    assert counts.changes(Region("r", {"V100": 4}), "V100", 0.0, 400.0) == []  # not spot
    # A gap whose multiples are not exact in floating point: each time reads its new slot.
    flags = TraceAvailability({"r": AvailabilityTrace(0.1, (0, 0, 0, 1, 0))})
    changes = flags.changes(region, "V100", 0.0, 0.5)
    assert [usable for _, usable in changes] == [0, 4]
    for at, usable in changes:
        assert flags.capacity(region, "V100", at) == usable
