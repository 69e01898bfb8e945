"""Region shards in worker processes (``simulator/workers.py``) give the serial simulator's results."""

from __future__ import annotations

import json

import pytest

from sailor_tasks.catalog.throughput import load_packaged
from sailor_tasks.simulator import (
    Region,
    SimConfig,
    SimJob,
    TraceAvailability,
    generate_jobs,
    load_availability_trace,
    simulate,
)
from sailor_tasks.simulator.rounds.workers import LocalShard, RemoteShard, split_regions


def outcome(result) -> tuple[dict, tuple]:
    """Everything a run reports except its wall time."""
    out = result.to_json()
    out.pop("wall_s")
    return out, result.jct_s


def test_split_regions_covers_every_region_once_and_gives_the_caller_a_smaller_share():
    for n_regions, processes in [(10, 2), (5, 3), (2, 8), (4, 1), (3, 2), (10, 3)]:
        groups = split_regions(n_regions, processes)
        assert sorted(r for g in groups for r in g) == list(range(n_regions))
        assert len(groups) == min(processes, n_regions) and all(groups)
    assert split_regions(10, 2) == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]  # the caller also routes
    assert split_regions(2, 8) == [[0], [1]]  # never an empty shard
    assert split_regions(4, 1) == [[0, 1, 2, 3]]


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_give_the_serial_results(workers):
    table = load_packaged()
    jobs = generate_jobs(300, 40.0, table, seed=5)
    regions = [Region(f"r{i}", {"V100": 8, "A100": 8, "K80": 8}) for i in range(4)]
    serial = simulate(jobs, regions, table, SimConfig(seed=5))
    parallel = simulate(jobs, regions, table, SimConfig(seed=5, workers=workers))
    assert serial.completed == 300
    assert outcome(parallel) == outcome(serial)


def test_grants_prepared_ahead_are_those_plan_computes(monkeypatch):
    from sailor_tasks.simulator.rounds.shard import RegionShard

    table = load_packaged()
    jobs = generate_jobs(200, 30.0, table, seed=2)
    regions = [Region(f"r{i}", {"V100": 8, "A100": 8, "K80": 8}) for i in range(3)]
    used = []
    real_plan = RegionShard.plan

    def plan(self, t, events, *rest):
        used.append(sum(r.ahead is not None and r.ahead[0] == t for r in self.sims.values()))
        return real_plan(self, t, events, *rest)

    def result(self):  # every call in this process, prepare included (as a worker runs them)
        calls, self._calls = self._calls, []
        return [getattr(self.shard, method)(*args) for method, args in calls]

    monkeypatch.setattr(RegionShard, "plan", plan)
    monkeypatch.setattr(LocalShard, "result", result)
    ahead = simulate(jobs, regions, table, SimConfig())
    assert sum(used) > 0  # most rounds leave most regions unchanged
    monkeypatch.setattr(RegionShard, "prepare", lambda self, t: None)
    assert outcome(simulate(jobs, regions, table, SimConfig())) == outcome(ahead)


def test_workers_give_the_serial_results_with_spot_preemptions_and_moves(tmp_path):
    table = load_packaged()
    trace = tmp_path / "spot.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 1800}, "data": [0, 1, 0, 0, 1, 1, 0]}))
    spot = load_availability_trace(str(trace))
    regions = [
        Region(f"s{i}", {"V100": 8, "A100": 8}, {"V100": 1.0, "A100": 2.0}, spot=i % 2 == 0) for i in range(4)
    ]
    avail = TraceAvailability({r.name: spot for r in regions if r.spot})
    jobs = generate_jobs(150, 40.0, table, seed=1)
    serial = simulate(jobs, regions, table, SimConfig(), availability=avail)
    parallel = simulate(jobs, regions, table, SimConfig(workers=2), availability=avail)
    assert serial.preemptions > 0 and serial.recovery_moves > 0 and serial.cost_usd > 0
    assert serial.waiting_moves > 0 and serial.faster_moves > 0
    assert outcome(parallel) == outcome(serial)


def test_a_job_that_finished_is_not_preempted_when_its_region_loses_capacity():
    """Its lease outlives it until the region's next re-solve; a capacity loss in between must not
    count it as preempted nor move it (it would run again in the other region)."""
    table = load_packaged()
    key = ("ResNet-50 (batch size 64)", 1)
    v100 = table.throughput(key, "V100")
    short = SimJob("short", key, total_steps=v100 * 100, arrival_s=0.0)
    long = SimJob("long", key, total_steps=v100 * 3600, arrival_s=0.0)
    regions = [Region("spot", {"V100": 1}, spot=True), Region("ondemand", {"V100": 1})]

    class ByName:
        def route(self, job, runnable, load):
            return 0 if job.job_id == "short" else 1

    class Gone:
        def capacity(self, region, gpu_type, t):
            return 0 if region.spot and t >= 100 else int(region.gpus.get(gpu_type, 0))

    class ToOnDemand:
        def on_preemption(self, job, region, now, available, load, free=None):
            return 1

    for workers in (1, 2):
        result = simulate(
            [short, long],
            regions,
            table,
            SimConfig(workers=workers),
            availability=Gone(),
            router=ByName(),
            strategy=ToOnDemand(),
        )
        assert result.completed == 2
        assert result.preemptions == 0 and result.recovery_moves == 0
        # "long" keeps the on-demand GPU to itself: it finishes after exactly its 3600 s.
        assert result.makespan_s == pytest.approx(3600.0)


def test_a_worker_reports_its_errors_to_the_caller():
    table = load_packaged()
    jobs = generate_jobs(5, 10.0, table, seed=0)
    bad = SimConfig(policy="srtf")  # not a policy: the worker's shard cannot be built
    shard = RemoteShard((jobs, [Region("r", {"V100": 4})], [0], table, bad))
    try:
        shard.submit([("plan", (0.0, []))])
        with pytest.raises(ValueError, match="srtf"):
            shard.result()
    finally:
        shard.close()
    assert shard.process.exitcode == 0


def test_workers_must_be_at_least_one():
    with pytest.raises(ValueError, match="workers=0"):
        SimConfig(workers=0)


def test_cli_workers_option(capsys):
    from sailor_tasks.cli.main import main

    base = "simulate --jobs 30 --jobs-per-hour 20 --cluster v100=4,k80=4 --regions 3".split()
    runs = []
    for workers in ("1", "2"):
        assert main([*base, "--workers", workers, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        out.pop("wall_s")
        runs.append(out)
    assert runs[0] == runs[1] and runs[0]["completed"] == 30
    assert main([*base, "--workers", "0", "--json"]) == 2
    assert "--workers 0: need ≥ 1" in capsys.readouterr().err


def test_generated_jobs_need_the_baseline_gpu_in_the_table_and_say_so():
    """Durations are drawn on V100: a table without it is refused naming what it measures."""
    from sailor_tasks.catalog.throughput import ThroughputTable

    table = ThroughputTable({("ResNet-18 (batch size 64)", 1): {"K80": 1.0, "P100": 2.0}})
    with pytest.raises(ValueError, match=r"measured on V100.*GPU types it measures: K80, P100"):
        generate_jobs(5, 10.0, table)
