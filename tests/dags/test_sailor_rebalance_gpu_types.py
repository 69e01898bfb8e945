"""The nightly rebalance also publishes per-run GPU-type shares (heterogeneity-aware policy)."""

from __future__ import annotations

from pathlib import Path


def test_allocate_gpu_types_runs_after_collect_utilization():
    from airflow.dag_processing.dagbag import DagBag

    dags = Path(__file__).resolve().parents[2] / "dags"
    dag = DagBag(dag_folder=str(dags / "sailor_rebalance.py")).get_dag("sailor_rebalance")
    task = dag.get_task("allocate_gpu_types")
    assert task.upstream_task_ids == {"collect_utilization"}
    assert task.downstream_task_ids == set()
