"""The simulator routes and recovers through the placement engine and the strategies registry."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sailor_tasks.catalog.throughput import ThroughputTable, load_packaged
from sailor_tasks.placement import plan
from sailor_tasks.simulator import (
    AvailabilityTrace,
    Region,
    SimConfig,
    SimJob,
    TraceAvailability,
    generate_jobs,
    simulate,
)
from sailor_tasks.simulator.rounds.replan import StrategyRecovery, make_recovery, recovery_names
from sailor_tasks.simulator.rounds.routing import PlacementRouter, SimPlacement, make_router
from sailor_tasks.strategies import RecoveryContext, get_strategy

RESNET = ("ResNet-50 (batch size 64)", 1)


def _regions() -> list[Region]:
    return [
        Region("east", {"V100": 8, "K80": 8}, {"V100": 2.48, "K80": 0.45}),
        Region("west", {"A100": 4, "P100": 8}, {"A100": 3.67, "P100": 1.46}),
        Region("north", {"V100": 4}, {"V100": 1.9}),
    ]


@pytest.mark.parametrize(
    "load",
    [(0.2, 0.2, 0.2), (1.8, 0.4, 0.9), (0.3, 2.5, 0.1), (3.0, 3.0, 0.5), (0.0, 0.95, 1.05)],
)
def test_router_returns_what_the_placement_engine_plans_for_the_same_request_and_view(load):
    table = load_packaged()
    sim = SimPlacement(_regions(), table)
    router = PlacementRouter(sim)
    for job in generate_jobs(40, 10.0, table, seed=1):
        # The engine's own entry point (full explanation, no batch) on the same request and view.
        expected = plan(sim.request(job), sim.catalog, sim.state(load), job.job_id, index=sim.index)
        got = router.route(job, [True] * 3, list(load))
        assert sim.regions[got].name == expected.region
        assert sim.placements[job.job_id].gpu_type == expected.gpu_type
        assert sim.placements[job.job_id].zone == expected.zone


def test_router_moves_load_away_from_overloaded_regions():
    table = load_packaged()
    identical = [Region(f"r{i}", {"V100": 8, "A100": 8}, {"V100": 2.0, "A100": 4.0}) for i in range(3)]
    router = PlacementRouter(SimPlacement(identical, table))
    job = SimJob("j", RESNET, total_steps=1e5, arrival_s=0.0)
    assert router.route(job, [True] * 3, [1.5, 0.5, 0.9]) == 1
    assert router.route(job, [True] * 3, [0.3, 0.5, 0.9]) == 0
    assert router.route(job, [True] * 3, [2.0, 2.2, 1.1]) == 2


def test_engine_picks_the_gpu_type_from_the_simulators_throughput_table():
    # A table in which K80 is 10x faster than V100 for this job: the router must follow it, not
    # the packaged table (where V100 is faster), because policies allocate with this table too.
    key = ("Toy (batch size 1)", 1)
    table = ThroughputTable(alone={key: {"V100": 1.0, "K80": 10.0}})
    regions = [Region("v", {"V100": 4}, {"V100": 1.0}), Region("k", {"K80": 4}, {"K80": 1.0})]
    sim = SimPlacement(regions, table)
    router = PlacementRouter(sim)
    job = SimJob("j", key, total_steps=1000.0, arrival_s=0.0)
    assert router.route(job, [True, True], [0.5, 0.5]) == 1
    assert router.summary() == {"K80": 1}
    assert sim.index.throughput is table


def test_a_job_too_large_for_every_region_is_rejected_with_the_engines_reason():
    table = load_packaged()
    router = PlacementRouter(SimPlacement([Region("r", {"V100": 2})], table))
    job = SimJob("big", ("ResNet-50 (batch size 64)", 4), total_steps=10.0, arrival_s=0.0)
    with pytest.raises(ValueError, match=r"big .*no region can run it \(CapacityUnavailableError|NoFeasible"):
        router.route(job, [False], [0.0])


def test_recovery_applies_the_strategys_constraint_through_the_engine():
    table = load_packaged()
    regions = _regions()
    sim = SimPlacement(regions, table)
    job = SimJob("j", RESNET, total_steps=1e5, arrival_s=0.0)
    load = [0.5, 0.5, 0.5]
    first = sim.regions.index(next(r for r in regions if r.name == sim.place(job, load).region))
    available = [dict(r.gpus) for r in regions]
    for name in ("same_zone_first", "eager_next_region"):
        recovery = StrategyRecovery(name, sim)
        lost = sim.place(job, load)  # back to its first placement
        dest = recovery.on_preemption(job, first, 600.0, available, load)
        # What the registry's strategy asks for, applied by the same engine on the same view.
        hist = tuple(recovery.history[job.job_id])
        assert [(p.region, p.zone) for p in hist] == [(lost.region, lost.zone)]
        constraint = get_strategy(name).next_constraint(
            RecoveryContext(sim.request(job), lost, hist, sim.zones_by_region)
        )
        blocked = constraint.all_blocked_zones(sim.zones_by_region)
        expected = plan(
            sim.request(job), sim.catalog, sim.state(load, available, blocked), "x", index=sim.index
        )
        assert sim.regions[dest].name == expected.region
        if name == "eager_next_region":
            assert dest != first and blocked == frozenset({f"{regions[first].name}-a"})
        else:
            assert dest == first  # one preemption: same_zone_first retries the zone, capacity allows


class _Outages:
    """Region -> list of [start, end) seconds without any GPU."""

    def __init__(self, outages):
        self.outages = outages

    def capacity(self, region, gpu_type, t):
        for start, end in self.outages.get(region.name, ()):
            if start <= t < end:
                return 0
        return int(region.gpus.get(gpu_type, 0))


class _Spy:
    """Records every recovery decision of the wrapped strategy."""

    def __init__(self, inner):
        self.inner, self.moves = inner, []
        self.name = inner.name

    def on_preemption(self, job, region, now, available, load, free=None):
        dest = self.inner.on_preemption(job, region, now, available, load, free)
        self.moves.append((job.job_id, region, dest, now))
        return dest


def _outage_run(recovery: str):
    table = load_packaged()
    # cheap (0) loses everything at 600-900 s; mid (1) at 1200-1500 s; dear (2) never. The engine
    # prefers the cheapest region with capacity.
    regions = [
        Region("cheap", {"V100": 2}, {"V100": 1.0}, spot=True),
        Region("mid", {"V100": 2}, {"V100": 1.5}, spot=True),
        Region("dear", {"V100": 2}, {"V100": 3.0}, spot=True),
    ]
    jobs = [
        SimJob(f"j{i}", RESNET, total_steps=table.throughput(RESNET, "V100") * 3600, arrival_s=0.0)
        for i in range(2)
    ]
    placement = SimPlacement(regions, table)
    spy = _Spy(make_recovery(recovery, placement))
    result = simulate(
        jobs,
        regions,
        table,
        SimConfig(recovery=recovery),
        availability=_Outages({"cheap": [(600, 900)], "mid": [(1200, 1500)]}),
        router=make_router("placement", placement),
        strategy=spy,
    )
    return result, spy.moves


def test_eager_next_region_never_goes_back_to_a_region_that_preempted_the_job():
    result, moves = _outage_run("eager_next_region")
    assert result.completed == 2 and result.recovery == "eager_next_region"
    preempted_in: dict[str, set[int]] = {}
    for job_id, src, dest, _ in moves:
        preempted_in.setdefault(job_id, set()).add(src)
        assert dest not in preempted_in[job_id], moves
    # cheap → mid at 600 s, then mid → dear at 1200 s although cheap has capacity again.
    assert [(src, dest) for j, src, dest, _ in moves if j == "j0"] == [(0, 1), (1, 2)]
    assert result.recovery_moves == 4


def test_same_zone_first_may_return_to_a_zone_that_preempted_the_job_once():
    result, moves = _outage_run("same_zone_first")
    assert result.completed == 2
    # cheap → mid at 600 s (cheap has no capacity), mid → cheap at 1200 s (preempted there once only).
    assert [(src, dest) for j, src, dest, _ in moves if j == "j0"] == [(0, 1), (1, 0)]


def test_recovery_waits_in_place_when_every_region_is_blocked():
    table = load_packaged()
    regions = [Region("a", {"V100": 2}, spot=True), Region("b", {"V100": 2}, spot=True)]
    sim = SimPlacement(regions, table)
    recovery = StrategyRecovery("eager_next_region", sim)
    job = SimJob("j", RESNET, total_steps=1e5, arrival_s=0.0)
    sim.place(job, [0.0, 0.0])
    available = [{"V100": 2}, {"V100": 2}]
    assert recovery.on_preemption(job, 0, 10.0, available, [0.5, 0.5]) == 1
    assert recovery.on_preemption(job, 1, 20.0, available, [0.5, 0.5]) == 1  # a and b blocked
    assert recovery.waits == 1


def test_stay_in_region_waits_for_capacity_in_its_region_while_another_region_has_free_gpus():
    """The spot region (the cheaper: the job starts there) loses its GPU from 360 s to 1800 s.
    Under ``stay_in_region`` the 1000 s job waits there although the on-demand region's GPU is
    free: 360 s, then its last 640 s from 1800 s (JCT 2440 s); ``same_zone_first`` moves it."""
    table = load_packaged()
    regions = [
        Region("spot", {"V100": 1}, {"V100": 1.0}, spot=True),
        Region("dear", {"V100": 1}, {"V100": 3.0}),
    ]
    job = SimJob("j", RESNET, total_steps=table.throughput(RESNET, "V100") * 1000, arrival_s=0.0)
    trace = AvailabilityTrace(360.0, (0, 1, 1, 1, 1) + (0,) * 50)
    runs = {
        recovery: simulate(
            [job],
            regions,
            table,
            SimConfig(policy="fifo", recovery=recovery),
            availability=TraceAvailability({"spot": trace}),
        )
        for recovery in ("stay_in_region", "same_zone_first")
    }
    stay = runs["stay_in_region"]
    assert stay.jct_by_job() == {"j": pytest.approx(2440.0)} and stay.preemptions == 1
    assert stay.recovery_moves == stay.waiting_moves == stay.faster_moves == 0
    moved = runs["same_zone_first"]
    assert moved.jct_by_job() == {"j": pytest.approx(1000.0)} and moved.recovery_moves == 1


def test_simulation_with_spot_outages_is_deterministic():
    a, moves_a = _outage_run("eager_next_region")
    b, moves_b = _outage_run("eager_next_region")
    assert a.jct_s == b.jct_s and moves_a == moves_b
    drop = {"wall_s"}
    assert {k: v for k, v in a.to_json().items() if k not in drop} == {
        k: v for k, v in b.to_json().items() if k not in drop
    }


def test_placement_router_and_least_loaded_baseline_agree_on_identical_regions():
    # On identical regions the engine's overload rule prefers the least loaded region, so where a
    # job queues (``route``) the engine reproduces the baseline heuristic's decision.
    table = load_packaged()
    regions = [Region(f"r{i}", {"V100": 8, "A100": 8, "K80": 8}) for i in range(3)]
    engine = PlacementRouter(SimPlacement(regions, table))
    baseline = make_router("least_loaded", engine.sim)
    rng = np.random.default_rng(2)
    for job in generate_jobs(200, 25.0, table, seed=2):
        load = rng.uniform(0.0, 3.0, size=3).round(3).tolist()
        assert engine.route(job, [True] * 3, load) == baseline.route(job, [True] * 3, load)


def test_the_least_loaded_baseline_binds_jobs_at_arrival():
    # The baseline has no ``start_now``: no job moves to free GPUs, only the engine's router does.
    table = load_packaged()
    jobs = generate_jobs(200, 25.0, table, seed=2)
    regions = [Region(f"r{i}", {"V100": 8, "A100": 8, "K80": 8}) for i in range(3)]
    engine = simulate(jobs, regions, table, SimConfig(seed=2))
    baseline = simulate(jobs, regions, table, SimConfig(seed=2, router="least_loaded"))
    assert engine.router == "placement" and baseline.router == "least_loaded"
    assert engine.completed == baseline.completed == 200
    assert baseline.waiting_moves == baseline.faster_moves == 0
    assert engine.waiting_moves + engine.faster_moves > 0


def test_unknown_router_and_recovery_names_list_the_valid_ones():
    sim = SimPlacement([Region("r", {"V100": 1})], load_packaged())
    with pytest.raises(ValueError, match=r"router='nearest' is not a router; valid: placement, least_loaded"):
        make_router("nearest", sim)
    with pytest.raises(ValueError, match=r"recovery='retry' .*valid: .*eager_next_region.*same_zone_first"):
        make_recovery("retry", sim)
    assert {"same_zone_first", "eager_next_region", "stay_in_region"} <= set(recovery_names())
    with pytest.raises(ValueError, match="valid: placement, least_loaded"):
        simulate([], [Region("r", {"V100": 1})], load_packaged(), SimConfig(router="nearest"))


def test_cli_router_and_recovery_options(capsys, tmp_path):
    from sailor_tasks.cli.main import main

    base = ["simulate", "--jobs", "30", "--jobs-per-hour", "20", "--cluster", "v100=4,k80=4"]
    assert main([*base, "--regions", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["router"] == "placement" and out["recovery"] == "same_zone_first"
    assert out["completed"] == 30 and sum(out["routed_gpu_types"].values()) == 30
    argv = [*base, "--regions", "2", "--router", "least_loaded", "--recovery", "eager_next_region", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["router"] == "least_loaded" and out["recovery"] == "eager_next_region"
    assert main([*base, "--router", "nearest", "--json"]) == 2
    assert "--router 'nearest' is not a router; valid: placement, least_loaded" in capsys.readouterr().err
    assert main([*base, "--recovery", "retry", "--json"]) == 2
    err = capsys.readouterr().err
    assert "--recovery 'retry' is not a recovery strategy; valid:" in err and "eager_next_region" in err


def test_same_zone_first_resumes_in_the_lost_zone_when_it_takes_the_job_though_another_scores_better():
    """The job's region got busier than the others (the engine alone would now place it
    elsewhere); after one preemption ``same_zone_first`` still resumes in the lost zone, which can
    take it, as live recovery does."""
    table = load_packaged()
    regions = _regions()
    sim = SimPlacement(regions, table)
    job = SimJob("j", RESNET, total_steps=1e5, arrival_s=0.0)
    lost = sim.place(job, [0.5, 0.5, 0.5])
    first = sim.region_index[lost.region]
    busy = [0.1, 0.1, 0.1]
    busy[first] = 3.0
    available = [dict(r.gpus) for r in regions]
    elsewhere = plan(
        sim.request(job), sim.catalog, sim.state(busy, available, frozenset()), "x", index=sim.index
    )
    assert elsewhere.region != lost.region  # what the engine picks without the preference
    dest = StrategyRecovery("same_zone_first", sim).on_preemption(job, first, 600.0, available, busy)
    assert dest == first and sim.placements[job.job_id].zone == lost.zone
