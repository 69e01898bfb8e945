"""What the nightly collect counts and refuses: an attempt whose utilization is recorded but which
was never ended counts once; an empty window is refused before anything is published."""

from __future__ import annotations

import datetime as dt

import pytest

from sailor_tasks.errors import InvalidRequestError


def _run(ctx, run_id, team="t"):
    ctx.ledger.upsert_run(
        run_id,
        job_name="j",
        team=team,
        status="running",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/d",
        request={},
    )


def test_an_attempt_never_ended_whose_utilization_is_recorded_counts_once(ctx):
    """finish_attempt records utilization first and ends the attempt later; a try dying in between
    leaves the attempt 'running' with a utilization row: its GPU-hours count once, from that row."""
    from sailor_tasks import stages
    from sailor_tasks.ledger.store import utcnow

    now = utcnow().replace(microsecond=0)
    started = now - dt.timedelta(hours=2)
    ended = now - dt.timedelta(hours=1)
    _run(ctx, "r1")
    pl = {"region": "us-east1", "zone": "us-east1-b", "gpu_type": "T4", "num_gpus": 4}
    ctx.ledger.start_attempt("r1", 1, 1, pl, {}, started_at=started)
    ctx.ledger.record_utilization("r1", "t", "us-east1", "T4", 4, started, ended)
    # (try dies here: end_attempt never ran)
    out = stages.collect_utilization(1.0, as_of=now.isoformat(), ctx=ctx)
    assert out["gpu_hours"] == pytest.approx(4.0)  # 4 GPUs for the recorded hour, not again in flight


def test_an_empty_window_or_a_negative_budget_is_refused_before_anything_is_published(ctx):
    """window_days=0 (or negative) yields an empty problem instead of an error; solve+publish then
    publish an assignment with no teams over the previous one."""
    from sailor_tasks import stages
    from sailor_tasks.ledger.store import utcnow

    now = utcnow()
    _run(ctx, "r1")
    ctx.ledger.record_utilization("r1", "t", "us-east1", "T4", 4, now - dt.timedelta(hours=5), now)
    ctx.ledger.publish_assignment({"t": {"us-east1": 1.0}}, source="earlier")
    before = ctx.ledger.latest_assignment()
    for days in (0.0, -1.0, float("nan")):
        with pytest.raises(InvalidRequestError, match="window_days"):
            stages.collect_utilization(days, as_of=now.isoformat(), ctx=ctx)
    with pytest.raises(InvalidRequestError, match="budget_gb"):
        stages.collect_utilization(7.0, as_of=now.isoformat(), budget_gb=-1.0, ctx=ctx)
    assert ctx.ledger.latest_assignment().version == before.version
