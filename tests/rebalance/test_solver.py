"""The HiGHS rebalance solver on hand-built cases with known optima, and its error paths."""

from __future__ import annotations

import pytest

from sailor_tasks.errors import RebalanceInfeasibleError
from sailor_tasks.rebalance.problem import Dataset, Problem, Team
from sailor_tasks.rebalance.solver import solve

SUPPLY3 = {"a": {"T4": 10.0}, "b": {"T4": 10.0}, "c": {"T4": 10.0}}


def _problem(teams, datasets=(), budget=0, storage=None, supply=SUPPLY3):
    return Problem(
        supply=supply,
        teams=tuple(teams),
        datasets={d.uri: d for d in datasets},
        budget_bytes=budget,
        storage_cap_bytes=storage or {},
    )


def test_three_regions_known_optimum_spreads_evenly():
    """21 GPUs of demand on 3 × 10 GPUs: the optimum puts 7 in each region (ratio 0.7)."""
    p = _problem(
        [
            Team("t1", {"a": {"T4": 12.0}}),
            Team("t2", {"a": {"T4": 6.0}}),
            Team("t3", {"b": {"T4": 3.0}}),
        ]
    )
    s = solve(p)
    assert s.status == "optimal"
    assert s.max_ratio_before == pytest.approx(1.8)
    assert s.max_ratio_after == pytest.approx(0.7, abs=1e-5)
    assert s.lower_bound == pytest.approx(0.7) and s.region_lower_bound == pytest.approx(0.7)
    assert s.region_load_after == pytest.approx({"a": 0.7, "b": 0.7, "c": 0.7}, abs=1e-5)
    for shares in s.shares.values():
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-5)
    assert s.bytes_moved == 0 and s.replicate == []
    # the tie-breaker moves as few GPUs as possible: 11 of a's 18 leave (a keeps 7)
    assert s.gpus_moved == pytest.approx(11.0, abs=1e-4)


def test_comfort_ratio_moves_only_what_exceeds_it():
    p = _problem(
        [Team("t1", {"a": {"T4": 12.0}}), Team("t2", {"a": {"T4": 6.0}}), Team("t3", {"b": {"T4": 3.0}})]
    )
    s = solve(p, comfort_ratio=0.9)
    assert s.max_ratio_after == pytest.approx(0.9, abs=1e-5)
    assert s.gpus_moved == pytest.approx(9.0, abs=1e-4)  # a keeps 9 of its 18; nothing more moves
    assert s.lower_bound == pytest.approx(0.7)  # the bound is still the true one


def test_locality_team_never_runs_where_its_data_is_not():
    """t1 reads d1 (only in a) and there is no budget: t1 stays; t2 (no data) moves out instead."""
    d1 = Dataset("d1", 100, ("a",))
    p = _problem(
        [Team("t1", {"a": {"T4": 8.0}}, datasets=("d1",)), Team("t2", {"a": {"T4": 10.0}})],
        [d1],
        budget=0,
    )
    s = solve(p)
    assert set(s.shares["t1"]) == {"a"}
    assert s.placement["t1"]["a"]["T4"] == pytest.approx(8.0)
    # a holds 8 (t1); the 10 of t2 are spread over b and c: worst ratio 0.8
    assert s.max_ratio_after == pytest.approx(0.8, abs=1e-5)
    assert s.cross_region_reads == 0 and s.bytes_moved == 0


def test_budget_binds_and_the_cheaper_useful_copy_wins():
    """Two teams crowd a; moving either needs its dataset copied. With budget for only the small
    dataset, the small team moves; with budget for both, the ratio drops further."""
    big, small = Dataset("big", 1000, ("a",)), Dataset("small", 300, ("a",))
    teams = [
        Team("heavy", {"a": {"T4": 10.0}}, datasets=("big",)),
        Team("light", {"a": {"T4": 8.0}}, datasets=("small",)),
    ]
    tight = solve(_problem(teams, [big, small], budget=500))
    assert tight.bytes_moved == 300 <= tight.budget_bytes
    assert [(c["dataset_uri"]) for c in tight.replicate] == ["small"]
    assert set(tight.shares["heavy"]) == {"a"}
    assert tight.max_ratio_after == pytest.approx(1.0, abs=1e-5)  # heavy's 10 GPUs stay on a
    assert tight.max_ratio_after > tight.lower_bound  # the bound ignores the budget
    loose = solve(_problem(teams, [big, small], budget=5000))
    assert loose.max_ratio_after == pytest.approx(0.6, abs=1e-5)
    assert loose.max_ratio_after < tight.max_ratio_after
    assert loose.bytes_moved <= 5000


def test_rounding_under_a_binding_budget_brings_every_region_down_before_any_to_the_mean():
    """Rounding path (``mip_max_binaries=0``), budget for 70 bytes. Region a (12 GPUs on 10) holds
    "big" (9 GPUs, its data 40 bytes) and "small" (3 GPUs, 20 bytes); region b (11 on 10) holds
    "other" (11 GPUs, 50 bytes); c (30 GPUs) is empty. Taking a to the mean ratio (0.46) worst
    first would copy big's data (most GPUs per byte) and leave too little for other's: b stays at
    1.1. Bringing every region to a common level first copies small's and other's data (70
    bytes): a keeps big at 0.9, the optimum within the budget."""
    datasets = [Dataset("d-big", 40, ("a",)), Dataset("d-small", 20, ("a",)), Dataset("d-other", 50, ("b",))]
    teams = [
        Team("big", {"a": {"T4": 9.0}}, datasets=("d-big",)),
        Team("small", {"a": {"T4": 3.0}}, datasets=("d-small",)),
        Team("other", {"b": {"T4": 11.0}}, datasets=("d-other",)),
    ]
    supply = {"a": {"T4": 10.0}, "b": {"T4": 10.0}, "c": {"T4": 30.0}}
    problem = _problem(teams, datasets, budget=70, supply=supply)
    s = solve(problem, mip_max_binaries=0)
    assert s.stage_status[0].startswith("rounded")
    assert sorted(c["dataset_uri"] for c in s.replicate) == ["d-other", "d-small"]
    assert s.bytes_moved == 70 <= s.budget_bytes
    assert s.max_ratio_after == pytest.approx(0.9, abs=1e-5)
    exact = solve(problem)  # the exact MIP agrees
    assert s.max_ratio_after == pytest.approx(exact.max_ratio_after, abs=1e-5)


def test_storage_cap_limits_where_replicas_go():
    d = Dataset("d", 100, ("a",))
    p = _problem([Team("t", {"a": {"T4": 12.0}}, datasets=("d",))], [d], budget=1000, storage={"b": 50.0})
    s = solve(p)
    assert {c["region"] for c in s.replicate} == {"c"}  # b's cap cannot hold the 100 bytes
    assert "b" not in s.shares["t"]


def test_quota_max_is_respected():
    p = _problem([Team("t", {"a": {"T4": 18.0}}, quota_max={"c": 2.0})])
    s = solve(p)
    assert sum(s.placement["t"].get("c", {}).values()) <= 2.0 + 1e-6
    assert s.max_ratio_after == pytest.approx(0.8, abs=1e-5)  # 16 over a and b, 2 in c


@pytest.mark.parametrize(
    ("team", "constraint"),
    [
        (Team("t", {"a": {"T4": 12.0}}, quota_max={"*": 0.0, "a": 5.0}), "quota_max of team 't'"),
        (Team("t", {"a": {"T4": 4.0}}, quota_min={"a": 3.0, "b": 3.0}), "quota_min of team 't'"),
        (Team("t", {"a": {"T4": 4.0}}, quota_min={"zz": 1.0}), "quota_min of team 't'"),
    ],
)
def test_infeasible_quotas_name_the_binding_constraint(team, constraint):
    with pytest.raises(RebalanceInfeasibleError, match="binding constraint") as err:
        solve(_problem([team]))
    assert constraint in str(err.value)


def test_quota_that_needs_a_copy_beyond_the_budget_names_the_budget():
    d = Dataset("d", 100, ("a",))
    team = Team("t", {"a": {"T4": 4.0}}, datasets=("d",), quota_min={"b": 2.0})
    with pytest.raises(RebalanceInfeasibleError, match="replication byte budget"):
        solve(_problem([team], [d], budget=10))
    ok = solve(_problem([team], [d], budget=100))
    assert ok.placement["t"]["b"]["T4"] >= 2.0 - 1e-6 and ok.bytes_moved == 100


def test_unknown_gpu_type_is_a_clear_error():
    with pytest.raises(RebalanceInfeasibleError, match="'H100'.*valid: T4"):
        solve(_problem([Team("t", {"a": {"H100": 1.0}})]))


def test_rounding_path_keeps_budget_locality_and_improves(monkeypatch):
    """Above the binary threshold the solver rounds the LP (greedy repair): still within budget,
    no cross-region reads, and the busiest region drops."""
    from sailor_tasks.rebalance.scenario import generate

    p = generate(regions=8, gpu_types=3, teams=120, datasets=400, seed=1, budget_fraction=0.5)
    s = solve(p, mip_max_binaries=0, team_block=60, time_limit_s=20)
    assert any("rounded" in st for st in s.stage_status) and s.partitions == 2
    assert s.bytes_moved <= s.budget_bytes
    assert s.cross_region_reads == 0
    assert s.max_ratio_after < s.max_ratio_before
    replicas = {d.uri: set(d.replicas) for d in p.datasets.values()}
    for c in s.replicate:
        replicas[c["dataset_uri"]].add(c["region"])
    for team in p.teams:
        for region in s.shares[team.name]:
            assert all(region in replicas[d] for d in team.datasets), (team.name, region)


@pytest.mark.parametrize("mip_max_binaries", [200, 0])
def test_a_team_stays_in_the_regions_its_datasets_may_be_stored_in(mip_max_binaries):
    """t reads d, which data residency keeps in a and b: with budget to copy it anywhere, t's
    demand spreads over a and b only (ratio 0.9), never to c, and no replica goes to c; u, which
    reads nothing restricted, takes c."""
    d = Dataset("d", 100, ("a",), regions=("a", "b"))
    p = _problem(
        [Team("t", {"a": {"T4": 18.0}}, datasets=("d",)), Team("u", {"a": {"T4": 6.0}})],
        [d],
        budget=1000,
    )
    s = solve(p, mip_max_binaries=mip_max_binaries)
    assert set(s.shares["t"]) <= {"a", "b"}
    assert {c["region"] for c in s.replicate} <= {"b"}
    assert s.max_ratio_after == pytest.approx(0.9, abs=1e-5)  # t's 18 on a and b, u's 6 in c
    assert s.lower_bound == pytest.approx(0.9, abs=1e-5)  # the bound knows the restriction too
    unrestricted = solve(_problem(p.teams, [Dataset("d", 100, ("a",))], budget=1000))
    assert unrestricted.max_ratio_after == pytest.approx(0.8, abs=1e-5)


def test_datasets_that_may_be_stored_nowhere_with_the_team_s_gpus_name_data_residency():
    d = Dataset("d", 100, ("a",), regions=("zz",))
    with pytest.raises(RebalanceInfeasibleError, match="data_residency of team 't'") as err:
        solve(_problem([Team("t", {"a": {"T4": 4.0}}, datasets=("d",))], [d]))
    assert "'d'" in str(err.value) and "T4" in str(err.value)


@pytest.mark.parametrize(
    "supply, quota_max",
    [
        ({"A": {"A100": 8}, "B": {"T4": 8}}, {}),  # region A no longer supplies T4
        ({"A": {"T4": 8}, "B": {"T4": 8}}, {"A": 0}),  # a quota now keeps the team out of A
    ],
)
@pytest.mark.parametrize("mip_max_binaries", [200, 0])
def test_demand_that_cannot_stay_where_it_ran_moves_with_its_data_exact_or_rounded(
    supply, quota_max, mip_max_binaries
):
    """The team ran T4s in A, its data only there. Tonight it cannot stay in A: the exact MIP and
    the rounding (above ``mip_max_binaries``) both copy its data to B and move it there."""
    p = Problem(
        supply,
        (Team("t", {"A": {"T4": 2}}, ("d",), quota_max=quota_max),),
        {"d": Dataset("d", 10, ("A",))},
        budget_bytes=100,
    )
    sol = solve(p, mip_max_binaries=mip_max_binaries, time_limit_s=10)
    assert sol.shares == {"t": {"B": 1.0}}
    if mip_max_binaries:  # the exact MIP: solved to within HiGHS's gap, and says so
        assert sol.status == "optimal" and sol.stage_status[0] == "p0:A:optimal within a 1% gap"
    else:
        assert sol.status == "feasible" and sol.stage_status[0].startswith("rounded")
    assert sol.replicate == [{"dataset_uri": "d", "region": "B", "bytes": 10}]


def test_a_team_kept_where_it_runs_in_a_cell_with_no_supply_is_refused_naming_it():
    from sailor_tasks.rebalance.problem import Problem as P

    p = Problem({"A": {"T4": 8}}, (Team("t", {"A": {"T4": 2}, "B": {"T4": 1}}, pinned=True),), {}, 0)
    with pytest.raises(RebalanceInfeasibleError, match=r"team 't' kept where it runs.*1 T4 GPUs in B"):
        solve(p)
    doc = p.to_json()
    assert doc["teams"][0]["pinned"] is True and P.from_json(doc) == p
    doc["teams"][0]["pinned"] = "yes"
    with pytest.raises(ValueError, match=r"teams\[0\]: pinned 'yes' is not true or false"):
        P.from_json(doc)


@pytest.mark.parametrize("mip_max_binaries", [200, 0])
def test_a_team_its_datas_residency_moves_gets_a_region_although_every_one_it_may_use_is_full(
    mip_max_binaries,
):
    """t's dataset may only be in europe-west4, which u (9 of 10 A100s) holds over the mean: t's
    demand must leave us-east1 for it. With the replicas rounded greedily (no MIP binaries), t still
    gets europe-west4 and the model moves u out to make room, as the MIP does."""
    doc = {
        "supply": {"europe-west4": {"A100": 10}, "us-east1": {"A100": 10}, "us-west1": {"A100": 10}},
        "teams": [
            {"name": "t", "current": {"us-east1": {"A100": 10}}, "datasets": ["gs://eu-only"]},
            {"name": "u", "current": {"europe-west4": {"A100": 9}}},
        ],
        "datasets": [
            {"uri": "gs://eu-only", "bytes": 1000, "replicas": ["us-east1"], "regions": ["europe-west4"]}
        ],
        "budget_bytes": 10**12,
    }
    sol = solve(Problem.from_json(doc), mip_max_binaries=mip_max_binaries, time_limit_s=10)
    assert sol.placement["t"] == {"europe-west4": {"A100": pytest.approx(10.0)}}
    assert sol.max_cell_ratio_after == pytest.approx(1.0, abs=1e-4)
    assert [r["region"] for r in sol.replicate] == ["europe-west4"]
