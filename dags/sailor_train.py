"""
### sailor_train — one SAILOR training run

Trigger with params (the form groups them by section). Stages, each a task calling one function of
`sailor_tasks.stages` through `run_stage`:

`validate → plan → place_data → provision → train → finalize`, and `teardown` (runs once `validate`
succeeded, whatever happened after: takes the run out of the queue, removes the cluster first,
then releases the reservation, each retried).

- **validate**: params → a frozen `JobRequest`; bad values fail here, nothing is reserved or copied.
- **plan** (`SailorPlanOperator`): the run's market `strategy` (default `sailor`: spot while the
  deadline's slack covers the expected preemption loss, else on-demand) picks the market; the
  planner picks region / zone / GPU type from the catalog and reserves the capacity (a lease,
  renewed by the run's stages and its training heartbeat). When nothing fits now the run waits in
  SAILOR's queue: the task *defers* (no worker slot held) until the queue policy admits it, at most
  `max_queue_hours` (`priority`, `deadline_hours` and the policy order the queue; `sailor queue`).
- **place_data**: copies the dataset into the region's bucket (checksummed manifest written last);
  the copy is an asset event of the alias `sailor_datasets`.
- **provision** (`SailorProvisionOperator`): creates the cluster (local: a record + torchrun; gke:
  the region's cluster and a GPU node pool of the placement, *deferring* while GKE's operations run).
- **train** (`SailorTrainOperator`): `python -m sailor_tasks.train` under torchrun; resumes from
  the newest checkpoint. Local: on a spot preemption the try fails with `PreemptedError` and is
  retried with exponential backoff; the retry asks the run's `strategy` (or its `recovery_strategy`
  override) where to go and on which market, re-plans / places data / provisions through the same
  stage code, moves the checkpoint if the region changed, and resumes (each attempt a try). GKE: the
  task starts the pods and *defers* (the triggerer watches them, no worker slot is held); a
  preempted attempt recovers the same way and defers again within the try. Every attempt is a row
  of the ledger's `run_attempts`, `attempt_markets` (market, why, slack left, cost) and `preemptions`.
- **finalize**: records the result and writes the run summary (markdown) next to the checkpoints;
  the summary is also in its log and in its XCom (`summary_md`). The final checkpoint is an asset
  event of the alias `sailor_checkpoints`; its extra `trained_on` names the dataset copy's asset.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, get_current_context, task

from sailor_tasks.airflow_glue import lineage
from sailor_tasks.airflow_glue.operators import (
    SailorPlanOperator,
    SailorProvisionOperator,
    SailorTrainOperator,
)
from sailor_tasks.request import train_param_schemas
from sailor_tasks.settings import STAGE_RETRIES

TRAIN_RECOVERY_ATTEMPTS = 5
"""Retries of ``train``: each is one recovery from a preemption (Airflow's exponential backoff from
1 s: 1-2 s, 2-4 s, 4-8 s, ..., at most 10 min)."""


MAX_ACTIVE_RUNS = 10_000
"""Runs of this DAG Airflow lets be active at once: far above any queue, so that SAILOR's queue
decides who waits. A run waiting there is an active DAG run (its ``plan`` is deferred): with a
lower cap Airflow would hold new runs back before they reach ``plan``, out of ``sailor queue``,
with their priority, latest start and ``max_queue_hours`` not counted yet."""


def _param(spec: dict) -> Param:
    spec = dict(spec)
    return Param(spec.pop("default"), description=spec.pop("description"), **spec)


@dag(
    dag_id=Path(__file__).stem,
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=MAX_ACTIVE_RUNS,
    tags=["sailor", "training"],
    default_args={
        "retries": STAGE_RETRIES,
        "retry_delay": timedelta(seconds=5),
        "retry_exponential_backoff": True,
        "owner": "sailor",
    },
    params={name: _param(spec) for name, spec in train_param_schemas().items()},
)
def sailor_train():
    @task  # a bad request fails at once (AirflowFailException); a ledger or storage blip retries
    def validate() -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        ctx = get_current_context()
        return run_stage(stages.validate, dict(ctx["params"]), ctx["run_id"])

    @task(outlets=[lineage.DATASETS])
    def place_data(request: dict, placement: dict) -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        ctx = get_current_context()
        data = run_stage(stages.place_data, request, placement, ctx["run_id"])
        lineage.emit_dataset(ctx["outlet_events"], request, data, ctx["run_id"])
        return data

    @task(outlets=[lineage.CHECKPOINTS])
    def finalize(request: dict, placement: dict, data: dict, result: dict) -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        ctx = get_current_context()
        summary = run_stage(stages.finalize, request, placement, data, result, ctx["run_id"])
        lineage.emit_checkpoint(ctx["outlet_events"], request, summary, ctx["run_id"])
        return summary

    @task(task_id="teardown")
    def release_capacity() -> dict:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.stage import run_stage

        context = get_current_context()  # the run's params name its backend even when the ledger is down
        return run_stage(stages.teardown, context["run_id"], backend=context["params"].get("backend"))

    request = validate()
    plan = SailorPlanOperator(task_id="plan", request=request)
    placement = plan.output
    data = place_data(request, placement)
    cluster = SailorProvisionOperator(task_id="provision", request=request, placement=placement).output
    train = SailorTrainOperator(
        task_id="train",
        request=request,
        placement=placement,
        data=data,
        retries=TRAIN_RECOVERY_ATTEMPTS,
        retry_delay=timedelta(seconds=1),
        retry_exponential_backoff=True,
        max_retry_delay=timedelta(minutes=10),
    )
    result = train.output
    data >> cluster >> result
    done = finalize(request, placement, data, result)
    # validate is a setup too: plan may end failed (cancelled while deferred in the queue, its
    # trigger failing) after it queued or reserved the run, and a teardown runs only when one of
    # its setups succeeded; teardown (idempotent) must still take the run out of the queue.
    done >> release_capacity().as_teardown(setups=[request.operator, plan])


sailor_train()
