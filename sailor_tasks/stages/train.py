"""The ``train`` stage (one attempt per call, or two halves around a deferred wait), then finalize
and teardown: the end of ``sailor_train``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sailor_tasks import paths, storage
from sailor_tasks.backends import get_backend
from sailor_tasks.ledger.store import utcnow
from sailor_tasks.model import RUN_STATUSES_DONE, RUN_STATUSES_LIVE, JobRequest, Placement, from_dict, run_key
from sailor_tasks.settings import BACKENDS
from sailor_tasks.stages.attempts import (
    begin_attempt,
    cancel_running_attempt,
    completed_result,
    end_orphaned_attempt,
    finish_attempt,
    resume_attempt,
    train_attempt,
)
from sailor_tasks.stages.context import JSON, StageContext, resolve_ctx, timed
from sailor_tasks.stages.summary import queue_wait, render_summary

logger = logging.getLogger(__name__)
T = TypeVar("T")


def train(
    request: JSON,
    placement: JSON,
    data: JSON,
    run_id: str,
    ctx: StageContext | None = None,
    *,
    try_number: int = 1,
    max_tries: int = 0,
) -> JSON:
    """Run training on the provisioned capacity, resuming from the newest checkpoint; one attempt
    per call. After a preempted attempt, the next call recovers first (``sailor_tasks.stages.attempts``).
    A run whose last attempt already completed (a retried try) gets that attempt's result; nothing
    trains again.

    Raises:
        PreemptedError: this attempt was preempted; retry the stage to recover.
        RecoveryExhaustedError: preempted on the last try (``try_number > max_tries``).
        TrainingFailedError: the process group exited with an error.
    """
    from sailor_tasks.stages.queueing import heartbeat, hold_lease

    ctx = resolve_ctx(ctx)
    done = completed_train(run_id, ctx)
    if done is not None:  # needs no capacity: also after a reclaim of what training no longer uses
        return done
    hold_lease(ctx, run_id, "train")
    with timed(ctx, run_id, "train", try_number), heartbeat(ctx, run_id):
        return train_attempt(ctx, request, placement, data, run_id, try_number, max_tries)


def completed_train(run_id: str, ctx: StageContext | None = None) -> JSON | None:
    """The run's train result when its last attempt already completed (``attempts.completed_result``:
    a retried try whose predecessor died after training ended); None when training has to run."""
    ctx = resolve_ctx(ctx)
    done = completed_result(ctx, run_id)
    if done is not None:
        logger.info("run %s: training already completed at step %s; not training again", run_id, done["step"])
    return done


def launch_train(
    request: JSON,
    placement: JSON,
    data: JSON,
    run_id: str,
    ctx: StageContext | None = None,
    *,
    try_number: int = 1,
) -> Any:
    """Deferrable ``train``, first half: begin the run's next attempt (recovering first after a
    preemption, through the same code as ``train``) or take over the attempt a dead try left
    running. Returns the ``recovery.Attempt``; its ``launch`` is what the backend starts.
    """
    from sailor_tasks.stages.queueing import heartbeat, hold_lease

    ctx = resolve_ctx(ctx)
    # Deferred, no task heartbeat renews the lease: the pods' trigger does, every poll. Until the
    # task defers, its own heartbeat does: a recovery copies the checkpoint to its new region here.
    hold_lease(ctx, run_id, "train (deferred)")
    with timed(ctx, run_id, "train_launch", try_number), heartbeat(ctx, run_id, "train (deferred)"):
        return begin_attempt(ctx, request, placement, data, run_id, try_number, reattach=True)


def stop_reclaimed(run_id: str, ctx: StageContext | None = None) -> None:
    """The run's reservation was lost while its deferred attempt ran: its lease was reclaimed (no
    task renewed it, and the triggerer could not either), or its teardown released it. Stop what
    the attempt still runs and fail.

    Raises:
        LeaseReclaimedError: the lease was reclaimed; the run may not train on capacity that is
            no longer its own.
        ReservationReleasedError: the reservation was released (the run was torn down).
    """
    from sailor_tasks.errors import LeaseReclaimedError, ReservationReleasedError

    ctx = resolve_ctx(ctx)
    stopped = stop_training(run_id, ctx, cancelled=False)
    reclaimed = (ctx.ledger.reservation_leases().get(run_id) or {}).get("reclaimed_at")
    logger.warning(
        "run %s: reservation %s; stopped %d training process(es) or pod(s)",
        run_id,
        "reclaimed" if reclaimed else "released",
        stopped,
    )
    if reclaimed is None:
        raise ReservationReleasedError(run_id, "while its deferred attempt ran")
    raise LeaseReclaimedError(run_id, reclaimed.isoformat(timespec="seconds"))


def stop_unstartable(run_id: str, pod: str, message: str, ctx: StageContext | None = None) -> None:
    """A training pod of the run's deferred attempt cannot start (``PodUnstartableError``): stop
    the attempt's pods and end it as ``failed``; the run's teardown removes its capacity.

    Raises:
        PodUnstartableError: always, naming the pod and why.
    """
    from sailor_tasks.errors import PodUnstartableError

    logger.error("run %s: pod %s cannot start (%s); stopping its pods", run_id, pod, message)
    stop_training(run_id, ctx, cancelled=False, failed_because=f"pod {pod} cannot start: {message}"[:2000])
    raise PodUnstartableError(run_id, pod, message)


def finish_train(
    request: JSON,
    run_id: str,
    attempt: int,
    exit_status: int,
    ctx: StageContext | None = None,
    *,
    try_number: int = 1,
    max_tries: int = 0,
) -> JSON:
    """Deferrable ``train``, second half: end launched ``attempt`` from its exit status (0 done,
    75 preempted after saving) and what the trainer wrote, as ``train`` does.

    A deferrable task recovers inside one try, so the run's attempts are bounded by number: a
    preemption of attempt ``max_tries + 1`` (or on the last try) is final, the same budget as
    ``train``'s one attempt per try.

    Raises:
        PreemptedError: preempted with attempts left; launch the next one (``launch_train``).
        RecoveryExhaustedError: preempted on the last allowed attempt (lists every attempt).
        TrainingFailedError: the process group failed for another reason.
    """
    from sailor_tasks.stages.queueing import hold_lease

    ctx = resolve_ctx(ctx)
    hold_lease(ctx, run_id, "train (deferred)")
    with timed(ctx, run_id, "train", try_number):
        att = resume_attempt(ctx, request, run_id, attempt)
        final = try_number > max_tries or attempt > max_tries
        return finish_attempt(ctx, att, exit_status, try_number, max_tries, final=final)


def finalize(
    request: JSON, placement: JSON, data: JSON, result: JSON, run_id: str, ctx: StageContext | None = None
) -> JSON:
    """Mark the run successful, estimate its cost, and write a markdown summary next to its checkpoints."""
    ctx = resolve_ctx(ctx)
    # After a preemption recovery the run may have moved: the train result carries where it ended.
    placement, data = result.get("placement", placement), result.get("data", data)
    req, pl = from_dict(JobRequest, request), from_dict(Placement, placement)
    with timed(ctx, run_id, "finalize"):
        hours = result["train_wall_s"] / 3600.0
        markets = result.get("markets", [])
        usd_attempts = sum(m["usd"] or 0.0 for m in markets)
        # The run's cost: every attempt's price x its training time (the attempts a preemption
        # ended included); the last attempt's alone without the ledger's market records.
        usd = round(usd_attempts if markets else pl.usd_per_hour * hours, 6)
        summary = {
            "run_id": run_id,
            "job_name": req.job_name,
            "team": req.team,
            "status": "success",
            "region": pl.region,
            "zone": pl.zone,
            "gpu_type": pl.gpu_type,
            "num_gpus": pl.num_gpus,
            "market": pl.market,
            "usd_per_hour": pl.usd_per_hour,
            "usd_estimate": usd,
            "why": list(pl.explanation),
            "data_uri": data["data_uri"],
            "data_bytes": data["bytes"],
            "steps": result["step"],
            "initial_loss": result["initial_loss"],
            "final_loss": result["final_loss"],
            "checkpoint_uri": result["checkpoint_uri"],
            "train_wall_s": round(result["train_wall_s"], 2),
            "samples_per_s": None if result["samples_per_s"] is None else round(result["samples_per_s"], 1),
            "command": list(req.command),
            "attempts": result.get("attempts", []),
            "strategy": req.strategy,
            "deadline_hours": req.deadline_hours,
            "markets": markets,
            "usd_attempts": usd_attempts,
            "queue": queue_wait(ctx, run_id),
        }
        summary_uri = paths.summary_uri(ctx.run_uri(pl.region, run_id))
        storage.write_bytes(summary_uri, render_summary(summary).encode())
        # A success carries no error (one the reconciler or a failed try left is not its outcome).
        ctx.ledger.upsert_run(run_id, status="success", usd_estimate=usd, error=None)
    markdown = render_summary(summary)
    logger.info("run summary (%s):\n%s", summary_uri, markdown)
    return {**summary, "summary_uri": summary_uri, "summary_md": markdown}


TEARDOWN_TRIES = 3
"""Tries of each teardown step (backend, then ledger) within one task try; Airflow retries the task."""
TEARDOWN_BACKOFF_S = 2.0
"""First wait between tries, doubled each time (2 s, 4 s: a ledger failover or a cloud API blip)."""


ATTEMPT_END_WAIT_S = 15.0
"""How long teardown waits for a local attempt still running in the ledger to be ended by its own
train task, once its workers are stopped: a task a user stopped is still alive when Airflow starts
teardown, and records how its attempt ended (``cancelled``) within seconds; a task that died never
does, and teardown then ends the attempt itself."""


def _await_attempt_end(ctx: StageContext, run_id: str, timeout_s: float) -> None:
    """Return once the run's last attempt is not running in the ledger, or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    waited = False
    while True:
        rows = ctx.ledger.attempts(run_id)
        if not rows or rows[-1]["outcome"] != "running" or time.monotonic() >= deadline:
            return
        if not waited:
            logger.info(
                "teardown of %s: waiting up to %.0f s for its train task to end attempt %d",
                run_id,
                timeout_s,
                rows[-1]["attempt"],
            )
            waited = True
        time.sleep(0.25)


def _with_retries(what: str, run_id: str, step: Callable[[], T]) -> T:
    """``step()``, retried ``TEARDOWN_TRIES`` times with exponential backoff; the last error raises."""
    for i in range(TEARDOWN_TRIES):
        try:
            return step()
        except Exception as exc:
            if i == TEARDOWN_TRIES - 1:
                raise
            wait = TEARDOWN_BACKOFF_S * 2**i
            logger.warning("teardown of %s: %s failed (%s); retrying in %.0f s", run_id, what, exc, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")


def _backend_of(ctx: StageContext, run_id: str) -> Any:
    run = ctx.ledger.get_run(run_id)
    return get_backend(run["backend"] if run and run["backend"] in BACKENDS else "local", ctx.settings)


def stop_training(
    run_id: str,
    ctx: StageContext | None = None,
    *,
    cancelled: bool = True,
    failed_because: str = "its reservation was lost while it ran (reclaimed or released)",
    for_good: bool = True,
) -> int:
    """Stop everything the run's training started: every worker process (local) or every pod still
    running (gke). Called when the train task is killed (a run marked failed: ``sailor cancel``),
    from the operator or, while it is deferred, its trigger, and when the run lost its
    reservation (``stop_reclaimed``: ``cancelled`` False). Returns how many processes or pods were
    stopped. ``for_good`` False: only the train task is being stopped (by Airflow, not by a user),
    not the run: a local attempt then ends interrupted and the task's next try resumes it.

    A backend whose attempts run detached from the task (gke) has no task left to end the running
    attempt: it ends here, as ``cancelled`` (and the run with it) or, with ``cancelled`` False,
    as ``failed`` (``failed_because``; so also with ``for_good`` False). A local attempt's own task
    ends it from what its workers report."""
    ctx = resolve_ctx(ctx)
    backend = _backend_of(ctx, run_id)
    if backend.detached_attempts:
        _mark_stopping(ctx, run_id)
    stopped = backend.cancel(run_key(run_id), for_good=for_good)
    if stopped:
        logger.warning("run %s: stopped %d training process(es) or pod(s)", run_id, stopped)
    if backend.detached_attempts and cancelled and for_good:
        cancel_running_attempt(ctx, run_id)
    elif backend.detached_attempts:
        end_orphaned_attempt(ctx, run_id, failed_because)
    elif cancelled and for_good:
        _record_cancel(ctx, run_id)
    return stopped


def _mark_stopping(ctx: StageContext, run_id: str) -> None:
    """Mark the running attempt's launch report as being stopped, before its pods are deleted: a
    retry that finds them gone (the stop interrupted before it ended the attempt) then resumes the
    attempt rather than judge a missing pod a preemption. Best effort: a stop goes on without it."""
    from sailor_tasks.stages.usage import attempt_run_uri, update_launch_report

    try:
        rows = ctx.ledger.attempts(run_id)
        if not rows or rows[-1]["outcome"] != "running":
            return
        update_launch_report(attempt_run_uri(ctx, run_id, rows[-1]), {"stopping": True})
    except Exception as exc:
        logger.warning("run %s: its launch report could not be marked as stopping: %s", run_id, exc)


def _record_cancel(ctx: StageContext, run_id: str) -> None:
    """Record a user's cancel of a run whose attempt its own task ends (local): teardown, which
    Airflow starts as soon as the task is marked failed, may end the attempt before the stopped
    task reports, and must then end it as ``cancelled``, not as a task that died. Where the ledger
    cannot be reached the workers are stopped all the same, and the task's report still ends the
    run as ``cancelled`` when it records before teardown."""
    try:
        ctx.ledger.advance_run(run_id, "cancelled", from_statuses=RUN_STATUSES_LIVE)
    except Exception as exc:
        logger.warning("run %s: its cancel could not be recorded in the ledger now: %s", run_id, exc)


def teardown(run_id: str, ctx: StageContext | None = None, *, backend: str | None = None) -> JSON:
    """Stop what training left running, remove the run's capacity, take it out of the queue if it
    waits there, then release its reservation (always runs; idempotent). A run that did not end
    (``success``, ``rejected``, ``failed``, ``cancelled``) is marked ``failed``. An attempt the
    ledger still has as running once the workers are stopped is waited for (local: its train task,
    stopped by a user, may still be recording it; ``ATTEMPT_END_WAIT_S``), then ended here: as
    ``cancelled`` when a user's cancel was recorded (``stop_training``, from the operator's or its
    trigger's ``on_kill``), else as ``failed`` (its task died or timed out).

    The backend goes first, so an unreachable ledger can never leave GPUs running; until it is gone
    the reservation stays, so no other run is planned onto capacity that is still held. The backend
    is the one the run's params name (``backend``, as Airflow recorded them), else the one the
    ledger recorded, else the default. Each step is retried (``TEARDOWN_TRIES``); if one still
    fails it raises, and Airflow's retry of the task repeats both steps.
    """
    ctx = resolve_ctx(ctx)
    started = utcnow()
    name = backend if backend in BACKENDS else None
    if name is None:
        try:
            run = ctx.ledger.get_run(run_id)
            name = run["backend"] if run and run["backend"] in BACKENDS else None
        except Exception as exc:  # the ledger is down: the default backend is the best guess
            logger.warning(
                "teardown of %s: ledger unreachable (%s); using backend %s", run_id, exc, ctx.settings.backend
            )
    name = name or ctx.settings.backend
    backend_impl = get_backend(name, ctx.settings)
    stopped = _with_retries(f"{name} stop", run_id, lambda: backend_impl.cancel(run_key(run_id)))
    if stopped:
        logger.warning("run %s: stopped %d training process(es) or pod(s)", run_id, stopped)
    removed = _with_retries(f"{name} teardown", run_id, lambda: backend_impl.teardown(run_key(run_id)))
    if not backend_impl.detached_attempts:
        try:
            _await_attempt_end(ctx, run_id, ATTEMPT_END_WAIT_S)
        except Exception as exc:  # the ledger is down: release below retries it
            logger.warning("teardown of %s: could not read its attempts: %s", run_id, exc)

    def release() -> bool:
        # Stopped above, so nothing else will end a running attempt: a user's cancel ends it as
        # cancelled (recorded at the cancel), anything else as a task that died.
        run = ctx.ledger.get_run(run_id)
        if run and run["status"] == "cancelled":
            cancel_running_attempt(ctx, run_id)
        else:
            end_orphaned_attempt(ctx, run_id)
        released = ctx.ledger.release(run_id)
        run = ctx.ledger.get_run(run_id)  # read after the stop: a stopped train may have ended it
        if run and run["status"] not in RUN_STATUSES_DONE:
            ctx.ledger.upsert_run(run_id, status="failed")
        ctx.ledger.record_stage(run_id, "teardown", started, utcnow(), ok=True)
        return released

    from sailor_tasks.stages.queueing import admit_after_release, leave_queue

    # Out of the queue before the release: an admission pass in between (another run's teardown)
    # can no longer admit this run, and whatever one admitted before is released next.
    left = False
    try:
        left = _with_retries(
            "leave the queue",
            run_id,
            lambda: leave_queue(ctx, run_id, "the run ended while waiting in the queue"),
        )
    except Exception as exc:  # released below all the same; the next admission pass finds the
        # run ended and takes its entry out of the queue (``Ledger.reserve_if_free``)
        logger.warning("teardown of %s: could not take it out of the queue: %s", run_id, exc)
    released = _with_retries("ledger release", run_id, release)
    # Also when nothing was released now: a retried teardown whose first try released the run and
    # died before its admission pass still owes the queue that pass (a no-op when none waits).
    admission = admit_after_release(ctx)
    return {
        "training_stopped": stopped,
        "reservation_released": released,
        "cluster_removed": removed,
        "left_queue": left,
        "admitted": list((admission or {}).get("admitted", [])),
    }
