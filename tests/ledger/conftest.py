from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    """A private PostgreSQL server for the module's tests (``create_database`` gives each a URL)."""
    from sailor_tasks.testing.airflow_stack import Postgres

    pg = Postgres(tmp_path_factory.mktemp("pg"))
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()
