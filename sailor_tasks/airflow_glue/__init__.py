"""The only modules of ``sailor_tasks`` that import Airflow: ``run_stage`` (every DAG task's entry),
``SailorTrainOperator`` (the ``train`` task) and the Google Cloud glue (connection credentials,
GKE training pods through the Google provider)."""
