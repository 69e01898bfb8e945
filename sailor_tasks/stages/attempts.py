"""One training attempt of the ``train`` stage: recover from the previous attempt's preemption, launch, end.

An attempt launches the process group on the run's current placement. When it is preempted, the
attempt and the preemption (zone, notice or not, step reached, steps lost) go to the ledger and
``PreemptedError`` is raised, so the orchestrator retries the task with backoff (each attempt is a
try in the Airflow UI). The next call finds the preempted attempt in the ledger and recovers before
launching: the run's recovery strategy turns the preemption history into a placement constraint,
and the same ``prepare.plan`` / ``prepare.place_data`` / ``prepare.provision`` code as the first
attempt re-plans with the blocked zones and the checkpoint it resumes from (another region's copy
of it priced and timed like the dataset's), places the data in the new region (copier, skipped when
a replica exists), copies the newest verified checkpoint to the new region's bucket and provisions.

Event sequence (``eager_next_region``, one noticed preemption)::

    try 1: launch in r1/z1 → notice at step 150 → checkpoint step 150 → exit 75 → PreemptedError
    try 2: strategy blocks r1 → plan picks r2/z3 → data + checkpoint copied to r2 → provision →
           launch → resume at step 150 → completed (steps lost 0, recovery seconds recorded)

On the last allowed try a preemption raises ``RecoveryExhaustedError`` listing every attempt.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, replace
from typing import Any

from sailor_tasks import paths, storage
from sailor_tasks.backends import TrainLaunch, get_backend
from sailor_tasks.errors import (
    CapacityUnavailableError,
    LeaseReclaimedError,
    NoFeasibleOfferError,
    PreemptedError,
    RecoveryExhaustedError,
    RunCancelledError,
    TrainingFailedError,
    TrainingInterruptedError,
)
from sailor_tasks.ledger.store import aware, utcnow
from sailor_tasks.model import RUN_STATUSES_LIVE, JobRequest, Placement, from_dict, run_key, to_dict
from sailor_tasks.stages import prepare
from sailor_tasks.stages.context import JSON, StageContext
from sailor_tasks.stages.summary import attempt_markets, describe_attempts
from sailor_tasks.stages.usage import attempt_run_uri, end_unreported_attempt, launch_report
from sailor_tasks.strategies import PreemptionRecord, RecoveryContext, get_strategy
from sailor_tasks.train.checkpoint.store import CheckpointStore
from sailor_tasks.train.config import TrainConfig

logger = logging.getLogger(__name__)


def injection_spec(req: JobRequest) -> JSON | None:
    """The run's preemption-injection params as a ``backends.preemption.InjectionSpec`` dict."""
    spec = {
        "notice_steps": list(req.inject_preemptions),
        "kill_steps": list(req.inject_kills),
        "rate_per_hour": req.preemption_rate_per_hour,
        "trace_uri": req.preemption_trace_uri,
        "trace_time_scale": req.preemption_trace_time_scale,
        "notice_s": req.preemption_notice_s,
        "seed": req.seed,
    }
    if not (spec["notice_steps"] or spec["kill_steps"] or spec["rate_per_hour"] or spec["trace_uri"]):
        return None
    return spec


def history(ctx: StageContext, run_id: str) -> tuple[PreemptionRecord, ...]:
    """The run's preemptions from the ledger, oldest first."""
    return tuple(
        PreemptionRecord(
            attempt=r["attempt"], region=r["region"], zone=r["zone"], noticed=r["noticed"], step=r["step"]
        )
        for r in reversed(ctx.ledger.preemptions(run_id, limit=10_000))
    )


def recover(
    ctx: StageContext, req: JobRequest, lost: Placement, data: JSON, run_id: str, attempt: int
) -> tuple[Placement, JSON]:
    """Place the run again after ``lost`` was preempted, through the first attempt's stage code."""
    # The market strategy decides where to resume unless the request names a recovery strategy.
    strategy = get_strategy(req.recovery_strategy or req.strategy)
    zones_by_region: dict[str, tuple[str, ...]] = {}
    for o in ctx.catalog.offers:
        zones_by_region.setdefault(o.region, ())
        if o.zone not in zones_by_region[o.region]:
            zones_by_region[o.region] += (o.zone,)
    constraint = strategy.next_constraint(RecoveryContext(req, lost, history(ctx, run_id), zones_by_region))
    blocked = constraint.all_blocked_zones(zones_by_region)
    progress = _progress(ctx, run_id)
    src = CheckpointStore(paths.checkpoint_uri(ctx.run_uri(lost.region, run_id)))
    # Where the run resumes from: another region copies this checkpoint first (planned like data).
    try:
        ckpt_bytes = src.committed_bytes()
    except OSError as exc:  # the copy after planning reads (and verifies) it again
        logger.warning("checkpoint size in %s unreadable (%s); planning without it", lost.region, exc)
        ckpt_bytes = None
    checkpoint = (lost.region, ckpt_bytes) if ckpt_bytes else None
    plan_req = replace(req, market=constraint.market) if constraint.market else req
    logger.info(
        "recovery attempt %d (%s): %s; blocked zones: %s",
        attempt,
        strategy.name,
        constraint.reason,
        ", ".join(sorted(blocked)) or "none",
    )
    # Blocked zones are a preference: with no offer outside them, only the lost zone is avoided;
    # with none outside that either (every offer the request allows is there), the run resumes
    # there, once it has capacity again, rather than fail for good.
    tries = [blocked]
    if not blocked <= {lost.zone}:
        tries.append(frozenset({lost.zone}))
    if blocked:
        tries.append(frozenset())
    preferred = constraint.prefer_zone is not None and constraint.prefer_zone not in blocked
    if preferred:
        # The zone the strategy retries first: only there, when it can take the run now.
        everywhere = {z for zs in zones_by_region.values() for z in zs}
        tries.insert(0, frozenset(everywhere - {constraint.prefer_zone}))
    # With a deadline, every tier is tried on it first: a looser block that finishes in time beats
    # a late relaunch; only when none does, the tiers are tried again without it (best effort).
    passes = (False, True) if req.deadline_hours is not None else (True,)
    order = [(best_effort, k, zones) for best_effort in passes for k, zones in enumerate(tries)]
    for i, (best_effort, k, zones) in enumerate(order):
        try:
            placed = prepare.plan(
                to_dict(plan_req),
                run_id,
                ctx,
                blocked_zones=zones,
                attempt=attempt,
                checkpoint=checkpoint,
                best_effort=best_effort,
                **progress,
            )
            break
        except CapacityUnavailableError:
            if not (preferred and k == 0):
                raise
            logger.warning("%s cannot take the run now; planning elsewhere", constraint.prefer_zone)
        except NoFeasibleOfferError:
            if i == len(order) - 1:
                raise
            if preferred and k == 0:
                logger.warning("no offer in %s fits the run; planning elsewhere", constraint.prefer_zone)
                continue
            if k < len(tries) - 1:
                logger.warning(
                    "no offer outside the blocked zones %s; %s",
                    ", ".join(sorted(zones)),
                    f"blocking only {lost.zone}" if tries[k + 1] else f"resuming in {lost.zone}",
                )
            else:
                logger.warning("no offer finishes run %s by its deadline; relaunching late", run_id)
    pl = from_dict(Placement, placed)
    if pl.region != lost.region:
        data = prepare.place_data(to_dict(req), placed, run_id, ctx)
        dst = paths.checkpoint_uri(ctx.run_uri(pl.region, run_id))
        step = src.copy_latest_to(dst)
        logger.info(
            "moved run %s from %s to %s; checkpoint step %s copied to %s",
            run_id,
            lost.region,
            pl.region,
            step,
            dst,
        )
    prepare.provision(to_dict(req), placed, run_id, ctx)
    return pl, data


def _progress(ctx: StageContext, run_id: str) -> dict[str, Any]:
    """Hours since the run was submitted and the step its newest checkpoint holds (market choice)."""
    run = ctx.ledger.get_run(run_id)
    elapsed_h = (utcnow() - aware(run["created_at"])).total_seconds() / 3600.0 if run else 0.0
    # The step the run resumes from: its last preemption recorded its newest checkpoint's.
    steps_done = int((run or {}).get("steps") or 0)
    return {"elapsed_h": max(0.0, elapsed_h), "steps_done": steps_done}


def _ts(epoch: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(epoch, dt.UTC) if epoch else None


def train_attempt(
    ctx: StageContext,
    request: JSON,
    placement: JSON,
    data: JSON,
    run_id: str,
    try_number: int = 1,
    max_tries: int = 0,
) -> JSON:
    """Run one attempt of training (recovering first when the previous attempt was preempted).

    ``begin_attempt`` → the backend's ``train`` (blocking) → ``finish_attempt``; a deferrable
    orchestrator calls the two halves itself around its wait (``airflow_glue.operators.SailorTrainOperator``).

    Args:
        placement, data: the first attempt's placement and placed data (the plan/place_data outputs).
        try_number: the orchestrator's try number of this call (1-based).
        max_tries: retries the orchestrator allows after the first try; a preemption on try
            ``max_tries + 1`` is final.

    Returns:
        The trainer's result plus ``placement``/``data`` of the attempt that completed, ``attempts``
        and ``train_wall_s``.

    Raises:
        PreemptedError: the attempt was preempted and the orchestrator may retry.
        RecoveryExhaustedError: preempted on the last allowed try (lists every attempt).
        TrainingFailedError: the process group failed for another reason.
    """
    backend = get_backend(from_dict(JobRequest, request).backend, ctx.settings)
    done = end_reported_attempt(ctx, request, run_id, try_number)
    if done is not None:
        return done
    att = begin_attempt(ctx, request, placement, data, run_id, try_number)
    rc = backend.train(att.launch)
    return finish_attempt(ctx, att, rc, try_number, max_tries)


def end_reported_attempt(ctx: StageContext, request: JSON, run_id: str, try_number: int = 1) -> JSON | None:
    """End the run's last attempt from its launch report when the try that launched it died after
    its process group exited but before recording how (a ledger or storage error, the task killed):
    the report says whether it completed, was preempted or failed, as it would have told that try.
    Returns the result of a completed attempt; None when there is nothing to end that way (no
    attempt running, or no report of its end), or when the attempt ended otherwise (recorded:
    the next attempt recovers from a preemption, resumes after a failure).

    Raises:
        RunCancelledError, LeaseReclaimedError: as ``finish_attempt``.
    """
    attempts = ctx.ledger.attempts(run_id)
    if not attempts or attempts[-1]["outcome"] != "running":
        return None
    last = attempts[-1]
    try:
        report = launch_report(attempt_run_uri(ctx, run_id, last))
    except (OSError, ValueError) as exc:
        logger.warning("run %s: launch report of attempt %d unreadable (%s)", run_id, last["attempt"], exc)
        return None
    if report.get("attempt") != last["attempt"] or report.get("rc") is None:
        return None
    logger.warning(
        "attempt %d of run %s ended (exit status %s) before its try recorded it: recording it from its report",
        last["attempt"],
        run_id,
        report["rc"],
    )
    att = resume_attempt(ctx, request, run_id, last["attempt"])
    try:  # it ended when its report says (``finish_attempt``), not now
        return finish_attempt(ctx, att, int(report["rc"]), try_number, final=False)
    except (PreemptedError, TrainingFailedError, TrainingInterruptedError) as exc:
        logger.info("attempt %d of run %s recorded as ended: %s", last["attempt"], run_id, exc)
        return None


@dataclass(frozen=True)
class Attempt:
    """One launched attempt of the train stage, between ``begin_attempt`` and ``finish_attempt``."""

    run_id: str
    req: JobRequest
    number: int
    placement: Placement
    data: JSON
    config: TrainConfig
    """The ``TrainConfig`` every worker of the attempt reads (at ``launch.config_uri``)."""
    launch: TrainLaunch
    started: dt.datetime
    prior: list[JSON]
    """The run's earlier attempts as the ledger held them when this one began, oldest first."""
    reattached: bool = False
    """True when a retried task took over this attempt from a try that died while it ran."""


def _planned_anew(ctx: StageContext, run_id: str, placement: Placement, last: Placement) -> bool:
    """The run was planned again after its last attempt ended (its tasks cleared in Airflow, which
    re-runs ``plan``): its live reservation is ``placement``'s, in another zone or of another GPU
    type than the ``last`` attempt ran on. Otherwise (a retried ``train``) the last attempt's
    placement is the run's current one: a recovery may have moved it since ``plan``."""
    held = ctx.ledger.live_reservation(run_id)
    return (
        held is not None
        and (held.zone, held.gpu_type) == (placement.zone, placement.gpu_type)
        and (held.zone, held.gpu_type) != (last.zone, last.gpu_type)
    )


def begin_attempt(
    ctx: StageContext,
    request: JSON,
    placement: JSON,
    data: JSON,
    run_id: str,
    try_number: int = 1,
    *,
    reattach: bool = False,
) -> Attempt:
    """Start the run's next attempt: recover first when the previous one was preempted (re-plan,
    place data, move the checkpoint, provision), write its train config, record it in the ledger.

    Args:
        reattach: when the previous try died while its attempt ran (ledger outcome ``running``),
            take that attempt over (its pods may still run) instead of ending it as failed and
            starting another (what a backend that can follow a running launch wants: gke).
    """
    req = from_dict(JobRequest, request)
    attempts = ctx.ledger.attempts(run_id)
    attempt = len(attempts) + 1
    pl = from_dict(Placement, placement)
    if attempts:
        last = attempts[-1]
        last_pl = from_dict(Placement, last["placement"])
        if last["outcome"] in ("running", "preempted") or not _planned_anew(ctx, run_id, pl, last_pl):
            pl, data = last_pl, last["data"]
        elif pl.region != last_pl.region:
            # Planned anew into another region: it resumes from the checkpoint the last attempt left.
            step = CheckpointStore(paths.checkpoint_uri(ctx.run_uri(last_pl.region, run_id))).copy_latest_to(
                paths.checkpoint_uri(ctx.run_uri(pl.region, run_id))
            )
            logger.info("run %s planned anew in %s; checkpoint step %s copied there", run_id, pl.region, step)
        if last["outcome"] == "running" and reattach:
            logger.info(
                "attempt %d of run %s is still recorded as running: reattaching", last["attempt"], run_id
            )
            return resume_attempt(ctx, request, run_id, last["attempt"], reattached=True)
        if last["outcome"] == "running":  # the previous try died before recording its end
            end_unreported_attempt(ctx, run_id, last, "failed", "ended without a report")
        if last["outcome"] == "preempted":
            pl, data = recover(ctx, req, pl, data, run_id, attempt)

    run_uri = ctx.run_uri(pl.region, run_id)
    config = TrainConfig(
        run_id=run_id,
        model=req.model,
        data_uri=data["data_uri"],
        output_uri=run_uri,
        total_steps=req.total_steps,
        checkpoint_every_steps=req.checkpoint_every_steps,
        seed=req.seed,
        batch_size=req.batch_size,
        learning_rate=req.learning_rate,
        async_checkpoint=req.async_checkpoint,
        attempt=attempt,
        command=req.command,
        env=dict(req.env),
    )
    config_uri = _config_uri(ctx, pl, run_id)
    report_uri = paths.launch_report_uri(run_uri)
    for stale in (config.result_uri, report_uri):  # outputs of an earlier attempt must not be read as ours
        storage.remove(stale)
    storage.write_bytes(config_uri, config.to_json().encode())
    CheckpointStore(config.checkpoint_uri).claim(attempt)  # an earlier attempt's stray workers commit no more
    started = utcnow()  # the attempt's start, as its row and its utilization record it
    ctx.ledger.start_attempt(run_id, attempt, try_number, to_dict(pl), data, started_at=started)
    ctx.ledger.upsert_run(run_id, status="running", region=pl.region, zone=pl.zone, market=pl.market)
    return Attempt(
        run_id,
        req,
        attempt,
        pl,
        data,
        config,
        _launch(req, run_id, pl, attempt, config_uri),
        started,
        attempts,
    )


def _config_uri(ctx: StageContext, pl: Placement, run_id: str) -> str:
    """Where an attempt's ``TrainConfig`` lives: the run's folder in the placement's region bucket."""
    return paths.train_config_uri(ctx.run_uri(pl.region, run_id))


def _launch(req: JobRequest, run_id: str, pl: Placement, attempt: int, config_uri: str) -> TrainLaunch:
    """What the backend starts for ``attempt``."""
    return TrainLaunch(
        run_id, run_key(run_id), config_uri, req.num_workers, pl, injection_spec(req), attempt, req.image
    )


def resume_attempt(
    ctx: StageContext, request: JSON, run_id: str, attempt: int, *, reattached: bool = False
) -> Attempt:
    """The launched ``attempt`` of the run rebuilt from the ledger and its train config, in another
    process than the one that began it (a deferred task resuming, or a retried one reattaching).

    Raises:
        ValueError: the ledger has no running attempt ``attempt`` for the run (names what it has).
    """
    req = from_dict(JobRequest, request)
    rows = ctx.ledger.attempts(run_id)
    row = next((r for r in rows if r["attempt"] == attempt), None)
    if row is None or row["outcome"] != "running":
        have = ", ".join(f"{r['attempt']}={r['outcome']}" for r in rows) or "none"
        raise ValueError(f"run {run_id} has no running attempt {attempt} to resume; attempts: {have}")
    pl, data = from_dict(Placement, row["placement"]), row["data"]
    config_uri = _config_uri(ctx, pl, run_id)
    config = TrainConfig.from_json(storage.read_bytes(config_uri).decode())
    launch = _launch(req, run_id, pl, attempt, config_uri)
    prior = [r for r in rows if r["attempt"] < attempt]
    return Attempt(
        run_id, req, attempt, pl, data, config, launch, aware(row["started_at"]), prior, reattached
    )


def _record_completed(ctx: StageContext, run_id: str, result: JSON) -> None:
    """Record what a completed attempt's result says on the run: its final checkpoint (once) and
    its steps, losses and checkpoint URI. Idempotent, so a retried try records what the try that
    ended the attempt did not."""
    uri = result["checkpoint_uri"]
    if uri:
        step = result.get("checkpoint_step", result["step"])
        if not any(c["step"] == step and c["uri"] == uri for c in ctx.ledger.checkpoints(run_id)):
            ctx.ledger.record_checkpoint(run_id, step, uri)
    ctx.ledger.upsert_run(
        run_id,
        steps=result["step"],
        initial_loss=result["initial_loss"],
        final_loss=result["final_loss"],
        checkpoint_uri=uri,
    )


def completed_result(ctx: StageContext, run_id: str) -> JSON | None:
    """The run's train result when its last attempt already completed, rebuilt as
    ``finish_attempt`` returned it (the trainer's result, that attempt's placement, data and wall
    time, every attempt and market); None when it has not (or its result file is gone).

    A retried ``train`` whose try died after its attempt ended (the worker lost before the task
    reported success) returns this instead of training again."""
    rows = ctx.ledger.attempts(run_id)
    if not rows or rows[-1]["outcome"] != "completed":
        return None
    row = rows[-1]
    pl, data = from_dict(Placement, row["placement"]), row["data"]
    try:
        config = TrainConfig.from_json(storage.read_bytes(_config_uri(ctx, pl, run_id)).decode())
        result = storage.read_json(config.result_uri)
    except (OSError, ValueError) as exc:  # FileNotFoundError included: train again, from its checkpoint
        logger.warning(
            "run %s: attempt %d completed but its result is unreadable (%s)", run_id, row["attempt"], exc
        )
        return None
    _record_completed(ctx, run_id, result)  # the try that ended the attempt may have died first
    wall_s = (aware(row["ended_at"] or row["started_at"]) - aware(row["started_at"])).total_seconds()
    return {
        **result,
        "train_wall_s": wall_s,
        "placement": to_dict(pl),
        "data": data,
        "attempts": describe_attempts(ctx, run_id),
        "markets": attempt_markets(ctx, run_id),
    }


def cancel_running_attempt(ctx: StageContext, run_id: str) -> int | None:
    """End the run's attempt that the ledger still has as running as ``cancelled`` (its training was
    stopped from outside: ``sailor cancel``, the run marked failed) and the run with it; the
    attempt's number, or None when none was running."""
    rows = ctx.ledger.attempts(run_id)
    if not rows or rows[-1]["outcome"] != "running":
        return None
    number = rows[-1]["attempt"]
    end_unreported_attempt(ctx, run_id, rows[-1], "cancelled", "stopped while running (run cancelled)")
    ctx.ledger.upsert_run(run_id, status="cancelled")
    logger.warning("run %s: attempt %d cancelled", run_id, number)
    return number


def end_orphaned_attempt(
    ctx: StageContext,
    run_id: str,
    detail: str = "still running when the run ended: its train task stopped without ending it",
) -> int | None:
    """End, as ``failed``, the run's attempt that the ledger still has as running once nothing can
    end it any more (teardown: the train task is over, its workers stopped). Its task died without
    ending it (killed hard, its worker lost, timed out while deferred); left running, it would
    count as demand for ever. The attempt's number, or None when none was running."""
    rows = ctx.ledger.attempts(run_id)
    if not rows or rows[-1]["outcome"] != "running":
        return None
    number = rows[-1]["attempt"]
    end_unreported_attempt(ctx, run_id, rows[-1], "failed", detail)
    logger.warning("run %s: attempt %d ended as failed (%s)", run_id, number, detail)
    return number


def _command_result(att: Attempt, store: CheckpointStore, report: JSON, wall_s: float) -> JSON:
    """The result of a run's own command that exited 0: what its checkpoints and progress say
    (the built-in trainer writes its own, with losses and throughput)."""
    step = store.latest_valid_step()
    return {
        "run_id": att.run_id,
        "status": "completed",
        "step": max(step or 0, report.get("step") or 0),
        "total_steps": att.config.total_steps,
        "resumed_from_step": report.get("resumed_from"),
        "initial_loss": None,
        "final_loss": None,
        "checkpoint_uri": store.step_uri(step) if step is not None else None,
        "checkpoint_step": step,  # the last step reached may be later than the last save
        "samples_per_s": None,
        "wall_s": wall_s,
        "world_size": att.req.num_workers,
    }


def finish_attempt(
    ctx: StageContext,
    att: Attempt,
    rc: int,
    try_number: int = 1,
    max_tries: int = 0,
    *,
    final: bool | None = None,
) -> JSON:
    """End a launched attempt from its process group's exit status and what the trainer wrote:
    record it (utilization, checkpoint, preemption) and return the result, or raise.

    The run contract decides: exit status 0 is done; anything else after a preemption (noticed or
    not) is preempted; anything else is a failure, raised with the last lines of the output.

    Args:
        rc: the process group's exit status (0 done, 75 preempted after saving).
        final: whether a preemption ends the run (default: ``try_number > max_tries``).

    Raises:
        PreemptedError, RecoveryExhaustedError, TrainingFailedError: as ``train_attempt``.
    """
    req, run_id, attempt, attempts = att.req, att.run_id, att.number, att.prior
    pl, data, config, started = att.placement, att.data, att.config, att.started
    report = launch_report(ctx.run_uri(pl.region, run_id))
    reported_end = _ts(report.get("ended_at"))  # when the process group or the pods ended
    ended = max(reported_end, started) if reported_end is not None else utcnow()
    ctx.ledger.record_utilization(run_id, req.team, pl.region, pl.gpu_type, pl.num_gpus, started, ended)
    ctx.ledger.end_attempt_market(
        run_id, attempt, (ended - started).total_seconds() / 3600.0, pl.usd_per_hour, pl.market, req.strategy
    )
    store = CheckpointStore(config.checkpoint_uri, attempt=attempt)
    store.seal()  # plain DCP checkpoints the workers left without a marker become resumable elsewhere
    result = storage.read_json(config.result_uri) if storage.exists(config.result_uri) else None
    if rc == 0 and result is None:  # the run's own command: done by the contract's exit status
        result = _command_result(att, store, report, (ended - started).total_seconds())
        storage.write_json(config.result_uri, result)

    if attempt > 1 and attempts[-1]["outcome"] == "preempted" and report.get("first_step_at"):
        # None: the try that ended the last attempt died before it recorded the preemption.
        prev = next(
            (p for p in ctx.ledger.preemptions(run_id) if p["attempt"] == attempts[-1]["attempt"]), None
        )
        if prev is not None:
            recovery_s = (_ts(report["first_step_at"]) - aware(prev["at"])).total_seconds()
            ctx.ledger.set_preemption_recovery(run_id, prev["attempt"], round(recovery_s, 3))

    resumed = result["resumed_from_step"] if result else report.get("resumed_from")
    preemption = report.get("preemption")
    if rc == 0 and result and result["status"] == "completed":
        ctx.ledger.end_attempt(
            run_id, attempt, "completed", step=result["step"], resumed_from_step=resumed, ended_at=ended
        )
        _record_completed(ctx, run_id, result)
        return {
            **result,
            "train_wall_s": (ended - started).total_seconds(),
            "placement": to_dict(pl),
            "data": data,
            "attempts": describe_attempts(ctx, run_id),
            "markets": attempt_markets(ctx, run_id),
        }

    if report.get("cancelled"):  # stopped on purpose: not a preemption, not a failure to retry
        reached = max(report.get("step") or 0, result["step"] if result else 0)
        reclaimed = (ctx.ledger.reservation_leases().get(run_id) or {}).get("reclaimed_at")
        if reclaimed is not None:  # stopped by the reconciler, which has ended the run
            ctx.ledger.end_attempt(
                run_id,
                attempt,
                "failed",
                step=reached,
                resumed_from_step=resumed,
                detail="lease reclaimed",
                ended_at=ended,
            )
            raise LeaseReclaimedError(run_id, reclaimed.isoformat(timespec="seconds"))
        ctx.ledger.end_attempt(
            run_id, attempt, "cancelled", step=reached, resumed_from_step=resumed, ended_at=ended
        )
        ctx.ledger.advance_run(run_id, "cancelled", from_statuses=RUN_STATUSES_LIVE)
        raise RunCancelledError(run_id, reached)

    if report.get("interrupted"):  # its task was stopped, not the run: the next try resumes it
        reached = max(report.get("step") or 0, result["step"] if result else 0)
        ctx.ledger.end_attempt(
            run_id,
            attempt,
            "failed",
            step=reached,
            resumed_from_step=resumed,
            detail="its train task was stopped by Airflow, not by a user: the next try resumes it",
            ended_at=ended,
        )
        raise TrainingInterruptedError(run_id, reached)

    # The step the attempt reached, as far as it said (a command may write no progress file).
    said = [s for s in (report.get("step"), result["step"] if result else None) if s is not None]
    if preemption is None and not (result and result["status"] == "preempted"):
        tail = report.get("log_tail") or []
        detail = f"exit code {rc}" + (f": {tail[-1][:200]}" if tail else "")
        step = max(said) if said else None
        ctx.ledger.end_attempt(
            run_id, attempt, "failed", step=step, resumed_from_step=resumed, detail=detail, ended_at=ended
        )
        raise TrainingFailedError(run_id, rc, "\n".join(tail))

    noticed = preemption["noticed"] if preemption else True
    resume_step = store.latest_valid_step() or 0
    # At least its newest checkpoint; the steps lost after it are unknown when it said no step.
    reached = max([*said, resume_step])
    lost = max(0, reached - resume_step) if said else None
    at = _ts(preemption["at"] if preemption else report.get("ended_at")) or ended
    ctx.ledger.end_attempt(
        run_id, attempt, "preempted", step=reached, resumed_from_step=resumed, ended_at=ended
    )
    ctx.ledger.record_preemption(run_id, attempt, pl.region, pl.zone, noticed, reached, lost, None, at=at)
    ctx.ledger.upsert_run(run_id, steps=resume_step)
    ctx.ledger.advance_run(run_id, "preempted", from_statuses=RUN_STATUSES_LIVE)  # not over an end
    logger.warning(
        "attempt %d preempted in %s %s notice at step %d; checkpoint at step %d (%s steps lost)",
        attempt,
        pl.zone,
        "with" if noticed else "without",
        reached,
        resume_step,
        "unknown" if lost is None else lost,
    )
    if (try_number > max_tries) if final is None else final:
        raise RecoveryExhaustedError(run_id, describe_attempts(ctx, run_id))
    raise PreemptedError(run_id, pl.zone, reached, noticed)
