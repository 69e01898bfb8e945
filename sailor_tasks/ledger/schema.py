"""Ledger tables (SQLAlchemy Core). Times are timezone-aware UTC datetimes.

These are the models; the database gets them through the alembic revisions in ``migrations/``. A
change here needs a revision (``sailor db revision -m "..."``; docs/ledger.md), or
tests/ledger/test_migrations.py fails."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(250), primary_key=True),
    Column("job_name", String(200), nullable=False),
    Column("team", String(100), nullable=False),
    Column("status", String(20), nullable=False),  # validated | planned | ... | running | success | failed | cancelled
    Column("backend", String(20), nullable=False),
    Column("model", String(50), nullable=False),
    Column("dataset_uri", Text, nullable=False),
    Column("request", JSON, nullable=False),
    Column("region", String(50)),
    Column("zone", String(50)),
    Column("gpu_type", String(30)),
    Column("market", String(20)),
    Column("num_gpus", Integer),
    Column("steps", Integer),
    Column("total_steps", Integer),
    Column("initial_loss", Float),
    Column("final_loss", Float),
    Column("checkpoint_uri", Text),
    Column("usd_per_hour", Float),
    Column("usd_estimate", Float),
    Column("error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

placements = Table(
    "placements",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), ForeignKey("runs.run_id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("region", String(50), nullable=False),
    Column("zone", String(50), nullable=False),
    Column("gpu_type", String(30), nullable=False),
    Column("market", String(20), nullable=False),
    Column("num_gpus", Integer, nullable=False),
    Column("usd_per_hour", Float, nullable=False),
    Column("assignment_version", Integer),
    Column("explanation", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

reservations = Table(
    "reservations",
    metadata,
    Column("run_id", String(250), primary_key=True),
    Column("region", String(50), nullable=False),
    Column("zone", String(50), nullable=False),
    Column("gpu_type", String(30), nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("market", String(20), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("released_at", DateTime(timezone=True)),
    Index("ix_reservations_live", "released_at", "zone", "gpu_type"),
)

held = Table(
    # GPUs the live reservations hold per (zone, GPU type), kept by the transactions that reserve
    # and release (``store._add_held``): a planner's snapshot reads these sums, a row per pair,
    # rather than summing every live reservation.
    "held",
    metadata,
    Column("zone", String(50), primary_key=True),
    Column("gpu_type", String(30), primary_key=True),
    Column("gpus", Integer, nullable=False),
)

reservation_intervals = Table(
    # The ended holdings of a run's reservation: a reservation replaced (a re-plan) or reserved
    # again after its release keeps its run_id row, so the interval it held before is kept here
    # (a team's attained service counts both).
    "reservation_intervals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), nullable=False, index=True),
    Column("zone", String(50), nullable=False),
    Column("gpu_type", String(30), nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("market", String(20), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=False, index=True),
)

stage_timings = Table(
    "stage_timings",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), nullable=False, index=True),
    Column("stage", String(50), nullable=False),
    Column("try_number", Integer, nullable=False, default=1),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=False),
    Column("seconds", Float, nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("detail", Text),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), nullable=False, index=True),
    Column("step", Integer, nullable=False),
    Column("uri", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

utilization = Table(
    "utilization",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), nullable=False, index=True),
    Column("team", String(100), nullable=False),
    Column("region", String(50), nullable=False),
    Column("gpu_type", String(30), nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("gpu_hours", Float, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=False),
    Index("ix_utilization_window", "ended_at", "team"),
)

preemptions = Table(
    "preemptions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("region", String(50), nullable=False),
    Column("zone", String(50), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("noticed", Boolean, nullable=False),
    Column("step", Integer),
    Column("steps_lost", Integer),
    Column("recovery_s", Float),
)

assignments = Table(
    "assignments",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("source", Text, nullable=False),
    Column("shares", JSON, nullable=False),
    Column("region_load", JSON, nullable=False, default=dict),
    Column("gpu_shares", JSON, nullable=True),
)

replicas = Table(
    "replicas",
    metadata,
    Column("dataset_uri", Text, primary_key=True),  # as long as a request's dataset_uri may be
    Column("region", String(50), primary_key=True),
    Column("uri", Text, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("files", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

rebalance_nights = Table(
    "rebalance_nights",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), nullable=False, index=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("dry_run", Boolean, nullable=False),
    Column("assignment_version", Integer),  # None on a dry run
    Column("window_days", Float, nullable=False),
    Column("solver_status", String(40), nullable=False),
    Column("max_ratio_before", Float, nullable=False),
    Column("max_ratio_after", Float, nullable=False),
    Column("lower_bound", Float, nullable=False),
    Column("allocation_rate_before", Float, nullable=False),  # realised, from the window's utilization
    Column("allocation_rate_after", Float, nullable=False),  # projected under the new assignment
    Column("region_ratio_before", JSON, nullable=False),  # region → realised demand/supply
    Column("region_ratio_after", JSON, nullable=False),  # region → projected demand/supply
    Column("bytes_planned", BigInteger, nullable=False),
    Column("bytes_replicated", BigInteger, nullable=False),
    Column("report_uri", Text),  # PNG chart (demand/supply per region before and after)
    Column("summary_uri", Text),  # markdown summary
)

run_attempts = Table(
    "run_attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("try_number", Integer, nullable=False),
    Column("region", String(50), nullable=False),
    Column("zone", String(50), nullable=False),
    Column("placement", JSON, nullable=False),
    Column("data", JSON, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True)),
    Column("outcome", String(20)),  # running | completed | preempted | failed | cancelled
    Column("resumed_from_step", Integer),
    Column("step", Integer),
    Column("detail", Text),
)

attempt_markets = Table(
    # One row per attempt of a run: the market its strategy chose, why, the slack left, the cost.
    "attempt_markets",
    metadata,
    Column("run_id", String(250), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("strategy", String(40), nullable=False),
    Column("market", String(20), nullable=False),
    Column("reason", Text, nullable=False),
    Column("slack_h", Float),  # hours to spare if the run went on-demand at the decision (None: no deadline)
    Column("usd_per_hour", Float),
    Column("decided_at", DateTime(timezone=True), nullable=False),
    Column("hours", Float),  # billed hours of the attempt (set when it ends)
    Column("usd", Float),  # usd_per_hour x hours
)

gpu_allocations = Table(
    # Written by nothing: live admission (stages.queueing) runs the policies over the queue at every
    # pass. Kept so that the rows of ledgers that had it stay readable (revisions never drop rows).
    "gpu_allocations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("version", Integer, nullable=False, index=True),  # one version per region per publish
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("source", Text, nullable=False),
    Column("region", String(50), nullable=False),
    Column("policy", String(50), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("shares", JSON, nullable=False),  # GPU type → fraction of time (Gavel's X row)
    Column("steps_per_s", Float, nullable=False),  # effective throughput under the shares
    Index("ix_gpu_allocations_region", "region", "version"),
)

queue_entries = Table(
    # One row per run that waited for capacity (SAILOR's queue): its state, the policy's ranking
    # and the placement its admission reserved. A table of its own so existing ledgers gain it.
    "queue_entries",
    metadata,
    Column("run_id", String(250), primary_key=True),
    Column("team", String(100), nullable=False),
    Column("priority", String(10), nullable=False),  # low | normal | high
    Column("gpu_type", String(30), nullable=False),  # the requested type or "any"
    Column("gpus", Integer, nullable=False),
    Column("request", JSON, nullable=False),
    Column("state", String(20), nullable=False),  # queued | admitted | timed_out | failed | left
    Column("policy", String(40), nullable=False),
    Column("position", Integer),  # 1 = next to be admitted; None once out of the queue
    Column("reason", Text),  # the policy's reason for the position, or why it is blocked
    Column("expected_hours", Float),  # training + data copy + launch, for estimates and deadlines
    Column("estimated_start_at", DateTime(timezone=True)),
    Column("deadline_at", DateTime(timezone=True)),
    Column("latest_start_at", DateTime(timezone=True)),  # Cameo: deadline - expected hours
    Column("max_wait_until", DateTime(timezone=True), nullable=False),
    Column("enqueued_at", DateTime(timezone=True), nullable=False),
    Column("admitted_at", DateTime(timezone=True)),
    Column("placement", JSON),  # the admitted placement (what plan returns)
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_queue_entries_state", "state", "enqueued_at"),
)

reservation_leases = Table(
    # A reservation's lease: renewed by the run's stages and its training heartbeat; a live
    # reservation whose lease expired is reclaimed by the reconciler.
    "reservation_leases",
    metadata,
    Column("run_id", String(250), primary_key=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("renewed_at", DateTime(timezone=True), nullable=False),
    Column("holder", String(100), nullable=False),  # what renewed it last (stage or heartbeat)
    Column("reclaimed_at", DateTime(timezone=True)),
)

leases = Table(
    # Named, expiring locks (e.g. one copy at a time into a dataset replica): a holder renews its
    # lease while it works; a holder killed with kill -9 stops renewing and the lease expires.
    "leases",
    metadata,
    Column("name", Text, primary_key=True),  # "replica:" and a replica's URI, of any length
    Column("holder", String(200), nullable=False),
    Column("acquired_at", Float, nullable=False),  # epoch seconds
    Column("expires_at", Float, nullable=False),  # epoch seconds
)
