"""Decomposed solves (the LP stages per partition of teams) against one-partition solves: heavy-tailed
demand on skewed supply, the invariants every solve keeps, and the rounding's quotas."""

from __future__ import annotations

import numpy as np
import pytest

from sailor_tasks.rebalance.problem import Dataset, Problem, Team
from sailor_tasks.rebalance.scenario import generate
from sailor_tasks.rebalance.solver import solve

# Regions of very different sizes and GPU mixes.
SKEWED = {
    "big": {"A100": 64.0, "T4": 32.0},
    "mid": {"A100": 16.0, "T4": 48.0},
    "small": {"A100": 8.0},
    "edge": {"T4": 8.0},
}


def _heavy_tailed() -> Problem:
    """One team holds most of the A100 demand in the smallest A100 region; small teams whose data
    is only where they run (and no budget to copy it) crowd the same cells."""
    teams = [
        Team("whale", {"small": {"A100": 40.0}}),
        Team("pinned-a100", {"small": {"A100": 3.0}}, datasets=("only-small",)),
        Team("pinned-t4", {"edge": {"T4": 5.0}}, datasets=("only-edge",)),
        Team("t4-crowd", {"edge": {"T4": 12.0}}),
        Team("a100-mid", {"mid": {"A100": 9.0}}),
        Team("t4-big", {"big": {"T4": 20.0}}, datasets=("in-big-and-mid",)),
        Team("mixed", {"mid": {"A100": 2.0, "T4": 6.0}}),
        *(Team(f"small-{i}", {"big": {"A100": 1.0 + i % 3}}) for i in range(6)),
    ]
    datasets = [
        Dataset("only-small", 100, ("small",)),
        Dataset("only-edge", 100, ("edge",)),
        Dataset("in-big-and-mid", 100, ("big", "mid")),
    ]
    return Problem(supply=SKEWED, teams=tuple(teams), datasets={d.uri: d for d in datasets}, budget_bytes=0)


@pytest.mark.parametrize("team_block", [1, 2, 5])
def test_decomposed_heavy_tailed_demand_reaches_the_one_partition_balance(team_block):
    """Forced into 3 to 13 partitions (every team its own dataset cluster), the solve reaches the
    worst (region, GPU type) ratio of the one-partition solve, within 2% of the LP bound: the
    pinned small teams keep their room in the crowded cells and the whale takes spare GPUs
    elsewhere."""
    p = _heavy_tailed()
    one = solve(p, mip_max_binaries=0, team_block=1000)
    split = solve(p, mip_max_binaries=0, team_block=team_block)
    assert one.partitions == 1 and split.partitions >= 3
    assert one.max_cell_ratio_after <= 1.02 * one.lower_bound
    assert split.max_cell_ratio_after == pytest.approx(one.max_cell_ratio_after, abs=1e-4)
    assert split.max_cell_ratio_after <= 1.02 * split.lower_bound
    assert split.max_ratio_after == pytest.approx(one.max_ratio_after, abs=1e-4)
    assert split.placement["pinned-a100"] == {"small": {"A100": pytest.approx(3.0)}}


def _generated_heavy_tailed(seed: int) -> Problem:
    """The generator's datasets, quotas and home regions on skewed supply, with Pareto team demands
    (a few teams hold most GPUs)."""
    supply = {
        "r-huge": {"A100": 400.0, "T4": 200.0, "L4": 100.0},
        "r-large": {"A100": 120.0, "L4": 160.0},
        "r-mid": {"T4": 80.0, "L4": 40.0},
        "r-small": {"A100": 16.0, "T4": 8.0},
        "r-tiny": {"L4": 8.0},
        "r-odd": {"T4": 24.0, "A100": 8.0},
    }
    demand = np.random.default_rng(seed).pareto(1.1, size=160) + 0.05
    return generate(datasets=500, seed=seed, supply=supply, team_demand=demand.tolist(), quota_fraction=0.05)


def _check_invariants(p: Problem, s) -> None:
    """Every team's demand placed per GPU type, quotas, locality, byte budget and storage caps."""
    replicas = {d.uri: set(d.replicas) for d in p.datasets.values()}
    for c in s.replicate:
        replicas[c["dataset_uri"]].add(c["region"])
    for team in p.teams:
        placed: dict[str, float] = {}
        for region, per in s.placement[team.name].items():
            assert all(region in replicas[d] for d in team.datasets), (team.name, region)
            cap = team.cap(region)
            assert cap is None or sum(per.values()) <= cap + 1e-6, (team.name, region)
            for g, n in per.items():
                placed[g] = placed.get(g, 0.0) + n
        assert placed == pytest.approx(team.demand(), abs=1e-5), team.name
        assert sum(s.shares[team.name].values()) == pytest.approx(1.0, abs=1e-5)
    assert s.bytes_moved <= s.budget_bytes and s.cross_region_reads == 0
    stored = {r: 0.0 for r in p.storage_cap_bytes}
    for d in p.datasets.values():
        for r in d.replicas:
            stored[r] = stored.get(r, 0.0) + d.bytes
    for c in s.replicate:
        stored[c["region"]] += c["bytes"]
    assert all(stored[r] <= cap + 1e-6 for r, cap in p.storage_cap_bytes.items())


@pytest.mark.parametrize("seed", [11, 12])
def test_decomposed_solve_keeps_every_invariant_and_is_deterministic(seed):
    p = _generated_heavy_tailed(seed)
    split = solve(p, mip_max_binaries=0, team_block=40, seed=seed, time_limit_s=30)
    assert split.partitions >= 4
    _check_invariants(p, split)
    assert split.max_ratio_after <= 1.0 and split.max_cell_ratio_after <= 1.0  # capacity held
    again = solve(p, mip_max_binaries=0, team_block=40, seed=seed, time_limit_s=30)
    assert again.placement == split.placement and again.replicate == split.replicate
    one = solve(p, mip_max_binaries=0, team_block=1000, seed=seed, time_limit_s=30)
    assert split.max_cell_ratio_after == pytest.approx(one.max_cell_ratio_after, abs=1e-4)


def test_rounding_enables_no_region_a_quota_forbids():
    """The copy the budget affords goes where the team may run: the rounding does not spend it on
    a region its quota_max closes (b), so the team spreads over a and c."""
    p = Problem(
        supply={"a": {"T4": 10.0}, "b": {"T4": 10.0}, "c": {"T4": 10.0}},
        teams=(Team("t", {"a": {"T4": 20.0}}, datasets=("d",), quota_max={"b": 0.0}),),
        datasets={"d": Dataset("d", 100, ("a",))},
        budget_bytes=150,
    )
    s = solve(p, mip_max_binaries=0)
    assert any(st.startswith("rounded") for st in s.stage_status)
    assert s.replicate == [{"dataset_uri": "d", "region": "c", "bytes": 100}]
    assert set(s.shares["t"]) == {"a", "c"} and s.max_ratio_after == pytest.approx(1.0, abs=1e-5)


def test_rounding_enables_the_region_a_quota_min_requires():
    """quota_min in a region without the team's data: the rounding copies it there first, though
    the team's cell is not overloaded (the overloaded one, b, is relieved by a team without data)."""
    p = Problem(
        supply={"a": {"T4": 10.0}, "b": {"T4": 10.0}},
        teams=(
            Team("t", {"a": {"T4": 4.0}}, datasets=("d",), quota_min={"b": 2.0}),
            Team("u", {"b": {"T4": 6.0}}),
        ),
        datasets={"d": Dataset("d", 100, ("a",))},
        budget_bytes=150,
    )
    s = solve(p, mip_max_binaries=0)
    assert s.placement["t"]["b"]["T4"] >= 2.0 - 1e-6 and s.bytes_moved == 100


def test_few_binaries_are_one_exact_mip_whatever_the_team_count():
    p = _heavy_tailed()
    s = solve(p, team_block=1)
    assert s.partitions == 1 and s.status == "optimal"


@pytest.mark.parametrize("team_block", [1, 1000])
def test_rounded_quota_min_beyond_the_budget_names_the_budget_and_the_team(team_block):
    """A quota_min in a region the budget cannot bring the team's data to: infeasible on the
    rounding path too, whether or not decomposed, and the error names the budget and the team
    (not the teams of the partitions solved before it)."""
    from sailor_tasks.errors import RebalanceInfeasibleError

    p = Problem(
        supply={"a": {"T4": 10.0}, "b": {"T4": 10.0}},
        teams=(
            Team("a-early", {"a": {"T4": 6.0}}),
            Team("b-early", {"b": {"T4": 3.0}}, datasets=("e",)),
            Team("z-bad", {"a": {"T4": 4.0}}, datasets=("d",), quota_min={"b": 2.0}),
        ),
        datasets={"d": Dataset("d", 100, ("a",)), "e": Dataset("e", 50, ("b",))},
        budget_bytes=10,
    )
    with pytest.raises(RebalanceInfeasibleError, match="replication byte budget") as err:
        solve(p, mip_max_binaries=0, team_block=team_block)
    assert "'z-bad'" in str(err.value)
    if team_block == 1:
        assert "a-early" not in str(err.value)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_partition_rounding_uses_regions_the_chosen_copies_already_serve(seed):
    """A (team, region) pair whose missing data the chosen copies already bring there costs no byte
    more: the one-partition solve may use it, as a later partition of a decomposed solve does."""
    problem = generate(6, 2, 80, 150, seed=seed, budget_fraction=0.05, quota_fraction=0.1)
    one = solve(problem, mip_max_binaries=0, team_block=1000, seed=seed, time_limit_s=30)
    split = solve(problem, mip_max_binaries=0, team_block=10, seed=seed, time_limit_s=30)
    assert one.partitions == 1 and split.partitions > 1
    assert one.max_cell_ratio_after <= split.max_cell_ratio_after + 1e-4
