"""One real Airflow deployment for every e2e test: PostgreSQL, api-server, scheduler, dag-processor,
triggerer, started as processes at the session's start and stopped by PID at its end.

A failing e2e test gets the tail of every service log and task log attached to its report.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from sailor_tasks.testing.airflow_stack import AirflowStack

ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "job_name": "e2e-lm",
    "team": "qa",
    "model": "tiny_gpt",
    "num_workers": 2,
    "total_steps": 40,
    "checkpoint_every_steps": 20,
    "batch_size": 8,
}
"""Small enough to train in seconds on two CPU processes; the same stages as a real run."""

RUN_TIMEOUT_S = 900.0


@pytest.fixture(scope="session")
def stack():
    # Under /tmp with a short name: PostgreSQL's socket path must stay below 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="sailor-e2e-", dir="/tmp"))
    s = AirflowStack(root, ROOT)
    try:
        s.start()
        _seed_demo_dataset(s)
        client = s.client()
        client.unpause("sailor_train")  # sailor_rebalance stays paused but for its own test
    except BaseException:
        print(s.dump_logs())
        s.stop()
        raise
    yield s
    s.stop()
    if not os.environ.get("SAILOR_E2E_KEEP"):  # set it to keep logs and state for a post-mortem
        shutil.rmtree(root, ignore_errors=True)


def _seed_demo_dataset(s: AirflowStack) -> None:
    from sailor_tasks import storage
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset

    write_demo_dataset(storage.resolve(DEMO_DATASET, s.settings()), num_shards=2, shard_bytes=64_000)


@pytest.fixture(scope="session")
def client(stack):
    return stack.client()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    s = item.funcargs.get("stack") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(s, AirflowStack):
        report.sections.append(("Airflow service and task logs", s.dump_logs()))
    return report
