"""The ``sailor`` command (``main``), one module per command group, and the Airflow REST API client."""
