"""Baseline: the ledger's tables and indexes.

Every table and index is created only where it is missing, so a ledger made by ``create_all``
before the ledger had migrations keeps its tables and rows and is stamped at this revision.

Revision ID: 8b9b5a07fc78
Revises: (none)
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "8b9b5a07fc78"
down_revision = None
branch_labels = None
depends_on = None

TABLES = (
    "placements",
    "utilization",
    "stage_timings",
    "runs",
    "run_attempts",
    "reservations",
    "replicas",
    "rebalance_nights",
    "preemptions",
    "gpu_allocations",
    "checkpoints",
    "attempt_markets",
    "assignments",
)
"""Every table of the baseline, dependents first (the order ``downgrade`` drops them in)."""


def upgrade() -> None:
    op.create_table(
        "assignments",
        sa.Column("version", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("shares", sa.JSON(), nullable=False),
        sa.Column("region_load", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("version"),
        if_not_exists=True,
    )
    op.create_table(
        "attempt_markets",
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("strategy", sa.String(length=40), nullable=False),
        sa.Column("market", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("slack_h", sa.Float(), nullable=True),
        sa.Column("usd_per_hour", sa.Float(), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hours", sa.Float(), nullable=True),
        sa.Column("usd", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "attempt"),
        if_not_exists=True,
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        if_not_exists=True,
    )
    op.create_index("ix_checkpoints_run_id", "checkpoints", ["run_id"], unique=False, if_not_exists=True)
    op.create_table(
        "gpu_allocations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("region", sa.String(length=50), nullable=False),
        sa.Column("policy", sa.String(length=50), nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("shares", sa.JSON(), nullable=False),
        sa.Column("steps_per_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        if_not_exists=True,
    )
    op.create_index(
        "ix_gpu_allocations_region",
        "gpu_allocations",
        ["region", "version"],
        unique=False,
        if_not_exists=True,
    )
    op.create_index(
        "ix_gpu_allocations_version", "gpu_allocations", ["version"], unique=False, if_not_exists=True
    )
    op.create_table(
        "preemptions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(length=50), nullable=False),
        sa.Column("zone", sa.String(length=50), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("noticed", sa.Boolean(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("steps_lost", sa.Integer(), nullable=True),
        sa.Column("recovery_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        if_not_exists=True,
    )
    op.create_index("ix_preemptions_run_id", "preemptions", ["run_id"], unique=False, if_not_exists=True)
    op.create_table(
        "rebalance_nights",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("assignment_version", sa.Integer(), nullable=True),
        sa.Column("window_days", sa.Float(), nullable=False),
        sa.Column("solver_status", sa.String(length=40), nullable=False),
        sa.Column("max_ratio_before", sa.Float(), nullable=False),
        sa.Column("max_ratio_after", sa.Float(), nullable=False),
        sa.Column("lower_bound", sa.Float(), nullable=False),
        sa.Column("allocation_rate_before", sa.Float(), nullable=False),
        sa.Column("allocation_rate_after", sa.Float(), nullable=False),
        sa.Column("region_ratio_before", sa.JSON(), nullable=False),
        sa.Column("region_ratio_after", sa.JSON(), nullable=False),
        sa.Column("bytes_planned", sa.BigInteger(), nullable=False),
        sa.Column("bytes_replicated", sa.BigInteger(), nullable=False),
        sa.Column("report_uri", sa.Text(), nullable=True),
        sa.Column("summary_uri", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        if_not_exists=True,
    )
    op.create_index(
        "ix_rebalance_nights_run_id", "rebalance_nights", ["run_id"], unique=False, if_not_exists=True
    )
    op.create_table(
        "replicas",
        sa.Column("dataset_uri", sa.String(length=500), nullable=False),
        sa.Column("region", sa.String(length=50), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("dataset_uri", "region"),
        if_not_exists=True,
    )
    op.create_table(
        "reservations",
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("region", sa.String(length=50), nullable=False),
        sa.Column("zone", sa.String(length=50), nullable=False),
        sa.Column("gpu_type", sa.String(length=30), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("market", sa.String(length=20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("run_id"),
        if_not_exists=True,
    )
    op.create_index(
        "ix_reservations_live",
        "reservations",
        ["released_at", "zone", "gpu_type"],
        unique=False,
        if_not_exists=True,
    )
    op.create_table(
        "run_attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("try_number", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(length=50), nullable=False),
        sa.Column("zone", sa.String(length=50), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=True),
        sa.Column("resumed_from_step", sa.Integer(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        if_not_exists=True,
    )
    op.create_index("ix_run_attempts_run_id", "run_attempts", ["run_id"], unique=False, if_not_exists=True)
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("job_name", sa.String(length=200), nullable=False),
        sa.Column("team", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("backend", sa.String(length=20), nullable=False),
        sa.Column("model", sa.String(length=50), nullable=False),
        sa.Column("dataset_uri", sa.Text(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("region", sa.String(length=50), nullable=True),
        sa.Column("zone", sa.String(length=50), nullable=True),
        sa.Column("gpu_type", sa.String(length=30), nullable=True),
        sa.Column("market", sa.String(length=20), nullable=True),
        sa.Column("num_gpus", sa.Integer(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=True),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("initial_loss", sa.Float(), nullable=True),
        sa.Column("final_loss", sa.Float(), nullable=True),
        sa.Column("checkpoint_uri", sa.Text(), nullable=True),
        sa.Column("usd_per_hour", sa.Float(), nullable=True),
        sa.Column("usd_estimate", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id"),
        if_not_exists=True,
    )
    op.create_table(
        "stage_timings",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("stage", sa.String(length=50), nullable=False),
        sa.Column("try_number", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        if_not_exists=True,
    )
    op.create_index("ix_stage_timings_run_id", "stage_timings", ["run_id"], unique=False, if_not_exists=True)
    op.create_table(
        "utilization",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("team", sa.String(length=100), nullable=False),
        sa.Column("region", sa.String(length=50), nullable=False),
        sa.Column("gpu_type", sa.String(length=30), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        if_not_exists=True,
    )
    op.create_index("ix_utilization_run_id", "utilization", ["run_id"], unique=False, if_not_exists=True)
    op.create_index(
        "ix_utilization_window", "utilization", ["ended_at", "team"], unique=False, if_not_exists=True
    )
    op.create_table(
        "placements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(length=50), nullable=False),
        sa.Column("zone", sa.String(length=50), nullable=False),
        sa.Column("gpu_type", sa.String(length=30), nullable=False),
        sa.Column("market", sa.String(length=20), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("usd_per_hour", sa.Float(), nullable=False),
        sa.Column("assignment_version", sa.Integer(), nullable=True),
        sa.Column("explanation", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
        sa.PrimaryKeyConstraint("id"),
        if_not_exists=True,
    )
    op.create_index("ix_placements_run_id", "placements", ["run_id"], unique=False, if_not_exists=True)


def downgrade() -> None:
    for table in TABLES:
        op.drop_table(table)
