"""What an attempt leaves in the ledger when its task is retried: one utilization record per
attempt, however many times the task that ends it runs, and the run's results even when the try
that ended the attempt died before recording them."""

from __future__ import annotations

import datetime as dt
import importlib

import pytest

from sailor_tasks import stages, storage
from sailor_tasks.train.checkpoint.store import CheckpointStore

TRAIN_STAGE = importlib.import_module("sailor_tasks.stages.train")  # ``stages.train`` is the function


def _launched(ctx, run_id: str, dataset: str, workers: int):
    """(request, placement, data, attempt) of a run validated, planned, placed and launched."""
    params = {"dataset_uri": dataset, "num_workers": workers, "total_steps": 20, "checkpoint_every_steps": 10}
    req = stages.validate(params, run_id, ctx)
    pl = stages.plan(req, run_id, ctx)
    data = stages.place_data(req, pl, run_id, ctx)
    return req, pl, data, TRAIN_STAGE.launch_train(req, pl, data, run_id, ctx, try_number=1)


def _completed(run_id: str, workers: int, checkpoint_uri: str | None = None) -> dict:
    """The result the built-in trainer writes once training completed (20 steps)."""
    return {
        "run_id": run_id,
        "status": "completed",
        "step": 20,
        "total_steps": 20,
        "resumed_from_step": None,
        "initial_loss": 5.0,
        "final_loss": 2.0,
        "checkpoint_uri": checkpoint_uri,
        **({"checkpoint_step": 20} if checkpoint_uri else {}),
        "samples_per_s": 1.0,
        "wall_s": 1.0,
        "world_size": workers,
    }


def test_a_retried_finish_of_one_attempt_records_its_utilization_once(ctx, demo_dataset, monkeypatch):
    run_id = "manual__retried"
    req, pl, data, att = _launched(ctx, run_id, demo_dataset, workers=2)
    storage.write_json(att.config.result_uri, _completed(run_id, 2))  # what the workers leave behind
    seal = CheckpointStore.seal
    failures = [OSError("503 Service Unavailable")]

    def flaky_seal(self):
        if failures:
            raise failures.pop()
        return seal(self)

    monkeypatch.setattr(CheckpointStore, "seal", flaky_seal)
    with pytest.raises(OSError, match="503"):  # the first try dies after recording the usage
        TRAIN_STAGE.finish_train(req, run_id, att.number, 0, ctx, try_number=1)
    again = TRAIN_STAGE.launch_train(req, pl, data, run_id, ctx, try_number=2)  # Airflow's retry
    assert again.reattached and again.number == att.number
    TRAIN_STAGE.finish_train(req, run_id, again.number, 0, ctx, try_number=2)
    assert [a["outcome"] for a in ctx.ledger.attempts(run_id)] == ["completed"]
    rows = [
        r
        for r in ctx.ledger.utilization_rows(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        if r["run_id"] == run_id
    ]
    assert len(rows) == 1 and rows[0]["gpus"] == 2


def test_a_try_that_died_after_its_attempt_completed_leaves_the_runs_results_to_the_retry(
    ctx, demo_dataset, monkeypatch
):
    run_id = "manual__died-after"
    req, pl, data, att = _launched(ctx, run_id, demo_dataset, workers=1)
    storage.write_json(att.config.result_uri, _completed(run_id, 1, "file:///ckpt/step-20"))
    record = ctx.ledger.record_checkpoint

    def worker_lost(*args, **kwargs):  # the try dies right after the attempt was ended
        raise SystemExit("worker lost")

    monkeypatch.setattr(ctx.ledger, "record_checkpoint", worker_lost)
    with pytest.raises(SystemExit):
        TRAIN_STAGE.finish_train(req, run_id, att.number, 0, ctx, try_number=1)
    assert ctx.ledger.attempts(run_id)[-1]["outcome"] == "completed"
    monkeypatch.setattr(ctx.ledger, "record_checkpoint", record)
    out = TRAIN_STAGE.train(req, pl, data, run_id, ctx, try_number=2)  # Airflow's retry
    assert out["step"] == 20
    TRAIN_STAGE.train(req, pl, data, run_id, ctx, try_number=3)  # once more: recorded once
    run = ctx.ledger.get_run(run_id)
    assert (run["steps"], run["final_loss"], run["checkpoint_uri"]) == (20, 2.0, "file:///ckpt/step-20")
    assert [(c["step"], c["uri"]) for c in ctx.ledger.checkpoints(run_id)] == [(20, "file:///ckpt/step-20")]


def test_a_first_attempt_is_described_as_from_scratch(ctx):
    from sailor_tasks.stages.summary import describe_attempts

    ctx.ledger.upsert_run(
        "r", job_name="j", team="t", status="running", backend="local", model="tiny_gpt",
        dataset_uri="x", request={},
    )  # fmt: skip
    placement = {"region": "us-central1", "zone": "us-central1-a", "gpu_type": "T4", "market": "spot"}
    ctx.ledger.start_attempt("r", 1, 1, placement, {})
    ctx.ledger.end_attempt("r", 1, "preempted", step=12)
    ctx.ledger.start_attempt("r", 2, 1, placement, {})
    ctx.ledger.end_attempt("r", 2, "completed", step=20, resumed_from_step=12)
    first, second = describe_attempts(ctx, "r")
    assert "spot, from scratch: preempted" in first and "resumed from step 12: completed" in second


def test_an_attempt_whose_try_died_is_billed_and_counted_as_usage(ctx, demo_dataset):
    """Attempt 1's try died (no finish): the next try ends it, with its GPU time in the
    utilization the rebalance reads and its cost in the run's estimate; the summary says the run
    took two attempts without calling it a recovery from a preemption, and that the command saved
    no checkpoint."""
    import time

    from sailor_tasks.stages import attempts

    run_id = "manual__died"
    req, pl, data, first = _launched(ctx, run_id, demo_dataset, workers=1)
    time.sleep(0.3)
    second = attempts.begin_attempt(ctx, req, pl, data, run_id, 2)  # the sync train task's retry
    assert second.number == 2
    storage.write_json(second.config.result_uri, _completed(run_id, 1))
    res = attempts.finish_attempt(ctx, second, 0, 2, 2)
    markets = {m["attempt"]: m for m in ctx.ledger.attempt_markets(run_id)}
    assert markets[1]["hours"] > 0 and markets[1]["usd"] > 0
    rows = [
        r
        for r in ctx.ledger.utilization_rows(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        if r["run_id"] == run_id
    ]
    assert len(rows) == 2
    out = TRAIN_STAGE.finalize(req, pl, data, res, run_id, ctx)
    assert out["usd_estimate"] == pytest.approx(markets[1]["usd"] + markets[2]["usd"], abs=1e-6)
    assert out["usd_estimate"] > markets[2]["usd"] + 1e-6  # attempt 1 billed too
    assert "- **Attempts**: 2\n" in out["summary_md"] and "Recovered" not in out["summary_md"]
    assert "**Checkpoint**: none (the command saved no checkpoint)" in out["summary_md"]


def test_a_preemption_of_a_command_that_reports_no_step_counts_from_its_checkpoint(ctx, demo_dataset):
    """The run's own command writes no progress file: the preemption is recorded at the step of the
    checkpoint it left (not 0), the steps it lost as unknown, and the recovery plans the steps left
    after that checkpoint."""
    import time

    from sailor_tasks import paths
    from sailor_tasks.errors import PreemptedError
    from sailor_tasks.stages import attempts
    from sailor_tasks.stages.summary import describe_attempts

    run_id = "manual__noprogress"
    req, pl, data, att = _launched(ctx, run_id, demo_dataset, workers=1)
    store = CheckpointStore(att.config.checkpoint_uri, attempt=1)
    storage.write_bytes(storage.join(store.step_uri(10), "__0_0.distcp"), b"x" * 10)
    store.commit(10)
    preemption = {"key": "notice", "noticed": True, "at": time.time(), "zone": att.placement.zone}
    report = {"rc": 75, "step": None, "resumed_from": None, "first_step_at": None, "preemption": preemption}
    storage.write_json(paths.launch_report_uri(ctx.run_uri(att.placement.region, run_id)), report)
    with pytest.raises(PreemptedError, match="at step 10"):
        attempts.finish_attempt(ctx, att, 75, 1, 5)
    (p,) = ctx.ledger.preemptions(run_id)
    assert (p["step"], p["steps_lost"]) == (10, None)
    assert attempts._progress(ctx, run_id)["steps_done"] == 10
    assert "preempted with notice at step 10 (steps lost unknown)" in describe_attempts(ctx, run_id)[0]
