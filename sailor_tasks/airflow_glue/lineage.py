"""Lineage as Airflow Assets: the dataset copies ``place_data`` puts in place and the checkpoints a
run commits, so Airflow shows which data a checkpoint was trained on; the region assignment the
nightly rebalance publishes.

Their URIs are known only when a run has been placed (``file://`` folders on the local backend,
``gs://`` on GKE), so the tasks declare an ``AssetAlias`` and add the concrete asset at run time
through ``outlet_events`` (Airflow: "Dynamic data events emitting and asset creation through
AssetAlias"). Each event's ``extra`` says what it is; a checkpoint's names the dataset copy it was
trained on (``trained_on``, the URI of that copy's asset) and the source dataset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Asset, AssetAlias

ASSIGNMENT = Asset(name="sailor_assignment")
"""A new region assignment published by ``sailor_rebalance`` (extra: its ``version``); named, not
a URI: a custom scheme makes Airflow load every provider at parse time. ``sailor_assignment_review``
is scheduled on it."""
DATASETS = AssetAlias(name="sailor_datasets")
"""Every dataset copy ``place_data`` placed or the nightly rebalance replicated (one asset per
region and dataset)."""
CHECKPOINTS = AssetAlias(name="sailor_checkpoints")
"""Every final checkpoint a ``sailor_train`` run committed."""


def emit_dataset(
    outlet_events: Any, request: Mapping[str, Any], data: Mapping[str, Any], run_id: str
) -> Asset:
    """Add the dataset copy ``place_data`` returned (``data``) to ``DATASETS``."""
    asset = Asset(uri=data["data_uri"])
    outlet_events[DATASETS].add(
        asset,
        extra={
            "kind": "dataset",
            "dataset_uri": request["dataset_uri"],
            "run_id": run_id,
            "bytes": data["bytes"],
            "files": data["files"],
            "bytes_copied": data["bytes_copied"],
        },
    )
    return asset


def emit_replica(outlet_events: Any, replica: Mapping[str, Any], run_id: str) -> Asset:
    """Add a dataset copy the nightly rebalance made (``replicate_dataset``'s result) to ``DATASETS``."""
    asset = Asset(uri=replica["uri"])
    outlet_events[DATASETS].add(
        asset,
        extra={
            "kind": "dataset",
            "dataset_uri": replica["dataset_uri"],
            "run_id": run_id,
            "region": replica["region"],
            "bytes": replica["bytes"],
            "bytes_copied": replica["bytes_copied"],
        },
    )
    return asset


def emit_checkpoint(
    outlet_events: Any, request: Mapping[str, Any], summary: Mapping[str, Any], run_id: str
) -> Asset | None:
    """Add the run's committed checkpoint (``finalize``'s ``summary``) to ``CHECKPOINTS``, naming
    the dataset copy it was trained on; None, and no event, for a run that committed none (a
    user's command that saves no checkpoint)."""
    if not summary.get("checkpoint_uri"):
        return None
    asset = Asset(uri=summary["checkpoint_uri"])
    outlet_events[CHECKPOINTS].add(
        asset,
        extra={
            "kind": "checkpoint",
            "run_id": run_id,
            "job_name": summary["job_name"],
            "team": summary["team"],
            "model": request.get("model"),
            "steps": summary["steps"],
            "final_loss": summary["final_loss"],
            "trained_on": summary["data_uri"],
            "dataset_uri": request["dataset_uri"],
            "region": summary["region"],
        },
    )
    return asset
