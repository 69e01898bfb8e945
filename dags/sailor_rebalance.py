"""
### sailor_rebalance — nightly region assignment and data replication (MAST slow path)

`collect_utilization → solve_assignment → publish_assignment → replicate_data[] → report`

Reads each team's GPU demand per region and GPU type from the ledger over a window (and the
datasets it reads), solves region shares and new dataset replicas with HiGHS (worst regional
overload first, then soft balance, then bytes moved; data locality, byte budget, storage caps and
quotas as hard constraints), publishes a new assignment version (asset `sailor_assignment`) that
every `sailor_train` run's `plan` reads (and `sailor_assignment_review` reviews), copies the
planned replicas (mapped tasks, each a batch of copies, at most 256; the same checksummed copier
as `place_data`; each copy an event of the asset alias `sailor_datasets`) and writes a chart + summary under
`sailor://source/reports/rebalance/<run>/`. `dry_run` computes and reports, publishes and copies
nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, get_current_context, task

from sailor_tasks.airflow_glue import lineage
from sailor_tasks.airflow_glue.lineage import ASSIGNMENT as ASSIGNMENT_ASSET
from sailor_tasks.request import FINITE


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
            **FINITE,  # NaN, which the REST API parses, passes every bound
            exclusiveMinimum=0,
            maximum=365,
            title="Window (days)",
            description="Utilization window read from the ledger, ending at the run's time.",
        ),
        "byte_budget_gb": Param(
            500.0,
            type="number",
            **FINITE,
            minimum=0,
            title="Replication budget (GB)",
            description="Bytes the nightly replication may copy (new dataset replicas), in GB.",
        ),
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            description="Solve and report only: publish no assignment and copy no data.",
        ),
        "quotas": Param(
            {},
            type="object",
            additionalProperties={
                "type": "object",
                "properties": {
                    kind: {
                        "type": "object",
                        "additionalProperties": {"type": "number", "minimum": 0, **FINITE},
                    }
                    for kind in ("max", "min")
                },
                "additionalProperties": False,
            },
            title="Hard quotas",
            description='team → {"max": {region: GPUs}, "min": {region: GPUs}}; "*" in max caps every other region.',
        ),
        "storage_cap_gb": Param(
            {},
            type="object",
            additionalProperties={"type": "number", "minimum": 0, **FINITE},
            title="Storage caps (GB)",
            description="region → GB its dataset replicas may hold in all (new copies included); empty: no cap.",
        ),
        "team_priority": Param(
            {},
            type="object",
            additionalProperties={"type": "number", "exclusiveMinimum": 0, **FINITE},
            title="Team priorities",
            description="team → weight of moving its GPUs (default 1): a higher weight moves a team last.",
        ),
        "comfort_ratio": Param(
            0.9,
            type="number",
            **FINITE,
            minimum=0,
            maximum=2,
            title="Comfort ratio",
            description="Demand/supply below this counts as balanced: nothing is moved or copied to go lower (0: pure min-max).",
        ),
        "time_limit_s": Param(
            50.0,
            type="number",
            **FINITE,
            minimum=1,
            maximum=3600,
            title="Solver time limit (s)",
            description="Time budget of the HiGHS solves (the whole decomposition).",
        ),
    },
)
def sailor_rebalance():
    @task
    def collect_utilization() -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        ctx = get_current_context()
        p = ctx["params"]
        return run_stage(
            stages.collect_utilization,
            float(p["window_days"]),
            as_of=ctx["dag_run"].run_after.isoformat(),
            budget_gb=float(p["byte_budget_gb"]),
            quotas=p["quotas"],
            storage_cap_gb=p["storage_cap_gb"],
            team_priority=p["team_priority"],
        )

    @task
    def solve_assignment(utilization: dict) -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        p = get_current_context()["params"]
        return run_stage(
            stages.solve_assignment,
            utilization,
            time_limit_s=float(p["time_limit_s"]),
            comfort_ratio=float(p["comfort_ratio"]),
        )

    @task(outlets=[ASSIGNMENT_ASSET])
    def publish_assignment(solution: dict) -> list:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        ctx = get_current_context()
        source = f"sailor_rebalance/{ctx['run_id']}"
        published = run_stage(
            stages.publish_assignment, solution, source=source, dry_run=bool(ctx["params"]["dry_run"])
        )
        ctx["outlet_events"][ASSIGNMENT_ASSET].extra["version"] = published["version"]
        return published["batches"]  # one mapped replicate_data task per batch of copies

    @task(max_active_tis_per_dag=4, outlets=[lineage.DATASETS])
    def replicate_data(copies: list) -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        ctx = get_current_context()
        ti = ctx["ti"]
        # Every copy of the batch is tried; failures fail the try (a retry makes what is missing)
        # except on the last, which hands them to report.
        result = run_stage(
            stages.replicate_datasets, copies, final=ti.try_number > ti.max_tries, run_id=ctx["run_id"]
        )
        for replica in result["done"]:
            lineage.emit_replica(ctx["outlet_events"], replica, ctx["run_id"])
        return result

    @task(trigger_rule="none_failed")
    def report(utilization: dict, solution: dict, replicated: list | None) -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        ctx = get_current_context()
        return run_stage(
            stages.report_rebalance,
            utilization,
            solution,
            list(replicated or ()),
            run_id=ctx["run_id"],
            dry_run=bool(ctx["params"]["dry_run"]),
        )

    utilization = collect_utilization()
    solution = solve_assignment(utilization)
    published = publish_assignment(solution)
    copies = replicate_data.expand(copies=published)
    report(utilization, solution, copies)


sailor_rebalance()
