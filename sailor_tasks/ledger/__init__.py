"""The ledger: SQL record of runs, placements, reservations, stages, checkpoints, utilization,
preemptions, region assignments and dataset replicas (SQLAlchemy; SQLite or PostgreSQL)."""

from sailor_tasks.ledger.store import Ledger

__all__ = ["Ledger"]
