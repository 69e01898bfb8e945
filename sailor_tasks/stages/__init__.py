"""What the DAGs call, one function per task, in pipeline order. Airflow is not imported here, so
the same stages run from the CLI, tests and benchmarks.

``sailor_train``:     validate → plan → place_data → provision (``prepare``) → train (``train``, one
                      attempt per call: ``attempts``) → finalize; teardown (always)
``sailor_rebalance``: collect_utilization → solve_assignment → publish_assignment →
                      replicate_datasets[] → report_rebalance
``sailor_reconcile``:  reconcile (reclaim expired leases, then admit_queued)
``dashboard``:        the read-only snapshot the SAILOR page of the Airflow UI renders
"""

from sailor_tasks.stages.context import StageContext
from sailor_tasks.stages.prepare import place_data, plan, provision, provision_step, validate
from sailor_tasks.stages.queueing import admit_queued, reconcile
from sailor_tasks.stages.rebalance import (
    collect_utilization,
    publish_assignment,
    replicate_dataset,
    replicate_datasets,
    report_rebalance,
    review_assignment,
    solve_assignment,
)
from sailor_tasks.stages.train import (
    completed_train,
    finalize,
    finish_train,
    launch_train,
    stop_reclaimed,
    stop_training,
    stop_unstartable,
    teardown,
    train,
)

__all__ = [
    "StageContext",
    "admit_queued",
    "collect_utilization",
    "finalize",
    "finish_train",
    "completed_train",
    "launch_train",
    "place_data",
    "plan",
    "provision",
    "provision_step",
    "reconcile",
    "publish_assignment",
    "replicate_dataset",
    "replicate_datasets",
    "report_rebalance",
    "review_assignment",
    "solve_assignment",
    "stop_reclaimed",
    "stop_unstartable",
    "stop_training",
    "teardown",
    "train",
    "validate",
]
