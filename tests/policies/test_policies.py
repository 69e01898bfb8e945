from __future__ import annotations

import itertools
import logging
from dataclasses import replace

import numpy as np
import pytest

from sailor_tasks.errors import InfeasibleAllocationError
from sailor_tasks.policies import Allocation, PolicyJob, PolicyState, get_policy, policy_names
from sailor_tasks.policies.base import singles
from sailor_tasks.policies.fairness import equal_share_throughput, max_min

from .conftest import random_state

ALL_POLICIES = ("fifo", "ftf", "las", "las_agnostic", "makespan", "max_throughput", "min_cost")
CLUSTERS = ({"K80": 4, "P100": 4, "V100": 4}, {"K80": 8, "P100": 2, "V100": 1}, {"V100": 3, "P100": 5})
SCALE_SETS = ((1,), (1, 2), (1, 2, 4))


def check_feasible(alloc: Allocation, state: PolicyState) -> None:
    x = alloc.matrix
    assert x.shape == (len(alloc.units), len(state.gpus))
    assert (x >= 0).all() and (x <= 1).all()
    per_job: dict[str, float] = {}
    for u, unit in enumerate(alloc.units):
        for job in unit:
            per_job[job] = per_job.get(job, 0.0) + float(x[u].sum())
    assert max(per_job.values(), default=0.0) <= 1 + 1e-6
    for g, used in alloc.gpus_used().items():
        assert used <= state.gpus[g] + 1e-6, (g, used)
    ids = {j.job_id for j in state.jobs}
    assert {j for unit in alloc.units for j in unit} <= ids
    # A job never gets time on a GPU type it cannot run on.
    by_id = {j.job_id: j for j in state.jobs}
    for u, unit in enumerate(alloc.units):
        for i, g in enumerate(alloc.gpu_types):
            if x[u, i] > 1e-9:
                assert all(by_id[j].throughput.get(g, 0) > 0 for j in unit)


def test_registry_lists_every_policy_and_rejects_unknown_names():
    assert set(ALL_POLICIES) <= set(policy_names())
    with pytest.raises(ValueError, match="unknown policy 'gandiva'.*valid policies: .*las, las_agnostic"):
        get_policy("gandiva")


@pytest.mark.parametrize(
    "policy, cluster, scales", list(itertools.product(ALL_POLICIES, CLUSTERS, SCALE_SETS))
)
def test_allocation_respects_capacity_and_bounds(table, policy, cluster, scales):
    for seed in range(2):
        state = random_state(table, n=12, gpus=cluster, seed=seed, scales=scales)
        check_feasible(get_policy(policy).allocate(state), state)


@pytest.mark.parametrize("policy, scales", list(itertools.product(("las", "makespan"), SCALE_SETS)))
def test_space_sharing_respects_capacity_and_bounds(table, policy, scales):
    state = random_state(table, n=40, gpus={"K80": 6, "P100": 6, "V100": 6}, seed=3, scales=scales)
    alloc = get_policy(policy).allocate(replace(state, space_sharing=True))
    check_feasible(alloc, state)
    assert any(len(unit) == 2 for unit in alloc.units)  # pairs were offered


def test_space_sharing_partitions_large_instances_and_stays_feasible(table):
    state = random_state(table, n=300, gpus={"K80": 75, "P100": 75, "V100": 75}, seed=4, space_sharing=True)
    alloc = get_policy("las").allocate(state)
    check_feasible(alloc, state)
    assert {j for unit in alloc.units for j in unit} == {j.job_id for j in state.jobs}


def test_space_sharing_partitions_leave_big_jobs_a_share(table):
    """With more jobs than one partition holds, a partition's share of 8 GPUs falls below an 8-GPU
    job's scale factor: the job still gets time, as without space sharing."""
    small = tuple(PolicyJob(f"s{i:02d}", {"V100": 1.0}) for i in range(70))
    big = PolicyJob("big", {"V100": 8.0}, scale_factor=8)
    state = PolicyState(jobs=(*small, big), gpus={"V100": 8}, space_sharing=True, table=table)
    alloc = get_policy("las").allocate(state)
    check_feasible(alloc, state)
    assert alloc.shares()["big"]["V100"] > 1e-3


def test_space_sharing_never_lowers_the_fair_share(table):
    state = random_state(table, n=24, gpus={"K80": 3, "P100": 3, "V100": 3}, seed=5, scales=(1,))

    def worst(alloc, st):
        units = singles(st.jobs, st.gpus)
        norm = equal_share_throughput(units, st.gpus)
        eff = alloc.effective_throughput()
        return min(eff[j.job_id] / (j.priority_weight * n) for j, n in zip(units.jobs, norm, strict=True))

    alone = get_policy("las").allocate(state)
    shared = get_policy("las").allocate(replace(state, space_sharing=True))
    assert worst(shared, state) >= worst(alone, state) - 1e-6


def test_las_with_equal_throughputs_gives_what_las_agnostic_gives():
    jobs = tuple(
        PolicyJob(f"j{i}", {"K80": 2.0, "P100": 2.0, "V100": 2.0}, scale_factor=s, priority_weight=w)
        for i, (s, w) in enumerate([(1, 1.0), (2, 1.0), (1, 2.0), (4, 1.0), (1, 1.0), (2, 3.0)])
    )
    # Every job fits on every type (4 GPUs or more of each); 9 GPUs for 11 GPUs of demand.
    state = PolicyState(jobs=jobs, gpus={"P100": 4, "V100": 5})
    las, agnostic = get_policy("las").allocate(state), get_policy("las_agnostic").allocate(state)
    assert las.units == agnostic.units
    coef = get_policy("las").coefficients(singles(state.jobs, state.gpus), state)

    def worst(alloc):
        e = alloc.effective_throughput()
        return min(e[j.job_id] * c for j, c in zip(singles(state.jobs, state.gpus).jobs, coef, strict=True))

    # The types are equally fast: las has nothing to exploit, so the same fair share and GPUs used.
    assert worst(agnostic) == pytest.approx(worst(las), rel=1e-6)
    assert sum(agnostic.gpus_used().values()) == pytest.approx(sum(las.gpus_used().values()), rel=1e-6)
    assert sum(las.gpus_used().values()) == pytest.approx(9.0, rel=1e-6)  # spare capacity handed out
    # The agnostic policy cannot tell the types apart: each job's time follows the GPU counts.
    split = agnostic.matrix / agnostic.matrix.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(split, np.tile([4 / 9, 5 / 9], (len(jobs), 1)), atol=1e-9)


@pytest.mark.parametrize("policy", ["las", "las_agnostic", "makespan", "ftf", "max_throughput"])
def test_no_time_on_a_type_with_fewer_gpus_than_the_job_needs(policy):
    # 4 V100s cannot hold an 8-GPU job in any round: the capacity row alone (8 · x ≤ 4) would let
    # the LP give it half the V100s' time, which the mechanism could never grant.
    jobs = (
        PolicyJob("big", {"K80": 1.0, "V100": 4.0}, scale_factor=8, steps_remaining=1e5, steps_total=1e5),
        PolicyJob("small", {"K80": 1.0, "V100": 3.0}, scale_factor=1, steps_remaining=1e4, steps_total=1e4),
    )
    alloc = get_policy(policy).allocate(PolicyState(jobs=jobs, gpus={"K80": 12, "V100": 4}))
    share = alloc.shares()["big"]
    assert share["V100"] == 0.0
    assert share["K80"] > 0.0


@pytest.mark.parametrize("policy", ["makespan", "ftf", "las", "max_throughput"])
def test_jobs_that_cannot_share_a_type_in_one_round_split_its_time(policy):
    # A 4-GPU job needs all 4 V100s whenever it runs there, so a 1-GPU job can use the V100s
    # only in the other rounds: their V100 time fractions add up to at most 1. The capacity row
    # alone (1 · x_small + 4 · x_big ≤ 4) allows x_small = 1 and x_big = 3/4, which no round
    # grants.
    speeds = {"small": (1, {"K80": 0.2, "P100": 0.5, "V100": 1.0}), "big": (4, {"K80": 0.8, "P100": 2.0, "V100": 4.0})}
    jobs = tuple(
        PolicyJob(name, thr, scale_factor=s, steps_remaining=1e6, steps_total=1e6, elapsed_s=100.0)
        for name, (s, thr) in speeds.items()
    )
    state = PolicyState(jobs=jobs, gpus={"K80": 12, "P100": 8, "V100": 4})
    solver = get_policy(policy)
    shares = solver.allocate(state).shares()
    assert shares["small"]["V100"] + shares["big"]["V100"] <= 1.0 + 1e-6
    session = solver.session(state.gpus) if hasattr(solver, "session") else None
    if session is not None:  # the kept model has no such rows: it hands the state to the policy
        again = session.allocate(state).shares()
        assert again["small"]["V100"] + again["big"]["V100"] <= 1.0 + 1e-6


def test_big_jobs_on_a_type_take_turns_there():
    # Two 3-GPU jobs on 4 GPUs never run together: their time fractions there add up to ≤ 1.
    thr = {"V100": 3.0}
    jobs = tuple(PolicyJob(f"j{i}", thr, scale_factor=3, steps_remaining=1e5) for i in range(2))
    alloc = get_policy("makespan").allocate(PolicyState(jobs=jobs, gpus={"V100": 4}))
    assert alloc.matrix.sum() == pytest.approx(1.0, abs=1e-6)


def test_las_agnostic_fills_the_spare_capacity_progressively():
    """Two 1-GPU jobs cap the fair share at one GPU each; the 8 GPUs leave 6 to the 2-, 4- and
    8-GPU jobs. Every GPU-second counts the same to the spare objective, so it alone would let the
    solver's vertex give them all to one job; filled progressively, the three raise their GPU
    shares together: the 2-GPU job stops at its bound (2 GPUs, all the time), the others share
    the rest equally."""
    scales = (1, 1, 2, 4, 8)
    gpus = {"V100": 8}
    jobs = tuple(PolicyJob(f"j{i}", {g: float(s) for g in gpus}, scale_factor=s) for i, s in enumerate(scales))
    alloc = get_policy("las_agnostic").allocate(PolicyState(jobs=jobs, gpus=gpus))
    gpu_share = alloc.matrix.sum(axis=1) * np.array(scales)
    np.testing.assert_allclose(gpu_share, [1.0, 1.0, 2.0, 2.0, 2.0], atol=1e-5)
    wider = get_policy("las_agnostic").allocate(PolicyState(jobs=jobs[:1] + jobs[2:], gpus={"V100": 11}))
    # 1 + 2 (at its bound) + 4 (at its bound) + 4 of the 8-GPU job's 8.
    np.testing.assert_allclose(wider.matrix.sum(axis=1) * np.array((1, 2, 4, 8)), [1.0, 2.0, 4.0, 4.0], atol=1e-5)


def test_las_agnostic_spreads_a_job_evenly_over_its_types_as_far_as_capacity_allows():
    gpus = {"V100": 4, "P100": 8, "K80": 12}
    thr = {"V100": 3.0, "P100": 2.0, "K80": 1.0}  # not seen by the agnostic policy
    few = tuple(PolicyJob(f"j{i}", thr) for i in range(6))
    alloc = get_policy("las_agnostic").allocate(PolicyState(jobs=few, gpus=gpus))
    split = {g: alloc.matrix[:, i] for i, g in enumerate(alloc.gpu_types)}
    # Room on every type: each job a third of its time on each (GPU counts would give 1/6 V100).
    for g in gpus:
        np.testing.assert_allclose(split[g], 1 / 3, atol=1e-6)
    # 24 one-GPU jobs fill the cluster: only the split by GPU counts fits.
    full = tuple(PolicyJob(f"j{i}", thr) for i in range(24))
    state = PolicyState(jobs=full, gpus=gpus)
    alloc = get_policy("las_agnostic").allocate(state)
    check_feasible(alloc, state)
    for i, g in enumerate(alloc.gpu_types):
        np.testing.assert_allclose(alloc.matrix[:, i], gpus[g] / 24, atol=1e-6)
    # In between (16 jobs): as even as the 4 V100s allow, and no type overfilled.
    mid = tuple(PolicyJob(f"j{i}", thr) for i in range(16))
    state = PolicyState(jobs=mid, gpus=gpus)
    alloc = get_policy("las_agnostic").allocate(state)
    check_feasible(alloc, state)
    used = alloc.gpus_used()
    assert used["V100"] == pytest.approx(4.0, abs=1e-6)  # the type that binds
    v100 = alloc.matrix[:, alloc.gpu_types.index("V100")]
    assert 4 / 24 < v100[0] <= 4 / 16 + 1e-9


def test_las_gives_multi_gpu_jobs_an_equal_share_per_gpu():
    # Same model and speeds, 1 and 4 workers: equal GPU-seconds, so the 4-GPU job gets 1/4 the time.
    thr = {"K80": 1.0, "P100": 2.0, "V100": 3.0}
    jobs = (
        PolicyJob("one", thr, scale_factor=1),
        PolicyJob("four", {g: 4 * v for g, v in thr.items()}, scale_factor=4),
        PolicyJob("big", {g: 40 * v for g, v in thr.items()}, scale_factor=4),
    )
    state = PolicyState(jobs=jobs, gpus={"K80": 4, "P100": 4, "V100": 4})
    units = singles(state.jobs, state.gpus)
    coef = dict(zip((j.job_id for j in units.jobs), get_policy("las").coefficients(units, state), strict=True))
    # Normalised by throughput per GPU of the mix: 4 workers at 4x the steps/s are worth one GPU.
    assert coef["four"] == pytest.approx(coef["one"])
    assert coef["big"] == pytest.approx(coef["one"] / 10)


def test_las_hands_out_the_capacity_the_fair_share_leaves():
    # A 1-GPU job caps the fair share (it cannot use more than one GPU); the 8-GPU jobs still get
    # the rest of the cluster instead of just enough time to match it.
    jobs = (
        PolicyJob("small", {"K80": 1.0, "P100": 3.0, "V100": 5.0}, scale_factor=1),
        PolicyJob("a", {"K80": 5.0, "P100": 14.0, "V100": 31.0}, scale_factor=8),
        PolicyJob("b", {"K80": 28.0, "P100": 83.0, "V100": 231.0}, scale_factor=8),
    )
    state = PolicyState(jobs=jobs, gpus={"K80": 8, "P100": 8, "V100": 8})
    alloc = get_policy("las").allocate(state)
    # Every job runs all the time (1 + 8 + 8 GPUs), not the ~3 GPUs the fair share alone needs.
    np.testing.assert_allclose(alloc.matrix.sum(axis=1), [1.0, 1.0, 1.0], atol=1e-6)
    assert sum(alloc.gpus_used().values()) == pytest.approx(17.0, rel=1e-6)


def test_las_fair_share_is_at_least_what_the_agnostic_allocation_delivers(table):
    state = random_state(table, n=20, gpus={"K80": 4, "P100": 4, "V100": 4}, seed=6)
    units = singles(state.jobs, state.gpus)
    coef = get_policy("las").coefficients(units, state)

    def worst(alloc):
        e = alloc.effective_throughput()
        return min(e[j.job_id] * c for j, c in zip(units.jobs, coef, strict=True))

    las, agnostic = get_policy("las").allocate(state), get_policy("las_agnostic").allocate(state)
    assert worst(las) >= worst(agnostic) - 1e-9
    assert worst(las) > worst(agnostic) * 1.05  # heterogeneity pays on this instance


def test_merging_identical_jobs_keeps_the_optimum(table):
    state = random_state(table, n=60, gpus={"K80": 5, "P100": 5, "V100": 5}, seed=7, scales=(1, 2))
    policy = get_policy("las")
    merged = policy.allocate(state)  # identical jobs merged into counted rows
    units = singles(state.jobs, state.gpus)
    coef = policy.coefficients(units, state)
    full = max_min(units, state.gpus, coef, "las")  # one row per job
    e = merged.effective_throughput()
    worst = min(e[j.job_id] * c for j, c in zip(units.jobs, coef, strict=True))
    assert worst == pytest.approx(full[-1], rel=1e-6)


def _spare_objective(alloc, units, coef) -> float:
    """What the spare stage maximises: Σ_j w_j² · coef_j · steps/s of job j."""
    e = alloc.effective_throughput()
    w = np.array([j.priority_weight for j in units.jobs])
    return float(sum(e[j.job_id] * c * wj * wj for j, c, wj in zip(units.jobs, coef, w, strict=True)))


@pytest.mark.parametrize(("n", "seed"), [(120, 0), (120, 1), (120, 2), (1100, 3)])
def test_the_spare_stage_from_the_fair_shares_basis_reaches_a_fresh_solves_optimum(
    table, monkeypatch, caplog, n, seed
):
    """The spare stage starts from the first stage's optimal basis in the same HiGHS model (simplex
    or, above ``IPM_ABOVE_VARS`` columns, interior point and crossover); its optimum (the fair
    share kept, the spare objective) is that of both stages solved from scratch."""
    from sailor_tasks.errors import InfeasibleAllocationError
    from sailor_tasks.policies import base, fairness

    gpus = {g: n // 10 for g in ("K80", "P100", "V100")}
    state = random_state(table, n=n, gpus=gpus, seed=seed, scales=(1, 2, 4))
    state = replace(state, jobs=tuple(replace(j, priority_weight=1.0 + 0.01 * i) for i, j in enumerate(state.jobs)))
    policy = get_policy("las")
    warm_starts = []

    def counted(*args):
        warm_starts.append(args)
        return base.resolve(*args)

    monkeypatch.setattr(fairness, "resolve", counted)
    caplog.set_level(logging.DEBUG, logger=fairness.logger.name)
    warm = policy.allocate(state)
    assert len(warm_starts) == 1 and "solving it anew" not in caplog.text  # the warm start itself ended optimal

    def fails(*args):
        raise InfeasibleAllocationError("las", "Unknown")

    monkeypatch.setattr(fairness, "resolve", fails)
    fresh = policy.allocate(state)  # the warm start fails: the spare stage is solved from scratch
    assert "solving it anew" in caplog.text
    units = singles(state.jobs, state.gpus)
    coef = policy.coefficients(units, state)
    for alloc in (warm, fresh):
        check_feasible(alloc, state)
    e_warm, e_fresh = warm.effective_throughput(), fresh.effective_throughput()
    worst = [min(e[j.job_id] * c for j, c in zip(units.jobs, coef, strict=True)) for e in (e_warm, e_fresh)]
    assert worst[0] == pytest.approx(worst[1], rel=1e-7)
    assert _spare_objective(warm, units, coef) == pytest.approx(_spare_objective(fresh, units, coef), rel=1e-7)


def _assert_session_matches_fresh_solve(policy, session, state):
    """The session's allocation is feasible and reaches the fresh solve's optimum (worst job)."""
    a, b = session.allocate(state), policy.allocate(state)
    check_feasible(a, state)
    units = singles(state.jobs, state.gpus)
    coef = policy.coefficients(units, state)
    ea, eb = a.effective_throughput(), b.effective_throughput()
    worst = [min(e[j.job_id] * c for j, c in zip(units.jobs, coef, strict=True)) for e in (ea, eb)]
    assert worst[0] == pytest.approx(worst[1], rel=1e-7)


def test_session_reuses_the_model_and_matches_fresh_solves(table):
    policy = get_policy("las")
    gpus = {"K80": 4, "P100": 4, "V100": 4}
    session = policy.session(gpus)
    pool = random_state(table, n=80, gpus=gpus, seed=8, scales=(1, 2)).jobs
    rng = np.random.default_rng(0)
    for _ in range(15):
        pick = sorted(set(rng.integers(0, len(pool), 25).tolist()))
        _assert_session_matches_fresh_solve(
            policy, session, PolicyState(jobs=tuple(pool[i] for i in pick), gpus=gpus)
        )
    assert session.solves == 15


def test_session_compacts_idle_classes_and_still_matches_fresh_solves(table):
    policy = get_policy("las")
    # 8 GPUs per type: no job of 4 GPUs or fewer excludes another (the session keeps its model).
    gpus = {"K80": 8, "P100": 8, "V100": 8}
    session = policy.session(gpus)
    pool = random_state(table, n=200, gpus=gpus, seed=8, scales=(1, 2, 4)).jobs
    rng = np.random.default_rng(0)
    for _ in range(60):  # small, changing job sets: many classes go idle and come back
        pick = sorted(set(rng.integers(0, len(pool), 10).tolist()))
        _assert_session_matches_fresh_solve(
            policy, session, PolicyState(jobs=tuple(pool[i] for i in pick), gpus=gpus)
        )
    assert session.compactions > 0
    assert session.h.getNumCol() == 1 + 3 * len(session._slot_class) < 1 + 3 * len(session.counts)


class _StopsOnce:
    """A HiGHS model whose next hot-started solve stops after 0 simplex iterations (a solve that
    ends without an optimum, as HiGHS' "Unknown" does); later solves run normally."""

    def __init__(self, h):
        self._h, self.stopped = h, False

    def __getattr__(self, name):
        return getattr(self._h, name)

    def run(self):
        if self.stopped:
            return self._h.run()
        self.stopped = True
        self._h.setOptionValue("simplex_iteration_limit", 0)
        try:
            return self._h.run()
        finally:
            self._h.setOptionValue("simplex_iteration_limit", 2**31 - 1)


def test_session_solves_again_from_scratch_when_a_hot_started_solve_ends_without_optimum(table):
    import highspy

    policy = get_policy("las")
    gpus = {"K80": 4, "P100": 4, "V100": 4}
    session = policy.session(gpus)
    pool = random_state(table, n=40, gpus=gpus, seed=3, scales=(1, 2)).jobs
    session.allocate(PolicyState(jobs=pool[:20], gpus=gpus))
    stops = _StopsOnce(session.h)
    session.models[0] = session.h = stops
    state = PolicyState(jobs=pool[10:], gpus=gpus)
    _assert_session_matches_fresh_solve(policy, session, state)
    assert stops.stopped and stops.getModelStatus() == highspy.HighsModelStatus.kOptimal


def test_min_cost_needs_prices_for_every_gpu_type(table):
    state = random_state(table, n=4, gpus={"K80": 1, "V100": 1}, seed=0)
    with pytest.raises(ValueError, match=r"positive, finite price per GPU-hour for V100 \(given none\)"):
        get_policy("min_cost").allocate(replace(state, usd_per_gpu_hour={"K80": 0.4}))
    for bad in (float("nan"), float("inf"), -1.0):  # NaN passed a "<= 0" check: an all-zero allocation
        with pytest.raises(ValueError, match=rf"V100 \(given {bad}\)"):
            get_policy("min_cost").allocate(replace(state, usd_per_gpu_hour={"K80": 0.4, "V100": bad}))


def test_min_cost_meets_deadlines_or_says_it_cannot(table):
    job = PolicyJob("slo", {"K80": 1.0, "V100": 4.0}, steps_remaining=3600.0, deadline_s=1800.0)
    prices = {"K80": 0.5, "V100": 2.5}
    alloc = get_policy("min_cost").allocate(
        PolicyState(jobs=(job,), gpus={"K80": 1, "V100": 1}, usd_per_gpu_hour=prices)
    )
    assert alloc.effective_throughput()["slo"] >= 2.0 - 1e-6  # 3600 steps in 1800 s
    impossible = replace(job, deadline_s=100.0)
    with pytest.raises(InfeasibleAllocationError, match="min_cost"):
        get_policy("min_cost").allocate(
            PolicyState(jobs=(impossible,), gpus={"K80": 1, "V100": 1}, usd_per_gpu_hour=prices)
        )


def test_fifo_serves_jobs_in_arrival_order(table):
    jobs = tuple(PolicyJob(f"j{i}", {"V100": 1.0}, arrival_s=float(10 - i)) for i in range(3))
    alloc = get_policy("fifo").allocate(PolicyState(jobs=jobs, gpus={"V100": 1}))
    assert [j for j, s in alloc.shares().items() if s["V100"] == 1.0] == ["j2"]


def test_policies_are_deterministic(table):
    state = random_state(table, n=30, gpus={"K80": 4, "P100": 4, "V100": 4}, seed=9)
    for name in ALL_POLICIES:
        a, b = get_policy(name).allocate(state), get_policy(name).allocate(state)
        np.testing.assert_array_equal(a.matrix, b.matrix)


def test_flatten_and_unflatten_use_sorted_keys():
    jobs = (PolicyJob("b", {"V100": 1.0, "K80": 0.5}), PolicyJob("a", {"V100": 2.0}))
    units = singles(jobs, {"V100": 1, "K80": 1})
    assert [j.job_id for j in units.jobs] == ["a", "b"] and units.gpu_types == ("K80", "V100")
    vec = units.flatten({(("b",), "K80"): 0.25, (("a",), "V100"): 1.0})
    np.testing.assert_array_equal(vec, [0.0, 1.0, 0.25, 0.0])
    np.testing.assert_array_equal(units.unflatten(vec), [[0.0, 1.0], [0.25, 0.0]])


def test_ftf_allocates_a_job_whose_finish_time_ratio_is_in_the_thousands():
    """A 10-step job that waited two days beside one other job: its ρ is about 17,000 (its
    isolated finish time is seconds). The bisection's bound grows until it holds, and the job
    that waited gets the GPU."""
    jobs = (
        PolicyJob("a", {"V100": 1.0}, steps_remaining=10, steps_total=10, elapsed_s=2 * 86400),
        PolicyJob("b", {"V100": 1.0}, steps_remaining=1000, steps_total=1000, elapsed_s=0),
    )
    shares = get_policy("ftf").allocate(PolicyState(jobs=jobs, gpus={"V100": 1})).shares()
    assert shares["a"]["V100"] > 0.99
