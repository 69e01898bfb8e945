from __future__ import annotations

import datetime as dt
import json
import re

import numpy as np
import pytest

from sailor_tasks.errors import PERMANENT_ERRORS, InvalidQuotaError
from sailor_tasks.rebalance.collect import build_problem, peak_concurrency
from sailor_tasks.rebalance.scenario import generate, philly_team_demand, reader_counts
from sailor_tasks.rebalance.solver import solve

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def _row(team, region, gpu, gpus, start_h, end_h, dataset="sailor://source/d"):
    return {
        "team": team,
        "region": region,
        "gpu_type": gpu,
        "gpus": gpus,
        "started_at": T0 + dt.timedelta(hours=start_h),
        "ended_at": T0 + dt.timedelta(hours=end_h),
        "dataset_uri": dataset,
    }


def test_demand_is_mean_gpus_over_the_window_and_peak_is_concurrency():
    rows = [
        _row("a", "r1", "T4", 8, 0, 12),  # 96 GPU-hours
        _row("a", "r1", "T4", 4, 6, 30),  # 18 h inside a 24 h window → 72 GPU-hours
        _row("b", "r2", "L4", 2, -10, 2, dataset="sailor://r2/e"),  # 2 h inside → 4 GPU-hours
    ]
    problem, stats = build_problem(
        rows,
        [{"dataset_uri": "sailor://source/d", "region": "r1", "bytes": 500}],
        {("r1", "T4"): 10, ("r2", "L4"): 4},
        since=T0,
        until=T0 + dt.timedelta(hours=24),
        budget_bytes=1000,
        size_of=lambda uri: 77,
        quotas={"a": {"max": {"r2": 0}}},
    )
    teams = {t.name: t for t in problem.teams}
    assert teams["a"].current == {"r1": {"T4": pytest.approx(168 / 24)}}
    assert teams["b"].current == {"r2": {"L4": pytest.approx(4 / 24)}}
    assert teams["a"].peak_gpus == 12 and teams["b"].peak_gpus == 2
    assert teams["a"].quota_max == {"r2": 0}
    assert stats["quotas_without_demand"] == []
    assert problem.datasets["sailor://source/d"].bytes == 500
    assert problem.datasets["sailor://source/d"].replicas == ("r1",)
    # in r2's bucket with no replica recorded: sized by size_of, complete in r2
    e = problem.datasets["sailor://r2/e"]
    assert e.bytes == 77 and e.replicas == ("r2",)
    assert stats["gpu_hours"] == pytest.approx(172)
    assert problem.supply == {"r1": {"T4": 10.0}, "r2": {"L4": 4.0}}


def test_a_dataset_of_unknown_size_is_left_out_never_counted_free():
    rows = [
        _row("a", "r1", "T4", 8, 0, 12, dataset="sailor://r1/d"),
        _row("b", "r1", "T4", 2, 0, 12, dataset="sailor://r1/gone"),
    ]
    problem, stats = build_problem(
        rows,
        [],
        {("r1", "T4"): 10, ("r2", "T4"): 10},
        since=T0,
        until=T0 + dt.timedelta(hours=24),
        budget_bytes=1000,
        size_of=lambda uri: None if uri.endswith("gone") else 400,
    )
    assert set(problem.datasets) == {"sailor://r1/d"} and problem.datasets["sailor://r1/d"].bytes == 400
    assert {t.name: t.datasets for t in problem.teams} == {"a": ("sailor://r1/d",), "b": ()}
    assert stats["unknown_size_datasets"] == ["sailor://r1/gone"]


def test_a_waiting_runs_new_dataset_neither_ties_its_team_nor_spends_the_budget():
    """A dataset in no region yet is copied by its run's place_data wherever the run goes: one
    larger than the whole budget does not make the night infeasible for every team, and its
    residency still keeps the team in its continent."""
    rows = [
        _row("nlp", "r1", "T4", 8, 0, 24),
        _row("nlp", "r1", "T4", 8, 20, 24, dataset="gs://corp/new-600gb"),
        _row("cv", "r1", "T4", 20, 0, 24, dataset="sailor://source/cv"),
    ]
    replicas = [
        {"dataset_uri": "sailor://source/d", "region": "r1", "bytes": 100},
        {"dataset_uri": "sailor://source/cv", "region": "r1", "bytes": 100},
    ]
    supply = {("r1", "T4"): 16, ("r2", "T4"): 16, ("r3", "T4"): 16}
    problem, stats = build_problem(
        rows,
        replicas,
        supply,
        since=T0,
        until=T0 + dt.timedelta(hours=24),
        budget_bytes=500,
        size_of=lambda uri: 600e9,
        residency=lambda uri: ["r1", "r2"] if uri == "gs://corp/new-600gb" else None,
    )
    assert stats["unplaced_datasets"] == ["gs://corp/new-600gb"]
    assert "gs://corp/new-600gb" not in problem.datasets
    nlp = next(t for t in problem.teams if t.name == "nlp")
    assert nlp.datasets == ("sailor://source/d",) and nlp.quota_max == {"r3": 0.0}
    solution = solve(problem, seed=0, time_limit_s=20.0)
    assert solution.max_ratio_after < solution.max_ratio_before  # the crowded r1 was relieved
    assert "r3" not in solution.shares["nlp"]


def test_a_team_whose_datasets_share_no_region_stays_where_it_ran_and_the_others_are_rebalanced():
    """One run on EU-only data, another on US-only data: no single region may hold all the team
    reads; it is kept where it ran, and the crowded team beside it is still rebalanced."""
    rows = [
        _row("nlp", "eu", "A100", 4, 0, 24, dataset="sailor://source/eu-corpus"),
        _row("nlp", "us", "A100", 4, 0, 24, dataset="sailor://source/us-corpus"),
        _row("vision", "us", "A100", 20, 0, 24, dataset="sailor://source/images"),
    ]
    replicas = [
        {"dataset_uri": "sailor://source/eu-corpus", "region": "eu", "bytes": 100},
        {"dataset_uri": "sailor://source/us-corpus", "region": "us", "bytes": 100},
        {"dataset_uri": "sailor://source/images", "region": "us", "bytes": 100},
    ]
    only = {"sailor://source/eu-corpus": ["eu"], "sailor://source/us-corpus": ["us", "us2"]}
    problem, stats = build_problem(
        rows,
        replicas,
        {("eu", "A100"): 16, ("us", "A100"): 16, ("us2", "A100"): 16},
        since=T0,
        until=T0 + dt.timedelta(hours=24),
        budget_bytes=1000,
        residency=only.get,
    )
    assert "no region (their restrictions do not overlap)" in stats["kept_in_place"]["nlp"]
    solution = solve(problem, seed=0, time_limit_s=20.0)
    assert solution.shares["nlp"] == {"eu": pytest.approx(0.5), "us": pytest.approx(0.5)}
    assert solution.max_ratio_after < solution.max_ratio_before and len(solution.shares["vision"]) > 1


def test_a_team_kept_where_it_ran_in_a_region_gone_from_the_supply_keeps_the_night_feasible():
    """The team is kept where it ran, but one of those regions no longer supplies its GPUs: its
    demand there is left out (a minimum nothing can meet made the whole night infeasible), and
    the rest of the night is solved."""
    rows = [
        _row("nlp", "eu", "A100", 4, 0, 24, dataset="sailor://source/eu-corpus"),
        _row("nlp", "gone", "A100", 4, 0, 24, dataset="sailor://source/us-corpus"),
        _row("vision", "us", "A100", 20, 0, 24, dataset="sailor://source/images"),
    ]
    replicas = [
        {"dataset_uri": "sailor://source/eu-corpus", "region": "eu", "bytes": 100},
        {"dataset_uri": "sailor://source/us-corpus", "region": "us", "bytes": 100},
        {"dataset_uri": "sailor://source/images", "region": "us", "bytes": 100},
    ]
    only = {"sailor://source/eu-corpus": ["eu"], "sailor://source/us-corpus": ["us", "gone"]}
    problem, stats = build_problem(
        rows,
        replicas,
        {("eu", "A100"): 16, ("us", "A100"): 16},
        since=T0,
        until=T0 + dt.timedelta(hours=24),
        budget_bytes=1000,
        residency=only.get,
    )
    assert "nlp" in stats["kept_in_place"]
    nlp = next(t for t in problem.teams if t.name == "nlp")
    assert nlp.quota_min == {"eu": 4.0} and nlp.current == {"eu": {"A100": 4.0}}
    solution = solve(problem, seed=0, time_limit_s=20.0)
    assert solution.shares["nlp"] == {"eu": pytest.approx(1.0)}


def test_collect_sizes_a_dataset_without_a_manifest_from_its_files(ctx):
    """A source the copier accepts without a manifest is sized by listing it (it was 0 bytes)."""
    from sailor_tasks import stages, storage

    raw = "sailor://us-central1/datasets/raw-text"  # in a region's bucket, no replica recorded
    for i in range(4):
        storage.write_bytes(storage.join(storage.resolve(raw, ctx.settings), f"part-{i}.txt"), b"x" * 250)
    torn = "sailor://us-central1/datasets/torn"  # its manifest was cut short
    storage.write_bytes(storage.join(storage.resolve(torn, ctx.settings), "part-0.txt"), b"x" * 10)
    storage.write_bytes(
        storage.join(storage.resolve(torn, ctx.settings), "_SAILOR_MANIFEST.json"), b'{"files": '
    )
    now = dt.datetime.now(dt.UTC)
    for team, uri in (("nlp", raw), ("cv", "sailor://us-central1/datasets/missing"), ("asr", torn)):
        ctx.ledger.enqueue(
            f"q-{team}",
            team=team,
            priority="normal",
            gpu_type="T4",
            gpus=8,
            request={"dataset_uri": uri},
            policy="fifo",
            max_wait_until=now + dt.timedelta(hours=5),
        )
    util = stages.collect_utilization(1.0, as_of=(now + dt.timedelta(hours=2)).isoformat(), ctx=ctx)
    assert {d["uri"]: d["bytes"] for d in util["problem"]["datasets"]} == {raw: 1000}
    assert util["unknown_size_datasets"] == ["sailor://us-central1/datasets/missing", torn]


def test_peak_counts_back_to_back_runs_once():
    rows = [_row("a", "r", "T4", 4, 0, 5), _row("a", "r", "T4", 4, 5, 10)]
    assert peak_concurrency(rows, T0, T0 + dt.timedelta(days=1)) == 4


def test_reader_counts_follow_mast_quantiles():
    counts = reader_counts(np.random.default_rng(0), 200_000)
    assert np.median(counts) == pytest.approx(3, abs=0.5)
    assert np.quantile(counts, 0.9) == pytest.approx(17, rel=0.1)
    assert np.quantile(counts, 0.99) == pytest.approx(45, rel=0.1)


def test_scenario_is_seeded_and_skewed():
    a = generate(regions=20, gpu_types=4, teams=400, datasets=1000, seed=3)
    b = generate(regions=20, gpu_types=4, teams=400, datasets=1000, seed=3)
    assert a.to_json() == b.to_json()
    from sailor_tasks.rebalance.problem import region_ratios

    load = {}
    for t in a.teams:
        for r, per in t.current.items():
            for g, n in per.items():
                load[(r, g)] = load.get((r, g), 0.0) + n
    ratios = region_ratios(load, a.cell_supply())
    assert max(ratios.values()) >= 2.0  # everyone wants the popular region
    total = sum(load.values()) / sum(a.cell_supply().values())
    assert total == pytest.approx(0.85, rel=1e-3)
    for t in a.teams:  # every team's data is where it runs now
        for d in t.datasets:
            assert set(t.current) <= set(a.datasets[d].replicas)


def test_scenario_with_given_supply_and_team_demand():
    supply = {"big": {"A": 400.0, "B": 100.0}, "small": {"A": 20.0}, "b-only": {"B": 60.0}}
    demand = [1.0, 1.0, 10.0, 100.0] * 25
    p = generate(datasets=300, seed=1, supply=supply, team_demand=demand)
    assert {r: dict(per) for r, per in p.supply.items()} == supply
    assert len(p.teams) == 100
    scale: dict[str, set[float]] = {}  # one GPU type: demand = given × that type's scale
    for t, given in zip(p.teams, demand, strict=True):
        if len(t.demand()) == 1:
            ((g, n),) = t.demand().items()
            scale.setdefault(g, set()).add(round(n / given, 3))
    assert scale and all(len(v) == 1 for v in scale.values()), scale
    for g in ("A", "B"):  # each GPU type scaled to demand_fraction of its supply
        want = sum(t.demand().get(g, 0.0) for t in p.teams)
        have = sum(per.get(g, 0.0) for per in supply.values())
        assert want == pytest.approx(0.85 * have, rel=1e-3)
    with pytest.raises(ValueError, match="every demand > 0"):
        generate(datasets=10, supply=supply, team_demand=[1.0, 0.0])


def test_quotas_with_a_misspelt_key_unknown_region_or_bad_number_are_refused_by_name():
    def collect(quotas):
        return build_problem(
            [_row("a", "r1", "T4", 4, 6, 30)],
            [],
            {("r1", "T4"): 10, ("r2", "L4"): 4, ("r3", "L4"): 0},
            since=T0,
            until=T0 + dt.timedelta(hours=24),
            budget_bytes=1000,
            quotas=quotas,
        )

    problem, _ = collect(
        {"a": {"max": {"*": 0, "r1": 8, "r3": 0}, "min": {"r2": 1}}, "idle-team": {"max": {"r2": 1}}}
    )
    assert {t.name: t.quota_max for t in problem.teams} == {"a": {"*": 0, "r1": 8, "r3": 0}}
    for quotas, message in (
        ({"a": {"maxx": {"r1": 1}}}, "quotas['a']: unknown key 'maxx'; valid: max, min"),
        (
            {"a": {"max": {"r9": 1}}},
            "quotas['a']['max']: 'r9' is not a region of the supply; valid: r1, r2, r3 and '*'",
        ),
        (
            {"a": {"min": {"*": 1}}},
            "quotas['a']['min']: '*' is not a region of the supply; valid: r1, r2, r3",
        ),
        ({"a": {"max": {"r1": "8"}}}, "quotas['a']['max']['r1']='8': need a number of GPUs ≥ 0"),
        ({"a": {"min": {"r1": -2}}}, "quotas['a']['min']['r1']=-2: need a number of GPUs ≥ 0"),
        ({"a": ["max"]}, "quotas['a']=['max']: need team → {"),
    ):
        with pytest.raises(InvalidQuotaError) as err:
            collect(quotas)
        assert message in str(err.value), (quotas, str(err.value))
        assert isinstance(err.value, PERMANENT_ERRORS)  # a task fails at once: a retry cannot fix it


def test_philly_team_demand_reads_plain_pairs_only(tmp_path):
    import pickle

    trace = tmp_path / "jobs.pickle"
    trace.write_bytes(pickle.dumps([(3600.0, 1), (7200.0, 8), (60.0, 2)]))
    got = philly_team_demand(str(trace), 3, seed=0)
    assert sorted(got) == [120.0, 3600.0, 57600.0]  # GPU-seconds of each job
    assert sorted(philly_team_demand(str(trace), 3, seed=0, measure="gpus")) == [1.0, 2.0, 8.0]
    with pytest.raises(ValueError, match="measure='hours'.*valid: gpu_seconds, gpus"):
        philly_team_demand(str(trace), 3, measure="hours")
    with pytest.raises(ValueError, match="teams=4"):
        philly_team_demand(str(trace), 4)
    trace.write_bytes(pickle.dumps([(1.0, 1), pytest.approx]))  # a class reference is refused
    with pytest.raises(pickle.UnpicklingError, match="only plain data"):
        philly_team_demand(str(trace), 1)


def test_problem_json_round_trip_and_cli(tmp_path, capsys):
    from sailor_tasks.cli.main import main
    from sailor_tasks.rebalance.problem import Problem

    p = generate(regions=5, gpu_types=2, teams=40, datasets=100, seed=0)
    assert Problem.from_json(json.loads(json.dumps(p.to_json()))).to_json() == p.to_json()
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(p.to_json()))
    assert main(["rebalance", "--scenario", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bytes_moved"] <= out["budget_bytes"] and out["max_ratio_after"] <= out["max_ratio_before"]
    assert main(["rebalance", "--scenario", str(path), "--full"]) == 0  # text: the summary, then the rest
    text = capsys.readouterr().out
    assert text.startswith("status") and "\nplacement:\n" in text and "\nshares:\n" in text
    assert main(["rebalance", "--scenario", str(tmp_path / "missing.json")]) == 2
    assert "neither 'generated' nor a problem JSON file" in capsys.readouterr().err
    unwritable = tmp_path / "no-such-folder" / "out.json"
    assert main(["rebalance", "--scenario", str(path), "--write-scenario", str(unwritable)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --write-scenario {str(unwritable)!r}: ") and "Traceback" not in err


def test_bad_problem_files_and_solver_options_are_refused_naming_the_value(tmp_path, capsys):
    from sailor_tasks.cli.main import main
    from sailor_tasks.rebalance.problem import Problem
    from sailor_tasks.rebalance.solver import solve

    cases = {
        "not json": "Expecting value",
        "[1]": "expected an object with supply",
        '{"supply": {}, "teams": []}': "missing datasets, budget_bytes",
        '{"supply": {}, "teams": [{"name": "a"}], "datasets": [], "budget_bytes": 1}': "teams[0] has no 'current'",
        '{"supply": {"r": {"A100": "x"}}, "teams": [], "datasets": [], "budget_bytes": 1}': (
            "supply['r']['A100']='x': need a finite number of GPUs"
        ),
        '{"supply": {"r": {"A100": NaN}}, "teams": [], "datasets": [], "budget_bytes": 1}': (
            "supply['r']['A100']=nan: need a finite number of GPUs"
        ),
        '{"supply": {}, "teams": [], "datasets": [{"uri": "gs://a"}], "budget_bytes": 1}': (
            "datasets[0] has no 'bytes'"
        ),
        '{"supply": {}, "teams": [{"name": "t", "current": {}, "quota_max": {"r": NaN}}], "datasets": [], '
        '"budget_bytes": 1}': "quota_max['r']=nan: need a finite number ≥ 0",
        '{"supply": {}, "teams": [{"name": "t", "current": {}, "priority": NaN}], "datasets": [], '
        '"budget_bytes": 1}': "priority=nan: need a finite number ≥ 0",
        '{"supply": {}, "teams": [], "datasets": [], "budget_bytes": 1, "storage_cap_bytes": {"r": "x"}}': (
            "storage_cap_bytes['r']='x': need a finite number ≥ 0"
        ),
        '{"supply": {}, "teams": [], "datasets": [{"uri": "d", "bytes": 1, "replicas": "r1"}], '
        '"budget_bytes": 1}': "replicas must be a list of strings",
        '{"supply": {}, "teams": [{"name": "t", "current": {}}, {"name": "t", "current": {}}], '
        '"datasets": [], "budget_bytes": 1}': "team name 't' appears twice",
        '{"supply": {}, "teams": [{"name": "t", "current": {}, "datasets": ["sailor://nope"]}], '
        '"datasets": [], "budget_bytes": 1}': "teams[0].datasets: 'sailor://nope' not among the problem's datasets",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.json"
        path.write_text(text)
        assert main(["rebalance", "--scenario", str(path)]) == 2, text
        err = capsys.readouterr().err
        assert message in err and str(path) in err and "Traceback" not in err, (text, err)

    for argv, message in (
        (["--seed", "-1"], "'-1': need an integer ≥ 0"),
        (["--time-limit", "0"], "'0': need a number > 0"),
        (["--comfort-ratio", "-3"], "'-3': need a number ≥ 0"),
        (["--budget-fraction", "nan"], "'nan': need a number ≥ 0"),
    ):
        with pytest.raises(SystemExit) as done:
            main(["rebalance", *argv])
        assert done.value.code == 2
        assert message in capsys.readouterr().err, argv

    problem = Problem.from_json(generate(regions=3, gpu_types=1, teams=4, datasets=4, seed=0).to_json())
    with pytest.raises(ValueError, match="time_limit_s=-1: need a number of seconds > 0"):
        solve(problem, time_limit_s=-1)
    with pytest.raises(ValueError, match="comfort_ratio=-0.5: need a demand/supply ratio ≥ 0"):
        solve(problem, comfort_ratio=-0.5)


def test_report_chart_and_markdown():
    from sailor_tasks.rebalance.report import render_chart, render_markdown, top_moves
    from sailor_tasks.rebalance.solver import solve

    p = generate(regions=5, gpu_types=2, teams=40, datasets=100, seed=0)
    s = solve(p).to_json()
    png = render_chart(s, "test")
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    moves = top_moves(p.to_json(), s["placement"], limit=3)
    assert len(moves) <= 3 and all(m["gpus_moved"] > 0 for m in moves)
    md = render_markdown(
        "t",
        s,
        moves,
        window="1 day",
        bytes_replicated=None,
        copies_done=None,
        version=None,
        chart_uri="x.png",
    )
    assert "not published (dry run)" in md and "Top moves" in md and f"{s['max_ratio_after']:.2f}" in md


def test_collect_reads_the_same_window_whatever_the_offset_of_as_of(ctx):
    from sailor_tasks import stages

    start = dt.datetime(2026, 3, 1, 2, 0, tzinfo=dt.UTC)
    ctx.ledger.upsert_run(
        "r1",
        job_name="j",
        team="vision",
        status="success",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/d",
        request={},
    )
    ctx.ledger.record_utilization("r1", "vision", "us-east1", "T4", 8, start, start + dt.timedelta(hours=2))
    until = dt.datetime(2026, 3, 2, 3, 0, tzinfo=dt.UTC)
    for offset_h in (0, 2, -5):
        as_of = until.astimezone(dt.timezone(dt.timedelta(hours=offset_h))).isoformat()
        assert stages.collect_utilization(1.0, as_of=as_of, ctx=ctx)["gpu_hours"] == pytest.approx(8.0), as_of


def _usage(run_id, team, region, gpu, gpus, started, ended, dataset):
    return {
        "run_id": run_id,
        "team": team,
        "region": region,
        "gpu_type": gpu,
        "gpus": gpus,
        "started_at": started,
        "ended_at": ended,
        "dataset_uri": dataset,
    }


def test_a_dataset_is_complete_in_the_region_its_sailor_uri_names():
    # as the placement engine counts it: no copy into its home region, and the team may go there
    until = dt.datetime(2026, 3, 1, 3, tzinfo=dt.UTC)
    since = until - dt.timedelta(days=1)
    uri = "sailor://us-east1/datasets/big"
    rows = [_usage("r", "t", "us-west1", "A100", 16, since, until, uri)]
    replicas = [{"dataset_uri": uri, "region": "us-west1", "bytes": 10**12}]
    supply = {("us-west1", "A100"): 8, ("us-east1", "A100"): 64}
    for budget in (0, 2 * 10**12):
        problem, _ = build_problem(rows, replicas, supply, since, until, budget_bytes=budget)
        assert set(problem.datasets[uri].replicas) == {"us-east1", "us-west1"}
        solved = solve(problem)
        assert solved.replicate == [] and solved.max_ratio_after < 1.0


def test_usage_of_a_gpu_type_no_region_supplies_is_left_out_and_listed():
    until = dt.datetime(2026, 3, 1, 3, tzinfo=dt.UTC)
    since = until - dt.timedelta(days=7)
    rows = [
        _usage("a", "big", "us-east1", "A100", 64, since, until, None),
        _usage("b", "legacy", "us-east1", "K80", 1, since, since + dt.timedelta(minutes=10), None),
    ]
    supply = {("us-east1", "A100"): 32, ("us-west1", "A100"): 64}
    problem, stats = build_problem(rows, [], supply, since, until, budget_bytes=0)
    assert [t.name for t in problem.teams] == ["big"] and stats["unsupplied_gpu_hours"] == {"K80": 0.166667}
    assert solve(problem).max_ratio_after <= 1.0  # the night's rebalance still runs for every team


def test_an_attempt_ended_without_its_report_still_counts_its_gpu_hours(ctx):
    from sailor_tasks.stages import collect_utilization
    from sailor_tasks.stages.attempts import end_orphaned_attempt

    now = dt.datetime.now(dt.UTC)
    ctx.ledger.upsert_run(
        "run-1", job_name="j", team="nlp", status="running", backend="local", model="tiny_gpt",
        dataset_uri="sailor://source/d", request={},
    )  # fmt: skip
    placement = {"region": "us-central1", "zone": "us-central1-a", "gpu_type": "A100", "num_gpus": 8}
    ctx.ledger.start_attempt("run-1", 1, 1, placement, {}, started_at=now - dt.timedelta(hours=10))
    running = collect_utilization(1.0, as_of=now.isoformat(), ctx=ctx)["gpu_hours"]
    end_orphaned_attempt(ctx, "run-1")  # its train task died; teardown ended it
    ended = collect_utilization(1.0, as_of=now.isoformat(), ctx=ctx)["gpu_hours"]
    assert running == ended == pytest.approx(80.0, rel=1e-3)


def test_a_waiting_run_counts_as_demand_only_in_regions_its_data_residency_allows(ctx):
    """Its unmet demand shows in the allowed region with the most capacity of its GPU type: within
    the continents its data_residency names, where alone it could ever run."""
    from sailor_tasks.stages.rebalance import queued_rows

    now = dt.datetime.now(dt.UTC)
    for run_id, residency in (("q-any", None), ("q-eu", ["EU"])):
        ctx.ledger.enqueue(
            run_id,
            team="nlp",
            priority="normal",
            gpu_type="T4",
            gpus=8,
            request={"dataset_uri": "sailor://source/d", "data_residency": residency},
            policy="fifo",
            max_wait_until=now + dt.timedelta(hours=5),
        )
    rows = {r["run_id"]: r for r in queued_rows(ctx, now + dt.timedelta(hours=1))}
    continent = ctx.catalog.transfer.continent
    assert continent(rows["q-eu"]["region"]) == "EU"
    assert continent(rows["q-any"]["region"]) != "EU"  # the largest T4 supply is elsewhere


def test_a_quota_of_a_team_with_no_demand_is_reported_not_silently_dropped():
    _, stats = build_problem(
        [_row("a", "r1", "T4", 8, 0, 12)],
        [],
        {("r1", "T4"): 10, ("r2", "T4"): 10},
        since=T0,
        until=T0 + dt.timedelta(hours=24),
        budget_bytes=1000,
        quotas={"a": {"max": {"r2": 4}}, "visoin": {"max": {"r1": 2}}},
    )
    assert stats["quotas_without_demand"] == ["visoin"]


def test_replicas_of_datasets_nobody_read_in_the_window_count_against_a_storage_cap():
    """Region B's bucket already holds a 10 GB replica no team read this window; its cap is 15 GB.
    Copying the 10 GB dataset both teams read (overloading A) would take B to 20 GB: not planned."""
    gb = 10**9
    rows = [_row(t, "A", "T4", 8, 0, 24, dataset="gs://b/d") for t in ("t", "u")]
    replicas = [
        {"dataset_uri": "gs://b/d", "region": "A", "bytes": 10 * gb},
        {"dataset_uri": "gs://b/old", "region": "B", "bytes": 10 * gb},
    ]
    supply = {("A", "T4"): 8, ("B", "T4"): 8}
    until = T0 + dt.timedelta(hours=24)
    p, _ = build_problem(
        rows, replicas, supply, T0, until, budget_bytes=100 * gb, storage_cap_bytes={"B": 15 * gb}
    )
    assert list(p.datasets) == ["gs://b/d"] and p.storage_held_bytes == {"B": 10 * gb}
    assert solve(p, time_limit_s=10).replicate == []
    roomy, _ = build_problem(
        rows, replicas, supply, T0, until, budget_bytes=100 * gb, storage_cap_bytes={"B": 20 * gb}
    )
    assert solve(roomy, time_limit_s=10).replicate == [
        {"dataset_uri": "gs://b/d", "region": "B", "bytes": 10 * gb}
    ]


@pytest.mark.parametrize("mip_max_binaries, team_block", [(200, 2000), (0, 2000), (0, 1)])
def test_a_team_kept_where_it_ran_keeps_each_gpu_type_in_its_region(mip_max_binaries, team_block):
    """Kept in place (its EU-only and US-only data share no region), the team's T4s stay in the EU
    and its A100s in the US: the solver may not swap them across regions to even out the cells,
    whether exact, rounded or solved in partitions (the kept team in another team's partition)."""
    rows = [
        _row("t", "eu", "T4", 8, 0, 24, dataset="gs://eu/d"),
        _row("t", "us", "A100", 8, 0, 24, dataset="gs://us/d"),
        _row("u", "us", "T4", 2, 0, 24, dataset="gs://us/e"),
    ]
    replicas = [
        {"dataset_uri": uri, "region": region, "bytes": 10**9}
        for uri, region in (("gs://eu/d", "eu"), ("gs://us/d", "us"), ("gs://us/e", "us"))
    ]
    supply = {("eu", "T4"): 4, ("eu", "A100"): 8, ("us", "T4"): 8, ("us", "A100"): 4}
    only = {"gs://eu/d": ["eu"], "gs://us/d": ["us"]}
    problem, stats = build_problem(
        rows, replicas, supply, T0, T0 + dt.timedelta(hours=24), budget_bytes=0, residency=only.get
    )
    assert list(stats["kept_in_place"]) == ["t"]
    sol = solve(problem, mip_max_binaries=mip_max_binaries, team_block=team_block, time_limit_s=20.0)
    assert sol.placement["t"] == {"eu": {"T4": 8.0}, "us": {"A100": 8.0}}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"teams": [{"name": "t", "current": {}, "quota_max": {"europe-west-4": 2}}]},
            "quota_max: 'europe-west-4' is not a region of the supply; valid: europe-west4, us-east1 or '*'",
        ),
        (
            {"teams": [{"name": "t", "current": {}, "quota_min": {"*": 2}}]},
            "quota_min: '*' is not a region of the supply; valid: europe-west4, us-east1;",
        ),
        (
            {"storage_cap_bytes": {"us-east": 10}},
            "storage_cap_bytes: 'us-east' is not a region of the supply",
        ),
        (
            {"datasets": [{"uri": "gs://d", "bytes": 1}, {"uri": "gs://d", "bytes": 2}]},
            "dataset uri 'gs://d' appears twice",
        ),
    ],
)
def test_a_scenario_naming_a_region_the_supply_lacks_or_a_dataset_twice_is_refused(change, said):
    """A misspelt region in a quota or a storage cap would otherwise be silently not applied, and
    a dataset given twice would keep only its second entry."""
    from sailor_tasks.rebalance.problem import Problem

    doc = {
        "supply": {"europe-west4": {"A100": 8}, "us-east1": {"A100": 8}},
        "teams": [],
        "datasets": [],
        "budget_bytes": 0,
        **change,
    }
    with pytest.raises(ValueError, match=re.escape(said)):
        Problem.from_json(doc)
