"""SAILOR: geo-distributed ML training on spot GPUs, orchestrated by Apache Airflow.

The package is the library the DAGs call. Its core (catalog, placement, rebalance, training, data,
ledger) never imports Airflow, so it runs and tests without it; Airflow glue lives in
``sailor_tasks.operators`` and in ``dags/``.
"""

__version__ = "0.1.0"
