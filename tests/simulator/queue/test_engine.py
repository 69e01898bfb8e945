"""The queue simulator: runs admitted by the live admission pass on simulated capacity. Invariants
(capacity never exceeded, non-preemptive, every run ends admitted, failed or timed out), the
Cameo guarantee, and ``sailor simulate --admission queue``."""

from __future__ import annotations

import itertools
import json

import pytest

from sailor_tasks.catalog.throughput import load_packaged
from sailor_tasks.simulator.queue import QueueJob, QueueSimConfig, mixed_queue, simulate_queue

SPOT = {"V100": 4, "T4": 4}
CAPPED = {"V100": 1, "T4": 1}


@pytest.fixture(scope="module")
def table():
    return load_packaged()


@pytest.fixture(scope="module")
def jobs(table):
    return mixed_queue(24, 3, table, tuple(SPOT), hours=6.0)


def sweep_max(intervals):
    """The most GPUs held at once over (start, end, gpus) intervals (an end frees before a start)."""
    events = sorted([(s, 1, g) for s, _, g in intervals] + [(e, 0, -g) for _, e, g in intervals])
    held = peak = 0
    for _, _, g in events:
        held += g
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize(
    ("policy", "on_demand"), list(itertools.product(("las", "fifo", "ftf", "edf"), (None, CAPPED)))
)
def test_capacity_is_never_exceeded_runs_hold_to_their_end_and_every_run_ends(table, jobs, policy, on_demand):
    result = simulate_queue(jobs, table, QueueSimConfig(SPOT, on_demand, policy))
    assert {r.state for r in result.runs} <= {"finished", "failed", "timed_out"}
    assert len(result.runs) == len(jobs) and sorted(result.admitted) == sorted(
        r.run_id for r in result.runs if r.state == "finished"
    )
    by_id = {j.run_id: j for j in jobs}
    groups: dict = {}
    for r in result.runs:
        if r.state != "finished":
            assert r.admitted_s is None and r.reason
            continue
        # Non-preemptive: it held its GPUs from admission for its whole run on the placed GPU type.
        job = by_id[r.run_id]
        speed = table.throughput(job.job_type, r.gpu_type, consolidated=r.num_nodes == 1)
        assert r.end_s - r.admitted_s == pytest.approx(job.total_steps / speed + 360.0, rel=1e-9)
        assert r.admitted_s >= r.arrival_s
        groups.setdefault((r.zone, r.gpu_type), []).append((r.admitted_s, r.end_s, r.gpus))
    for (zone, gpu), intervals in groups.items():
        assert sweep_max(intervals) <= result.capacity[(zone, gpu)]
    assert result.to_json()["overcommitted"] == 0
    if on_demand is not None:
        assert sum(n for (z, _), n in result.capacity.items() if z.startswith("on-demand")) == 2


def test_every_deadline_on_demand_can_meet_is_met_when_on_demand_is_not_capped(table, jobs):
    for policy in ("las", "fifo", "ftf", "edf"):
        result = simulate_queue(jobs, table, QueueSimConfig(SPOT, None, policy))
        with_deadline = [r for r in result.runs if r.deadline_s is not None]
        assert with_deadline and all(r.meetable for r in with_deadline)
        assert [r.run_id for r in with_deadline if r.missed] == []
        assert result.to_json()["latest_start_misses"] == 0


def test_runs_at_their_latest_start_go_on_demand_and_fail_early_when_it_is_full(table):
    # One V100 on spot, held for hours; two runs with a deadline arrive behind it.
    hog = QueueJob("hog", "a", ("LM (batch size 20)", 1), total_steps=64.74 * 3600 * 10, arrival_s=0.0)
    tight = [
        QueueJob(
            f"d{i}",
            "b",
            ("LM (batch size 20)", 1),
            total_steps=64.74 * 3600,
            arrival_s=60.0 + i,
            deadline_hours=3.0,
        )
        for i in range(2)
    ]
    config = QueueSimConfig({"V100": 1}, {"V100": 1}, "fifo")
    result = simulate_queue([hog, *tight], table, config)
    runs = {r.run_id: r for r in result.runs}
    assert runs["d0"].market == "on_demand" and not runs["d0"].missed
    # The run waited until its latest start (deadline − 1 h of work − one launch), not longer.
    assert runs["d0"].admitted_s == pytest.approx(runs["d0"].latest_start_s - 300.0)
    assert runs["d1"].state == "failed" and "cannot meet its deadline" in runs["d1"].reason
    assert runs["d1"].end_s is None and runs["d1"].missed


def test_a_run_that_waits_longer_than_max_queue_hours_times_out(table):
    hog = QueueJob("hog", "a", ("LM (batch size 20)", 1), total_steps=64.74 * 3600 * 5, arrival_s=0.0)
    waiter = QueueJob(
        "w", "b", ("LM (batch size 20)", 1), total_steps=1000, arrival_s=10.0, max_queue_hours=1.0
    )
    result = simulate_queue([hog, waiter], table, QueueSimConfig({"V100": 1}, {}, "las"))
    w = next(r for r in result.runs if r.run_id == "w")
    assert w.state == "timed_out" and "waited 1 h (max_queue_hours)" in w.reason


def test_las_shares_contended_capacity_between_teams_better_than_fifo(table):
    jobs = mixed_queue(40, 7, table, tuple(SPOT), hours=8.0)
    las = simulate_queue(jobs, table, QueueSimConfig(SPOT, None, "las"))
    fifo = simulate_queue(jobs, table, QueueSimConfig(SPOT, None, "fifo"))
    # fifo serves team a's burst first: team b holds (almost) nothing while both wait.
    assert las.share_ratio() is not None
    assert las.share_ratio() < (fifo.share_ratio() or float("inf"))
    assert las.to_json()["teams"]["b"]["avg_wait_h"] < fifo.to_json()["teams"]["b"]["avg_wait_h"]


def test_the_simulation_is_deterministic(table, jobs):
    a = simulate_queue(jobs, table, QueueSimConfig(SPOT, CAPPED, "las")).to_json()
    b = simulate_queue(jobs, table, QueueSimConfig(SPOT, CAPPED, "las")).to_json()
    assert a == b


def test_bad_inputs_name_the_value_and_the_choices(table):
    with pytest.raises(ValueError, match="queue policy 'sjf' is not one of las, fifo, ftf, edf"):
        QueueSimConfig(SPOT, None, "sjf")
    with pytest.raises(ValueError, match="market 'cheap' is not one of auto, spot, on_demand"):
        QueueJob("x", "a", ("LM (batch size 20)", 1), 10, 0.0, market="cheap")
    job = QueueJob("x", "a", ("LM (batch size 20)", 1), 10, 0.0)
    with pytest.raises(ValueError, match="'x' appears twice"):
        simulate_queue([job, job], table, QueueSimConfig(SPOT))
    with pytest.raises(ValueError, match="spot capacity .* no GPUs"):
        simulate_queue([job], table, QueueSimConfig({"V100": 0}))


def test_cli_runs_the_workload_through_the_queue(capsys):
    from sailor_tasks.cli.main import main

    argv = ["simulate", "--admission", "queue", "--queue-policy", "edf", "--jobs", "12", "--seed", "2"]
    argv += ["--cluster", "v100=4,t4=4", "--on-demand", "v100=1,t4=1", "--team-weights", "a=2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["admission"] == "queue" and out["policy"] == "edf" and out["runs"] == 12
    assert out["on_demand"] == {"V100": 1, "T4": 1} and set(out["teams"]) == {"a", "b"}
    assert out["overcommitted"] == 0 and len(out["jct_s"]) == out["finished"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--admission", "queue", "--jobs", "5", "--policy", "fifo"],
            "--policy: not read with --admission queue",
        ),
        (
            ["--admission", "queue", "--jobs", "5", "--regions", "2"],
            "--regions: not read with --admission queue",
        ),
        (["--jobs", "5", "--queue-policy", "fifo"], "--queue-policy: only read with --admission queue"),
        (["--admission", "queue", "--jobs", "5", "--on-demand", "v100=x"], "--on-demand item 'v100=x'"),
        (["--admission", "queue", "--jobs", "5", "--team-weights", "a=0"], "--team-weights item 'a=0'"),
        (
            ["--admission", "queue", "--jobs", "5", "--team-weights", "a=inf"],
            "--team-weights item 'a=inf': expected TEAM=WEIGHT with a weight from 0.001 to 1000",
        ),
        (
            ["--admission", "queue", "--jobs", "5", "--team-weights", "a=1e-320"],
            "--team-weights item 'a=1e-320'",
        ),
        (
            ["--jobs", "3", "--availability", "/nonexistent", "--bind", "exact"],
            "--availability, --bind: only read by the spot simulator",
        ),
        (
            ["--jobs", "3", "--strategy", "on_demand", "--policy", "fifo", "--cluster", "v100=4"],
            "--policy, --cluster: not read by the spot simulator",
        ),
    ],
)
def test_cli_refuses_options_of_the_other_simulator_and_bad_values(capsys, argv, message):
    from sailor_tasks.cli.main import main

    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--round-s", "--jobs-per-hour", "--arrival-hours"])
@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_cli_refuses_a_rate_or_length_that_is_not_a_finite_positive_number(capsys, flag, value):
    from sailor_tasks.cli.main import main

    argv = ["simulate", "--jobs", "3", flag, value]
    if flag == "--arrival-hours":
        argv += ["--admission", "queue"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert (
        exit_.value.code == 2 and f"argument {flag}: {value!r}: need a number > 0" in capsys.readouterr().err
    )


def test_the_wake_ups_of_a_run_admitted_early_start_no_pass(table, monkeypatch):
    """d (a deadline) waits behind a 1-hour hog and is admitted when it ends, long before its
    urgent time and latest start; w waits behind d. d's wake-ups then find nothing new: no pass
    runs at them, and the admissions are those of the passes that do run."""
    import sailor_tasks.simulator.queue.engine as engine

    hour = 64.74 * 3600  # steps of one hour of this job on a V100
    hog = QueueJob("hog", "a", ("LM (batch size 20)", 1), total_steps=hour, arrival_s=0.0)
    d = QueueJob(
        "d", "b", ("LM (batch size 20)", 1), total_steps=10 * hour, arrival_s=10.0, deadline_hours=12.0
    )
    w = QueueJob("w", "c", ("LM (batch size 20)", 1), total_steps=hour, arrival_s=20.0)
    at = []
    real = engine.admit

    def admit(queued, held, capacity, now_s, *args, **kwargs):
        at.append(now_s)
        return real(queued, held, capacity, now_s, *args, **kwargs)

    monkeypatch.setattr(engine, "admit", admit)
    result = simulate_queue([hog, d, w], table, QueueSimConfig({"V100": 1}, {}, "fifo"))
    runs = {r.run_id: r for r in result.runs}
    assert runs["d"].admitted_s == pytest.approx(runs["hog"].end_s) and runs["w"].state == "finished"
    latest = runs["d"].latest_start_s
    assert runs["d"].admitted_s < latest - 600 < runs["w"].admitted_s  # its wake-ups come while w waits
    assert not [t for t in at if runs["d"].admitted_s < t < runs["w"].admitted_s]  # nothing moved between
