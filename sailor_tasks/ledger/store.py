"""Ledger queries. One ``Ledger`` per process; every method is one short transaction."""

from __future__ import annotations

import datetime as dt
import functools
import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import create_engine, delete, event, func, insert, select, text, union_all, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine

from sailor_tasks.errors import LeaseReclaimedError, ReservationReleasedError
from sailor_tasks.ledger import migrate
from sailor_tasks.ledger import schema as t
from sailor_tasks.ledger.lease import Lease
from sailor_tasks.model import (
    DEFAULT_BATCH_SIZE,
    RUN_STATUSES_DONE,
    RUN_STATUSES_LIVE,
    Assignment,
    Placement,
    Reservation,
)
from sailor_tasks.settings import DEFAULT_LEASE_S

RUN_LIST_FIELDS = (
    "run_id",
    "job_name",
    "team",
    "created_at",
    "status",
    "region",
    "zone",
    "gpu_type",
    "market",
    "steps",
    "initial_loss",
    "final_loss",
    "checkpoint_uri",
    "usd_estimate",
)


QUEUE_STATES = ("queued", "admitted", "timed_out", "failed", "left")
"""States of a queue entry: waiting, admitted (capacity reserved), gave up after
``max_queue_hours``, failed (cannot meet its deadline or no longer feasible), left (cancelled)."""


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def aware(t_: dt.datetime | None) -> dt.datetime | None:
    """A datetime read back from the ledger, in UTC: SQLite returns naive ones (written in UTC),
    PostgreSQL aware ones in its session's time zone, which need not be UTC."""
    if t_ is None:
        return t_
    return t_.replace(tzinfo=dt.UTC) if t_.tzinfo is None else t_.astimezone(dt.UTC)


def open_engine(url: str) -> Engine:
    """An engine for the ledger at ``url`` (SQLite: its folder created, WAL); no schema change."""
    if url.startswith("sqlite"):
        import os

        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(conn, _record):  # WAL lets readers (the UI) run beside the writer
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")

        return engine
    return create_engine(url, pool_pre_ping=True)


def _replace_row(conn: Any, table: Any, key: Mapping[str, Any], **values: Any) -> None:
    """Inside the caller's transaction: the row of ``table`` identified by ``key`` becomes
    ``key | values`` (delete then insert: portable across SQLite and PostgreSQL; a retry replaces,
    never doubles)."""
    conn.execute(delete(table).where(*(table.c[k] == v for k, v in key.items())))
    conn.execute(insert(table).values(**key, **values))


def _update_or_insert(
    conn: Any,
    table: Any,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    on_insert: Mapping[str, Any] | None = None,
) -> None:
    """Inside the caller's transaction: the row of ``table`` identified by ``key`` gets ``values``,
    updated in place (a transaction waiting for its lock then finds it, not a row that vanished),
    or inserted with ``on_insert`` too when there is none."""
    updated = conn.execute(update(table).where(*(table.c[k] == v for k, v in key.items())).values(**values))
    if updated.rowcount == 0:
        conn.execute(insert(table).values(**key, **values, **(on_insert or {})))


def _add_held(conn: Any, deltas: Mapping[tuple[str, str], int]) -> None:
    """Inside the caller's transaction: add ``deltas`` ((zone, GPU type) -> GPUs) to the sums of
    the GPUs live reservations hold (``schema.held``), each in one statement, in key order: two
    transactions update the rows they share in the same order (no deadlock on PostgreSQL)."""
    h = t.held
    dialect = conn.dialect.name
    for (zone, gpu_type), gpus in sorted(deltas.items()):
        if gpus == 0:
            continue
        if dialect == "postgresql":
            stmt: Any = postgresql_insert(h)
        else:
            stmt = sqlite_insert(h)
        stmt = stmt.values(zone=zone, gpu_type=gpu_type, gpus=gpus)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[h.c.zone, h.c.gpu_type], set_={"gpus": h.c.gpus + stmt.excluded.gpus}
            )
        )


def _release(conn: Any, run_id: str, when: dt.datetime) -> bool:
    """Inside the caller's transaction: release the run's live reservation at ``when``, its GPUs
    taken off the held sums; False when it held none (nothing changed)."""
    cols = t.reservations.c
    row = conn.execute(
        update(t.reservations)
        .where(cols.run_id == run_id, cols.released_at.is_(None))
        .values(released_at=when)
        .returning(cols.zone, cols.gpu_type, cols.gpus)
    ).first()
    if row is None:
        return False
    _add_held(conn, {(row.zone, row.gpu_type): -row.gpus})
    return True


def _put_lease(conn: Any, run_id: str, lease_s: float, holder: str) -> None:
    """Inside the caller's transaction: the run's lease runs ``lease_s`` seconds from now."""
    now = utcnow()
    _replace_row(
        conn,
        t.reservation_leases,
        {"run_id": run_id},
        expires_at=now + dt.timedelta(seconds=lease_s),
        renewed_at=now,
        holder=holder[:100],
        reclaimed_at=None,
    )


def _replace_reservation(conn: Any, r: Reservation, lease_s: float = DEFAULT_LEASE_S) -> None:
    """Inside the caller's transaction: the run's reservation becomes ``r``, with a fresh lease.
    The reservation's row first, then the lease's: the order renewals, claims and reclaims lock
    them in (``_lock_live_reservation``), so two of them on one run never deadlock on PostgreSQL.
    The reservation's row is updated in place: a renewal waiting for its lock then finds the run's
    new reservation. The run's previous holding, live or released, is kept in
    ``reservation_intervals``: a team's attained service counts it."""
    cols = t.reservations.c
    now = utcnow()
    # Locked (PostgreSQL) before its GPUs come off the held sums: a concurrent replacement of the
    # same run waits, then reads this one's reservation.
    old = conn.execute(
        select(cols.zone, cols.gpu_type, cols.gpus, cols.market, cols.created_at, cols.released_at)
        .where(cols.run_id == r.run_id)
        .with_for_update()
    ).first()
    held: dict[tuple[str, str], int] = {(r.zone, r.gpu_type): r.gpus}
    if old is not None and old.released_at is None:
        key = (old.zone, old.gpu_type)
        held[key] = held.get(key, 0) - old.gpus
    if old is not None:
        ended = aware(old.released_at) if old.released_at is not None else now
        if ended > aware(old.created_at):
            conn.execute(
                insert(t.reservation_intervals).values(
                    run_id=r.run_id,
                    zone=old.zone,
                    gpu_type=old.gpu_type,
                    gpus=old.gpus,
                    market=old.market,
                    started_at=old.created_at,
                    ended_at=ended,
                )
            )
    _update_or_insert(
        conn,
        t.reservations,
        {"run_id": r.run_id},
        {
            "region": r.region,
            "zone": r.zone,
            "gpu_type": r.gpu_type,
            "gpus": r.gpus,
            "market": r.market,
            "created_at": now,
            "released_at": None,
        },
    )
    _add_held(conn, held)
    _put_lease(conn, r.run_id, lease_s, "reserve")


def _end_queue_entry(conn: Any, run_id: str, state: str, reason: str) -> bool:
    """Inside the caller's transaction: the run's entry, if still queued, leaves the queue as
    ``state`` with ``reason``; False when it was not queued."""
    q = t.queue_entries.c
    res = conn.execute(
        update(t.queue_entries)
        .where(q.run_id == run_id, q.state == "queued")
        .values(state=state, reason=reason[:2000], position=None, updated_at=utcnow())
    )
    return res.rowcount > 0


def _aware_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: aware(v) if isinstance(v, dt.datetime) else v for k, v in row.items()}


ASSIGNMENTS_LOCK_KEY = zlib.crc32(b"sailor:assignments") - (1 << 31)
"""PostgreSQL advisory lock serialising assignment publishes."""


def _lock_live_reservation(c: Any, run_id: str) -> bool:
    """Whether ``run_id`` holds a live reservation, its row locked to the end of the transaction
    on PostgreSQL (SQLite's ``BEGIN IMMEDIATE`` has locked the whole ledger already): renewals,
    claims and reclaims of one reservation are serialised."""
    cols = t.reservations.c
    live = select(cols.run_id).where(cols.run_id == run_id, cols.released_at.is_(None)).with_for_update()
    return c.execute(live).first() is not None


def _assignment(row: Mapping[str, Any]) -> Assignment:
    return Assignment(
        version=row["version"],
        shares=row["shares"],
        region_load=row["region_load"] or {},
        created_at=aware(row["created_at"]).isoformat(),
        source=row["source"],
        gpu_shares=row["gpu_shares"] or {},
    )


class Ledger:
    def __init__(self, url: str, *, upgrade: bool = True):
        """``upgrade`` False: the ledger must be at this SAILOR's revision already
        (``LedgerSchemaError`` else), as for a command that only reads it."""
        self.url = url
        self.engine = open_engine(url)
        if upgrade:
            migrate.ensure_current(self.engine)  # alembic: a new or older ledger is upgraded to the head
        else:
            try:
                migrate.check_current(self.engine)
            except BaseException:
                self.engine.dispose()
                raise

    @classmethod
    def for_reading(cls, url: str) -> Ledger | None:
        """The ledger at ``url`` for a command that only reads it: nothing is created or upgraded.
        None when ``url`` names a SQLite file that does not exist (nothing recorded there yet).

        Raises:
            LedgerSchemaError: the ledger is not at this SAILOR's revision.
        """
        if migrate.missing_sqlite_file(url):
            return None
        return cls(url, upgrade=False)

    # --- runs ------------------------------------------------------------------------------
    def upsert_run(self, run_id: str, **fields: Any) -> None:
        """Create the run row or update the given fields (idempotent for task retries)."""
        now = utcnow()
        with self.engine.begin() as c:
            _update_or_insert(
                c, t.runs, {"run_id": run_id}, {"updated_at": now, **fields}, {"created_at": now}
            )

    def mark_planned(self, run_id: str, **fields: Any) -> bool:
        """Record the run ``planned`` (with ``fields``) only while it holds a live reservation,
        checked in the same transaction with that reservation locked (PostgreSQL; SQLite's
        ``BEGIN IMMEDIATE`` holds every writer off): a teardown or reclaim that released it first
        keeps the run's final status, and one that comes after finds it ``planned``. False when
        the run holds no live reservation (nothing changed). A run that has ended meanwhile
        (``RUN_STATUSES_DONE``) keeps its status, and the reservation it still holds is released
        (False)."""
        with self._locking_engine.begin() as c:
            if not _lock_live_reservation(c, run_id):
                return False
            status = c.execute(
                select(t.runs.c.status).where(t.runs.c.run_id == run_id).with_for_update()
            ).scalar()
            if status in RUN_STATUSES_DONE:
                _release(c, run_id, utcnow())
                return False
            c.execute(
                update(t.runs)
                .where(t.runs.c.run_id == run_id)
                .values(status="planned", updated_at=utcnow(), **fields)
            )
        return True

    def advance_run(self, run_id: str, status: str, *, from_statuses: Iterable[str], **fields: Any) -> bool:
        """Set the run's ``status`` (and ``fields``) only while it is one of ``from_statuses``, in
        one statement: a status another process wrote meanwhile (a teardown's end) is never
        overwritten. False when the run is in none of them, or is not recorded (nothing changed)."""
        with self.engine.begin() as c:
            updated = c.execute(
                update(t.runs)
                .where(t.runs.c.run_id == run_id, t.runs.c.status.in_(list(from_statuses)))
                .values(status=status, updated_at=utcnow(), **fields)
            )
        return updated.rowcount > 0

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            row = c.execute(select(t.runs).where(t.runs.c.run_id == run_id)).mappings().first()
            return _aware_row(row) if row else None

    def run_statuses(self, run_ids: Iterable[str]) -> dict[str, str]:
        """run id → status of the recorded runs among ``run_ids`` (one query)."""
        ids = list(run_ids)
        if not ids:
            return {}
        r = t.runs.c
        with self.engine.connect() as c:
            return {run_id: status for run_id, status in c.execute(select(r.run_id, r.status).where(r.run_id.in_(ids)))}

    def list_runs(
        self, limit: int = 100, *, team: str | None = None, status: Iterable[str] | None = None
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` runs, of ``team`` only and in one of the ``status`` values when given."""
        q = select(t.runs).order_by(t.runs.c.created_at.desc()).limit(limit)
        if team is not None:
            q = q.where(t.runs.c.team == team)
        if status is not None:
            q = q.where(t.runs.c.status.in_(list(status)))
        with self.engine.connect() as c:
            return [_aware_row(r) for r in c.execute(q).mappings()]

    def dataset_residency(self, dataset_uri: str) -> frozenset[str] | None:
        """The continents every run that read ``dataset_uri`` with ``data_residency`` allows it in
        (the intersection of what they declared); None when no run declared any."""
        allowed: frozenset[str] | None = None
        with self.engine.connect() as c:
            rows = c.execute(select(t.runs.c.request).where(t.runs.c.dataset_uri == dataset_uri))
            for (request,) in rows:
                declared = request.get("data_residency") if isinstance(request, Mapping) else None
                if declared:
                    allowed = frozenset(declared) if allowed is None else allowed & frozenset(declared)
        return allowed

    # --- placements and reservations ---------------------------------------------------------
    def record_placement(self, placement: Placement, attempt: int = 1) -> None:
        with self.engine.begin() as c:
            c.execute(
                insert(t.placements).values(
                    run_id=placement.run_id,
                    attempt=attempt,
                    region=placement.region,
                    zone=placement.zone,
                    gpu_type=placement.gpu_type,
                    market=placement.market,
                    num_gpus=placement.num_gpus,
                    usd_per_hour=placement.usd_per_hour,
                    assignment_version=placement.assignment_version,
                    explanation=list(placement.explanation),
                    created_at=utcnow(),
                )
            )

    def placements(self, run_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        q = select(t.placements).order_by(t.placements.c.id.desc()).limit(limit)
        if run_id is not None:
            q = q.where(t.placements.c.run_id == run_id)
        with self.engine.connect() as c:
            return [_aware_row(r) for r in c.execute(q).mappings()]

    def reserve(self, reservation: Reservation, lease_s: float = DEFAULT_LEASE_S) -> None:
        """Hold capacity for a run; re-reserving the same run replaces its live reservation. One
        write transaction from its start (SQLite ``BEGIN IMMEDIATE``; PostgreSQL locks the row):
        the replaced reservation's GPUs come off the held sums exactly once."""
        with self._locking_engine.begin() as c:
            _replace_reservation(c, reservation, lease_s)

    def reserve_if_free(
        self,
        reservation: Reservation,
        capacity_gpus: int | None,
        lease_s: float = DEFAULT_LEASE_S,
        admit: Mapping[str, Any] | None = None,
    ) -> bool:
        """Reserve only if the (zone, GPU type) still has room: optimistic concurrency (ParSync).

        One transaction re-reads the live reservations of the zone and GPU type (the run's own
        previous reservation excluded, so a retried ``plan`` replaces rather than doubles) and
        inserts only when ``used + gpus <= capacity_gpus``. Writers to the same (zone, GPU type)
        are serialised: SQLite by ``BEGIN IMMEDIATE`` (one writer at a time), PostgreSQL by a
        transaction-scoped advisory lock on the pair. Returns False on conflict (nothing changed).

        ``admit``: the placement of a queued run being admitted. The same transaction then moves
        the run's queue entry from ``queued`` to ``admitted`` with that placement; if the entry is
        no longer queued (another admission pass got there first, or it left), nothing changes; if
        the run has ended (its teardown could not take it out of the queue), it leaves the queue.
        The reservation starts a lease of ``lease_s`` seconds.

        Raises:
            ReservationReleasedError: the run has ended (its teardown ran, or the reconciler ended
                it), checked in the same transaction: it reserves nothing (nothing changed).
            LeaseReclaimedError: the reconciler claimed the run's live reservation (its lease
                expired): a new reservation would undo that fence.
        """
        r = reservation
        cols = t.reservations.c
        with self._locking_engine.begin() as c:
            if admit is None:
                status = c.execute(
                    select(t.runs.c.status).where(t.runs.c.run_id == r.run_id).with_for_update()
                ).scalar()
                if status in RUN_STATUSES_DONE:
                    raise ReservationReleasedError(
                        r.run_id, f"and the run ended ({status}) before it reserved"
                    )
            lc = t.reservation_leases.c
            claimed = c.execute(
                select(lc.reclaimed_at)
                .select_from(t.reservations.join(t.reservation_leases, lc.run_id == cols.run_id))
                .where(cols.run_id == r.run_id, cols.released_at.is_(None), lc.reclaimed_at.is_not(None))
            ).scalar()
            if claimed is not None:
                raise LeaseReclaimedError(r.run_id, aware(claimed).isoformat(timespec="seconds"))
            if admit is not None:
                # Locked until this transaction ends (PostgreSQL; SQLite's BEGIN IMMEDIATE already
                # holds every writer off): a teardown taking the run out of the queue, or another
                # admission pass, waits, then finds it admitted.
                q = t.queue_entries.c
                state = c.execute(
                    select(q.state).where(q.run_id == r.run_id).with_for_update()
                ).scalar_one_or_none()
                if state != "queued":
                    return False
                status = c.execute(select(t.runs.c.status).where(t.runs.c.run_id == r.run_id)).scalar()
                if status in RUN_STATUSES_DONE:
                    # Its teardown could not take it out of the queue: it leaves now, unreserved.
                    _end_queue_entry(c, r.run_id, "left", f"the run had ended ({status}) while still queued")
                    return False
            if self._locking_engine.dialect.name == "postgresql":
                key = zlib.crc32(f"{r.zone}|{r.gpu_type}".encode()) - (1 << 31)
                c.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
            if capacity_gpus is not None:
                used = c.execute(
                    select(func.coalesce(func.sum(cols.gpus), 0)).where(
                        cols.released_at.is_(None),
                        cols.zone == r.zone,
                        cols.gpu_type == r.gpu_type,
                        cols.run_id != r.run_id,
                    )
                ).scalar_one()
                if int(used) + r.gpus > capacity_gpus:
                    return False
            _replace_reservation(c, r, lease_s)
            if admit is not None:
                now = utcnow()
                c.execute(
                    update(t.queue_entries)
                    .where(t.queue_entries.c.run_id == r.run_id)
                    .values(
                        state="admitted",
                        admitted_at=now,
                        updated_at=now,
                        position=None,
                        placement=dict(admit),
                    )
                )
        return True

    @functools.cached_property
    def _locking_engine(self) -> Engine:
        """Engine whose transactions take the write lock at BEGIN on SQLite (``BEGIN IMMEDIATE``),
        so a read-check-insert cannot interleave with another writer's."""
        if not self.url.startswith("sqlite") or self.url.split("///", 1)[-1] in ("", ":memory:", "sqlite://"):
            return self.engine  # PostgreSQL locks per pair; an in-memory SQLite has one connection
        return migrate.sqlite_write_locking_engine(self.url)

    def renew_reservation_lease(self, run_id: str, lease_s: float = DEFAULT_LEASE_S, holder: str = "heartbeat") -> bool:
        """Extend the lease of the run's live reservation to ``lease_s`` from now; False when the
        run holds no live reservation (released or reclaimed: nothing to renew)."""
        lc = t.reservation_leases.c
        # One serialised transaction (SQLite BEGIN IMMEDIATE; PostgreSQL locks the reservation
        # row, as reclaim does): a reclaim can never slip between the check and the new lease.
        with self._locking_engine.begin() as c:
            if not _lock_live_reservation(c, run_id):
                return False
            claimed = c.execute(select(lc.reclaimed_at).where(lc.run_id == run_id)).scalar_one_or_none()
            if claimed is not None:  # the reconciler is stopping the run: too late to renew
                return False
            _put_lease(c, run_id, lease_s, holder)
        return True

    def reservation_leases(self) -> dict[str, dict[str, Any]]:
        """run_id → lease row (expires_at, renewed_at, holder, reclaimed_at) for every lease."""
        with self.engine.connect() as c:
            rows = c.execute(select(t.reservation_leases)).mappings()
            return {
                r["run_id"]: {k: aware(v) if isinstance(v, dt.datetime) else v for k, v in r.items()}
                for r in rows
            }

    def live_reservation_rows(self) -> list[dict[str, Any]]:
        """Live reservations with their run's team, model, request and steps (admission's view)."""
        cols, r = t.reservations.c, t.runs.c
        q = (
            select(
                cols.run_id,
                cols.region,
                cols.zone,
                cols.gpu_type,
                cols.gpus,
                cols.market,
                cols.created_at,
                r.team,
                r.model,
                r.request,
                r.steps,
                r.total_steps,
            )
            .select_from(t.reservations.outerjoin(t.runs, r.run_id == cols.run_id))
            .where(cols.released_at.is_(None))
        )
        with self.engine.connect() as c:
            return [_aware_row(row) for row in c.execute(q).mappings()]

    def team_gpu_seconds(self, since: dt.datetime, now: dt.datetime | None = None) -> dict[str, float]:
        """team → GPU-seconds its runs held reservations in [since, now] (live ones up to now,
        and the holdings a re-plan replaced): the service each team attained recently, for
        least-attained-service admission."""
        now = now or utcnow()
        cols, r, iv = t.reservations.c, t.runs.c, t.reservation_intervals.c
        q = union_all(
            select(r.team, cols.gpus, cols.created_at, cols.released_at)
            .select_from(t.reservations.join(t.runs, r.run_id == cols.run_id))
            .where((cols.released_at.is_(None)) | (cols.released_at >= since)),
            select(r.team, iv.gpus, iv.started_at, iv.ended_at)
            .select_from(t.reservation_intervals.join(t.runs, r.run_id == iv.run_id))
            .where(iv.ended_at >= since),
        )
        out: dict[str, float] = {}
        with self.engine.connect() as c:
            for team, gpus, created, released in c.execute(q):
                start = max(aware(created), since)
                end = min(aware(released) or now, now)
                if end > start:
                    out[team] = out.get(team, 0.0) + gpus * (end - start).total_seconds()
        return out

    def expired_leases(self, now: dt.datetime | None = None) -> list[Reservation]:
        """Live reservations whose lease expired before ``now`` (their holder stopped renewing)."""
        now = now or utcnow()
        cols, lc = t.reservations.c, t.reservation_leases.c
        q = (
            select(cols.run_id, cols.region, cols.zone, cols.gpu_type, cols.gpus, cols.market)
            .select_from(t.reservations.join(t.reservation_leases, lc.run_id == cols.run_id))
            .where(cols.released_at.is_(None), lc.expires_at < now)
        )
        with self.engine.connect() as c:
            return [Reservation(*r) for r in c.execute(q).all()]

    def claim_expired(self, run_id: str, now: dt.datetime | None = None) -> bool:
        """Fence the run's expired lease before its backend is stopped: in one transaction, if the
        reservation is live and its lease still expired (a renewal that just happened wins), mark
        the lease reclaimed so that no later renewal succeeds (``hold_lease`` then raises
        ``LeaseReclaimedError``); the capacity stays held until ``reclaim``. True when the lease
        is (now or already) claimed."""
        now = now or utcnow()
        lc = t.reservation_leases.c
        with self._locking_engine.begin() as c:
            if not _lock_live_reservation(c, run_id):
                return False
            c.execute(
                update(t.reservation_leases)
                .where(lc.run_id == run_id, lc.expires_at < now, lc.reclaimed_at.is_(None))
                .values(reclaimed_at=now)
            )
            claimed = c.execute(
                select(lc.run_id).where(lc.run_id == run_id, lc.reclaimed_at.is_not(None))
            ).first()
            return claimed is not None

    def reclaim(self, run_id: str, now: dt.datetime | None = None, *, fail: str | None = None) -> bool:
        """Release the run's reservation if its lease is still expired or was claimed
        (``claim_expired``), checked in the same transaction, so a renewal that just happened
        wins; True when it was reclaimed. ``fail``: the error the same transaction records the run
        ``failed`` with, unless it has ended or its latest attempt completed its training (only
        ``finalize``, which needs no capacity, is left): a plan retried right after the release
        finds the run ended and reserves nothing."""
        now = now or utcnow()
        lc = t.reservation_leases.c
        with self._locking_engine.begin() as c:
            if not _lock_live_reservation(c, run_id):
                return False
            expired = c.execute(
                select(lc.run_id).where(
                    lc.run_id == run_id, (lc.expires_at < now) | lc.reclaimed_at.is_not(None)
                )
            ).first()
            if expired is None:
                return False
            released = _release(c, run_id, now)
            c.execute(update(t.reservation_leases).where(lc.run_id == run_id).values(reclaimed_at=now))
            if released and fail is not None:
                a, r = t.run_attempts.c, t.runs.c
                last = c.execute(
                    select(a.outcome).where(a.run_id == run_id).order_by(a.attempt.desc()).limit(1)
                ).scalar()
                if last != "completed":
                    c.execute(
                        update(t.runs)
                        .where(r.run_id == run_id, r.status.in_(list(RUN_STATUSES_LIVE)))
                        .values(status="failed", error=fail, updated_at=utcnow())
                    )
            return released

    # --- the queue -------------------------------------------------------------------------------
    def enqueue(
        self,
        run_id: str,
        *,
        team: str,
        priority: str,
        gpu_type: str,
        gpus: int,
        request: Mapping[str, Any],
        policy: str,
        max_wait_until: dt.datetime,
        expected_hours: float | None = None,
        deadline_at: dt.datetime | None = None,
        latest_start_at: dt.datetime | None = None,
    ) -> dict[str, Any]:
        """Put the run in the queue; a run already queued keeps its place (a retried ``plan``).
        Returns the entry."""
        now = utcnow()
        q = t.queue_entries.c
        with self._locking_engine.begin() as c:
            state = c.execute(
                select(q.state).where(q.run_id == run_id).with_for_update()
            ).scalar_one_or_none()
            if state not in ("queued", "admitted"):
                _replace_row(
                    c,
                    t.queue_entries,
                    {"run_id": run_id},
                    team=team,
                    priority=priority,
                    gpu_type=gpu_type,
                    gpus=gpus,
                    request=dict(request),
                    state="queued",
                    policy=policy,
                    expected_hours=expected_hours,
                    deadline_at=deadline_at,
                    latest_start_at=latest_start_at,
                    max_wait_until=max_wait_until,
                    enqueued_at=now,
                    updated_at=now,
                )
        entry = self.queue_entry(run_id)
        assert entry is not None
        return entry

    def queue_entry(self, run_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            row = (
                c.execute(select(t.queue_entries).where(t.queue_entries.c.run_id == run_id))
                .mappings()
                .first()
            )
        return _aware_row(row) if row else None

    def queue_entries(self, states: Iterable[str] = ("queued",)) -> list[dict[str, Any]]:
        """Queue entries in ``states``, oldest first."""
        q = t.queue_entries.c
        query = select(t.queue_entries).where(q.state.in_(list(states))).order_by(q.enqueued_at, q.run_id)
        with self.engine.connect() as c:
            return [_aware_row(r) for r in c.execute(query).mappings()]

    def set_queue_ranking(self, rows: Iterable[tuple[str, int, str, dt.datetime | None]]) -> None:
        """(run_id, position, reason, estimated start) of queued runs, in one transaction."""
        q = t.queue_entries.c
        now = utcnow()
        with self.engine.begin() as c:
            for run_id, position, reason, estimate in rows:
                c.execute(
                    update(t.queue_entries)
                    .where(q.run_id == run_id, q.state == "queued")
                    .values(
                        position=position, reason=reason[:2000], estimated_start_at=estimate, updated_at=now
                    )
                )

    def end_queue_entry(self, run_id: str, state: str, reason: str) -> bool:
        """Take a queued run out of the queue as ``state`` (timed_out, failed, left) with ``reason``;
        False when it was not queued (admitted meanwhile, or already out)."""
        if state not in QUEUE_STATES or state in ("queued", "admitted"):
            raise ValueError(f"queue state {state!r}: valid end states are timed_out, failed, left")
        with self._locking_engine.begin() as c:
            return _end_queue_entry(c, run_id, state, reason)

    def forget_spent_queue_entry(self, run_id: str) -> bool:
        """Delete the run's queue entry once the queue is done with it (admitted, timed out, failed
        or left) and the run holds no live reservation, in one transaction: a run validated
        again (its Airflow tasks cleared) then goes through the queue afresh. False when there
        was none, it still waits, or its admission still holds capacity (nothing changed)."""
        q = t.queue_entries.c
        with self._locking_engine.begin() as c:
            state = c.execute(
                select(q.state).where(q.run_id == run_id).with_for_update()
            ).scalar_one_or_none()
            if state is None or state == "queued" or _lock_live_reservation(c, run_id):
                return False
            c.execute(delete(t.queue_entries).where(q.run_id == run_id))
        return True

    def set_queue_placement(self, run_id: str, placement: Mapping[str, Any]) -> None:
        """The admitted run's final placement (with the market decision in its explanation)."""
        with self.engine.begin() as c:
            c.execute(
                update(t.queue_entries)
                .where(t.queue_entries.c.run_id == run_id)
                .values(placement=dict(placement), updated_at=utcnow())
            )

    def release(self, run_id: str) -> bool:
        """Release a run's reservation; True when one was live."""
        with self.engine.begin() as c:
            return _release(c, run_id, utcnow())

    def held_gpus(self, exclude_run_id: str | None = None) -> dict[tuple[str, str], int]:
        """(zone, GPU type) → GPUs held by live reservations (of runs other than
        ``exclude_run_id``): the sums the reserving and releasing transactions keep
        (``schema.held``), a row per pair, less the run's own live reservation, read in one
        statement (one snapshot of both)."""
        h, cols = t.held.c, t.reservations.c
        q: Any = select(h.zone, h.gpu_type, h.gpus).where(h.gpus != 0)
        if exclude_run_id is not None:
            own = select(cols.zone, cols.gpu_type, -cols.gpus).where(
                cols.run_id == exclude_run_id, cols.released_at.is_(None)
            )
            q = union_all(q, own)
        out: dict[tuple[str, str], int] = {}
        with self.engine.connect() as c:
            for zone, gpu, n in c.execute(q):
                out[(zone, gpu)] = out.get((zone, gpu), 0) + int(n)
        return {key: n for key, n in out.items() if n > 0}

    def live_reservation(self, run_id: str) -> Reservation | None:
        """The run's live reservation, or None (one row read, not every run's)."""
        cols = t.reservations.c
        with self.engine.connect() as c:
            row = c.execute(
                select(cols.run_id, cols.region, cols.zone, cols.gpu_type, cols.gpus, cols.market).where(
                    cols.run_id == run_id, cols.released_at.is_(None)
                )
            ).first()
        return Reservation(*row) if row else None

    def live_reservations(self) -> list[Reservation]:
        cols = t.reservations.c
        with self.engine.connect() as c:
            rows = c.execute(
                select(cols.run_id, cols.region, cols.zone, cols.gpu_type, cols.gpus, cols.market).where(
                    cols.released_at.is_(None)
                )
            ).all()
        return [Reservation(*r) for r in rows]

    # --- stage timings, checkpoints, utilization, preemptions -------------------------------
    def record_stage(
        self,
        run_id: str,
        stage: str,
        started_at: dt.datetime,
        ended_at: dt.datetime,
        ok: bool,
        try_number: int = 1,
        detail: str | None = None,
    ) -> None:
        with self.engine.begin() as c:
            c.execute(
                insert(t.stage_timings).values(
                    run_id=run_id,
                    stage=stage,
                    try_number=try_number,
                    started_at=started_at,
                    ended_at=ended_at,
                    seconds=(ended_at - started_at).total_seconds(),
                    ok=ok,
                    detail=detail,
                )
            )

    def stage_timings(self, run_id: str) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            q = (
                select(t.stage_timings)
                .where(t.stage_timings.c.run_id == run_id)
                .order_by(t.stage_timings.c.id)
            )
            return [dict(r) for r in c.execute(q).mappings()]

    def record_checkpoint(self, run_id: str, step: int, uri: str) -> None:
        with self.engine.begin() as c:
            c.execute(insert(t.checkpoints).values(run_id=run_id, step=step, uri=uri, created_at=utcnow()))

    def checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        """The checkpoints recorded for the run (step, URI, time), oldest first."""
        q = select(t.checkpoints).where(t.checkpoints.c.run_id == run_id).order_by(t.checkpoints.c.id)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def record_utilization(
        self,
        run_id: str,
        team: str,
        region: str,
        gpu_type: str,
        gpus: int,
        started_at: dt.datetime,
        ended_at: dt.datetime,
    ) -> float:
        """Record what one attempt used; keyed by (run, start), so a retried task's second record
        of the same attempt replaces the first, never doubles it."""
        gpu_hours = gpus * (ended_at - started_at).total_seconds() / 3600.0
        with self.engine.begin() as c:
            _replace_row(
                c,
                t.utilization,
                {"run_id": run_id, "started_at": started_at},
                team=team,
                region=region,
                gpu_type=gpu_type,
                gpus=gpus,
                gpu_hours=gpu_hours,
                ended_at=ended_at,
            )
        return gpu_hours

    def utilization_by_team_region(
        self, since: dt.datetime | None = None
    ) -> dict[tuple[str, str, str], float]:
        """(team, region, gpu_type) → GPU-hours ended since ``since`` (all time when None)."""
        u = t.utilization.c
        q = select(u.team, u.region, u.gpu_type, func.sum(u.gpu_hours)).group_by(u.team, u.region, u.gpu_type)
        if since is not None:
            q = q.where(u.ended_at >= since)
        with self.engine.connect() as c:
            return {(team, region, gpu): float(h) for team, region, gpu, h in c.execute(q)}

    def record_preemption(
        self,
        run_id: str,
        attempt: int,
        region: str,
        zone: str,
        noticed: bool,
        step: int | None,
        steps_lost: int | None,
        recovery_s: float | None,
        at: dt.datetime | None = None,
    ) -> None:
        with self.engine.begin() as c:
            c.execute(
                insert(t.preemptions).values(
                    run_id=run_id,
                    attempt=attempt,
                    region=region,
                    zone=zone,
                    at=at or utcnow(),
                    noticed=noticed,
                    step=step,
                    steps_lost=steps_lost,
                    recovery_s=recovery_s,
                )
            )

    def preemptions(self, run_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        q = select(t.preemptions).order_by(t.preemptions.c.id.desc()).limit(limit)
        if run_id is not None:
            q = q.where(t.preemptions.c.run_id == run_id)
        with self.engine.connect() as c:
            return [_aware_row(r) for r in c.execute(q).mappings()]

    def set_preemption_recovery(self, run_id: str, attempt: int, recovery_s: float) -> None:
        """Record how long the run took to train again after its preemption in ``attempt``."""
        p = t.preemptions.c
        with self.engine.begin() as c:
            c.execute(
                update(t.preemptions)
                .where(p.run_id == run_id, p.attempt == attempt)
                .values(recovery_s=recovery_s)
            )

    # --- run attempts (one row per launch of the training process group) -----------------------
    def start_attempt(
        self,
        run_id: str,
        attempt: int,
        try_number: int,
        placement: Mapping[str, Any],
        data: Mapping[str, Any],
        started_at: dt.datetime | None = None,
    ) -> None:
        with self.engine.begin() as c:
            c.execute(
                insert(t.run_attempts).values(
                    run_id=run_id,
                    attempt=attempt,
                    try_number=try_number,
                    region=placement["region"],
                    zone=placement["zone"],
                    placement=dict(placement),
                    data=dict(data),
                    started_at=started_at or utcnow(),
                    outcome="running",
                )
            )

    def end_attempt(
        self, run_id: str, attempt: int, outcome: str, *, if_running: bool = False, **fields: Any
    ) -> bool:
        """Record how the attempt ended (at ``ended_at`` in ``fields``, else now); ``if_running``:
        only while it is still ``running`` (an outcome another process recorded meanwhile stays).
        Whether it was recorded."""
        a = t.run_attempts.c
        q = update(t.run_attempts).where(a.run_id == run_id, a.attempt == attempt)
        if if_running:
            q = q.where(a.outcome == "running")
        with self.engine.begin() as c:
            return c.execute(q.values(**{"outcome": outcome, "ended_at": utcnow(), **fields})).rowcount > 0

    def spot_observations(
        self, exclude_backends: Iterable[str] = ("local",), now: dt.datetime | None = None
    ) -> dict[tuple[str, str], tuple[int, float]]:
        """(zone, GPU type) → (preemptions, spot VM-hours) observed by attempts on spot (an attempt
        still running counts up to ``now``). Runs on ``exclude_backends`` are left out: the local
        backend's preemptions are injected by the run's own params."""
        now = now or utcnow()
        a, r, p = t.run_attempts.c, t.runs.c, t.preemptions.c
        q = (
            select(a.run_id, a.attempt, a.zone, a.placement, a.started_at, a.ended_at)
            .select_from(t.run_attempts.join(t.runs, r.run_id == a.run_id))
            .where(r.backend.not_in(list(exclude_backends)))
        )
        out: dict[tuple[str, str], list[float]] = {}
        attempt_key: dict[tuple[str, int], tuple[str, str]] = {}
        with self.engine.connect() as c:
            for run_id, attempt, zone, placement, started, ended in c.execute(q):
                pl = placement or {}
                if pl.get("market") != "spot" or not pl.get("gpu_type"):
                    continue
                key = (zone, pl["gpu_type"])
                attempt_key[(run_id, attempt)] = key
                hours = max(0.0, ((aware(ended) or now) - aware(started)).total_seconds() / 3600.0)
                out.setdefault(key, [0, 0.0])[1] += hours * int(pl.get("num_nodes") or 1)
            for run_id, attempt in c.execute(select(p.run_id, p.attempt)):
                key = attempt_key.get((run_id, attempt))
                if key is not None:
                    out[key][0] += 1
        return {k: (int(n), float(h)) for k, (n, h) in out.items()}

    def attempt_speeds(self, backend: str, limit: int = 200) -> list[dict[str, Any]]:
        """Steps/s of the newest ended attempts on ``backend`` that trained (completed or
        preempted): steps made over the attempt's wall time, launch included, with the run's
        model, command, GPU type and GPUs. What the queue's duration estimates learn from, on
        every backend (the local one included: its speed is this machine's)."""
        a, r = t.run_attempts.c, t.runs.c
        q = (
            select(a.placement, a.started_at, a.ended_at, a.step, a.resumed_from_step, r.model, r.request)
            .select_from(t.run_attempts.join(t.runs, r.run_id == a.run_id))
            .where(
                r.backend == backend,
                a.outcome.in_(("completed", "preempted")),
                a.ended_at.is_not(None),
                a.step.is_not(None),
            )
            .order_by(a.ended_at.desc())
            .limit(limit)
        )
        out = []
        with self.engine.connect() as c:
            for placement, started, ended, step, resumed, model, request in c.execute(q):
                seconds = (aware(ended) - aware(started)).total_seconds()
                steps = int(step) - int(resumed or 0)
                if seconds <= 0 or steps <= 0:
                    continue
                pl = placement or {}
                out.append(
                    {
                        "model": model,
                        "command": tuple((request or {}).get("command") or ()),
                        "gpu_type": pl.get("gpu_type"),
                        "num_gpus": pl.get("num_gpus"),
                        "steps_per_s": steps / seconds,
                    }
                )
        return out

    def running_attempts(self) -> list[dict[str, Any]]:
        """Attempts still running (no end recorded), with their run's team and dataset: in-flight
        demand for the nightly rebalance. An attempt whose utilization row is already recorded
        (its task died between recording it and ending the attempt) is counted there, not here."""
        a, r, u = t.run_attempts.c, t.runs.c, t.utilization.c
        q = (
            select(a.run_id, a.attempt, a.region, a.placement, a.started_at, r.team, r.dataset_uri)
            .select_from(
                t.run_attempts.join(t.runs, r.run_id == a.run_id).outerjoin(
                    t.utilization, (u.run_id == a.run_id) & (u.started_at == a.started_at)
                )
            )
            .where(a.outcome == "running", u.id.is_(None))
        )
        with self.engine.connect() as c:
            return [_aware_row(row) for row in c.execute(q).mappings()]

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        """The run's attempts, oldest first."""
        q = select(t.run_attempts).where(t.run_attempts.c.run_id == run_id).order_by(t.run_attempts.c.attempt)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    # --- market decision and cost per attempt --------------------------------------------------
    def record_attempt_market(
        self,
        run_id: str,
        attempt: int,
        strategy: str,
        market: str,
        reason: str,
        slack_h: float | None,
        usd_per_hour: float | None = None,
    ) -> None:
        """The market the run's strategy chose for ``attempt`` (a retried plan replaces its row)."""
        with self.engine.begin() as c:
            _replace_row(
                c,
                t.attempt_markets,
                {"run_id": run_id, "attempt": attempt},
                strategy=strategy,
                market=market,
                reason=reason,
                slack_h=slack_h,
                usd_per_hour=usd_per_hour,
                decided_at=utcnow(),
            )

    def end_attempt_market(
        self, run_id: str, attempt: int, hours: float, usd_per_hour: float, market: str, strategy: str
    ) -> None:
        """The attempt's billed hours and cost; an attempt launched without a new plan (a try that
        died) reuses the previous placement and gets a row saying so."""
        a = t.attempt_markets.c
        usd = hours * usd_per_hour
        with self.engine.begin() as c:
            done = c.execute(
                update(t.attempt_markets)
                .where(a.run_id == run_id, a.attempt == attempt)
                .values(hours=hours, usd=usd, usd_per_hour=usd_per_hour)
            )
            if done.rowcount == 0:
                c.execute(
                    insert(t.attempt_markets).values(
                        run_id=run_id,
                        attempt=attempt,
                        strategy=strategy,
                        market=market,
                        reason="relaunched on the previous attempt's placement",
                        slack_h=None,
                        usd_per_hour=usd_per_hour,
                        decided_at=utcnow(),
                        hours=hours,
                        usd=usd,
                    )
                )

    def attempt_markets(self, run_id: str) -> list[dict[str, Any]]:
        """The run's market decisions and costs, oldest attempt first."""
        q = (
            select(t.attempt_markets)
            .where(t.attempt_markets.c.run_id == run_id)
            .order_by(t.attempt_markets.c.attempt)
        )
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    # --- assignments and replicas -------------------------------------------------------------
    def publish_assignment(
        self,
        shares: Mapping[str, Mapping[str, float]],
        source: str,
        region_load: Mapping[str, float] | None = None,
        gpu_shares: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None,
    ) -> Assignment:
        """Publish a new version; idempotent: when the newest version has the same source, shares
        and loads (a retried publish of one rebalance run), that version is returned instead."""
        now = utcnow()
        plain = {team: dict(regions) for team, regions in shares.items()}
        load = dict(region_load or {})
        by_gpu = {team: {g: dict(r) for g, r in per.items()} for team, per in (gpu_shares or {}).items()}
        a = t.assignments.c
        # Serialised (SQLite BEGIN IMMEDIATE; PostgreSQL an advisory lock): overlapping publishes
        # of one rebalance run (a retried task while the old one still runs) make one version.
        with self._locking_engine.begin() as c:
            if c.dialect.name == "postgresql":
                c.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ASSIGNMENTS_LOCK_KEY})
            newest = c.execute(select(t.assignments).order_by(a.version.desc()).limit(1)).mappings().first()
            if (
                newest is not None
                and newest["source"] == source
                and newest["shares"] == plain
                and (newest["region_load"] or {}) == load
                and (newest["gpu_shares"] or {}) == by_gpu
            ):
                return _assignment(newest)
            res = c.execute(
                insert(t.assignments).values(
                    created_at=now, source=source, shares=plain, region_load=load, gpu_shares=by_gpu
                )
            )
            version = int(res.inserted_primary_key[0])
        return Assignment(
            version=version,
            shares=plain,
            region_load=load,
            created_at=now.isoformat(),
            source=source,
            gpu_shares=by_gpu,
        )

    def latest_assignment(self) -> Assignment | None:
        a = t.assignments.c
        with self.engine.connect() as c:
            row = c.execute(select(t.assignments).order_by(a.version.desc()).limit(1)).mappings().first()
        return None if row is None else _assignment(row)

    def record_replica(self, dataset_uri: str, region: str, uri: str, nbytes: int, files: int) -> None:
        with self.engine.begin() as c:
            _replace_row(
                c,
                t.replicas,
                {"dataset_uri": dataset_uri, "region": region},
                uri=uri,
                bytes=nbytes,
                files=files,
                created_at=utcnow(),
            )

    def forget_replica(self, dataset_uri: str, region: str) -> None:
        """The region's replica of the dataset is no longer complete (a copy is changing it)."""
        with self.engine.begin() as c:
            c.execute(
                delete(t.replicas).where(t.replicas.c.dataset_uri == dataset_uri, t.replicas.c.region == region)
            )

    def replicas(self, dataset_uris: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
        """dataset URI → regions holding a complete replica."""
        q = select(t.replicas.c.dataset_uri, t.replicas.c.region)
        if dataset_uris is not None:
            q = q.where(t.replicas.c.dataset_uri.in_(list(dataset_uris)))
        out: dict[str, list[str]] = {}
        with self.engine.connect() as c:
            for uri, region in c.execute(q):
                out.setdefault(uri, []).append(region)
        return {k: tuple(sorted(v)) for k, v in out.items()}

    def dataset_bytes(self, dataset_uris: Iterable[str]) -> dict[str, int]:
        """dataset URI → size in bytes of its largest recorded complete replica."""
        r = t.replicas.c
        q = select(r.dataset_uri, func.max(r.bytes)).where(r.dataset_uri.in_(list(dataset_uris)))
        with self.engine.connect() as c:
            return {uri: int(n) for uri, n in c.execute(q.group_by(r.dataset_uri))}

    # --- nightly rebalance ---------------------------------------------------------------------
    def utilization_rows(self, since: dt.datetime, until: dt.datetime | None = None) -> list[dict[str, Any]]:
        """Utilization rows overlapping [since, until) with the run's dataset (for the rebalance)."""
        u = t.utilization.c
        q = (
            select(
                u.run_id, u.team, u.region, u.gpu_type, u.gpus, u.started_at, u.ended_at, t.runs.c.dataset_uri
            )
            .select_from(t.utilization.outerjoin(t.runs, t.runs.c.run_id == u.run_id))
            .where(u.ended_at > since)
        )
        if until is not None:
            q = q.where(u.started_at < until)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def unrecorded_attempt_rows(self, since: dt.datetime, until: dt.datetime) -> list[dict[str, Any]]:
        """Utilization-shaped rows for ended attempts overlapping [since, until) that have no
        utilization row (their task died before ``finish_attempt`` recorded one: ended later as
        failed by a retry or by teardown, or cancelled): their GPUs were held all the same."""
        a, r, u = t.run_attempts.c, t.runs.c, t.utilization.c
        q = (
            select(a.run_id, a.region, a.placement, a.started_at, a.ended_at, r.team, r.dataset_uri)
            .select_from(
                t.run_attempts.join(t.runs, r.run_id == a.run_id).outerjoin(
                    t.utilization, (u.run_id == a.run_id) & (u.started_at == a.started_at)
                )
            )
            .where(a.outcome != "running", a.ended_at.is_not(None), u.id.is_(None))
            .where(a.ended_at > since, a.started_at < until)
        )
        out = []
        with self.engine.connect() as c:
            for row in c.execute(q).mappings():
                pl = row["placement"] or {}
                if not pl.get("gpu_type") or not pl.get("num_gpus"):
                    continue
                out.append(
                    {
                        "run_id": row["run_id"],
                        "team": row["team"],
                        "region": row["region"],
                        "gpu_type": pl["gpu_type"],
                        "gpus": int(pl["num_gpus"]),
                        "started_at": row["started_at"],
                        "ended_at": row["ended_at"],
                        "dataset_uri": row["dataset_uri"],
                    }
                )
        return out

    def replica_rows(self) -> list[dict[str, Any]]:
        """Every recorded replica: dataset_uri, region, uri, bytes, files."""
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(select(t.replicas)).mappings()]

    def record_rebalance(self, run_id: str, **fields: Any) -> int:
        """One row per rebalance run (see ``schema.rebalance_nights``; a retried report replaces
        the run's row); returns its id."""
        with self.engine.begin() as c:
            c.execute(delete(t.rebalance_nights).where(t.rebalance_nights.c.run_id == run_id))
            res = c.execute(insert(t.rebalance_nights).values(run_id=run_id, created_at=utcnow(), **fields))
            return int(res.inserted_primary_key[0])

    def rebalance_nights(self, limit: int = 30) -> list[dict[str, Any]]:
        """Newest first; ``report_uri`` of the first row is the newest rebalance chart (PNG)."""
        q = select(t.rebalance_nights).order_by(t.rebalance_nights.c.id.desc()).limit(limit)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    # --- measured speeds -------------------------------------------------------------------
    def measured_throughputs(
        self, exclude_backends: Iterable[str] = ("local",)
    ) -> list[tuple[str, str, float]]:
        """(model, GPU type, steps/s) of successful runs of a built-in model on one VM: their steps
        over their recorded training time, every attempt's (one row per attempt: a run preempted k
        times trained its steps in k + 1 attempts, not in each of them). Left out: a run whose
        attempts ran on several GPU types (its steps cannot be split between them); a run of its
        own ``command`` (its steps are not the model's, which it still names); a run of another
        ``batch_size`` than ``DEFAULT_BATCH_SIZE`` (a step of more sequences takes longer: not the
        speed the table's entry stands for); a run with an
        attempt on several VMs (the table's entry is one VM's speed, and placement slows a spread
        run by the spread penalty itself); runs on ``exclude_backends`` (the local backend trains
        on this machine's CPU whatever GPU type the placement named, so its speed says nothing
        about that GPU).
        """
        r, u, a = t.runs.c, t.utilization.c, t.run_attempts.c
        q = (
            select(r.run_id, r.model, r.request, u.gpu_type, r.steps, u.started_at, u.ended_at)
            .join(t.utilization, u.run_id == r.run_id)
            .where(r.status == "success", r.steps > 0, r.backend.not_in(list(exclude_backends)))
            .order_by(u.ended_at)
        )
        runs: dict[str, dict[str, Any]] = {}  # in the order of their first attempt's end
        with self.engine.connect() as c:
            for run_id, model, request, gpu, steps, started, ended in c.execute(q):
                if (request or {}).get("command") or (request or {}).get(
                    "batch_size", DEFAULT_BATCH_SIZE
                ) != DEFAULT_BATCH_SIZE:
                    continue
                run = runs.setdefault(run_id, {"model": model, "steps": steps, "gpus": set(), "s": 0.0})
                run["gpus"].add(gpu)
                run["s"] += max((ended - started).total_seconds(), 0.0)
            spread = set()
            if runs:
                placed = select(a.run_id, a.placement).where(a.run_id.in_(list(runs)))
                spread = {
                    run_id for run_id, pl in c.execute(placed) if int((pl or {}).get("num_nodes") or 1) > 1
                }
        return [
            (run["model"], next(iter(run["gpus"])), run["steps"] / run["s"])
            for run_id, run in runs.items()
            if len(run["gpus"]) == 1 and run["s"] > 0 and run_id not in spread
        ]

    # --- leases ----------------------------------------------------------------------------
    def try_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take (or renew, for the same holder) the lease ``name`` for ``ttl_s`` seconds unless
        another holder's lease on it is unexpired; True when ``holder`` now holds it. One
        transaction, serialised like ``reserve_if_free`` (SQLite ``BEGIN IMMEDIATE``, PostgreSQL
        an advisory lock on the name)."""
        cols = t.leases.c
        with self._locking_engine.begin() as c:
            if self._locking_engine.dialect.name == "postgresql":
                import zlib

                c.execute(
                    text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(name.encode()) - (1 << 31)}
                )
            now = time.time()  # once the lock is held: a wait for it must not shorten the lease
            row = c.execute(select(cols.holder, cols.expires_at).where(cols.name == name)).first()
            if row is not None and row.holder != holder and row.expires_at > now:
                return False
            _replace_row(c, t.leases, {"name": name}, holder=holder, acquired_at=now, expires_at=now + ttl_s)
        return True

    def renew_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Extend ``holder``'s lease by ``ttl_s`` from now; False when it no longer holds it."""
        cols = t.leases.c
        with self.engine.begin() as c:
            res = c.execute(
                update(t.leases)
                .where(cols.name == name, cols.holder == holder, cols.expires_at > time.time())
                .values(expires_at=time.time() + ttl_s)
            )
            return res.rowcount == 1

    def release_lease(self, name: str, holder: str) -> bool:
        """Drop ``holder``'s lease; True when it held one."""
        with self.engine.begin() as c:
            res = c.execute(delete(t.leases).where(t.leases.c.name == name, t.leases.c.holder == holder))
            return res.rowcount == 1

    def lease_holder(self, name: str) -> str | None:
        """Who holds the unexpired lease ``name``, or None."""
        cols = t.leases.c
        with self.engine.connect() as c:
            return c.execute(
                select(cols.holder).where(cols.name == name, cols.expires_at > time.time())
            ).scalar_one_or_none()

    def live_leases(self) -> list[dict[str, Any]]:
        """Every unexpired lease (name, holder, acquired_at, expires_at)."""
        with self.engine.connect() as c:
            rows = c.execute(select(t.leases).where(t.leases.c.expires_at > time.time()))
            return [dict(r._mapping) for r in rows]

    def lease(self, name: str, **options: Any) -> Lease:
        """A ``Lease`` on ``name`` (a context manager: taken on entry, renewed, released on exit);
        ``options`` as ``Lease`` (ttl_s, wait_s, poll_s)."""
        return Lease(self, name, **options)

    def dispose(self) -> None:
        self.engine.dispose()
        if "_locking_engine" in self.__dict__:
            self._locking_engine.dispose()
