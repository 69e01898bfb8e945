"""
### sailor_rebalance — nightly region assignment (MAST slow path)

`collect_utilization → solve_assignment → publish_assignment → report`

Reads the GPU-hours each team used per region from the ledger over a window, computes team →
region shares against regional supply, and publishes them as a new assignment version that every
`sailor_train` run's `plan` reads. Runs nightly; trigger it by hand with another window.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, get_current_context, task


@dag(
    dag_id=Path(__file__).stem,
    doc_md=__doc__,
    schedule="0 3 * * *",
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
    params={
        "window_days": Param(
            7.0,
            type="number",
            exclusiveMinimum=0,
            maximum=365,
            title="Window (days)",
            description="Utilization window read from the ledger, ending at the run's time.",
        ),
    },
)
def sailor_rebalance():
    @task
    def collect_utilization() -> dict:
        from sailor_tasks import stages

        ctx = get_current_context()
        as_of = ctx["dag_run"].run_after.isoformat()
        return stages.collect_utilization(float(ctx["params"]["window_days"]), as_of=as_of)

    @task
    def solve_assignment(utilization: dict) -> dict:
        from sailor_tasks import stages

        return stages.solve_assignment(utilization)

    @task
    def publish_assignment(solution: dict) -> dict:
        from sailor_tasks import stages

        return stages.publish_assignment(
            solution, source=f"sailor_rebalance/{get_current_context()['run_id']}"
        )

    @task
    def report(utilization: dict, solution: dict, published: dict) -> dict:
        from sailor_tasks import stages

        return stages.report_rebalance(utilization, solution, published)

    @task
    def allocate_gpu_types(utilization: dict) -> dict:
        from sailor_tasks import stages

        return stages.allocate_gpu_types(
            utilization, source=f"sailor_rebalance/{get_current_context()['run_id']}"
        )

    utilization = collect_utilization()
    allocate_gpu_types(utilization)
    solution = solve_assignment(utilization)
    report(utilization, solution, publish_assignment(solution))


sailor_rebalance()
