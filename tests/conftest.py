"""Shared fixtures. Airflow's environment is set before anything imports Airflow, with the same
values the Makefile exports, so `pytest` works alone as well as under `make test`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SAILOR_SHARED_DATA") or ROOT.parent / "shared" / "data")
"""The reference data folder (``../shared/data`` next to the checkout; ``SAILOR_SHARED_DATA`` when
the checkout lives elsewhere, e.g. in a worktree)."""

os.environ.setdefault("AIRFLOW_HOME", str(ROOT / ".airflow"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(ROOT / "plugins"))
os.environ.setdefault("AIRFLOW__CORE__PARALLELISM", "4")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _root_log_handlers():
    """The root logger's handlers as before each test: ``sailor`` commands call
    ``logging.basicConfig``, whose handler would keep writing to the stream a test's ``capsys``
    had put in ``sys.stderr``, closed after that test ("--- Logging error ---" in later tests)."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def write_packaged_offers(path: Path, rows: Callable[[list[dict[str, str]]], list[dict[str, str]]]) -> Path:
    """A catalog file at ``path`` holding ``rows(the packaged offers' CSV rows)``."""
    import csv

    import sailor_tasks.catalog

    packaged = Path(sailor_tasks.catalog.__file__).parent / "data" / "gcp_gpu_offers.csv"
    offers = list(csv.DictReader(ln for ln in packaged.read_text().splitlines() if not ln.startswith("#")))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(offers[0]))
        writer.writeheader()
        writer.writerows(rows(offers))
    return path


@pytest.fixture
def one_gpu_vms(tmp_path, monkeypatch):
    """The packaged catalog with its 1-GPU VMs only (``SAILOR_CATALOG_FILE``): a run of N workers
    takes N VMs, a multi-node torchrun. (Given bigger VMs the planner takes fewer: workers spread
    over VMs train slower.)"""
    from sailor_tasks.catalog import load_catalog

    path = write_packaged_offers(
        tmp_path / "one-gpu-offers.csv", lambda rows: [r for r in rows if r["gpus_per_node"] == "1"]
    )
    monkeypatch.setenv("SAILOR_CATALOG_FILE", str(path))
    load_catalog.cache_clear()
    yield path
    load_catalog.cache_clear()


@pytest.fixture
def settings(tmp_path, monkeypatch):
    """Settings rooted at a fresh state folder; exported so stages and subprocesses see it too."""
    from sailor_tasks.settings import Settings

    state = tmp_path / "state"
    monkeypatch.setenv("SAILOR_STATE_DIR", str(state))
    monkeypatch.delenv("SAILOR_LEDGER_URL", raising=False)
    monkeypatch.delenv("SAILOR_BUCKET_TEMPLATE", raising=False)
    return Settings.from_env()


@pytest.fixture
def ctx(settings):
    from sailor_tasks.stages import StageContext

    return StageContext(settings)


@pytest.fixture
def demo_dataset(settings):
    """A small sealed demo corpus in the source bucket; returns its sailor:// URI."""
    from sailor_tasks import storage
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset

    write_demo_dataset(storage.resolve(DEMO_DATASET, settings), num_shards=2, shard_bytes=64_000)
    return DEMO_DATASET


@pytest.fixture
def shared_data():
    """../shared/data when present; tests that need it skip cleanly without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference data folder {SHARED_DATA} is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def gcs_server():
    """One GCS API server for the session (see sailor_tasks/gcs_emulator.py); yields its URL."""
    from sailor_tasks.testing.gcs_emulator import gcs_emulator

    with gcs_emulator() as url:
        yield url


@pytest.fixture
def gcs(gcs_server, monkeypatch):
    """gcsfs pointed at the emulator; yields a function making a fresh, empty bucket (its gs:// URI)."""
    import uuid

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    from sailor_tasks.storage import filesystem

    made: list[str] = []

    def make_bucket(name: str | None = None) -> str:
        name = name or f"t-{uuid.uuid4().hex[:12]}"
        fs, _ = filesystem(f"gs://{name}")
        fs.mkdir(name)
        made.append(name)
        return f"gs://{name}"

    yield make_bucket
    fs, _ = filesystem("gs://x")
    fs.invalidate_cache()


@pytest.fixture
def airflow_task_state(monkeypatch):
    """Set the state Airflow's API gives a task (``RuntimeTaskInstance.get_task_states``, which
    ``SailorTrainOperator.on_kill`` asks to tell a user's stop from Airflow's)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    def set_state(state: str) -> None:
        monkeypatch.setattr(
            RuntimeTaskInstance,
            "get_task_states",
            staticmethod(
                lambda dag_id, task_ids, run_ids: {r: dict.fromkeys(task_ids, state) for r in run_ids}
            ),
        )

    return set_state
