"""
### sailor_reconcile — leases, not leaks

Every 5 minutes: `reconcile` finds live reservations whose lease expired (the run's task was killed
or its worker lost, so nothing renewed it), stops and removes what the run left on its backend,
releases the capacity, marks the run failed, and runs an admission pass for SAILOR's queue (so the
waiting runs move on). A run that still renews its lease is never touched. It starts unpaused.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import dag, task


@dag(
    dag_id=Path(__file__).stem,
    doc_md=__doc__,
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,  # the safety net runs from the start, whatever the default
    tags=["sailor", "queue"],
    default_args={
        "retries": 2,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": True,
        "owner": "sailor",
    },
)
def sailor_reconcile():
    @task
    def reconcile() -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        return run_stage(stages.reconcile)

    reconcile()


sailor_reconcile()
