"""The admission pass the live queue and the simulator share (``queue.admit``): time-outs, the
urgent on-demand fallback, failing at the latest start, holding back; the estimates it needs."""

from __future__ import annotations

import pytest

from sailor_tasks.errors import CapacityUnavailableError, NoFeasibleOfferError
from sailor_tasks.queue import QueuedRun, admit, estimate_hours, refused_on_arrival

CAP = {"T4": 4}
THR = {"T4": 2.0}
H = 3600.0


def q(run_id, team="a", arrival=0.0, gpus=2, **kw):
    return QueuedRun(run_id, team, gpus, THR, arrival_s=arrival, expected_s=H, **kw)


class FakeReserver:
    """Free GPUs per market; records every reserve call and every end."""

    def __init__(self, spot=0, on_demand=0, infeasible=(), gone=(), sells_on_demand=True):
        self.free = {"spot": spot, "on_demand": on_demand}
        self.sells_on_demand = sells_on_demand
        self.infeasible, self.gone = set(infeasible), set(gone)
        self.calls, self.ended, self.held = [], {}, {}

    def reserve(self, run, market, deadline_hours):
        self.calls.append((run.run_id, market, deadline_hours))
        if run.run_id in self.gone:
            return None
        if run.run_id in self.infeasible:
            raise NoFeasibleOfferError(f"{run.gpus}x T4", {"deadline": 1})
        m = market or "spot"
        if m == "on_demand" and not self.sells_on_demand:
            raise NoFeasibleOfferError(f"{run.gpus}x T4", {"market": 1})
        if self.free[m] < run.gpus:
            raise CapacityUnavailableError("r", "T4", run.gpus, [])
        self.free[m] -= run.gpus
        self.held[run.run_id] = m
        return True

    def end(self, run, state, reason):
        self.ended[run.run_id] = (state, reason)
        return True


def test_a_run_past_its_max_wait_times_out_naming_what_it_waited_for():
    res = FakeReserver(spot=4)
    out = admit([q("old", wait_until_s=100.0, waiting_for="2x T4 GPUs in r1")], [], CAP, 100.0, res)
    assert out.timed_out == ["old"] and out.admitted == [] and res.calls == []
    state, reason = res.ended["old"]
    assert state == "timed_out" and "waited 0.028 h" in reason and "2x T4 GPUs in r1" in reason


def test_an_urgent_run_goes_on_demand_when_spot_cannot_take_it_unless_it_asked_for_spot():
    urgent = dict(deadline_s=10 * H, latest_start_s=100.0)
    res = FakeReserver(spot=0, on_demand=4)
    out = admit([q("u", **urgent), q("s", arrival=1.0, market="spot", **urgent)], [], CAP, 100.0, res)
    assert out.admitted == ["u"] and res.held == {"u": "on_demand"}
    # The deadline counts from arrival: the engine gets the hours left.
    assert res.calls[:2] == [
        ("u", None, pytest.approx(10 - 100 / H)),
        ("u", "on_demand", pytest.approx(10 - 100 / H)),
    ]
    assert ("s", "on_demand", pytest.approx(10 - 100 / H)) not in res.calls
    assert out.failed == ["s"] and "cannot meet its deadline" in res.ended["s"][1]


def test_an_urgent_run_with_no_on_demand_offer_waits_for_its_own_market_until_its_latest_start():
    """Its market is full now but may free: the on-demand fallback having no offer at all does not
    fail it before its latest start."""
    run = q("u", deadline_s=10 * H, latest_start_s=1000.0)
    res = FakeReserver(spot=0, sells_on_demand=False)
    urgent = admit([run], [], CAP, 800.0, res)
    assert [c[1] for c in res.calls] == [None, "on_demand"]  # urgent: the fallback was tried
    assert urgent.failed == [] and [r.run_id for r in urgent.waiting] == ["u"] and res.ended == {}
    late = admit([run], [], CAP, 1000.0, res)
    assert late.failed == ["u"] and "no capacity at its latest start" in res.ended["u"][1]


def test_a_run_fails_at_its_latest_start_not_before_and_waits_until_then():
    run = q("d", deadline_s=5 * H, latest_start_s=4 * H)
    early = admit([run], [], CAP, 3 * H, FakeReserver())
    assert early.failed == [] and [r.run_id for r in early.waiting] == ["d"]
    res = FakeReserver()
    late = admit([run], [], CAP, 4 * H, res)
    assert late.failed == ["d"] and late.waiting == []
    assert "had to start by 1970-01-01T04:00:00+00:00" in res.ended["d"][1]
    assert "no capacity at its latest start" in res.ended["d"][1]


def test_a_run_no_offer_can_take_fails_at_once_and_a_gone_run_is_skipped():
    res = FakeReserver(spot=4, infeasible={"never"}, gone={"gone"})
    out = admit([q("never"), q("gone", arrival=1.0), q("ok", arrival=2.0)], [], CAP, 10.0, res, policy="fifo")
    assert out.failed == ["never"] and out.admitted == ["ok"]
    assert res.ended["never"][0] == "failed" and res.ended["never"][1].startswith("NoFeasibleOfferError")
    assert "gone" not in res.ended and out.waiting == []


def test_a_run_that_does_not_fit_holds_back_the_smaller_runs_behind_it():
    res = FakeReserver(spot=2)
    out = admit([q("big", gpus=4), q("small", arrival=1.0, gpus=1)], [], CAP, 10.0, res, policy="fifo")
    assert out.admitted == [] and [c[0] for c in res.calls] == ["big"]
    assert [r.run_id for r in out.waiting] == ["big", "small"]


def test_refused_on_arrival_when_its_latest_start_passed_or_it_may_not_wait():
    late = refused_on_arrival(q("l", deadline_s=2 * H, latest_start_s=50.0), 100.0)
    assert type(late).__name__ == "DeadlineUnmeetableError" and "nothing fits now either" in str(late)
    now = refused_on_arrival(q("n", wait_until_s=100.0, waiting_for="1x T4"), 100.0)
    assert type(now).__name__ == "QueueTimeoutError" and "1x T4" in str(now)
    assert refused_on_arrival(q("fine", wait_until_s=200.0, latest_start_s=150.0), 100.0) is None


def test_a_run_that_may_not_wait_gets_its_arrival_pass_before_it_times_out():
    """max_queue_hours 0 with others waiting: not refused on arrival, tried in the first pass that
    reads it, its arrival's or another's (admitted when it fits), timed out at the end of that pass
    when it does not."""
    zero = dict(arrival=10.0, wait_until_s=10.0, waiting_for="2x T4 GPUs")
    assert refused_on_arrival(q("z", **zero), 10.0, tried=False) is None
    assert type(refused_on_arrival(q("z", **zero), 10.0)).__name__ == "QueueTimeoutError"
    waiting = QueuedRun("w", "a", 4, {"V100": 2.0}, arrival_s=0.0, expected_s=H)  # holds back no T4 run
    cap = {"T4": 4, "V100": 4}
    res = FakeReserver(spot=2)
    out = admit([waiting, q("z", **zero)], [], cap, 10.0, res, policy="fifo", arriving=("z",))
    assert out.admitted == ["z"] and out.timed_out == [] and [r.run_id for r in out.waiting] == ["w"]
    res = FakeReserver(spot=0)
    out = admit([waiting, q("z", **zero)], [], cap, 10.0, res, policy="fifo", arriving=("z",))
    assert out.timed_out == ["z"] and res.ended["z"][0] == "timed_out" and "2x T4 GPUs" in res.ended["z"][1]
    assert [r.run_id for r in out.waiting] == ["w"]
    # Another run's pass that reads it before its own (a teardown's, a re-check) tries it once
    # too: admitted when it fits, else timed out; never timed out untried.
    out = admit([q("z", **zero)], [], CAP, 10.0, FakeReserver(spot=2))
    assert out.admitted == ["z"] and out.timed_out == []
    res = FakeReserver(spot=0)
    out = admit([q("z", **zero)], [], CAP, 10.0, res)
    assert out.timed_out == ["z"] and out.admitted == [] and res.ended["z"][0] == "timed_out"


def test_a_deadline_run_is_estimated_on_its_fastest_on_demand_offer_others_on_the_best():
    from sailor_tasks.catalog.throughput import load_packaged
    from sailor_tasks.model import ClusterState
    from sailor_tasks.simulator.queue import QueueJob, SimCapacity

    # T4 costs less per step than V100 (0.45x the speed at a quarter of the price).
    cap = SimCapacity(
        load_packaged(),
        {"V100": 4, "T4": 4},
        {"V100": 4, "T4": 4},
        prices={"spot": {"V100": 0.5, "T4": 0.1}, "on_demand": {"V100": 2.0, "T4": 0.5}},
    )
    job = QueueJob("r", "a", ("LM (batch size 20)", 2), total_steps=132.17 * 3600, arrival_s=0.0)
    idx, catalog = cap.placement.index, cap.placement.catalog
    best = estimate_hours(cap.request(job, "auto"), catalog, ClusterState(), idx)
    assert (best.market, best.gpu_type) == ("on_demand", "T4") and best.hours == pytest.approx(
        132.17 / 59.48, rel=1e-3
    )
    fastest = estimate_hours(cap.request(job, "auto", deadline_hours=3.0), catalog, ClusterState(), idx)
    assert (fastest.market, fastest.gpu_type) == ("on_demand", "V100") and fastest.hours == pytest.approx(
        1.0, rel=1e-3
    )
    # Held capacity does not count, summed as a ledger snapshot holds it or listed reservation by
    # reservation: the estimate is the same with every GPU held.
    full = ClusterState(held_gpus={(o.zone, o.gpu_type): o.capacity_gpus for o in catalog.offers})
    assert estimate_hours(cap.request(job, "auto"), catalog, full, idx) == best


def test_a_run_bound_to_one_market_is_estimated_on_that_market():
    """A spot-only deadline run's latest start comes from the spot offers it will run on (the
    on-demand ones, faster here, made it start too late); an on-demand-only run never counts spot."""
    from sailor_tasks.catalog.throughput import load_packaged
    from sailor_tasks.model import ClusterState
    from sailor_tasks.simulator.queue import QueueJob, SimCapacity

    cap = SimCapacity(
        load_packaged(),
        {"T4": 4},  # spot: T4 only
        {"V100": 4},  # on-demand: V100 only
        prices={"spot": {"V100": 0.5, "T4": 0.1}, "on_demand": {"V100": 2.0, "T4": 0.5}},
    )
    job = QueueJob("r", "a", ("LM (batch size 20)", 2), total_steps=132.17 * 3600, arrival_s=0.0)
    idx, catalog = cap.placement.index, cap.placement.catalog
    for deadline in (None, 30.0):
        spot = estimate_hours(cap.request(job, "spot", deadline_hours=deadline), catalog, ClusterState(), idx)
        assert (spot.market, spot.gpu_type) == ("spot", "T4")
        on_demand = estimate_hours(
            cap.request(job, "on_demand", deadline_hours=deadline), catalog, ClusterState(), idx
        )
        assert (on_demand.market, on_demand.gpu_type) == ("on_demand", "V100")
        auto = estimate_hours(cap.request(job, "auto", deadline_hours=deadline), catalog, ClusterState(), idx)
        assert auto.market == "on_demand"
        assert spot.hours > on_demand.hours
