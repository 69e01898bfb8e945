"""Spot simulator: hand-computed cost and timing, strategy behaviour on built traces, determinism, CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.simulator.spot.engine import (
    SpotJob,
    SpotMarket,
    SpotParams,
    SpotZone,
    on_demand_time_h,
    simulate_spot,
    with_deadlines,
)
from sailor_tasks.simulator.spot.setup import build_market, generate_spot_jobs
from sailor_tasks.traces.availability import AvailabilityTrace
from sailor_tasks.traces.sources import ZoneTrace, load_sources

HOUR = 3600.0
SPOT, OD = 1.0, 3.0  # USD per VM-hour in every test zone


@pytest.fixture(scope="module")
def transfer():
    return load_catalog().transfer


def zone(name: str, flags: list[int] | None, gap: float = HOUR) -> SpotZone:
    trace = AvailabilityTrace(gap, tuple(flags)) if flags is not None else None
    return SpotZone(
        zone=name,
        region=name.rsplit("-", 1)[0],
        gpu_type="V100",
        spot_usd={1: SPOT} if trace else {},
        on_demand_usd={1: OD},
        preemption_rate_per_hour=0.1,
        trace=trace,
    )


def job(work_h: float = 2.0, home: str = "us-central1", **kw) -> SpotJob:
    return SpotJob("j0", 0.0, "V100", 1, work_h, home, **kw)


def test_spot_restart_cost_and_time_match_a_hand_computation(transfer):
    """Zone a: available 1 h, unavailable 1 h, then available. Job: 2 h of work, restart 0.1 h.

    t=0 launch (provisioning to 0.1 h) → trains 0.9 h → t=1 h preempted, no notice checkpoint:
    back to the periodic checkpoint at 0.5 h (0.4 h lost) → waits for zone a → t=2 h relaunch →
    provisioning to 2.1 h → 1.5 h of work → done at 3.6 h. Billed: 1.0 h + 1.6 h = 2.6 h at $1.
    """
    market = SpotMarket((zone("us-central1-a", [0, 1] + [0] * 20),), transfer)
    out = simulate_spot([job()], market, "spot_restart").outcomes[0]
    assert out.finished and out.preemptions == 1
    assert out.end_s == pytest.approx(3.6 * HOUR)
    assert out.usd == pytest.approx(2.6 * SPOT)
    assert out.billed_gpu_h == pytest.approx(2.6)
    assert out.lost_gpu_h == pytest.approx(0.6)
    assert [(a.zone, a.market, a.outcome) for a in out.attempts] == [
        ("us-central1-a", "spot", "preempted"),
        ("us-central1-a", "spot", "completed"),
    ]


def _count_zone(name: str, gpus: list[int], capacity: int | None = None) -> SpotZone:
    return SpotZone(
        zone=name,
        region=name.rsplit("-", 1)[0],
        gpu_type="V100",
        spot_usd={1: SPOT},
        on_demand_usd={1: OD},
        preemption_rate_per_hour=0.1,
        trace=AvailabilityTrace(HOUR, tuple(gpus), "available_count"),
        capacity_gpus=capacity,
    )


def test_spot_capacity_is_the_count_or_the_catalog_capacity_while_a_flag_trace_is_available():
    assert _count_zone("us-central1-a", [3, 0]).spot_capacity(0.5 * HOUR) == 3
    assert _count_zone("us-central1-a", [3, 0]).spot_capacity(1.5 * HOUR) == 0
    flag = zone("us-central1-a", [0, 1])
    assert flag.spot_capacity(0.0) == float("inf") and flag.spot_capacity(HOUR) == 0
    sized = SpotZone(**{**flag.__dict__, "capacity_gpus": 8})
    assert sized.spot_capacity(0.0) == 8 and sized.spot_available(0.0, 1)
    assert zone("us-central1-a", None).spot_capacity(0.0) == 0


def test_jobs_take_spot_capacity_from_the_trace_in_arrival_order(transfer):
    """One spot GPU in the only zone, two 1-GPU jobs half an hour apart: competing, the second
    waits until the first is done; alone, they overlap."""
    market = SpotMarket((_count_zone("us-central1-a", [1] * 30),), transfer)
    jobs = [
        SpotJob("a", 0.0, "V100", 1, 2.0, "us-central1"),
        SpotJob("b", 0.5 * HOUR, "V100", 1, 2.0, "us-central1"),
    ]
    first, second = simulate_spot(jobs, market, "spot_restart").outcomes
    assert first.finished and first.end_s == pytest.approx(2.1 * HOUR) and first.preemptions == 0
    assert second.finished and second.attempts[0].start_s >= first.end_s
    assert second.attempts[0].start_s < first.end_s + 300.0 + 1e-6  # the next 5-minute check
    alone = simulate_spot(jobs, market, "spot_restart", compete=False).outcomes
    assert alone[1].attempts[0].start_s == pytest.approx(0.5 * HOUR)
    assert alone[1].attempts[0].start_s < alone[0].end_s
    # the order of the list does not matter: capacity goes by arrival
    swapped = simulate_spot(jobs[::-1], market, "spot_restart").outcomes
    assert [o.end_s for o in swapped] == [second.end_s, first.end_s]


def test_an_earlier_arrival_claiming_the_gpus_preempts_the_holder(transfer):
    """As the hand computation above, but the GPU is lost to an earlier arrival holding it from
    1 h to 2 h (the trace keeps it): the same times and cost, counted as lost to competition."""
    from sailor_tasks.simulator.spot.engine import SpotLedger, _JobSim
    from sailor_tasks.strategies import get_strategy

    z = _count_zone("us-central1-a", [1] * 30)
    market = SpotMarket((z,), transfer)
    ledger = SpotLedger()
    ledger.record(z, 1.0 * HOUR, 2.0 * HOUR, 1)
    out = _JobSim(job(), market, get_strategy("spot_restart"), SpotParams(), ledger).run()
    assert out.finished and out.preemptions == 1 and out.preempted_by_competition == 1
    assert out.end_s == pytest.approx(3.6 * HOUR)
    assert out.usd == pytest.approx(2.6 * SPOT)


def test_on_demand_cost_is_launch_plus_work_at_the_on_demand_price(transfer):
    market = SpotMarket((zone("us-central1-a", [1] * 5),), transfer)
    out = simulate_spot([job(work_h=3.0)], market, "on_demand").outcomes[0]
    assert out.preemptions == 0 and out.end_s == pytest.approx(3.1 * HOUR)
    assert out.usd == pytest.approx(3.1 * OD)
    assert on_demand_time_h(job(work_h=3.0), market) == pytest.approx(3.1)


def test_moving_to_another_region_pays_the_catalog_transfer(transfer):
    """The dataset lives in europe-west4; the only zone is in us-central1: 100 GB cross NA-EU."""
    market = SpotMarket((zone("us-central1-a", [0] * 10),), transfer)
    link = transfer.bucket_link("europe-west4", "us-central1")
    j = job(work_h=1.0, home="europe-west4", data_gb=100.0)
    out = simulate_spot([j], market, "spot_restart").outcomes[0]
    move_h = 100.0 * 8 / link.gbps / HOUR
    assert out.end_s == pytest.approx((0.1 + move_h + 1.0) * HOUR)
    assert out.transfer_usd == pytest.approx(100.0 * link.usd_per_gb)
    assert out.usd == pytest.approx((0.1 + move_h + 1.0) * SPOT + 100.0 * link.usd_per_gb)


def test_sailor_checkpoints_at_the_notice_and_moves_to_the_cheapest_zone_with_capacity(transfer):
    """Same timeline as the spot_restart hand computation, plus a zone b in the region."""
    a = zone("us-central1-a", [0, 1] + [0] * 20)
    b = zone("us-central1-b", [1, 0] + [0] * 20)
    market = SpotMarket((a, b), transfer)
    [j] = with_deadlines([job()], market, 0.5)
    out = simulate_spot([j], market, "sailor").outcomes[0]
    notice_h = SpotParams().notice_s / HOUR
    # preempted at 1 h having trained 0.9 h; saved at the notice → 0.9 h - 30 s kept; relaunch in b
    assert [(x.zone, x.market) for x in out.attempts] == [
        ("us-central1-a", "spot"),
        ("us-central1-b", "spot"),
    ]
    assert out.end_s == pytest.approx((1.0 + 0.1 + 2.0 - (0.9 - notice_h)) * HOUR)
    assert not out.missed_deadline
    # spot_restart on the same market waits for a and loses the work since the periodic checkpoint
    slow = simulate_spot([j], market, "spot_restart").outcomes[0]
    assert slow.end_s > out.end_s and slow.lost_gpu_h > out.lost_gpu_h


def test_sailor_moves_back_to_the_cheaper_zone_once_it_has_capacity_again(transfer):
    """Zone a ($1/h) loses its capacity from 1 h to 2 h; zone b in the same region sells spot at
    $2/h throughout. sailor saves at the notice and moves to b, then, at the first decision tick
    with a's capacity back, checkpoints and moves back to a (no transfer: same region)."""
    a = zone("us-central1-a", [0, 1] + [0] * 20)
    b = replace(zone("us-central1-b", [0] * 22), spot_usd={1: 2 * SPOT})
    market = SpotMarket((a, b), transfer)
    [j] = with_deadlines([job(work_h=4.0)], market, 0.5)
    out = simulate_spot([j], market, "sailor").outcomes[0]
    assert [(x.zone, x.outcome) for x in out.attempts] == [
        ("us-central1-a", "preempted"),
        ("us-central1-b", "switched"),
        ("us-central1-a", "completed"),
    ]
    back = out.attempts[2]
    assert 2 * HOUR <= back.start_s <= 2 * HOUR + SpotParams().tick_s
    assert "moving" in back.why
    assert not out.missed_deadline
    # no work is lost at the move: a kept 0.9 h less the notice, b all it trained
    notice_h = SpotParams().notice_s / HOUR
    on_b_h = (out.attempts[1].end_s - out.attempts[1].start_s) / HOUR - 0.1
    assert out.end_s == pytest.approx(back.start_s + (0.1 + 4.0 - (0.9 - notice_h) - on_b_h) * HOUR)
    # paying b's price only while a was out
    assert out.usd < simulate_spot([j], SpotMarket((b,), transfer), "sailor").outcomes[0].usd


def test_a_move_brings_the_checkpoint_it_saves_where_the_run_was(transfer):
    """As above with b in another region and a 20 GB checkpoint: the relaunch in b brings the
    checkpoint saved at the notice in a, and the move back brings the one saved in b."""
    a = zone("us-central1-a", [0, 1] + [0] * 20)
    b = replace(zone("us-east1-b", [0] * 22), spot_usd={1: 2 * SPOT})
    market = SpotMarket((a, b), transfer)
    [j] = with_deadlines([job(work_h=4.0, checkpoint_gb=20.0)], market, 0.5)
    out = simulate_spot([j], market, "sailor").outcomes[0]
    assert [x.zone for x in out.attempts] == ["us-central1-a", "us-east1-b", "us-central1-a"]
    there, back = (
        transfer.bucket_link("us-central1", "us-east1"),
        transfer.bucket_link("us-east1", "us-central1"),
    )
    assert out.transfer_usd == pytest.approx(20.0 * (there.usd_per_gb + back.usd_per_gb))
    assert out.attempts[2].usd == pytest.approx(
        (out.attempts[2].end_s - out.attempts[2].start_s) / HOUR * SPOT + 20.0 * back.usd_per_gb
    )


def test_estimates_bring_the_checkpoint_from_where_the_run_trains_or_was_lost(transfer):
    """The reserve after losing a zone counts bringing the checkpoint saved there, even before the
    first save; while an attempt trains, a launch elsewhere brings the checkpoint from its region."""
    from sailor_tasks.simulator.spot.engine import _JobSim
    from sailor_tasks.strategies import get_strategy

    a, b = zone("us-central1-a", [0] * 22), zone("us-east1-b", [0] * 22)
    sim = _JobSim(
        job(work_h=4.0, checkpoint_gb=20.0),
        SpotMarket((a, b), transfer),
        get_strategy("sailor"),
        SpotParams(),
    )
    link = transfer.bucket_link("us-central1", "us-east1")
    ckpt_h = 20.0 * 8 / link.gbps / HOUR
    assert sim._transfer("us-east1") == (0.0, 0.0)  # nothing saved, nothing running
    assert sim.fastest_on_demand_h(a) == pytest.approx(0.1 + ckpt_h)  # b is the only other zone
    sim.running_region, sim.progress_h = "us-central1", 1.0
    assert sim._transfer("us-east1") == pytest.approx((ckpt_h, 20.0 * link.usd_per_gb))


def test_long_stock_out_sailor_goes_on_demand_in_time_and_spot_restart_misses(transfer):
    """Every spot zone loses capacity after 1 h for 10 h; the deadline leaves 20% slack."""
    flags = [0] + [1] * 10 + [0] * 20
    market = SpotMarket((zone("us-central1-a", flags), zone("us-central1-b", flags)), transfer)
    [j] = with_deadlines([job(work_h=4.0)], market, 0.2)
    sailor = simulate_spot([j], market, "sailor").outcomes[0]
    assert not sailor.missed_deadline
    assert sailor.attempts[-1].market == "on_demand"
    assert "on-demand" in sailor.attempts[-1].why
    assert sailor.attempts[-1].slack_h is not None and sailor.attempts[-1].slack_h >= 0
    for name in ("spot_restart", "eager_next_region"):
        assert simulate_spot([j], market, name).outcomes[0].missed_deadline
    assert not simulate_spot([j], market, "on_demand").outcomes[0].missed_deadline


def test_sailor_reserve_counts_the_transfer_of_the_on_demand_fallback_outside_the_lost_zone(transfer):
    """The dataset (3 TB) is in australia-southeast1, whose only zone sells spot and on-demand;
    us-central1-a sells on-demand only. Spot in the Australian zone is lost after 1 h. A relaunch
    after that loss plans with that zone blocked, so the on-demand fallback is in us-central1,
    behind the dataset's transfer: the reserve counts it, and at 20% slack sailor runs on-demand
    where the data is rather than take spot it could not leave in time."""
    home = "australia-southeast1"
    far = zone("us-central1-a", None)
    market = SpotMarket((zone(f"{home}-a", [0, 1] + [1] * 20), far), transfer)
    link = transfer.bucket_link(home, "us-central1")
    data_gb = 3000.0
    assert data_gb * 8 / link.gbps / HOUR > 0.5  # the fallback's transfer alone exceeds the slack
    [j] = with_deadlines([job(work_h=2.0, home=home, data_gb=data_gb)], market, 0.2)
    out = simulate_spot([j], market, "sailor").outcomes[0]
    assert not out.missed_deadline
    assert [(a.zone, a.market) for a in out.attempts] == [(f"{home}-a", "on_demand")]


def test_slack_exhausted_at_arrival_sailor_runs_on_demand_from_the_start(transfer):
    market = SpotMarket((zone("us-central1-a", [0] * 30),), transfer)
    [j] = with_deadlines([job(work_h=4.0)], market, 0.0)
    out = simulate_spot([j], market, "sailor").outcomes[0]
    assert [a.market for a in out.attempts] == ["on_demand"]
    assert not out.missed_deadline


def test_sailor_without_deadline_runs_on_demand_where_no_zone_sells_spot(transfer):
    market = SpotMarket((zone("us-central1-a", None),), transfer)
    out = simulate_spot([job(work_h=3.0)], market, "sailor").outcomes[0]
    assert out.finished and out.end_s == pytest.approx(3.1 * HOUR)
    assert [(a.zone, a.market) for a in out.attempts] == [("us-central1-a", "on_demand")]
    assert "no spot offer" in out.attempts[0].why


def test_eager_next_region_leaves_the_preempted_region(transfer):
    a = zone("us-central1-a", [0, 1] + [0] * 20)
    b = zone("us-central1-b", [0] * 22)
    c = zone("us-east1-b", [0] * 22)
    market = SpotMarket((a, b, c), transfer)
    j = job(work_h=3.0)
    out = simulate_spot([j], market, "eager_next_region").outcomes[0]
    assert [x.zone for x in out.attempts] == ["us-central1-a", "us-east1-b"]
    # sailor blocks only the zone and stays in the region (no transfer)
    assert [x.zone for x in simulate_spot([j], market, "sailor").outcomes[0].attempts] == [
        "us-central1-a",
        "us-central1-b",
    ]


def test_eager_next_region_resumes_in_its_only_spot_zone_once_it_has_capacity_again(transfer):
    """The only zone is available 1 h, unavailable 1 h, repeating. Blocking its region leaves no
    spot zone, and so does blocking only it: the run blocks none and relaunches there at 2 h, 4 h,
    ... Each attempt keeps its periodic checkpoint at 0.5 h of work (0.1 h provisioning, 0.9 h of
    training): 3 h of work take six attempts, the last from 10 h to 10.6 h."""
    market = SpotMarket((zone("us-central1-a", [0, 1]),), transfer)
    out = simulate_spot([job(work_h=3.0)], market, "eager_next_region").outcomes[0]
    assert out.finished
    assert [(a.zone, a.market) for a in out.attempts] == [("us-central1-a", "spot")] * 6
    assert [a.start_s for a in out.attempts] == pytest.approx([k * 2 * HOUR for k in range(6)])
    assert out.end_s == pytest.approx(10.6 * HOUR)


def test_summary_has_the_issue_fields_and_is_deterministic_per_seed(transfer):
    traces = [
        ZoneTrace("t1", AvailabilityTrace(900.0, tuple([0] * 8 + [1] * 4) * 5)),
        ZoneTrace("t2", AvailabilityTrace(900.0, tuple([0] * 20 + [1] * 2) * 3), "us-central1-c", "V100"),
    ]
    cat = load_catalog()

    def run(seed: int) -> dict:
        market = build_market(cat, traces, gpu_types=("V100", "T4"), seed=seed)
        jobs = with_deadlines(generate_spot_jobs(12, market, seed=seed), market, 0.2)
        return simulate_spot(jobs, market, "sailor").to_json()

    first = run(0)
    assert {
        "strategy",
        "jobs",
        "finished",
        "deadline_misses",
        "usd_total",
        "usd_per_finished_job",
        "avg_jct_s",
        "preemptions",
        "lost_gpu_hours",
    } <= set(first)
    assert first == run(0)
    assert first != run(1)


def test_exact_binding_gives_spot_only_to_zones_with_their_own_trace():
    trace = ZoneTrace("x", AvailabilityTrace(900.0, (0, 1)), "us-central1-c", "V100")
    market = build_market(load_catalog(), [trace], gpu_types=("V100",), bind="exact")
    spot = [z.zone for z in market.zones if z.trace is not None]
    assert spot == ["us-central1-c"]
    with pytest.raises(ValueError, match=r"bind='nearest' is not a trace binding; valid: pool, exact"):
        build_market(load_catalog(), [trace], bind="nearest")


def test_exact_binding_refuses_a_trace_recorded_where_the_catalog_sells_no_such_gpu(tmp_path):
    path = tmp_path / "V100_us-centrl1-a.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 900}, "data": [0, 1]}))
    traces = load_sources([str(tmp_path)])
    cat = load_catalog()
    v100_zones = sorted({o.zone for o in cat.offers if o.gpu_type == "V100"})
    with pytest.raises(ValueError) as err:
        build_market(cat, traces, gpu_types=("V100",), bind="exact")
    assert f"availability trace {path}: zone 'us-centrl1-a' sells no V100" in str(err.value)
    assert str(err.value).endswith(f"zones selling V100: {', '.join(v100_zones)}")
    # pool binding replays it in every zone; a GPU type the market does not simulate is left out
    pooled = build_market(cat, traces, gpu_types=("V100",), bind="pool")
    assert all(z.trace_name == "V100_us-centrl1-a" for z in pooled.zones)
    assert all(z.trace is None for z in build_market(cat, traces, gpu_types=("T4",), bind="exact").zones)


def test_bad_deadline_slack_is_rejected(transfer):
    market = SpotMarket((zone("us-central1-a", [0]),), transfer)
    with pytest.raises(ValueError, match=r"deadline slack=-0.1: need a number >= 0"):
        with_deadlines([job()], market, -0.1)


def test_cli_runs_a_strategy_on_the_shared_traces(shared_data, capsys):
    from sailor_tasks.cli.main import main

    argv = ["simulate", "--jobs", "6", "--availability", str(shared_data), "--seed", "0", "--json"]
    assert main([*argv, "--strategy", "sailor", "--deadline-slack", "0.2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"] == "sailor" and out["jobs"] == 6 and out["deadline_misses"] == 0
    assert main([*argv, "--strategy", "cheapest"]) == 2
    assert "valid: on_demand, spot_restart, eager_next_region, sailor" in capsys.readouterr().err


def test_cli_refuses_an_empty_strategy_rather_than_run_another_simulator(capsys):
    from sailor_tasks.cli.main import main

    assert main(["simulate", "--strategy", "", "--jobs", "2", "--json"]) == 2
    captured = capsys.readouterr()
    assert not captured.out
    assert (
        "--strategy '' is not a market strategy; valid: on_demand, spot_restart, eager_next_region, sailor"
        in captured.err
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_cli_refuses_a_deadline_slack_that_is_not_a_finite_number_at_least_0(capsys, value):
    from sailor_tasks.cli.main import main

    argv = ["simulate", "--strategy", "sailor", "--jobs", "2", "--availability", "/nonexistent"]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--deadline-slack", value])
    assert exit_.value.code == 2
    assert f"argument --deadline-slack: {value!r}: need a number ≥ 0" in capsys.readouterr().err


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_cli_refuses_fewer_than_one_job_naming_the_flag(tmp_path, capsys, jobs):
    from sailor_tasks.cli.main import main

    (tmp_path / "us-central1-a.json").write_text(json.dumps({"metadata": {"gap_seconds": 900}, "data": [0]}))
    argv = ["simulate", "--strategy", "sailor", "--availability", str(tmp_path), "--json"]
    assert main([*argv, "--jobs", jobs]) == 2
    captured = capsys.readouterr()
    assert not captured.out
    assert f"--jobs {jobs}: need an integer ≥ 1" in captured.err


def test_shared_traces_bind_to_their_real_zones(shared_data):
    traces = load_sources([str(shared_data / "gcp_preemption_2020"), str(shared_data / "sailor")])
    bound = {(t.zone, t.gpu_type) for t in traces if t.zone}
    assert ("us-west1-b", "V100") in bound and ("us-central1-a", "A100") in bound
    gcp = [t for t in traces if t.name.startswith("gcp_2020:") and t.gpu_type == "V100"]
    assert gcp and all(t.trace.gap_seconds == 900.0 for t in gcp)


def _engine_zone(j, market, market_name, remaining_h, t, data_regions, blocked) -> str:
    """The zone ``placement.engine.plan`` picks for this launch (what the live ``plan`` stage calls)."""
    from sailor_tasks.placement.engine import plan
    from sailor_tasks.simulator.spot.engine import launch_request, launch_state

    time_left = None if j.deadline_s is None else (j.deadline_s - t) / HOUR
    return plan(
        launch_request(j, market_name, remaining_h, time_left),
        market.engine_catalog(j.gpu_type, j.num_gpus),
        launch_state(j, data_regions, frozenset(blocked)),
        run_id=j.job_id,
    ).zone


def test_first_launch_of_every_strategy_is_the_placement_engines_choice(shared_data):
    """16 generated jobs on the real catalog and shared traces, all four strategies: each first
    launch is where ``placement.engine.plan`` puts the same request (the job's GPU type and count,
    the chosen market, its work, the hours to its deadline, its dataset in its home region), with
    every zone the trace gives no spot capacity at that moment blocked for spot."""
    traces = load_sources([str(shared_data / "gcp_preemption_2020"), str(shared_data / "sailor")])
    market = build_market(load_catalog(), traces, seed=0)
    jobs = with_deadlines(generate_spot_jobs(16, market, seed=3), market, 0.2)
    checked = 0
    for name in ("on_demand", "spot_restart", "eager_next_region", "sailor"):
        for j, out in zip(jobs, simulate_spot(jobs, market, name).outcomes, strict=True):
            if not out.attempts:
                continue
            first = out.attempts[0]
            blocked = (
                {
                    z.zone
                    for z in market.zones_for(j.gpu_type, j.num_gpus)
                    if not z.spot_available(first.start_s, j.num_gpus)
                }
                if first.market == "spot"
                else set()
            )
            expected = _engine_zone(
                j, market, first.market, j.work_h, first.start_s, {j.home_region}, blocked
            )
            assert first.zone == expected, (name, j)
            checked += 1
    assert checked >= 50


def test_relaunch_after_a_preemption_is_the_placement_engines_choice(transfer):
    """sailor is preempted in a at 1 h (saved at the notice); b has no capacity then; the engine
    plans with a (the strategy's blocked zone) and b (no capacity) blocked: c or d, whichever the
    engine prefers for the remaining work, the deadline left and the data in us-central1."""
    a = zone("us-central1-a", [0, 1] + [0] * 20)
    b = zone("us-central1-b", [1, 1] + [0] * 20)
    c = zone("us-central1-c", [0] * 22)
    d = zone("us-east1-b", [0] * 22)
    market = SpotMarket((a, b, c, d), transfer)
    [j] = with_deadlines([job(work_h=3.0, data_gb=50.0)], market, 0.5)
    out = simulate_spot([j], market, "sailor").outcomes[0]
    assert out.attempts[0].zone == "us-central1-a" and out.attempts[0].outcome == "preempted"
    relaunch = out.attempts[1]
    saved = 0.9 - SpotParams().notice_s / HOUR
    expected = _engine_zone(
        j, market, "spot", 3.0 - saved, HOUR, {"us-central1"}, {"us-central1-a", "us-central1-b"}
    )
    assert relaunch.start_s == pytest.approx(HOUR) and relaunch.zone == expected == "us-central1-c"


def test_spot_launch_weighs_the_catalog_preemption_rate_as_the_engine_does(transfer):
    """b is 10% cheaper on spot but its catalog preemption rate is 2/h: the engine's
    preemption_loss preference (rate × hours × (half a checkpoint interval + restart) × price)
    outweighs the saving, so the launch goes to c (a price-only rule would pick b)."""
    from dataclasses import replace

    b = replace(zone("us-central1-b", [0] * 10), spot_usd={1: 0.9 * SPOT}, preemption_rate_per_hour=2.0)
    c = replace(zone("us-central1-c", [0] * 10), preemption_rate_per_hour=0.0)
    market = SpotMarket((b, c), transfer)
    out = simulate_spot([job(work_h=2.0)], market, "spot_restart").outcomes[0]
    assert [x.zone for x in out.attempts] == ["us-central1-c"]


def test_on_demand_relaunch_tries_every_blocked_zone_tier_on_the_deadline_before_a_late_one(transfer):
    """As live recovery: the dataset (3 TB) is in australia-southeast1, the run was lost there and
    then in asia-east1, both regions now blocked. The only zone outside them (us-central1-a) is
    late behind the dataset's transfer; blocking only the last preempted zone lets the run
    relaunch on-demand where the data is, in time. The late zone is taken only when no tier is
    on time."""
    from sailor_tasks.simulator.spot.engine import _JobSim
    from sailor_tasks.strategies import get_strategy
    from sailor_tasks.strategies.base import PlacementConstraint, PreemptionRecord

    home = "australia-southeast1"
    market = SpotMarket(
        (zone(f"{home}-a", [0] * 22), zone("asia-east1-a", [0] * 22), zone("us-central1-a", None)), transfer
    )
    link = transfer.bucket_link(home, "us-central1")
    data_gb = 3000.0
    transfer_h = data_gb * 8 / link.gbps / HOUR
    sim = _JobSim(job(work_h=2.0, home=home, data_gb=data_gb), market, get_strategy("sailor"), SpotParams())
    sim.history = [
        PreemptionRecord(attempt=1, region=home, zone=f"{home}-a", noticed=True),
        PreemptionRecord(attempt=2, region="asia-east1", zone="asia-east1-a", noticed=True),
    ]
    sim.constraint = PlacementConstraint(blocked_regions=frozenset({home, "asia-east1"}))
    time_left_h = 2.0 + 0.1 + transfer_h / 2  # room for the restart, not for the transfer
    assert sim.on_demand_choice(0.0, 2.0, time_left_h, exact=True).zone.zone == f"{home}-a"
    # No tier on time: the late relaunch still goes where the constraint allows.
    assert sim.on_demand_choice(0.0, 2.0, 1.0, exact=True).zone.zone == "us-central1-a"


def test_a_relaunch_copies_the_dataset_from_its_home_region_not_from_a_region_it_ran_in(transfer):
    """A copy reads the dataset's own URI (``place_data``): a region without a copy pays the
    link from the home region, though a region the job ran in (which holds one) is nearer."""
    from sailor_tasks.simulator.spot.engine import _JobSim
    from sailor_tasks.strategies import get_strategy

    home = "australia-southeast1"
    market = SpotMarket((zone(f"{home}-a", [0] * 22), zone("asia-east1-a", [0] * 22)), transfer)
    sim = _JobSim(job(work_h=2.0, home=home, data_gb=100.0), market, get_strategy("sailor"), SpotParams())
    sim.data_regions.add("asia-east1")
    far, near = transfer.bucket_link(home, "asia-east2"), transfer.bucket_link("asia-east1", "asia-east2")
    assert near.usd_per_gb < far.usd_per_gb
    hours, usd = sim._transfer("asia-east2", None)
    assert usd == pytest.approx(100.0 * far.usd_per_gb)
    assert hours == pytest.approx(100.0 * 8 / far.gbps / HOUR)
    assert sim._transfer("asia-east1", None) == (0.0, 0.0)  # it holds a copy


@pytest.mark.parametrize("gap", [15.3, 0.1, 122.25206005573273, 900.0])
def test_each_next_slot_is_later_and_reads_the_next_slot_whatever_the_gap(gap):
    """A trace's slot boundaries are not exact in floating point for most gaps (15.3 s): each
    next slot is still strictly later than the time asked and reads the slot after it, so a
    simulation that steps from slot to slot always moves on and sees every change."""
    import random

    rng = random.Random(0)
    for _ in range(20):
        z = replace(zone("us-central1-a", [0, 1, 0, 0, 1], gap), trace_offset_s=rng.uniform(0, 10 * gap))
        t = rng.uniform(0, 3 * gap)
        for _ in range(500):
            after = z.next_slot_s(t)
            assert after > t
            assert (after + z.trace_offset_s) // gap == (t + z.trace_offset_s) // gap + 1
            t = after


@pytest.mark.parametrize("gap", [15.3, 0.1])
def test_the_next_slot_from_time_zero_behind_a_large_offset_is_found_at_once(gap):
    """At t = 0 with an offset far larger than one step of t (a zone's place in a pooled trace),
    the next slot is still one step away, read from the sum of both."""
    for off in (5 * gap, 333 * gap, 33299.9, 99_999.7):
        z = replace(zone("us-central1-a", [0, 1, 0, 0, 1], gap), trace_offset_s=off)
        after = z.next_slot_s(0.0)
        assert after > 0.0 and (after + off) // gap == off // gap + 1


def test_a_preferred_zone_that_misses_the_deadline_gives_way_to_one_that_meets_it(transfer):
    """``same_zone_first`` prefers the lost zone a (preempting 3 times an hour: it cannot finish 2 h
    of work within 4 h); b meets the deadline: the launch goes to b, as live recovery tries every
    tier on the deadline first. With time enough, a is taken."""
    from sailor_tasks.simulator.spot.engine import SpotMarket, SpotParams, _JobSim
    from sailor_tasks.strategies import get_strategy
    from sailor_tasks.strategies.base import PlacementConstraint

    def flaky(name, rate):
        return replace(zone(name, [0] * 50), preemption_rate_per_hour=rate)

    market = SpotMarket((flaky("us-central1-a", 3.0), flaky("us-central1-b", 0.01)), transfer)
    sim = _JobSim(job(2.0), market, get_strategy("same_zone_first"), SpotParams())
    prefer_a = PlacementConstraint(prefer_zone="us-central1-a")
    assert sim.best("spot", 2.0, prefer_a, 0.0, 4.0).zone.zone == "us-central1-b"
    assert sim.best("spot", 2.0, prefer_a, 0.0, 10.0).zone.zone == "us-central1-a"
