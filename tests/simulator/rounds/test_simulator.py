from __future__ import annotations

import json

import pytest

from sailor_tasks.catalog.throughput import load_gavel, load_packaged
from sailor_tasks.simulator import (
    AvailabilityTrace,
    Region,
    SimConfig,
    SimJob,
    TraceAvailability,
    generate_jobs,
    load_availability_trace,
    read_gavel_trace,
    simulate,
)
from sailor_tasks.traces import availability

CLUSTER = {"V100": 4, "P100": 4, "K80": 4}


@pytest.fixture(scope="module")
def gavel(request):
    from tests.conftest import SHARED_DATA

    path = SHARED_DATA / "gavel" / "simulation_throughputs.json"
    if not path.exists():
        pytest.skip(f"{path} is not present")
    return load_gavel(str(path)), SHARED_DATA / "gavel" / "small_test.trace"


def test_las_beats_the_heterogeneity_agnostic_baseline_on_gavels_trace(gavel):
    table, trace = gavel
    jobs = read_gavel_trace(str(trace), table)
    assert len(jobs) == 20
    las = simulate(jobs, [Region("r", CLUSTER)], table, SimConfig(policy="las"))
    agnostic = simulate(jobs, [Region("r", CLUSTER)], table, SimConfig(policy="las_agnostic"))
    assert las.completed == agnostic.completed == 20
    # Gavel's simulator: 148 s vs 306 s on this trace and cluster.
    assert las.avg_jct_s <= 0.6 * agnostic.avg_jct_s


@pytest.mark.parametrize(
    "policy", ["las", "las_agnostic", "ftf", "fifo", "makespan", "max_throughput", "min_cost"]
)
def test_every_policy_completes_every_job(gavel, policy):
    table, trace = gavel
    jobs = read_gavel_trace(str(trace), table)
    prices = {"V100": 2.48, "P100": 1.46, "K80": 0.45}
    result = simulate(jobs, [Region("r", CLUSTER, prices)], table, SimConfig(policy=policy))
    assert result.completed == len(jobs)
    assert 0 < result.utilization <= 1
    assert result.p50_jct_s <= result.p99_jct_s <= result.makespan_s + 1e-6
    assert result.cost_usd > 0


def test_space_sharing_runs_pairs_to_completion(gavel):
    table, trace = gavel
    jobs = read_gavel_trace(str(trace), table)
    result = simulate(jobs, [Region("r", CLUSTER)], table, SimConfig(policy="las", space_sharing=True))
    assert result.completed == len(jobs) and result.space_sharing


def test_a_job_arriving_at_an_idle_cluster_starts_at_once():
    table = load_packaged()
    key = next(k for k in table.job_types if k[1] == 1 and table.throughput(k, "V100") > 0)
    steps = table.throughput(key, "V100") * 200.0  # 200 s on a V100
    jobs = [SimJob("a", key, steps, arrival_s=100.0), SimJob("b", key, steps, arrival_s=5000.0)]
    result = simulate(jobs, [Region("r", {"V100": 1})], table, SimConfig(policy="las", router="least_loaded"))
    # Neither waits for the next multiple of the round length (360 s, 5040 s).
    assert result.jct_by_job() == pytest.approx({"a": 200.0, "b": 200.0})
    assert result.makespan_s == pytest.approx(5200.0 - 100.0)


def test_generated_jobs_without_multi_gpu_have_one_gpu_each():
    table = load_packaged()
    jobs = generate_jobs(200, 5.0, table, seed=1, multi_gpu=False)
    assert {j.scale_factor for j in jobs} == {1}
    assert {j.scale_factor for j in generate_jobs(200, 5.0, table, seed=1)} > {1}


def test_simulation_is_deterministic_for_a_seed():
    table = load_packaged()
    jobs = generate_jobs(150, 20.0, table, seed=3)
    assert jobs == generate_jobs(150, 20.0, table, seed=3)
    assert jobs != generate_jobs(150, 20.0, table, seed=4)
    regions = [Region(f"r{i}", {"V100": 8, "A100": 8, "K80": 8}) for i in range(2)]
    a = simulate(jobs, regions, table, SimConfig(seed=3))
    b = simulate(jobs, regions, table, SimConfig(seed=3))
    assert a.jct_s == b.jct_s
    drop = {"wall_s"}
    assert {k: v for k, v in a.to_json().items() if k not in drop} == {
        k: v for k, v in b.to_json().items() if k not in drop
    }
    assert a.completed == 150 and a.regions == 2


def test_spot_region_losing_capacity_preempts_and_jobs_still_finish(tmp_path):
    table = load_packaged()
    trace = tmp_path / "spot.json"
    # Spot capacity gone for the second and fourth 10-minute slots.
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 1, 0, 1, 0, 0, 0, 0]}))
    avail = TraceAvailability({"spot": load_availability_trace(str(trace))})
    key = ("ResNet-50 (batch size 64)", 1)
    jobs = [
        SimJob(f"j{i}", key, total_steps=table.throughput(key, "V100") * 3000, arrival_s=0.0)
        for i in range(4)
    ]
    result = simulate(
        jobs, [Region("spot", {"V100": 4}, spot=True)], table, SimConfig(round_s=300), availability=avail
    )
    assert result.completed == 4
    assert result.preemptions >= 4
    # Without interruptions the jobs take 3000 s; the outages add their length.
    assert result.makespan_s > 3000


def test_recovery_strategy_can_move_preempted_jobs():
    table = load_packaged()

    class Gone:
        def capacity(self, region, gpu_type, t):
            return 0 if region.name == "spot" and t >= 600 else int(region.gpus.get(gpu_type, 0))

    class NextRegion:
        def on_preemption(self, job, region, now, available, load, free=None):
            return next(r for r, gpus in enumerate(available) if sum(gpus.values()) > 0)

    key = ("ResNet-50 (batch size 64)", 1)
    jobs = [
        SimJob(f"j{i}", key, total_steps=table.throughput(key, "V100") * 3600, arrival_s=0.0)
        for i in range(2)
    ]
    regions = [Region("spot", {"V100": 2}, spot=True), Region("ondemand", {"V100": 2})]

    class SpotFirst:
        def route(self, job, runnable, load):
            return 0

    result = simulate(
        jobs, regions, table, SimConfig(), availability=Gone(), router=SpotFirst(), strategy=NextRegion()
    )
    assert result.completed == 2 and result.preemptions == 2
    assert result.makespan_s < 3600 + 2 * 360  # moved right away, not waiting for capacity


def test_trace_errors_name_the_line_and_the_fields(tmp_path):
    bad = tmp_path / "bad.trace"
    bad.write_text("ResNet-18 (batch size 16)\tcmd\tdir\t--n\t1\t100\t1\n")
    with pytest.raises(ValueError, match=r"bad.trace:1: 7 fields, expected 10: job_type, command"):
        read_gavel_trace(str(bad))
    unknown = tmp_path / "unknown.trace"
    unknown.write_text("Nope (batch size 1)\tcmd\tdir\t--n\t1\t100\t1\t1\t-1\t0\n")
    with pytest.raises(ValueError, match="not in the throughput table"):
        read_gavel_trace(str(unknown), load_packaged())
    line = "ResNet-18 (batch size 16)\tcmd\tdir\t--n\t1\t{steps}\t{scale}\t{weight}\t{slo}\t{arrival}\n"
    good = {"steps": 100, "scale": 1, "weight": 1, "slo": -1, "arrival": 0}
    assert len(read_gavel_trace(str(_write(tmp_path, line.format(**good))), load_packaged())) == 1
    for field, value, message in (
        ("steps", -100, "total_steps='-100': need a finite number > 0"),
        ("steps", "nan", "total_steps='nan': need a finite number > 0"),
        ("scale", 0, "scale_factor='0': need a finite number ≥ 1"),
        ("weight", 0, "priority_weight='0': need a finite number > 0"),
        ("arrival", -5, "arrival_time_s='-5': need a finite number ≥ 0"),
        ("slo", "inf", "SLO='inf': need a finite number (≤ 0: no SLO)"),
        (
            "scale",
            3,
            "scale_factor=3 of 'ResNet-18 (batch size 16)': the throughput table has it at scale "
            "factors 1, 2, 4, 8",
        ),
    ):
        path = _write(tmp_path, line.format(**{**good, field: value}))
        with pytest.raises(ValueError) as err:
            read_gavel_trace(str(path), load_packaged())
        assert f"{path}:1: {message}" in str(err.value), str(err.value)


def _write(folder, text):
    path = folder / "one.trace"
    path.write_text(text)
    return path


def test_unknown_policy_is_rejected_with_the_valid_names():
    with pytest.raises(ValueError, match="valid policies: edf, fifo, ftf, las, las_agnostic"):
        simulate([], [Region("r", CLUSTER)], load_packaged(), SimConfig(policy="srtf"))


def test_cli_prints_one_json_object(gavel, capsys):
    from sailor_tasks.cli.main import main

    table, trace = gavel
    throughputs = trace.parent / "simulation_throughputs.json"
    argv = [
        "simulate",
        "--trace",
        str(trace),
        "--throughputs",
        str(throughputs),
        "--cluster",
        "v100=4,p100=4,k80=4",
    ]
    assert main([*argv, "--policy", "las", "--round-s", "360", "--seed", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"policy", "jobs", "avg_jct_s", "p99_jct_s", "makespan_s", "utilization", "wall_s"} <= set(out)
    assert out["policy"] == "las" and out["jobs"] == 20
    # Every job's JCT, keyed by job id in trace order; their mean is the average printed.
    jct = out["jct_s"]
    assert list(jct) == [f"job{i:06d}" for i in range(20)]
    assert all(v > 0 for v in jct.values())
    assert sum(jct.values()) / 20 == pytest.approx(out["avg_jct_s"], abs=1e-3)
    assert main([*argv, "--policy", "nope", "--json"]) == 2
    assert "valid policies" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(trace), "--cluster", "v100=4,tpu=2", "--json"]) == 2
    assert "--cluster GPU type 'tpu'" in capsys.readouterr().err


def test_availability_trace_reader_checks_the_format(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [0, 1, 0]}))
    trace = load_availability_trace(str(good))
    assert AvailabilityTrace is availability.AvailabilityTrace and isinstance(trace, AvailabilityTrace)
    assert trace.kind == "unavailable_flag" and [trace.at(t) for t in (0, 60, 130, 180)] == [0, 1, 0, 0]
    counts = tmp_path / "counts.json"
    counts.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [4, 2]}))
    region = Region("r", {"V100": 3}, spot=True)
    assert TraceAvailability({"r": load_availability_trace(str(counts))}).capacity(region, "V100", 61) == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [0, 1]}))
    with pytest.raises(ValueError, match=r"bad\.json.*'metadata' and 'data'.*gap_seconds"):
        load_availability_trace(str(bad))


def test_capacity_that_never_returns_stops_at_the_horizon():
    table = load_packaged()

    class Never:
        def capacity(self, region, gpu_type, t):
            return 0

    key = ("ResNet-50 (batch size 64)", 1)
    jobs = [SimJob("j", key, total_steps=100.0, arrival_s=0.0)]
    result = simulate(
        jobs, [Region("r", {"V100": 1})], table, SimConfig(horizon_s=3600), availability=Never()
    )
    assert result.completed == 0 and result.avg_jct_s == 0.0


def test_reusing_stable_rounds_changes_nothing_but_speed():
    table = load_packaged()
    jobs = generate_jobs(300, 15.0, table, seed=5)
    regions = [Region(f"r{i}", {"V100": 8, "A100": 8, "K80": 8}) for i in range(2)]
    fast = simulate(jobs, regions, table, SimConfig())
    slow = simulate(jobs, regions, table, SimConfig(reuse_stable_rounds=False))
    assert fast.jct_s == slow.jct_s and fast.cost_usd == slow.cost_usd and fast.rounds == slow.rounds


def test_min_cost_with_slos_that_cannot_all_hold_allocates_without_them_and_finishes(tmp_path, caplog):
    """Two jobs of ~1000 s each on one V100, each with a 1500 s SLO: either alone meets it, both
    cannot. The policy's LP is infeasible; the round allocates without the SLOs (as Gavel's cost
    policy does) instead of ending the simulation."""
    line = (
        "Recommendation (batch size 8192)\tpython3 train.py --batch_size 8192\trecommendation\t-n\t1\t2841"
        "\t1\t1\t1500\t0\n"
    )
    trace = tmp_path / "contended.trace"
    trace.write_text(line * 2)
    table = load_packaged()
    jobs = read_gavel_trace(str(trace), table)
    with caplog.at_level("WARNING"):
        region = Region("r", {"V100": 1}, {"V100": 2.48})
        result = simulate(jobs, [region], table, SimConfig(policy="min_cost")).to_json()
    assert result["completed"] == 2
    assert "SLOs of job000000, job000001 cannot all be met" in caplog.text


@pytest.mark.parametrize("policy", ["ftf", "fifo", "edf", "max_throughput", "min_cost"])
def test_space_sharing_with_a_policy_that_solves_no_pairs_is_refused_naming_those_that_do(policy):
    """Those policies would ignore it, and the output would still say space sharing was on."""
    with pytest.raises(ValueError, match=rf"policy '{policy}': .*policies that do: las, las_agnostic, makespan"):
        SimConfig(policy=policy, space_sharing=True)


def test_a_shared_gpu_is_freed_once_when_both_jobs_of_its_pair_finish_together():
    """Two identical jobs space-sharing one GPU finish in the same second: the GPU comes back once
    (it came back twice, and the free count could exceed the cluster)."""
    import numpy as np

    from sailor_tasks.simulator.rounds.shard import unit_frees

    unit_of = np.array([0, 0, 1, 2, 2])  # a pair finishing together, a single, a pair finishing apart
    need = np.array([5.0, 5.0, 3.0, 2.0, 4.0])
    gpus = np.array([1.0, 1.0, 2.0, 1.0, 1.0])
    np.testing.assert_array_equal(unit_frees(unit_of, need, gpus, 3), [1.0, 0.0, 2.0, 0.0, 1.0])
