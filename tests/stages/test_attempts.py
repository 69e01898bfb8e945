"""Preemption recovery through the real stages: injected notices and kills on torchrun workers."""

from __future__ import annotations

import pytest

from sailor_tasks.errors import PreemptedError, RecoveryExhaustedError
from sailor_tasks.ledger import Ledger
from sailor_tasks.testing.run_inline import run_inline
from sailor_tasks.train.checkpoint.dcp import CheckpointManager, diff_states

pytestmark = pytest.mark.slow

BASE = {
    "job_name": "resilient",
    "team": "qa",
    "model": "tiny_gpt",
    "num_workers": 2,
    "total_steps": 30,
    "checkpoint_every_steps": 10,
    "batch_size": 8,
    "preemption_notice_s": 20,
}


def final_state(summary: dict) -> dict:
    root, step = summary["checkpoint_uri"].rsplit("/step-", 1)
    return CheckpointManager(root).load_all(int(step))


def test_noticed_and_unnoticed_preemptions_end_bit_identical_to_an_uninterrupted_run(
    settings, ctx, demo_dataset
):
    reference = run_inline({**BASE, "dataset_uri": demo_dataset}, "ref", ctx)
    summary = run_inline(
        {
            **BASE,
            "dataset_uri": demo_dataset,
            "inject_preemptions": [6],
            "inject_kills": [17],
            "recovery_strategy": "eager_next_region",
        },
        "preempted",
        ctx,
    )
    assert summary["steps"] == reference["steps"] == 30
    assert diff_states(final_state(reference), final_state(summary)) == []

    ledger = Ledger(settings.ledger_url)
    noticed, killed = sorted(ledger.preemptions("preempted"), key=lambda p: p["attempt"])
    assert noticed["noticed"] and noticed["steps_lost"] == 0 and noticed["recovery_s"] > 0
    assert not killed["noticed"] and 0 < killed["steps_lost"] <= BASE["checkpoint_every_steps"]
    attempts = ledger.attempts("preempted")
    assert [a["outcome"] for a in attempts] == ["preempted", "preempted", "completed"]
    # eager_next_region: every recovery left the regions that preempted the run.
    assert attempts[1]["region"] != attempts[0]["region"]
    assert attempts[2]["region"] not in (attempts[0]["region"], attempts[1]["region"])
    assert attempts[1]["resumed_from_step"] == noticed["step"]
    assert len(summary["attempts"]) == 3 and summary["region"] == attempts[2]["region"]
    # The run's cost counts the preempted attempts too.
    assert len(summary["markets"]) == 3
    assert ledger.get_run("preempted")["usd_estimate"] == pytest.approx(summary["usd_attempts"], abs=1e-6)
    assert summary["usd_estimate"] == pytest.approx(summary["usd_attempts"], abs=1e-6)
    # each recovery was planned knowing the checkpoint it resumes from and where it was saved
    plans = {p["attempt"]: p for p in ledger.placements("preempted")}
    for attempt in (2, 3):
        lost_region = attempts[attempt - 2]["region"]
        assert any(
            f"GB from {lost_region}" in line and "checkpoint" in line
            for line in plans[attempt]["explanation"]
        )


def test_exhausted_attempts_fail_with_a_message_listing_every_attempt(settings, ctx, demo_dataset):
    params = {
        **BASE,
        "dataset_uri": demo_dataset,
        "inject_preemptions": [4, 12],
        "recovery_strategy": "same_zone_first",
    }
    with pytest.raises(RecoveryExhaustedError, match=r"after 2 attempt") as info:
        run_inline(params, "doomed", ctx, max_tries=1)
    message = str(info.value)
    assert "attempt 1 (try 1)" in message and "attempt 2 (try 2)" in message
    assert message.count("preempted with notice") == 2
    assert not isinstance(info.value, PreemptedError)  # final: not retryable
    attempts = Ledger(settings.ledger_url).attempts("doomed")
    assert attempts[0]["zone"] == attempts[1]["zone"]  # same_zone_first retried the zone once
    run = Ledger(settings.ledger_url).get_run("doomed")
    assert run["status"] == "failed"


def test_each_attempt_records_its_market_why_cost_and_slack(settings, ctx, demo_dataset):
    """Default strategy (sailor) with a deadline: the plan and the recovery each ask it for a market;
    the summary and the ledger hold the market, the reason, the slack left and the attempt's cost."""
    summary = run_inline(
        {**BASE, "dataset_uri": demo_dataset, "deadline_hours": 2.0, "inject_preemptions": [6]},
        "economics",
        ctx,
    )
    assert summary["strategy"] == "sailor" and summary["deadline_hours"] == 2.0
    markets = summary["markets"]
    assert [m["attempt"] for m in markets] == [1, 2]
    for m in markets:
        assert m["strategy"] == "sailor" and m["market"] in ("spot", "on_demand")
        assert m["why"].startswith("sailor: ")
        assert 0 < m["slack_h"] < 2.0  # hours to spare before the 2 h deadline at the decision
        assert m["hours"] > 0 and m["usd"] > 0
    assert markets[1]["slack_h"] < markets[0]["slack_h"]  # time passed between the two decisions
    assert summary["usd_attempts"] == pytest.approx(sum(m["usd"] for m in markets))
    rows = Ledger(settings.ledger_url).attempt_markets("economics")
    assert [(r["attempt"], r["market"]) for r in rows] == [(m["attempt"], m["market"]) for m in markets]
    assert all(r["usd"] == pytest.approx(r["hours"] * r["usd_per_hour"]) for r in rows)
    assert "Market per attempt" in summary["summary_md"]


def test_a_preemption_whose_row_was_never_recorded_does_not_stop_the_recovery(ctx, demo_dataset, monkeypatch):
    """The try that ended attempt 1 as preempted died before it recorded the preemption row: the
    next attempt still completes (its recovery time has nothing to attach to)."""
    real = Ledger.record_preemption

    def lost_for_attempt_1(self, run_id, attempt, *args, **kwargs):
        if attempt != 1:
            real(self, run_id, attempt, *args, **kwargs)

    monkeypatch.setattr(Ledger, "record_preemption", lost_for_attempt_1)
    summary = run_inline(
        {**BASE, "num_workers": 1, "total_steps": 20, "checkpoint_every_steps": 5, "dataset_uri": demo_dataset,
         "inject_preemptions": [6]},
        "lost-row",
        ctx,
    )  # fmt: skip
    assert summary["steps"] == 20
    assert [a["outcome"] for a in ctx.ledger.attempts("lost-row")] == ["preempted", "completed"]
    assert ctx.ledger.preemptions("lost-row") == []


def test_a_run_allowed_in_one_zone_resumes_there_after_a_preemption(settings, ctx, demo_dataset):
    """The request allows one region whose only zone has its GPU type: the recovery's blocked zone
    leaves no offer, so the run resumes in the zone it lost (once it has capacity) instead of
    failing for good."""
    params = {**BASE, "dataset_uri": demo_dataset, "regions": ["asia-east1"], "gpu_type": "V100"}
    summary = run_inline({**params, "inject_preemptions": [12]}, "one-zone", ctx)
    assert summary["steps"] == 30 and summary["zone"] == "asia-east1-c"
    attempts = Ledger(settings.ledger_url).attempts("one-zone")
    assert [a["outcome"] for a in attempts] == ["preempted", "completed"]
    assert {a["zone"] for a in attempts} == {"asia-east1-c"}


def test_a_deadline_relaunch_tries_looser_blocks_on_the_deadline_before_going_late(ctx, monkeypatch):
    """eager_next_region blocks the lost region; no offer outside it finishes by the deadline, one
    in it (another zone) does. Recovery tries every block on the deadline before it relaunches
    late (best effort): the run resumes in time, next door, rather than late, elsewhere."""
    from sailor_tasks.errors import NoFeasibleOfferError
    from sailor_tasks.model import JobRequest, Placement, from_dict, to_dict
    from sailor_tasks.stages import attempts, prepare

    req = from_dict(
        JobRequest,
        {**BASE, "dataset_uri": "sailor://source/d", "deadline_hours": 2.0, "strategy": "eager_next_region"},
    )
    lost = Placement("r", "gcp", "us-central1", "us-central1-a", "T4", 1, 1, 1, "spot", "n1-standard-4", 0.35)
    tried = []

    def plan(request, run_id, ctx, *, blocked_zones, best_effort, **kwargs):
        tried.append((len(blocked_zones) > 1, best_effort))
        if len(blocked_zones) > 1 and not best_effort:  # the region blocked: nothing in time
            raise NoFeasibleOfferError("1x T4", {"deadline": 2})
        zone = "europe-west1-b" if len(blocked_zones) > 1 else "us-central1-b"
        return {**to_dict(lost), "zone": zone, "region": zone[:-2]}

    monkeypatch.setattr(prepare, "plan", plan)
    monkeypatch.setattr(prepare, "provision", lambda *a, **k: {"status": "ready"})
    ctx.ledger.record_preemption("r", 1, "us-central1", "us-central1-a", True, 10, 0, None)
    placed, _ = attempts.recover(ctx, req, lost, {"data_uri": "x"}, "r", 2)
    assert placed.zone == "us-central1-b" and tried == [(True, False), (False, False)]


@pytest.mark.parametrize("preempt", [True, False])
def test_a_retried_try_records_how_the_attempt_it_launched_ended_from_its_report(
    ctx, demo_dataset, monkeypatch, preempt
):
    """The try died after the process group exited but before it recorded the end (a ledger
    error): the retry records the end its launch report gives, a preemption (recovered, then
    the next attempt) or a completion (its result, nothing trains again), not a failure."""
    from sailor_tasks import stages
    from sailor_tasks.ledger.store import aware, utcnow

    run_id = f"blip-{preempt}"
    params = {
        **BASE, "dataset_uri": demo_dataset, "num_workers": 1, "total_steps": 20,
        **({"inject_preemptions": [10]} if preempt else {}),
    }  # fmt: skip
    request = stages.validate(params, run_id, ctx)
    placement = stages.plan(request, run_id, ctx)
    data = stages.place_data(request, placement, run_id, ctx)
    stages.provision(request, placement, run_id, ctx)
    real, calls = ctx.ledger.record_utilization, []

    def blip(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("ledger failover")
        return real(*a, **k)

    monkeypatch.setattr(ctx.ledger, "record_utilization", blip)
    with pytest.raises(ConnectionError):
        stages.train(request, placement, data, run_id, ctx, try_number=1, max_tries=3)
    retried_at = utcnow()
    result = stages.train(request, placement, data, run_id, ctx, try_number=2, max_tries=3)
    # the attempt ended when its process group exited, not when the retry recorded it
    assert aware(ctx.ledger.attempts(run_id)[0]["ended_at"]) < retried_at
    attempts = [(a["attempt"], a["outcome"]) for a in ctx.ledger.attempts(run_id)]
    assert result["step"] == 20
    if preempt:
        assert attempts == [(1, "preempted"), (2, "completed")]
        [lost] = ctx.ledger.preemptions(run_id)
        assert lost["attempt"] == 1 and lost["noticed"]
    else:
        assert attempts == [(1, "completed")]
    assert len(calls) == len(attempts) + 1  # every attempt's use recorded once more after the blip


@pytest.mark.parametrize("lost_zone_has_room", [True, False])
def test_same_zone_first_relaunches_in_the_lost_zone_when_it_can_take_the_run(
    ctx, monkeypatch, lost_zone_has_room
):
    """After one preemption ``same_zone_first`` plans in the lost zone alone first (its learned
    preemption rate, raised by the preemption, does not send the run to a zone that only ties with
    it); when that zone cannot take the run now, the run is planned as without the preference."""
    import dataclasses

    from sailor_tasks.errors import CapacityUnavailableError
    from sailor_tasks.model import ClusterState, to_dict
    from sailor_tasks.placement import plan
    from sailor_tasks.request import from_params
    from sailor_tasks.stages import attempts, prepare

    req = from_params(
        {**BASE, "dataset_uri": "sailor://source/d", "recovery_strategy": "same_zone_first"}, ctx.catalog
    )
    lost = plan(req, ctx.catalog, ClusterState(), "sz")
    everywhere = {o.zone for o in ctx.catalog.offers}
    other = next(o.zone for o in ctx.catalog.offers if o.region == lost.region and o.zone != lost.zone)
    calls = []

    def planned(request, run_id, ctx, *, blocked_zones=frozenset(), **kw):
        calls.append(frozenset(blocked_zones))
        if blocked_zones == everywhere - {lost.zone}:
            if not lost_zone_has_room:
                raise CapacityUnavailableError(lost.region, lost.gpu_type, lost.num_gpus)
            return to_dict(lost)
        return to_dict(dataclasses.replace(lost, zone=other))

    monkeypatch.setattr(prepare, "plan", planned)
    monkeypatch.setattr(prepare, "provision", lambda *a, **k: None)
    placed, _ = attempts.recover(ctx, req, lost, {"data_uri": "x"}, "sz", 2)
    assert calls[0] == everywhere - {lost.zone}
    if lost_zone_has_room:
        assert placed.zone == lost.zone and len(calls) == 1
    else:
        assert placed.zone == other and calls[1:] == [frozenset()]
