"""Placing a run, or queueing it when nothing fits now; admission passes; lease reconciliation.

``plan`` (``stages.prepare``) calls ``plan_or_queue`` for a run's first placement:

* the queue is empty and the run fits → it is planned and reserved as before (nothing changes);
* otherwise the run enters SAILOR's queue (``queue_entries``) and an admission pass runs
  (``admit_queued``, which runs ``sailor_tasks.queue.admit``, the pass the queue simulator runs
  too): the queue policy (``Settings.queue_policy``) ranks the waiting runs and each, in order, is
  planned and reserved in the transaction that admits it (``_LedgerReserver``). A run still
  waiting raises ``RunQueuedError``; ``sailor_train``'s ``plan`` defers on it and is resumed when
  the run is admitted.

Admission passes run wherever capacity may have freed: ``plan`` (a run arrives), ``teardown`` (a
run released its capacity), ``reconcile`` (an expired lease was reclaimed) and a waiting
``plan``'s periodic re-check (time-outs, latest starts).

Leases: every reservation carries a lease (``Settings.lease_s``); the run's stages renew it, its
training renews it from a heartbeat thread (a deferred GKE attempt: its pods' trigger). ``reconcile`` reclaims live reservations whose lease
expired (the run was killed or its worker lost): it stops and removes what the run left on its
backend, releases the capacity, marks the run failed and admits the queue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from sailor_tasks import storage
from sailor_tasks.errors import (
    CapacityUnavailableError,
    InvalidRequestError,
    LeaseReclaimedError,
    NoFeasibleOfferError,
    QueueRejectedError,
    QueueTimeoutError,
    ReconcileIncompleteError,
    ReservationReleasedError,
    RunQueuedError,
)
from sailor_tasks.ledger.store import utcnow
from sailor_tasks.model import ANY_GPU, RUN_STATUSES_DONE, JobRequest, Placement, from_dict, run_key, to_dict
from sailor_tasks.stages.context import JSON, StageContext, resolve_ctx

logger = logging.getLogger(__name__)

RECHECK_S = 300.0
"""A waiting ``plan`` re-runs an admission pass at least this often (time-outs, latest starts),
besides the passes that capacity events run."""


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat(timespec="seconds")


# --- placing --------------------------------------------------------------------------------------


def with_dataset_residency(ctx: StageContext, req: JobRequest) -> JobRequest:
    """``req`` limited to the continents every run of its dataset allowed it in (``data_residency``
    is the dataset's: a run that declares none must not copy it where another run forbade it).

    Raises:
        InvalidRequestError: the run's own residency shares no continent with the dataset's.
    """
    declared = ctx.ledger.dataset_residency(req.dataset_uri)
    if declared is None:
        return req
    allowed = declared & set(req.data_residency) if req.data_residency else declared
    if not allowed:
        raise InvalidRequestError(
            "data_residency",
            list(req.data_residency),
            f"the runs of {req.dataset_uri} keep it in {', '.join(sorted(declared))}",
            sorted(declared),
        )
    return dataclasses.replace(req, data_residency=tuple(sorted(allowed)))


def reserve_placement(
    ctx: StageContext,
    req: JobRequest,
    run_id: str,
    *,
    attempt: int = 1,
    blocked_zones: frozenset[str] = frozenset(),
    elapsed_h: float = 0.0,
    steps_done: int = 0,
    admit: bool = False,
    market: str | None = None,
    checkpoint: tuple[str, int] | None = None,
    best_effort: bool = True,
) -> Placement:
    """Pick the market (the run's strategy, or ``market`` when admission forces one), plan on a
    fresh snapshot, reserve (and with ``admit`` admit the queued run in the same transaction), and
    record the placement, the market decision and the run's status. ``checkpoint``: (region, bytes)
    of the checkpoint a relaunch resumes from (another region copies it first). A relaunch that
    no offer finishes by the deadline goes on without it (best effort) unless ``best_effort`` is
    False (recovery has looser blocked zones to try first).

    Raises:
        CapacityUnavailableError: nothing fits now (retryable, or queued).
        NoFeasibleOfferError, InvalidRequestError: the request cannot be placed anywhere.
        NotQueuedError: ``admit`` and another pass admitted the run first (nothing reserved).
        ReservationReleasedError: the reservation was released before the run was recorded
            ``planned`` (its teardown or a reclaim ran meanwhile): the run keeps its final status.
    """
    from sailor_tasks.data.manifest import read_manifest
    from sailor_tasks.placement.index import index_for
    from sailor_tasks.placement.reservations import ledger_state, plan_and_reserve
    from sailor_tasks.strategies.live import decide_market, rest_of

    req = with_dataset_residency(ctx, req)

    manifest = read_manifest(storage.resolve(req.dataset_uri, ctx.settings))
    nbytes = manifest.total_bytes if manifest is not None else None
    # The throughput matrix admission's policies use too, measured speeds included.
    table = ctx.planning_table()
    catalog = ctx.planning_catalog()  # preemption rates learned from the ledger's spot attempts
    index = index_for(catalog, table)
    blocked = frozenset(blocked_zones)
    if market is None:
        decision = decide_market(
            req,
            catalog,
            ledger_state(ctx.ledger, req, run_id, nbytes, blocked, checkpoint),
            elapsed_h=elapsed_h,
            steps_done=steps_done,
            index=index,
        )
        chosen, reason, slack_h = decision.market, decision.reason, decision.slack_h
    else:
        chosen, reason, slack_h = market, f"{market}: forced by admission at the run's latest start", None
    req = dataclasses.replace(req, market=chosen)
    late = None
    relaunch = steps_done > 0 or elapsed_h > 0
    if relaunch:
        # A relaunch: the planner's deadline rule and costs see the work left and the time left, as
        # the market strategy above did, not the whole run from scratch against the whole deadline.
        req = rest_of(req, steps_done, None if req.deadline_hours is None else req.deadline_hours - elapsed_h)
        if req.deadline_hours is not None and req.deadline_hours <= 0:
            late = f"deadline passed {-req.deadline_hours:.2f} h ago: relaunched without it (best effort)"
            req = dataclasses.replace(req, deadline_hours=None)

    def reserve(r: JobRequest):
        return plan_and_reserve(
            r,
            catalog,
            ctx.ledger,
            run_id,
            snapshot=lambda: ledger_state(ctx.ledger, r, run_id, nbytes, blocked, checkpoint),
            index=index,
            lease_s=ctx.settings.lease_s,
            admit=admit,
        )

    try:
        reserved = reserve(req)
    except NoFeasibleOfferError as exc:
        if not relaunch or not best_effort or req.deadline_hours is None or "deadline" not in exc.rejections:
            raise
        # Nothing finishes the rest of the run in time any more: finish it as soon as possible
        # rather than fail a run that is partly done, and say so.
        late = (
            f"no offer finishes the remaining work in the {req.deadline_hours:.2f} h left before the "
            "deadline: relaunched without it (best effort)"
        )
        reserved = reserve(dataclasses.replace(req, deadline_hours=None))
    if late is not None:
        reason = f"{reason}; {late}"
    placement = dataclasses.replace(
        reserved.placement, explanation=(*reserved.placement.explanation, f"market: {reason}")
    )
    ctx.ledger.record_placement(placement, attempt=attempt)
    ctx.ledger.record_attempt_market(
        run_id, attempt, req.strategy, placement.market, reason, slack_h, placement.usd_per_hour
    )
    planned = ctx.ledger.mark_planned(
        run_id,
        region=placement.region,
        zone=placement.zone,
        gpu_type=placement.gpu_type,
        market=placement.market,
        num_gpus=placement.num_gpus,
        usd_per_hour=placement.usd_per_hour,
    )
    if not planned:  # released since the reservation: the run ended (teardown) or was reclaimed
        raise ReservationReleasedError(run_id)
    if admit:
        ctx.ledger.set_queue_placement(run_id, to_dict(placement))
    return placement


def learned_hours(ctx: StageContext, req: JobRequest) -> float | None:
    """Hours the run's training is expected to take from the speed its workload (built-in model,
    or its own command) reached in past attempts on the same backend with the same GPUs (the GPU
    type too when the run pins one): the median steps/s of those attempts, launch included.
    None: no such attempt yet."""
    import statistics

    speeds = [
        s["steps_per_s"]
        for s in ctx.ledger.attempt_speeds(req.backend)
        if s["model"] == req.model
        and s["command"] == tuple(req.command)
        and s["num_gpus"] == req.num_gpus
        and (req.gpu_type in (ANY_GPU, s["gpu_type"]) or req.backend == "local")
    ]
    if not speeds:
        return None
    return req.total_steps / statistics.median(speeds) / 3600.0


def expected_hours(ctx: StageContext, req: JobRequest) -> float | None:
    """Hours the run holds capacity: training, the data copy and one launch. Training comes from
    the speed learned from past attempts of the same workload on the same backend
    (``learned_hours``, launch included) when there are any, else from the placement engine's
    estimate (``queue.estimate_hours``: the run's best on-demand offer) plus one launch. A run with
    a deadline always takes the engine's estimate on its fastest offer: its latest start must be
    the last moment the engine's deadline rule, which admission applies, still lets an offer meet
    the deadline (from learned speeds it was later, and the run failed before it, never urgent).
    Capacity held by others is ignored (an estimate of the run, not of the wait), not the
    dataset's residency (``with_dataset_residency``), which admission applies too. None: no offer
    can run it.

    Raises:
        InvalidRequestError: the run's own residency shares no continent with the dataset's.
    """
    from sailor_tasks.placement.context import RESTART_HOURS
    from sailor_tasks.placement.index import index_for
    from sailor_tasks.placement.reservations import ledger_state
    from sailor_tasks.queue import estimate_hours

    req = with_dataset_residency(ctx, req)
    table = ctx.planning_table()
    catalog = ctx.planning_catalog()
    est = estimate_hours(req, catalog, ledger_state(ctx.ledger, req, ""), index_for(catalog, table))
    if est is None:
        return None
    engine = est.hours + RESTART_HOURS
    learned = learned_hours(ctx, req) if req.deadline_hours is None else None
    return (engine if learned is None else learned) + est.data_hours


def plan_or_queue(ctx: StageContext, req: JobRequest, run_id: str) -> Placement:
    """The run's first placement: reserved now when the queue is empty and it fits, else through
    the queue (see the module). Idempotent: a resumed or retried ``plan`` of an admitted run gets
    the admitted placement.

    Raises:
        RunQueuedError: the run waits (not a failure; the caller waits for admission).
        QueueTimeoutError: it waited ``max_queue_hours`` (or 0 was allowed) without admission.
        DeadlineUnmeetableError: its latest start passed with no capacity for it.
        QueueRejectedError: the queue turned it away (cancelled, or no longer feasible).
        NoFeasibleOfferError, InvalidRequestError: nothing in the catalog can run it.
        ReservationReleasedError: the run has ended (a plan retried after its lease was reclaimed,
            or after its teardown): it reserves nothing.
    """
    status = (ctx.ledger.get_run(run_id) or {}).get("status")
    if status in RUN_STATUSES_DONE:
        raise ReservationReleasedError(run_id, f"and the run ended ({status}) before this plan ran")
    entry = ctx.ledger.queue_entry(run_id)
    if entry is not None and entry["state"] != "queued":
        return _settled(ctx, req, run_id, entry)
    if entry is None:
        waiting = [e for e in ctx.ledger.queue_entries(("queued",)) if e["run_id"] != run_id]
        waited_for = f"{req.num_gpus}x {req.gpu_type} GPUs"
        # A retried plan of a run that was placed without waiting still holds its reservation:
        # it re-plans in its own capacity (a retried plan replaces its reservation) rather than
        # queue behind runs that arrived after it, holding GPUs it would then not use.
        held = ctx.ledger.live_reservation(run_id) is not None
        if not waiting or held:
            try:
                return reserve_placement(ctx, req, run_id)
            except CapacityUnavailableError as exc:
                waited_for = str(exc).removeprefix("no capacity for ")
                if held:  # its capacity is gone (the catalog shrank): it waits holding nothing
                    ctx.ledger.release(run_id)
        entry = _enqueue(ctx, req, run_id, waited_for, tried=not waiting)
        admit_queued(ctx, arriving=(run_id,))
    else:
        admit_queued(ctx)
    entry = ctx.ledger.queue_entry(run_id)
    assert entry is not None
    if entry["state"] != "queued":
        return _settled(ctx, req, run_id, entry)
    raise _queued_error(entry)


def _enqueue(
    ctx: StageContext, req: JobRequest, run_id: str, waited_for: str, *, tried: bool = True
) -> dict[str, Any]:
    """Put the run in the queue unless it may not wait (``refused_on_arrival``; ``tried``: it was
    just planned and did not fit)."""
    from sailor_tasks.queue import QueuedRun, refused_on_arrival

    now = utcnow()
    hours = expected_hours(ctx, req)
    deadline_at = latest = None
    if req.deadline_hours is not None:
        deadline_at = now + dt.timedelta(hours=req.deadline_hours)
        latest = deadline_at - dt.timedelta(hours=hours or 0.0)
    refusal = refused_on_arrival(
        QueuedRun(
            run_id=run_id,
            team=req.team,
            gpus=req.num_gpus,
            throughput={},
            arrival_s=now.timestamp(),
            expected_s=(hours or 0.0) * 3600.0,
            deadline_s=None if deadline_at is None else deadline_at.timestamp(),
            latest_start_s=None if latest is None else latest.timestamp(),
            wait_until_s=now.timestamp() + req.max_queue_hours * 3600.0,
            waiting_for=waited_for,
        ),
        now.timestamp(),
        tried,
    )
    if refusal is not None:
        raise refusal
    logger.info("run %s: nothing fits now (%s); queued", run_id, waited_for)
    return ctx.ledger.enqueue(
        run_id,
        team=req.team,
        priority=req.priority,
        gpu_type=req.gpu_type,
        gpus=req.num_gpus,
        request=to_dict(req),
        policy=ctx.settings.queue_policy,
        max_wait_until=now + dt.timedelta(hours=req.max_queue_hours),
        expected_hours=hours,
        deadline_at=deadline_at,
        latest_start_at=latest,
    )


def _queued_error(entry: Mapping[str, Any]) -> RunQueuedError:
    now = utcnow()
    recheck = now + dt.timedelta(seconds=RECHECK_S)
    if entry.get("latest_start_at") is not None:
        from sailor_tasks.queue.admission import URGENT_MARGIN_S

        # Next when it turns urgent (tried on-demand then), and once urgent at its latest start
        # (it fails then if nothing took it): passes that capacity freeing runs come in between.
        latest = entry["latest_start_at"]
        urgent_at = latest - dt.timedelta(seconds=URGENT_MARGIN_S)
        due = urgent_at if now < urgent_at else latest + dt.timedelta(seconds=1)
        recheck = max(min(recheck, due), now + dt.timedelta(seconds=5))
    recheck = min(recheck, entry["max_wait_until"])
    return RunQueuedError(
        entry["run_id"],
        entry.get("position"),
        entry.get("reason") or "waiting for capacity",
        _iso(entry.get("estimated_start_at")),
        _iso(entry["max_wait_until"]) or "",
        recheck_at=_iso(recheck),
    )


def _settled(ctx: StageContext, req: JobRequest, run_id: str, entry: Mapping[str, Any]) -> Placement:
    """The placement of a run the queue admitted, its lease renewed (the lease began at the
    admission, and the plan resumes after it: its trigger, a worker slot); else the queue's end.

    Raises:
        ReservationReleasedError, LeaseReclaimedError: the admitted run's reservation is gone.
    """
    state = entry["state"]
    if state == "admitted":
        hold_lease(ctx, run_id, "plan (admitted)")
        return from_dict(Placement, entry["placement"])
    if state == "timed_out":
        raise QueueTimeoutError(run_id, req.max_queue_hours, _waited_for(ctx, entry))
    raise QueueRejectedError(run_id, state, entry.get("reason") or state)


def _waited_for(ctx: StageContext, entry: Mapping[str, Any]) -> str:
    """What the run waits for, in words: GPUs, the regions it allows, its queue position."""
    req = entry.get("request") or {}
    excluded = sorted(set(req.get("exclude_regions") or ()))
    allowed = set(req.get("regions") or ()) - set(excluded)
    every = set(ctx.catalog.regions) - set(excluded)
    if not allowed or allowed >= every:
        where = "any region" + (f" but {','.join(excluded)}" if excluded else "")
    elif len(allowed) <= 4:
        where = ",".join(sorted(allowed))
    else:
        where = f"{len(allowed)} regions"
    position = entry.get("position")
    return f"{entry['gpus']}x {entry['gpu_type']} GPUs in {where}" + (
        f" (queue position {position})" if position is not None else ""
    )


# --- admission --------------------------------------------------------------------------------------


def _capacity(ctx: StageContext) -> dict[str, int]:
    """GPUs per type with a known capacity in the catalog (summed over zones)."""
    out: dict[str, int] = {}
    for (_region, gpu), n in _region_capacity(ctx).items():
        out[gpu] = out.get(gpu, 0) + n
    return out


def _region_capacity(ctx: StageContext) -> dict[tuple[str, str], int]:
    """GPUs per (region, type) with a known capacity in the catalog (summed over zones)."""
    per_zone: dict[tuple[str, str, str], int] = {}
    for o in ctx.catalog.offers:
        if o.capacity_gpus is not None:
            per_zone[(o.region, o.zone, o.gpu_type)] = o.capacity_gpus
    out: dict[tuple[str, str], int] = {}
    for (region, _zone, gpu), n in per_zone.items():
        out[(region, gpu)] = out.get((region, gpu), 0) + n
    return out


def _allowed_regions(
    ctx: StageContext, request: Mapping[str, Any], residencies: dict[str, Any] | None = None
) -> frozenset[str]:
    """The regions a queued request may use (within its dataset's residency too, as
    ``with_dataset_residency`` limits its placement), or empty when that is every region of the
    catalog. ``residencies``: each dataset's residency read so far (one ledger read per dataset
    for a pass's many runs)."""
    every = set(ctx.catalog.regions)
    allowed = set(request.get("regions") or every) - set(request.get("exclude_regions") or ())
    residency = set(request.get("data_residency") or ())
    uri = str(request.get("dataset_uri") or "")
    residencies = {} if residencies is None else residencies
    if uri not in residencies:
        residencies[uri] = ctx.ledger.dataset_residency(uri)
    declared = residencies[uri]
    if declared is not None:
        residency = residency & declared if residency else set(declared)
    if residency or declared is not None:
        continent = ctx.catalog.transfer.continent
        allowed = {r for r in allowed if continent(r) in residency}
    if not allowed:  # a name no region has: it can take no GPUs (no start, holds nothing back)
        return frozenset({""})
    return frozenset() if allowed >= every else frozenset(allowed)


def _throughput(run: Mapping[str, Any], gpus: int, gpu_types: list[str], table: Any) -> dict[str, float]:
    """Steps/s of the run on each GPU type it may use (the policies' throughput matrix)."""
    from sailor_tasks.policies.regions import job_from_run

    request = run.get("request") or {}
    try:
        return dict(job_from_run({**run, "num_gpus": gpus, "request": request}, table, gpu_types).throughput)
    except ValueError:  # a model without a job type: equally fast everywhere it may run
        pinned = request.get("gpu_type", ANY_GPU)
        return {g: float(gpus) for g in gpu_types if pinned in (ANY_GPU, g)}


def _rank(ctx: StageContext, entries: list[dict[str, Any]], now: dt.datetime) -> list:
    from sailor_tasks.queue import rank

    queued, held, capacity = _views(ctx, entries, now)
    return rank(
        queued,
        held,
        capacity,
        now.timestamp(),
        ctx.settings.queue_policy,
        dict(ctx.settings.team_weights),
        _attained(ctx, now),
        _region_capacity(ctx),
    )


def _attained(ctx: StageContext, now: dt.datetime) -> dict[str, float]:
    """team → GPU-seconds its reservations held over the attained-service window."""
    from sailor_tasks.queue import ATTAINED_WINDOW_S

    return ctx.ledger.team_gpu_seconds(now - dt.timedelta(seconds=ATTAINED_WINDOW_S), now)


def _views(ctx: StageContext, entries: list[dict[str, Any]], now: dt.datetime) -> tuple[list, list, dict]:
    from sailor_tasks.queue import HeldRun, QueuedRun

    table = ctx.planning_table()
    capacity = _capacity(ctx)
    types = sorted(capacity)
    queued = []
    residencies: dict[str, Any] = {}
    for e in entries:
        req = e["request"]
        thr = _throughput({"run_id": e["run_id"], "model": req.get("model"), **e}, e["gpus"], types, table)
        queued.append(
            QueuedRun(
                run_id=e["run_id"],
                team=e["team"],
                gpus=e["gpus"],
                throughput=thr,
                arrival_s=e["enqueued_at"].timestamp(),
                expected_s=(e.get("expected_hours") or 0.0) * 3600.0,
                priority=e["priority"],
                steps_remaining=float(req.get("total_steps") or 0),
                deadline_s=None if e.get("deadline_at") is None else e["deadline_at"].timestamp(),
                latest_start_s=None if e.get("latest_start_at") is None else e["latest_start_at"].timestamp(),
                market=str(req.get("market") or "auto"),
                wait_until_s=e["max_wait_until"].timestamp(),
                waiting_for=_waited_for(ctx, e),
                regions=_allowed_regions(ctx, req, residencies),
            )
        )
    admitted = {e["run_id"]: e for e in ctx.ledger.queue_entries(("admitted",))}
    held = []
    for r in ctx.ledger.live_reservation_rows():
        req = r.get("request") or {}
        hours = (admitted.get(r["run_id"]) or {}).get("expected_hours")
        if hours is None and req:
            try:
                hours = expected_hours(ctx, from_dict(JobRequest, req))
            except (ValueError, TypeError, KeyError):
                hours = None
        started = r["created_at"]
        held.append(
            HeldRun(
                run_id=r["run_id"],
                team=r.get("team") or "?",
                gpus=r["gpus"],
                gpu_type=r["gpu_type"],
                throughput=_throughput(
                    {
                        "run_id": r["run_id"],
                        "model": r.get("model"),
                        "request": req,
                        "total_steps": r.get("total_steps"),
                        "steps": r.get("steps"),
                    },
                    r["gpus"],
                    types,
                    table,
                ),
                started_s=started.timestamp(),
                expected_end_s=started.timestamp() + (hours or 0.0) * 3600.0,
                steps_remaining=float(max((r.get("total_steps") or 0) - (r.get("steps") or 0), 0)),
                region=r.get("region") or "",
            )
        )
    return queued, held, capacity


class _LedgerReserver:
    """Admission's ``Reserver`` on the live path: plan on a fresh view of the ledger and reserve
    in the transaction that admits the run (``reserve_placement(..., admit=True)``)."""

    def __init__(self, ctx: StageContext, entries: Mapping[str, Mapping[str, Any]]):
        self.ctx, self.entries = ctx, entries

    def reserve(self, run: Any, market: str | None, deadline_hours: float | None) -> bool | None:
        from sailor_tasks.placement.reservations import NotQueuedError

        req = from_dict(JobRequest, self.entries[run.run_id]["request"])
        if deadline_hours is not None:
            req = dataclasses.replace(req, deadline_hours=deadline_hours)
        try:
            reserve_placement(self.ctx, req, run.run_id, admit=True, market=market)
        except NotQueuedError:
            return None
        except ReservationReleasedError:
            logger.warning("queued run %s ended while it was being admitted: not admitted", run.run_id)
            return None
        logger.info("admitted queued run %s%s", run.run_id, f" ({market}, forced)" if market else "")
        return True

    def end(self, run: Any, state: str, reason: str) -> bool:
        return self.ctx.ledger.end_queue_entry(run.run_id, state, reason)


def admit_queued(
    ctx: StageContext | None = None, now: dt.datetime | None = None, *, arriving: tuple[str, ...] = ()
) -> JSON:
    """One admission pass (``sailor_tasks.queue.admit``, the code the queue simulator runs too):
    time out runs past ``max_queue_hours``, fail runs past their latest start that nothing can
    take, then admit in the policy's order every run that fits (a run that does not fit holds back
    the runs behind it that wait for the same GPU types), and store every waiting run's position,
    reason and estimated start. Safe to run concurrently: a run is admitted by the transaction
    that reserves its capacity, once. ``arriving``: the runs whose arrival this pass is (a run
    that may not wait is tried before it times out)."""
    from sailor_tasks.queue import admit

    ctx = resolve_ctx(ctx)
    now = now or utcnow()
    entries = ctx.ledger.queue_entries(("queued",))
    # A run that ended while queued (its teardown could not take it out) leaves before the ranking:
    # it would hold back the runs behind it on its GPU types, and count in its team's share.
    statuses = ctx.ledger.run_statuses(e["run_id"] for e in entries)
    ended = {run_id: s for run_id, s in statuses.items() if s in RUN_STATUSES_DONE}
    for run_id, status in ended.items():
        leave_queue(ctx, run_id, f"the run had ended ({status}) while still queued")
    entries = [e for e in entries if e["run_id"] not in ended]
    if not entries:
        return {"admitted": [], "timed_out": [], "failed": [], "waiting": 0}
    queued, held, capacity = _views(ctx, entries, now)
    result = admit(
        queued,
        held,
        capacity,
        now.timestamp(),
        _LedgerReserver(ctx, {e["run_id"]: e for e in entries}),
        ctx.settings.queue_policy,
        dict(ctx.settings.team_weights),
        _attained(ctx, now),
        arriving,
        _region_capacity(ctx),
    )
    waiting = ctx.ledger.queue_entries(("queued",))
    if waiting:
        ctx.ledger.set_queue_ranking(
            (
                r.run_id,
                r.position,
                r.reason,
                None
                if r.estimated_start_s is None
                else dt.datetime.fromtimestamp(r.estimated_start_s, dt.UTC),
            )
            for r in _rank(ctx, waiting, now)
        )
    return {
        "admitted": result.admitted,
        "timed_out": result.timed_out,
        "failed": result.failed,
        "waiting": len(waiting),
    }


def admit_after_release(ctx: StageContext) -> JSON | None:
    """An admission pass after capacity was released; its failure is logged, never raised (the
    release itself succeeded, and waiting runs re-check on their own)."""
    try:
        return admit_queued(ctx)
    except Exception as exc:  # the caller's work is done; the queue's own re-check will retry
        logger.warning("admission pass after a release failed: %s: %s", type(exc).__name__, exc)
        return None


def leave_queue(ctx: StageContext, run_id: str, reason: str) -> bool:
    """Take a run that ended while waiting out of the queue (``left``)."""
    return ctx.ledger.end_queue_entry(run_id, "left", reason)


# --- leases -----------------------------------------------------------------------------------------


def renew_lease(ctx: StageContext, run_id: str, holder: str, lease_s: float | None = None) -> bool:
    """Renew the run's lease (False when it holds no live reservation)."""
    return ctx.ledger.renew_reservation_lease(run_id, lease_s or ctx.settings.lease_s, holder)


def hold_lease(ctx: StageContext, run_id: str, holder: str, lease_s: float | None = None) -> None:
    """Renew the run's lease before it uses its capacity.

    Raises:
        LeaseReclaimedError: the reconciler reclaimed the reservation (its lease had expired).
        ReservationReleasedError: the run holds no live reservation any more (its teardown
            released it: a stage retried after the run ended may not use capacity not its own).
    """
    if renew_lease(ctx, run_id, holder, lease_s):
        return
    reclaimed = (ctx.ledger.reservation_leases().get(run_id) or {}).get("reclaimed_at")
    if reclaimed is not None:
        raise LeaseReclaimedError(run_id, _iso(reclaimed) or "")
    raise ReservationReleasedError(run_id, f"before {holder} could use its capacity")


@contextlib.contextmanager
def heartbeat(ctx: StageContext, run_id: str, holder: str = "train heartbeat") -> Iterator[None]:
    """Renew the run's lease every third of ``lease_s`` while the block runs (the heartbeat of the
    stages that hold a task while they work: train, place_data, provision); a lost renewal is
    logged and retried at the next beat."""
    stop = threading.Event()
    every = max(1.0, ctx.settings.lease_s / 3.0)

    def beat() -> None:
        while not stop.wait(every):
            try:
                if not renew_lease(ctx, run_id, holder):
                    logger.warning("run %s holds no live reservation: its lease was reclaimed", run_id)
            except Exception as exc:  # the ledger may be briefly unreachable; the lease has margin
                logger.warning("lease renewal of %s failed: %s", run_id, exc)

    thread = threading.Thread(target=beat, name=f"lease-{run_id[:40]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def reconcile(ctx: StageContext | None = None, now: dt.datetime | None = None) -> JSON:
    """Reclaim every live reservation whose lease expired: stop and remove what the run left on its
    backend, release the capacity (only if the lease is still expired: a renewal wins), mark the
    run failed (unless it ended, or its training completed: finalize records its success), then
    run an admission pass for the queue.

    Raises:
        ReconcileIncompleteError: what some runs left could not be stopped or removed (after the
            rest of the pass; its ``result`` is what the pass returns otherwise).
    """
    from sailor_tasks.backends import get_backend
    from sailor_tasks.settings import BACKENDS
    from sailor_tasks.stages.usage import end_unreported_attempt

    ctx = resolve_ctx(ctx)
    given_now, now = now, now or utcnow()
    reclaimed, errors = [], []
    for res in ctx.ledger.expired_leases(now):
        # Fence the lease first: a renewal that landed since expired_leases() wins, and none can
        # land after, so a run is never stopped while its reservation stays held.
        if not ctx.ledger.claim_expired(res.run_id, now):
            continue
        run = ctx.ledger.get_run(res.run_id) or {}
        name = run.get("backend") if run.get("backend") in BACKENDS else ctx.settings.backend
        try:
            backend = get_backend(name, ctx.settings)
            stopped = backend.cancel(run_key(res.run_id))
            backend.teardown(run_key(res.run_id))
        except Exception as exc:  # keep the capacity held until its backend is really gone
            errors.append(f"{res.run_id}: {type(exc).__name__}: {exc}")
            continue
        # Marked failed in the same transaction (unless it ended or trained to the end): a plan
        # retried right after the release finds it ended.
        if ctx.ledger.reclaim(res.run_id, now, fail="lease expired: the run stopped renewing its reservation"):
            reclaimed.append(res.run_id)
            logger.warning(
                "run %s: lease expired; stopped %d process(es) or pod(s), reclaimed %dx %s in %s",
                res.run_id,
                stopped,
                res.gpus,
                res.gpu_type,
                res.zone,
            )
            for att in ctx.ledger.attempts(res.run_id):
                if att["outcome"] == "running":
                    end_unreported_attempt(ctx, res.run_id, att, "failed", "lease expired; reclaimed")
    # On the clock of when it runs: stopping and removing what runs left can take minutes each.
    admission = admit_queued(ctx, given_now) if reclaimed or ctx.ledger.queue_entries(("queued",)) else None
    result = {"reclaimed": reclaimed, "errors": errors, "admission": admission}
    if errors:
        raise ReconcileIncompleteError(errors, result)
    return result
