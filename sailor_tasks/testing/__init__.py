"""Test and benchmark infrastructure: real Airflow services on PostgreSQL, a local GCS API server,
and every ``sailor_train`` stage run inline in one process. Not used by the product itself."""
