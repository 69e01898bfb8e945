"""
### sailor_assignment_review — what a new region assignment means for the capacity held now

Scheduled on the asset `sailor_assignment`: runs each time `sailor_rebalance` publishes a new
assignment version (a dry run publishes none). One task, `review`, reads the newest assignment and
the live reservations from the ledger and reports the runs holding GPUs in a region their team's
new shares leave out (they keep running; `plan` follows the new shares at their next placement,
e.g. a recovery), and the regions the assignment projects over capacity. The report is in the
task's log and XCom.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import dag, get_current_context, task

from sailor_tasks.airflow_glue.lineage import ASSIGNMENT


@dag(
    dag_id=Path(__file__).stem,
    doc_md=__doc__,
    schedule=[ASSIGNMENT],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["sailor", "rebalance"],
    default_args={
        "retries": 2,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": True,
        "owner": "sailor",
    },
)
def sailor_assignment_review():
    @task
    def review() -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        events = get_current_context().get("triggering_asset_events") or {}
        versions = [e.extra.get("version") for evs in events.values() for e in evs if e.extra.get("version")]
        return run_stage(stages.review_assignment, max(versions) if versions else None)

    review()


sailor_assignment_review()
