"""Across regions the round loop is work-conserving: jobs start, wait and move where GPUs are free."""

from __future__ import annotations

import pytest

from sailor_tasks.catalog.throughput import load_packaged
from sailor_tasks.simulator import Region, SimConfig, SimJob, simulate
from sailor_tasks.simulator.rounds.replan import make_recovery
from sailor_tasks.simulator.rounds.routing import PlacementRouter, SimPlacement
from sailor_tasks.simulator.rounds.shard import MOVE_GAIN_S
from sailor_tasks.simulator.rounds.workload import run_throughput, total_gpu_seconds

RESNET = ("ResNet-50 (batch size 64)", 1)


def _job(table, name: str, v100_s: float, arrival_s: float = 0.0, key=RESNET) -> SimJob:
    """A job that needs ``v100_s`` seconds alone on a V100."""
    return SimJob(name, key, total_steps=table.throughput(key, "V100") * v100_s, arrival_s=arrival_s)


class QueueOnly:
    """The placement engine's router without ``start_now``: jobs stay where they were routed."""

    def __init__(self, router: PlacementRouter):
        self.inner, self.name = router, "placement"

    def route(self, job, runnable, load):
        return self.inner.route(job, runnable, load)


def _run(jobs, regions, table, queue_only=False, **kwargs):
    placement = SimPlacement(regions, table)
    router = PlacementRouter(placement)
    result = simulate(
        jobs,
        regions,
        table,
        SimConfig(**kwargs),
        router=QueueOnly(router) if queue_only else router,
        strategy=make_recovery("same_zone_first", placement),
    )
    return result, placement


def test_an_arriving_job_starts_on_idle_slower_gpus_instead_of_queueing_for_busy_faster_ones():
    table = load_packaged()
    regions = [Region("fast", {"A100": 2}), Region("slow", {"V100": 2})]
    # Two jobs hold both A100s for days; a third arrives a minute later.
    jobs = [_job(table, f"long{i}", 10 * 86400) for i in range(2)] + [_job(table, "late", 3600, arrival_s=60)]
    result, placement = _run(jobs, regions, table)
    assert placement.placements["late"].region == "slow"
    # It starts at the next round (360 s) on a V100 and runs its 3,600 s there without waiting.
    assert result.jct_by_job()["late"] == pytest.approx(360 - 60 + 3600, abs=1.0)
    # The A100 jobs are not slowed down: 10 days of V100 work at 2.2x.
    a100 = table.throughput(RESNET, "A100") / table.throughput(RESNET, "V100")
    assert result.jct_by_job()["long0"] == pytest.approx(10 * 86400 / a100, rel=1e-6)
    # Routed on the load view only, the engine queues it behind the A100s (demand 1.5 there is
    # still cheaper than a V100 at 2.2x the hours): it takes A100 rounds from the long jobs while
    # both V100s idle.
    queued, placement = _run(jobs, regions, table, queue_only=True)
    assert placement.placements["late"].region == "fast"
    assert queued.jct_by_job()["long0"] > result.jct_by_job()["long0"] + 360


class Pinned:
    """Arrivals go where their name says; later moves are the engine's (``start_now``)."""

    name = "pinned"

    def __init__(self, router: PlacementRouter, where: dict[str, int]):
        self.inner, self.where = router, where

    def route(self, job, runnable, load):
        return self.where[job.job_id]

    def start_now(self, job, load, free, exclude=None):
        if exclude is None:
            return self.where[job.job_id]
        return self.inner.start_now(job, load, free, exclude)


def test_a_job_that_gets_no_gpus_where_it_waits_moves_to_gpus_freed_in_another_region():
    table = load_packaged()
    regions = [Region("a", {"V100": 2}), Region("b", {"V100": 2})]
    # Region a holds two long jobs and two queued ones; region b two jobs that end after 1,000 s.
    jobs = [_job(table, f"long{i}", 20000) for i in range(2)]
    jobs += [_job(table, f"queued{i}", 5000) for i in range(2)]
    jobs += [_job(table, f"short{i}", 1000) for i in range(2)]
    where = {j.job_id: 1 if j.job_id.startswith("short") else 0 for j in jobs}
    runs = {}
    for moves in (True, False):
        placement = SimPlacement(regions, table)
        router = Pinned(PlacementRouter(placement), where)
        runs[moves] = simulate(
            jobs, regions, table, SimConfig(), router=router if moves else QueueOnly(router)
        )
    assert runs[True].completed == runs[False].completed == 6
    assert runs[True].waiting_moves == 2 and runs[False].waiting_moves == 0
    # Work-conserving: the queued jobs take b's GPUs after 1,000 s (at a round boundary) and end
    # 5,000 s later; left in a they share its two GPUs with the long jobs.
    jct = runs[True].jct_by_job()
    assert max(jct["queued0"], jct["queued1"]) <= 1000 + 360 + 5000
    assert runs[False].jct_by_job()["queued0"] > 1.5 * jct["queued0"]
    assert runs[True].makespan_s < runs[False].makespan_s


def test_a_running_job_moves_to_faster_gpus_freed_elsewhere_when_it_finishes_sooner_there():
    table = load_packaged()
    regions = [Region("fast", {"V100": 1}), Region("slow", {"K80": 1})]
    k80 = table.throughput(RESNET, "K80") / table.throughput(RESNET, "V100")
    jobs = [_job(table, "first", 1800), _job(table, "second", 7200)]
    result, placement = _run(jobs, regions, table)
    # "second" starts on the K80 and takes the V100 once "first" is done with it.
    assert result.faster_moves == 1 and placement.placements["second"].region == "fast"
    assert result.jct_by_job()["second"] < 0.5 * 7200 / k80
    # Nearly done on the K80 (it would finish less than MOVE_GAIN_S sooner on the V100): it stays.
    nearly = [_job(table, "first", 1800), _job(table, "second", 2000 * k80)]
    stays, placement = _run(nearly, regions, table)
    assert (2000 - 1800) * (1 - k80) < MOVE_GAIN_S
    assert stays.faster_moves == 0 and placement.placements["second"].region == "slow"


def test_a_running_job_is_offered_only_the_free_gpus_on_which_it_finishes_sooner():
    table = load_packaged()
    # When the V100 frees up, the engine alone would pick the cheap K80 (same speed as the one the
    # job runs on): the move is planned on the V100 only, the GPUs worth a restart.
    regions = [
        Region("slow", {"K80": 1}),
        Region("cheap", {"K80": 1}, usd_per_gpu_hour={"K80": 0.1}),
        Region("fast", {"V100": 1}, usd_per_gpu_hour={"V100": 10.0}),
    ]
    jobs = [_job(table, "first", 1800), _job(table, "second", 7200)]
    where = {"first": 2, "second": 0}
    placement = SimPlacement(regions, table)
    router = PlacementRouter(placement)
    free = [{"K80": 0}, {"K80": 1}, {"V100": 1}]
    assert router.start_now(jobs[1], [1.0, 0.0, 1.0], free, exclude=0) == 1
    result = simulate(jobs, regions, table, SimConfig(), router=Pinned(router, where))
    assert result.faster_moves == 1 and placement.placements["second"].region == "fast"


class _Flapping:
    """The spot region loses its GPUs for the last 400 s of every half hour, forever."""

    def capacity(self, region, gpu_type, t):
        if region.spot and t % 1800 >= 1400:
            return 0
        return int(region.gpus.get(gpu_type, 0))


def test_a_job_preempted_in_a_spot_region_is_not_sent_back_after_its_strategy_blocks_the_zone():
    table = load_packaged()
    regions = [Region("spot", {"A100": 1}, spot=True), Region("ondemand", {"V100": 1})]
    jobs = [_job(table, "long", 12 * 3600)]
    placement = SimPlacement(regions, table)
    result = simulate(
        jobs,
        regions,
        table,
        SimConfig(),
        availability=_Flapping(),
        router=PlacementRouter(placement),
        strategy=make_recovery("same_zone_first", placement),
    )
    assert result.completed == 1
    # Spot first (A100); preempted at 1,440 s, it goes on on the V100, back to the faster A100 once
    # (same_zone_first retries a zone that preempted it once), preempted there again: the zone is
    # blocked, so neither recovery nor a faster place sends it back, for the ~20 outages to come.
    assert result.preemptions == 2 and result.faster_moves == 1
    assert placement.placements["long"].region == "ondemand"


def test_a_job_larger_than_a_server_is_allocated_with_the_throughput_it_runs_at():
    table = load_packaged()
    key = ("LM (batch size 10)", 8)
    # On 4-GPU servers its 8 workers are always spread: 65.5 steps/s on V100 (615 consolidated),
    # 84.5 on P100. Allocated on consolidated figures it would go to the V100s.
    spread = {g: table.throughput(key, g, consolidated=False) for g in ("V100", "P100")}
    assert spread["P100"] > spread["V100"] and table.throughput(key, "V100") > spread["P100"]
    assert run_throughput(table, key, "P100", 4) == spread["P100"]
    assert run_throughput(table, key, "V100", 8) == table.throughput(key, "V100")
    job = SimJob("lm", key, total_steps=spread["P100"] * 3600, arrival_s=0.0)
    result = simulate([job], [Region("r", {"V100": 8, "P100": 8})], table, SimConfig(gpus_per_server=4))
    assert result.makespan_s == pytest.approx(3600.0)
    # The offered load counts the same speed.
    assert total_gpu_seconds([job], table, "P100", gpus_per_server=4) == pytest.approx(8 * 3600)
    assert total_gpu_seconds([job], table, "P100") < 8 * 3600


def test_a_job_moved_to_faster_gpus_is_not_preempted_in_the_region_it_left():
    """The long jobs move from the spot K80s to the V100s the short jobs free at the end of a
    round; the K80s' capacity goes at the next boundary, before the region's shard has heard of
    the move: no job there is preempted, and none recovered."""
    from sailor_tasks.simulator.rounds.hooks import TraceAvailability
    from sailor_tasks.traces.availability import AvailabilityTrace

    table = load_packaged()
    key = ("ResNet-18 (batch size 64)", 1)
    regions = [Region("spot", {"K80": 4}, spot=True), Region("dedicated", {"V100": 4})]
    jobs = [_job(table, f"short{i}", 600, key=key) for i in range(4)]
    jobs += [_job(table, f"long{i}", 20 * 3600, arrival_s=1.0, key=key) for i in range(4)]
    placement = SimPlacement(regions, table)
    result = simulate(
        jobs,
        regions,
        table,
        SimConfig(),
        availability=TraceAvailability({"spot": AvailabilityTrace(360.0, (0, 0, 0, 1, 0, 0))}),
        router=PlacementRouter(placement),
        strategy=make_recovery("same_zone_first", placement),
    )
    assert result.completed == 8 and result.faster_moves == 4
    assert (result.preemptions, result.recovery_moves) == (0, 0)
