"""The stages before training, in pipeline order: validate → plan → place_data → provision.

Preemption recovery (``stages.attempts``) re-runs plan, place_data and provision through these same
functions. Each takes and returns small JSON-able dicts (what XCom carries), records itself in the
ledger, and is safe to retry.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from sailor_tasks import paths, storage
from sailor_tasks.backends import get_backend
from sailor_tasks.data.copier import EMPTY_MANIFEST_REASON, copy_dataset, empty_dataset_reason, list_files
from sailor_tasks.data.manifest import read_manifest
from sailor_tasks.errors import (
    PERMANENT_ERRORS,
    DataIntegrityError,
    InvalidRequestError,
    InvalidRequestErrors,
    RunQueuedError,
)
from sailor_tasks.model import RUN_STATUSES_DONE, JobRequest, Placement, from_dict, run_key, to_dict
from sailor_tasks.stages.context import JSON, StageContext, resolve_ctx, timed
from sailor_tasks.stages.queueing import heartbeat, hold_lease

logger = logging.getLogger(__name__)


def _storable(value: Any, limit: int) -> str:
    """``value`` as text any ledger stores: characters UTF-8 cannot encode (a lone surrogate) and
    NUL escaped, cut to ``limit`` characters (a rejected param is recorded as it came)."""
    try:
        text = value if isinstance(value, str) else str(value)
    except ValueError:  # an integer past Python's digit limit
        text = f"<{type(value).__name__} too large to print>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")[:limit]


def _replica_problem(ctx: StageContext, uri: str, src: str, given: str) -> InvalidRequestError | None:
    """A dataset URI that is SAILOR's replica of another dataset (its residency and its copies are
    the source's: name the source), or a folder that would hold its own replica (a region bucket's
    ``datasets/`` folder: every copy of it would land inside it and grow on each run). ``uri``:
    the dataset's key (``dataset_key``); ``given``: the URI as the run wrote it (named)."""
    inside = src.rstrip("/") + "/"
    for row in ctx.ledger.replica_rows():
        if row["uri"] and (row["uri"] == src or src.startswith(row["uri"].rstrip("/") + "/")):
            return InvalidRequestError(
                "dataset_uri",
                given,
                f"is SAILOR's replica of {row['dataset_uri']} in {row['region']}: name that dataset",
            )
    for region in ctx.catalog.regions:
        if paths.replica_uri(region, uri, ctx.settings).startswith(inside):
            return InvalidRequestError(
                "dataset_uri",
                given,
                "holds SAILOR's dataset replicas (a region bucket's datasets/ folder): name one dataset in it",
            )
    return None


def _sealed_empty(src: str) -> bool:
    """The dataset's manifest lists no file (files added after an empty folder was sealed): a
    copy would place none. A damaged manifest is the copy's to name."""
    try:
        manifest = read_manifest(src)
    except DataIntegrityError:
        return False
    return manifest is not None and not manifest.files


def validate(params: Mapping[str, Any], run_id: str, ctx: StageContext | None = None) -> JSON:
    """Check the params against the schema, the catalog and the source data; record the run.

    Raises:
        InvalidRequestErrors: with every problem; the run is recorded as ``rejected`` and nothing
            is reserved, copied or provisioned.
    """
    ctx = resolve_ctx(ctx)
    from sailor_tasks.placement import catalog_errors
    from sailor_tasks.request import check_data_access, check_local_command, dataset_key, from_params
    from sailor_tasks.strategies.live import as_planned

    with timed(ctx, run_id, "validate"):
        try:
            request = from_params(params, ctx.catalog)
            errors = []
            if request.backend == "gke":  # before the bucket names: they need the project
                from sailor_tasks.backends.checks import config_problems

                if problems := config_problems(ctx.settings):
                    raise InvalidRequestErrors(
                        [
                            InvalidRequestError("backend", "gke", f"{c.name}: {c.detail}; fix: {c.fix}")
                            for c in problems
                        ]
                    )
            access = [("dataset_uri", request.dataset_uri)]
            if request.preemption_trace_uri:
                access.append(("preemption_trace_uri", request.preemption_trace_uri))
            denied = [
                e for f, u in access if (e := check_data_access(f, u, ctx.settings, ctx.catalog.regions))
            ]
            if denied:
                raise InvalidRequestErrors(denied)  # never look at what a run may not read
            # One key per folder, whichever way the run spelled it (replicas, residency); errors
            # name the URI as given.
            given = request.dataset_uri
            request = dataclasses.replace(
                request, dataset_uri=dataset_key(request.dataset_uri, ctx.settings, ctx.catalog.regions)
            )
            if request.backend == "local":
                command_err = check_local_command(request.command, ctx.settings.command_roots)
                if command_err:
                    errors.append(command_err)
            # What no offer can ever satisfy (GPUs, residency, price cap, deadline): refused now,
            # not after queueing.
            errors.extend(catalog_errors(as_planned(request), ctx.catalog, ctx.planning_table()))
            try:
                get_backend(request.backend, ctx.settings)
            except ValueError as exc:
                errors.append(InvalidRequestError("backend", request.backend, str(exc)))
            src = storage.resolve(request.dataset_uri, ctx.settings)
            if replica_err := _replica_problem(ctx, request.dataset_uri, src, given):
                raise InvalidRequestErrors([replica_err])  # never copied, not even looked into
            if not storage.exists(src):
                errors.append(InvalidRequestError("dataset_uri", given, f"dataset not found at {src}"))
            elif not list_files(src):  # one file, or an empty folder: nothing to place
                errors.append(InvalidRequestError("dataset_uri", given, empty_dataset_reason(src)))
            elif _sealed_empty(src):
                errors.append(InvalidRequestError("dataset_uri", given, EMPTY_MANIFEST_REASON))
            if request.preemption_trace_uri:
                from sailor_tasks.traces.availability import load_availability_trace

                try:
                    load_availability_trace(request.preemption_trace_uri)
                except (OSError, ValueError) as exc:
                    errors.append(
                        InvalidRequestError("preemption_trace_uri", request.preemption_trace_uri, str(exc))
                    )
            if errors:
                raise InvalidRequestErrors(errors)
        except InvalidRequestError as exc:
            ctx.ledger.upsert_run(
                run_id,
                job_name=_storable(params.get("job_name", "?"), 200),
                team=_storable(params.get("team", "?"), 100),
                status="rejected",
                backend=_storable(params.get("backend", "?"), 20),
                model=_storable(params.get("model", "?"), 50),
                dataset_uri=_storable(params.get("dataset_uri", "?"), 1024),
                request={},
                error=_storable(exc, 4000),
            )
            raise
        ctx.ledger.upsert_run(
            run_id,
            job_name=request.job_name,
            team=request.team,
            status="validated",
            backend=request.backend,
            model=request.model,
            dataset_uri=request.dataset_uri,
            request=to_dict(request),
            total_steps=request.total_steps,
            error=None,
        )
        # Validated again: the run's tasks were cleared in Airflow, which runs the setups again.
        # What the queue decided on its earlier pass is spent once nothing holds capacity for it.
        if ctx.ledger.forget_spent_queue_entry(run_id):
            logger.info("run %s: validated again; its earlier queue entry is forgotten", run_id)
    logger.info("validated run %s: %s", run_id, request.summary())
    return to_dict(request)


def plan(
    request: JSON,
    run_id: str,
    ctx: StageContext | None = None,
    *,
    blocked_zones: frozenset[str] = frozenset(),
    attempt: int = 1,
    elapsed_h: float = 0.0,
    steps_done: int = 0,
    checkpoint: tuple[str, int] | None = None,
    best_effort: bool = True,
) -> JSON:
    """Place the run and reserve its capacity (keyed by run_id, so a retry replaces, never doubles).

    The run's market strategy first picks the market (``sailor_tasks.strategies.live``); the decision,
    its reason and the slack left go to the ledger (``attempt_markets``) and to the placement's
    explanation. The engine plans on a fresh ledger snapshot (live reservations, assignment, the
    dataset's replicas and size); the reservation is checked in one transaction (with a lease), and a
    conflict with another planner re-plans (bounded).

    The first placement goes through SAILOR's queue when nothing fits now or runs are already
    waiting (``stages.queueing.plan_or_queue``): it raises ``RunQueuedError`` while the run waits, and
    a later call returns the placement its admission reserved. ``blocked_zones``, ``attempt``,
    ``elapsed_h``, ``steps_done`` and ``checkpoint`` (region and bytes of the checkpoint it resumes
    from) are set by preemption recovery (``stages.attempts``), which re-plans through this same
    function and retries (``CapacityUnavailableError``) when nothing fits; ``best_effort`` False:
    a relaunch that no offer finishes by the deadline raises (recovery loosens its blocked zones
    first) rather than going on without the deadline.
    """
    ctx = resolve_ctx(ctx)
    from sailor_tasks.stages.queueing import plan_or_queue, reserve_placement

    req = from_dict(JobRequest, request)
    queued: RunQueuedError | None = None
    with timed(ctx, run_id, "plan"):  # queueing the run is plan doing its job, not a failure
        if attempt == 1:
            try:
                placement = plan_or_queue(ctx, req, run_id)
            except RunQueuedError as exc:
                queued = exc
            except PERMANENT_ERRORS as exc:
                _end_unplaced_run(ctx, run_id, exc)
                raise
        else:
            placement = reserve_placement(
                ctx,
                req,
                run_id,
                attempt=attempt,
                blocked_zones=frozenset(blocked_zones),
                elapsed_h=elapsed_h,
                steps_done=steps_done,
                checkpoint=checkpoint,
                best_effort=best_effort,
            )
    if queued is not None:
        raise queued
    for line in placement.explanation:
        logger.info("plan: %s", line)
    return to_dict(placement)


def _end_unplaced_run(ctx: StageContext, run_id: str, exc: Exception) -> None:
    """The run's first plan failed for good (no offer, the queue refused it or gave up on it):
    record it failed with the error (``teardown``, which runs next, ends an unfinished run without
    saying why)."""
    run = ctx.ledger.get_run(run_id)
    if run and run["status"] not in RUN_STATUSES_DONE:  # a cancel or a reclaim already ended it
        ctx.ledger.upsert_run(run_id, status="failed", error=f"{type(exc).__name__}: {exc}"[:4000])
        logger.error("run %s failed at plan: %s", run_id, exc)


def place_data(request: JSON, placement: JSON, run_id: str, ctx: StageContext | None = None) -> JSON:
    """Copy the dataset into the placement's region bucket (skipped when a verified replica exists).
    The run's lease is renewed while the copy runs (a large dataset can take longer than it)."""
    ctx = resolve_ctx(ctx)
    req, pl = from_dict(JobRequest, request), from_dict(Placement, placement)
    hold_lease(ctx, run_id, "place_data")
    with timed(ctx, run_id, "place_data"), heartbeat(ctx, run_id, "place_data"):
        src = storage.resolve(req.dataset_uri, ctx.settings)
        dst = paths.replica_uri(pl.region, req.dataset_uri, ctx.settings)
        logger.info("placing %s into %s", src, dst)
        result = copy_dataset(
            src,
            dst,
            lease=ctx.ledger.lease,
            on_invalidate=lambda: ctx.ledger.forget_replica(req.dataset_uri, pl.region),
            on_complete=lambda m: ctx.ledger.record_replica(
                req.dataset_uri, pl.region, dst, m.total_bytes, len(m.files)
            ),
        )
    logger.info(
        "data placed: %d files, %.1f MB (%.1f MB copied, %.1f MB already there) in %.2f s",
        len(result.manifest.files),
        result.manifest.total_bytes / 1e6,
        result.bytes_copied / 1e6,
        result.bytes_skipped / 1e6,
        result.seconds,
    )
    return {
        "data_uri": dst,
        "bytes": result.manifest.total_bytes,
        "files": len(result.manifest.files),
        "bytes_copied": result.bytes_copied,
        "seconds": round(result.seconds, 3),
    }


def _mark_provisioned(ctx: StageContext, run_id: str) -> None:
    """Record the run ``provisioned`` while it has not begun training: a recovery's capacity, or a
    GKE train task checking its capacity before each launch, leaves ``running``, ``preempted`` or
    an end as they are, also one a teardown writes while this runs."""
    ctx.ledger.advance_run(run_id, "provisioned", from_statuses=("validated", "planned", "provisioned"))


def provision(request: JSON, placement: JSON, run_id: str, ctx: StageContext | None = None) -> JSON:
    """Create (or reuse) the capacity of the placement on the request's backend, renewing the
    run's lease while it waits (a GPU node pool can take longer than the lease)."""
    ctx = resolve_ctx(ctx)
    req, pl = from_dict(JobRequest, request), from_dict(Placement, placement)
    hold_lease(ctx, run_id, "provision")
    with timed(ctx, run_id, "provision"), heartbeat(ctx, run_id, "provision"):
        record = get_backend(req.backend, ctx.settings).provision(run_key(run_id), pl)
        _mark_provisioned(ctx, run_id)
    return {"backend": req.backend, "run_key": run_key(run_id), "status": record.get("status", "ready")}


def provision_step(
    request: JSON, placement: JSON, run_id: str, ctx: StageContext | None = None, *, finished: JSON | None = None
) -> JSON:
    """``provision`` one step at a time, for an orchestrator that waits for cloud operations itself
    (deferrable: ``airflow_glue.operators.SailorProvisionOperator`` waits in the triggerer).

    Returns ``{"pending": {...}}`` (the operation to wait for: name, location, project, phase,
    what, gcp_conn_id, poll_s) or, once the capacity is there, what ``provision`` returns. Call
    again with ``finished`` = that pending dict when its operation is DONE; its outcome is checked
    first. A backend without steps (local) provisions in one call.

    Raises:
        RuntimeError: the finished operation failed (its error message, e.g. a quota).
    """
    ctx = resolve_ctx(ctx)
    req, pl = from_dict(JobRequest, request), from_dict(Placement, placement)
    backend = get_backend(req.backend, ctx.settings)
    # Each step renews the lease: between steps the task waits for a cloud operation, deferred.
    hold_lease(ctx, run_id, "provision")
    if not hasattr(backend, "provision_step"):
        return provision(request, placement, run_id, ctx)
    from sailor_tasks.backends.gke import PendingOperation

    with timed(ctx, run_id, "provision"):
        after = None
        if finished is not None:
            done = PendingOperation(**{k: finished[k] for k in ("name", "location", "project", "phase", "what")})
            backend.finish_operation(done)
            after = done.phase
        step = backend.provision_step(run_key(run_id), pl, after=after)
        if isinstance(step, PendingOperation):
            logger.info("provision of %s waits for GKE operation %s (%s)", run_id, step.name, step.what)
            return {
                "pending": {
                    **dataclasses.asdict(step),
                    "gcp_conn_id": backend.cfg.gcp_conn_id,
                    "poll_s": backend.cfg.operation_poll_s,
                }
            }
        _mark_provisioned(ctx, run_id)
    return {"backend": req.backend, "run_key": run_key(run_id), "status": step.get("status", "ready")}
