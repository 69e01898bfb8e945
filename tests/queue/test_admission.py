"""Live admission order: the policy objects decide who gets freed capacity; priorities and latest
starts come first; estimated starts follow the order."""

from __future__ import annotations

import pytest

from sailor_tasks.queue import HeldRun, QueuedRun, estimate_starts, rank
from sailor_tasks.queue.admission import policy_targets

CAP = {"T4": 4}
THR = {"T4": 2.0}


def q(run_id, team, arrival, gpus=2, **kw):
    return QueuedRun(run_id, team, gpus, THR, arrival_s=arrival, expected_s=3600.0, **kw)


def held(run_id, team, gpus=2, end=3600.0):
    return HeldRun(run_id, team, gpus, "T4", THR, started_s=0.0, expected_end_s=end)


def order(ranked):
    return [r.run_id for r in ranked]


def test_las_admits_the_team_below_its_fair_share_before_an_earlier_arrival():
    # Team a holds 2 of 4 GPUs and has two more runs waiting; team b's single run arrived last.
    waiting = [q("a-2", "a", 1.0), q("a-3", "a", 2.0), q("b-1", "b", 3.0)]
    ranked = rank(waiting, [held("a-1", "a")], CAP, now_s=10.0, policy="las")
    assert order(ranked) == ["b-1", "a-2", "a-3"]
    assert "team b" in ranked[0].reason and "fair share" in ranked[0].reason
    fifo = rank(waiting, [held("a-1", "a")], CAP, now_s=10.0, policy="fifo")
    assert order(fifo) == ["a-2", "a-3", "b-1"]
    assert fifo[0].reason == "fifo: by arrival"


def test_las_team_weights_shift_the_fair_share():
    waiting = [q("a-2", "a", 1.0), q("b-1", "b", 2.0)]
    # Both teams hold one run; a weighs 3, so its fair share is larger and it goes first.
    running = [held("a-1", "a", gpus=1), held("b-0", "b", gpus=1)]
    assert order(rank(waiting, running, CAP, 10.0, "las", {"a": 3.0})) == ["a-2", "b-1"]
    assert order(rank(waiting, running, CAP, 10.0, "las", {"b": 3.0})) == ["b-1", "a-2"]


def test_las_targets_are_the_policy_allocation_per_team():
    waiting = [q("a-2", "a", 1.0), q("b-1", "b", 2.0)]
    targets = policy_targets("las", waiting, [held("a-1", "a")], CAP, 10.0)
    team_a = targets["a-1"] + targets["a-2"]
    assert team_a == pytest.approx(targets["b-1"], rel=1e-6)  # max-min fair across teams
    assert sum(targets.values()) == pytest.approx(4.0, rel=1e-6)  # the whole capacity is handed out


def test_edf_orders_by_deadline_and_runs_without_one_last():
    waiting = [
        q("late", "a", 1.0, deadline_s=50_000.0),
        q("none", "a", 0.5),
        q("soon", "b", 2.0, deadline_s=20_000.0),
    ]
    ranked = rank(waiting, [held("x", "a", gpus=4)], CAP, 10.0, "edf")
    assert order(ranked) == ["soon", "late", "none"]
    assert order(rank(waiting, [held("x", "a", gpus=4)], CAP, 10.0, "fifo")) == ["none", "late", "soon"]


def test_priority_classes_come_before_the_policy_and_urgent_runs_before_priorities():
    waiting = [
        q("low", "b", 0.0, priority="low"),
        q("normal", "b", 1.0),
        q("high", "a", 2.0, priority="high"),
        q("urgent", "a", 3.0, latest_start_s=100.0),
    ]
    ranked = rank(waiting, [held("x", "a", gpus=4)], CAP, now_s=10.0, policy="las")
    assert order(ranked) == ["urgent", "high", "normal", "low"]
    assert ranked[0].urgent and ranked[0].reason.startswith("urgent")
    assert ranked[1].reason.startswith("priority high")


def test_ftf_gives_every_queued_run_a_share():
    waiting = [q("a-2", "a", 1.0, steps_remaining=1000.0), q("b-1", "b", 2.0, steps_remaining=10.0)]
    ranked = rank(waiting, [], CAP, now_s=10.0, policy="ftf")
    assert {r.run_id for r in ranked} == {"a-2", "b-1"}
    assert all(r.reason.startswith("ftf:") for r in ranked)


def test_unknown_policy_and_priority_name_the_choices():
    with pytest.raises(ValueError, match="las, fifo, ftf, edf"):
        rank([q("a", "a", 0.0)], [], CAP, 0.0, "sjf")
    with pytest.raises(ValueError, match="low, normal, high"):
        q("a", "a", 0.0, priority="urgent")


def test_estimated_starts_follow_the_order_as_held_runs_end():
    # 4 GPUs: one run holds 2 until t=3600, another 2 until t=7200; three 2-GPU runs wait (1 h each).
    running = [held("h1", "a", end=3600.0), held("h2", "b", end=7200.0)]
    waiting = [q("w1", "a", 0.0), q("w2", "b", 1.0), q("w3", "a", 2.0)]
    starts = estimate_starts(waiting, running, CAP, now_s=100.0)
    assert starts == {"w1": 3600.0, "w2": 7200.0, "w3": 7200.0}
    too_big = q("huge", "a", 3.0, gpus=8)
    assert estimate_starts([too_big], [], CAP, 0.0) == {"huge": None}
    ranked = rank(waiting, running, CAP, 100.0, "fifo")
    assert [r.estimated_start_s for r in ranked] == [3600.0, 7200.0, 7200.0]
    assert [r.position for r in ranked] == [1, 2, 3]


def test_a_run_limited_to_some_regions_is_estimated_on_their_gpus_alone():
    # 2 T4 in r1 (held until t=3600) and 2 in r2 (free): a run that may use r1 only waits.
    by_region = {("r1", "T4"): 2, ("r2", "T4"): 2}
    running = [HeldRun("h", "a", 2, "T4", THR, started_s=0.0, expected_end_s=3600.0, region="r1")]
    waiting = [q("only-r1", "b", 0.0, regions=frozenset({"r1"})), q("any", "b", 1.0)]
    starts = estimate_starts(waiting, running, CAP, 100.0, by_region)
    # "any" waits behind it: the admission pass holds back runs on its GPU type (no backfill).
    assert starts == {"only-r1": 3600.0, "any": 3600.0}
    assert estimate_starts(waiting, running, CAP, 100.0)["only-r1"] == 100.0  # regions not known: pooled
    nowhere = q("r3", "b", 2.0, regions=frozenset({"r3"}))  # no capacity there at all
    assert estimate_starts([nowhere], running, CAP, 100.0, by_region) == {"r3": None}
    ranked = rank(waiting, running, CAP, 100.0, "fifo", region_capacity=by_region)
    assert [r.estimated_start_s for r in ranked] == [3600.0, 3600.0]
    # Ahead of "any" nothing waits: it takes r2's free GPUs now.
    assert estimate_starts(waiting[1:], running, CAP, 100.0, by_region) == {"any": 100.0}


def test_a_run_that_may_use_several_types_counts_the_runs_ahead_on_each():
    """A run pinned to T4 takes the T4s; a run behind it that may use T4 or V100 (the V100s held
    for 10 h) starts when the T4 run ends, not now; a run needing more GPUs than any one type has
    never starts."""
    cap = {"T4": 4, "V100": 4}
    running = [HeldRun("h", "a", 4, "V100", {"V100": 4.0}, started_s=0.0, expected_end_s=10 * 3600.0)]
    both = {"T4": 2.0, "V100": 4.0}
    pinned = QueuedRun("A", "a", 4, THR, arrival_s=0.0, expected_s=3600.0)
    either = QueuedRun("B", "b", 4, both, arrival_s=1.0, expected_s=3600.0)
    wide = QueuedRun("C", "b", 8, both, arrival_s=2.0, expected_s=3600.0)
    assert estimate_starts([pinned, either, wide], running, cap, 0.0) == {"A": 0.0, "B": 3600.0, "C": None}


def test_a_run_that_does_not_fit_holds_back_the_runs_behind_it_on_the_same_gpus():
    from sailor_tasks.queue import Ranked, admission_pass

    ranked = [
        Ranked("big", 1, "", None, blocks=("T4",)),
        Ranked("small-t4", 2, "", None, blocks=("T4",)),
        Ranked("l4", 3, "", None, blocks=("L4",)),
        Ranked("gone", 4, "", None, blocks=("L4",)),
        Ranked("urgent-t4", 5, "", None, urgent=True, blocks=("T4",)),
    ]
    tried = []

    def try_admit(r):
        tried.append(r.run_id)
        return {"big": False, "l4": True, "gone": None, "urgent-t4": True}[r.run_id]

    assert admission_pass(ranked, try_admit) == ["l4", "urgent-t4"]
    assert tried == ["big", "l4", "gone", "urgent-t4"]  # small-t4 waits behind big: no backfill


def test_a_run_held_back_holds_back_the_runs_behind_it_on_all_its_gpu_types():
    """A waits for T4s; B (any type, ahead of C) is held back behind it; C, a V100-only run
    behind B, must not take the V100s B waits for too (the order says B starts first)."""
    from sailor_tasks.queue import Ranked, admission_pass

    ranked = [
        Ranked("A-t4", 1, "", None, blocks=("T4",)),
        Ranked("B-any", 2, "", None, blocks=("T4", "V100")),
        Ranked("C-v100", 3, "", None, blocks=("V100",)),
        Ranked("D-a100", 4, "", None, blocks=("A100",)),
    ]
    tried = []

    def try_admit(r):
        tried.append(r.run_id)
        return r.run_id != "A-t4"

    assert admission_pass(ranked, try_admit) == ["D-a100"]
    assert tried == ["A-t4", "D-a100"]


def test_queue_settings_refuse_bad_values_naming_them():
    from sailor_tasks.settings import Settings

    base = {"SAILOR_STATE_DIR": "/tmp/sailor-settings-test"}
    s = Settings.from_env({**base, "SAILOR_QUEUE_POLICY": "edf", "SAILOR_TEAM_WEIGHTS": "ml=2, search=0.5"})
    assert s.queue_policy == "edf" and s.team_weights == (("ml", 2.0), ("search", 0.5)) and s.lease_s == 900
    with pytest.raises(ValueError, match=r"SAILOR_QUEUE_POLICY='sjf' .* valid: las, fifo, ftf, edf"):
        Settings.from_env({**base, "SAILOR_QUEUE_POLICY": "sjf"})
    with pytest.raises(ValueError, match=r"SAILOR_TEAM_WEIGHTS item 'ml=-1'"):
        Settings.from_env({**base, "SAILOR_TEAM_WEIGHTS": "ml=-1"})
    for far in ("inf", "1e-320", "nan"):  # the policies' LP cannot weigh them
        with pytest.raises(ValueError, match=rf"SAILOR_TEAM_WEIGHTS item 'ml={far}': .* from 0.001 to 1000"):
            Settings.from_env({**base, "SAILOR_TEAM_WEIGHTS": f"ml={far}"})
    with pytest.raises(ValueError, match=r"SAILOR_TEAM_WEIGHTS item 'ml'"):
        Settings.from_env({**base, "SAILOR_TEAM_WEIGHTS": "ml"})
    with pytest.raises(ValueError, match=r"SAILOR_LEASE_S='0'"):
        Settings.from_env({**base, "SAILOR_LEASE_S": "0"})


def test_a_lease_shorter_than_three_renewals_is_refused():
    """A heartbeat beats at most once a second and the GKE triggers renew at each 15 s poll: a
    shorter lease would expire under a run that is alive."""
    from sailor_tasks.settings import Settings

    base = {"SAILOR_STATE_DIR": "/tmp/sailor-settings-test"}
    with pytest.raises(
        ValueError, match=r"SAILOR_LEASE_S='2.5': need at least 3 seconds with SAILOR_BACKEND=local"
    ):
        Settings.from_env({**base, "SAILOR_LEASE_S": "2.5"})
    assert Settings.from_env({**base, "SAILOR_LEASE_S": "3"}).lease_s == 3
    gke = {**base, "SAILOR_BACKEND": "gke"}
    with pytest.raises(
        ValueError, match=r"SAILOR_LEASE_S='30': need at least 45 seconds with SAILOR_BACKEND=gke"
    ):
        Settings.from_env({**gke, "SAILOR_LEASE_S": "30"})
    assert Settings.from_env({**gke, "SAILOR_LEASE_S": "45"}).lease_s == 45


def test_a_waiting_run_holds_back_only_the_gpu_types_it_can_take():
    """A run that may use any type but only in r2, where only T4s are, waits for T4s: a run behind
    it that needs the A100s of r1 is not held back by it."""
    from sailor_tasks.queue import admission_pass

    cap = {"T4": 2, "A100": 8}
    by_region = {("r1", "A100"): 8, ("r2", "T4"): 2}
    running = [HeldRun("h", "a", 2, "T4", THR, started_s=0.0, expected_end_s=3600.0, region="r2")]
    anything = {"T4": 2.0, "A100": 9.0}
    x = QueuedRun("x", "b", 2, anything, arrival_s=0.0, expected_s=3600.0, regions=frozenset({"r2"}))
    y = QueuedRun("y", "c", 2, {"A100": 9.0}, arrival_s=1.0, expected_s=3600.0)
    ranked = rank([x, y], running, cap, 100.0, "fifo", region_capacity=by_region)
    assert [(r.run_id, r.blocks) for r in ranked] == [("x", (("r2", "T4"),)), ("y", (("r1", "A100"),))]
    assert [r.estimated_start_s for r in ranked] == [3600.0, 100.0]
    assert admission_pass(ranked, lambda r: r.run_id == "y") == ["y"]  # x does not fit, y does
    # Without regions the types are pooled: x may take A100s, so y waits behind it.
    pooled = rank([x, y], running, cap, 100.0, "fifo")
    assert pooled[0].blocks == (("", "A100"), ("", "T4"))


def test_a_waiting_run_holds_back_only_the_regions_it_can_take_its_gpus_in():
    """x and y both want 4 A100s; x may only use r1, which is full until h ends, and y only r2.
    y is not held back behind x (it cannot take r1's GPUs), and starts now; z, which may use
    either region, waits behind x (it could take the r1 GPUs x waits for), then takes r2's when
    y ends."""
    from sailor_tasks.queue import admission_pass

    cap = {"A100": 8}
    by_region = {("r1", "A100"): 4, ("r2", "A100"): 4}
    running = [HeldRun("h", "a", 4, "A100", THR, started_s=0.0, expected_end_s=3600.0, region="r1")]
    a100 = {"A100": 9.0}
    x = QueuedRun("x", "b", 4, a100, arrival_s=0.0, expected_s=3600.0, regions=frozenset({"r1"}))
    y = QueuedRun("y", "c", 4, a100, arrival_s=1.0, expected_s=3600.0, regions=frozenset({"r2"}))
    z = QueuedRun("z", "d", 4, a100, arrival_s=2.0, expected_s=3600.0)
    ranked = rank([x, y, z], running, cap, 100.0, "fifo", region_capacity=by_region)
    assert [r.estimated_start_s for r in ranked] == [3600.0, 100.0, 3700.0]
    tried = []

    def try_admit(r):
        tried.append(r.run_id)
        return r.run_id != "x"  # r1 is full

    assert admission_pass(ranked, try_admit) == ["y"]
    assert tried == ["x", "y"]  # z is held back behind x
