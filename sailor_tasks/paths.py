"""Every folder and file name SAILOR lays out in a region bucket, in one place.

A run lives in ``sailor://<region>/runs/<run_key>/`` of the region it trains in::

    train_config.json   the TrainConfig every worker of the current attempt reads
    launch.json         the backend's report of the attempt (first step, preemption, exit)
    result.json         the trainer's result (completed or preempted, step, losses)
    checkpoints/        step-NNNNNNNN/ folders, each committed by its marker
    cancelled.json      written when the run's training was stopped on purpose (local backend)
    summary.md          the run summary ``finalize`` writes

A dataset's replica lives in ``sailor://<region>/datasets/<name>-<hash>/``; each nightly rebalance
writes its report under ``sailor://source/reports/rebalance/<run_key>/``. Helpers taking a
``run_uri`` work on any concrete URI of that folder (``file://``, ``gs://``).
"""

from __future__ import annotations

import hashlib

from sailor_tasks import storage
from sailor_tasks.model import run_key
from sailor_tasks.settings import SOURCE_BUCKET, Settings

TRAIN_CONFIG = "train_config.json"
LAUNCH_REPORT = "launch.json"
RESULT = "result.json"
CHECKPOINTS = "checkpoints"
SUMMARY = "summary.md"
RUNS = "runs"
"""Folder of every run's folder in a region bucket; never readable as a dataset or trace."""
CANCELLED = "cancelled.json"
REBALANCE_REPORTS = f"sailor://{SOURCE_BUCKET}/reports/rebalance"
"""Where each rebalance run stores its chart, summary and solution (``<root>/<run_key>/``)."""


def run_folder(region: str, run_id: str) -> str:
    """The run's folder in ``region``'s bucket as a ``sailor://`` URI."""
    return f"sailor://{region}/{RUNS}/{run_key(run_id)}"


def run_uri(region: str, run_id: str, settings: Settings) -> str:
    """Concrete URI of the run's folder in ``region``'s bucket."""
    return storage.resolve(run_folder(region, run_id), settings)


def train_config_uri(run_uri: str) -> str:
    return storage.join(run_uri, TRAIN_CONFIG)


def launch_report_uri(run_uri: str) -> str:
    return storage.join(run_uri, LAUNCH_REPORT)


def result_uri(run_uri: str) -> str:
    return storage.join(run_uri, RESULT)


def checkpoint_uri(run_uri: str) -> str:
    return storage.join(run_uri, CHECKPOINTS)


def cancelled_uri(run_uri: str) -> str:
    return storage.join(run_uri, CANCELLED)


def summary_uri(run_uri: str) -> str:
    return storage.join(run_uri, SUMMARY)


def replica_path(dataset_uri: str) -> str:
    """Path of a dataset's replica inside a region bucket: stable, collision-free, readable."""
    digest = hashlib.sha256(dataset_uri.encode()).hexdigest()[:12]
    name = dataset_uri.rstrip("/").rsplit("/", 1)[-1]
    return f"datasets/{name}-{digest}"


def replica_uri(region: str, dataset_uri: str, settings: Settings) -> str:
    """Concrete URI of the dataset's replica in ``region``'s bucket."""
    return storage.resolve(f"sailor://{region}/{replica_path(dataset_uri)}", settings)


def rebalance_report_uri(run_id: str, settings: Settings) -> str:
    """Concrete URI of one rebalance run's report folder."""
    return storage.resolve(f"{REBALANCE_REPORTS}/{run_key(run_id)}", settings)
