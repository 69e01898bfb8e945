"""SAILOR: geo-distributed ML training on spot GPUs, orchestrated by Apache Airflow.

The package is the library the DAGs call, laid out as the pipeline (``docs/architecture.md``):
``stages`` (what each task does) over the core (catalog, placement, strategies, policies,
rebalance, data, ledger, backends, train, simulator). Only ``airflow_glue`` imports Airflow.
"""

__version__ = "0.1.0"
