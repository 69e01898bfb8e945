"""The local backend really preempts torchrun: a trace-driven notice reaches the workers, which
checkpoint and stop; a second launch resumes from that checkpoint."""

from __future__ import annotations

import json

import pytest

from sailor_tasks import storage
from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.backends.local import LocalBackend
from sailor_tasks.errors import PREEMPTED_EXIT_CODE
from sailor_tasks.model import Placement
from sailor_tasks.train.checkpoint.store import CheckpointManager
from sailor_tasks.train.config import TrainConfig

pytestmark = pytest.mark.slow


def test_trace_notice_checkpoints_then_the_next_launch_resumes(settings, tmp_path, demo_dataset):
    from sailor_tasks.data.copier import copy_dataset

    data_uri = f"file://{tmp_path}/data"
    copy_dataset(storage.resolve(demo_dataset, settings), data_uri)
    out = f"file://{tmp_path}/run"
    config = TrainConfig(
        run_id="r",
        model="tiny_gpt",
        data_uri=data_uri,
        output_uri=out,
        total_steps=100_000,  # far more than fits before the trace's first loss of capacity
        checkpoint_every_steps=100_000,
        batch_size=2,
    )
    config_uri = storage.join(out, "train_config.json")
    storage.write_bytes(config_uri, config.to_json().encode())
    trace = tmp_path / "trace.json"
    # 20 s available (torchrun starts well within it), then one preemption 20 s after the first launch.
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 20}, "data": [0, 1]}))
    placement = Placement("r", "gcp", "us-x1", "us-x1-a", "L4", 1, 1, 1, "spot", "g2", 0.3)
    backend = LocalBackend(settings)
    inject = {"trace_uri": str(trace), "notice_s": 20.0}

    rc = backend.train(TrainLaunch("r", "r", config_uri, 2, placement, inject, attempt=1))
    assert rc == PREEMPTED_EXIT_CODE
    report = storage.read_json(storage.join(out, "launch.json"))
    assert report["preemption"]["noticed"] and report["preemption"]["key"] == "trace@20s"
    result = storage.read_json(config.result_uri)
    assert result["status"] == "preempted" and result["step"] > 0
    saved = CheckpointManager(config.checkpoint_uri).latest_valid_step()
    assert saved == result["step"]  # the notice was used: nothing lost

    # The trace event fired once; a second launch (after it) is not preempted again by it, and
    # resumes from the saved step. Stop it quickly with a step-based kill.
    inject2 = {**inject, "kill_steps": [saved + 5]}
    rc2 = backend.train(TrainLaunch("r", "r", config_uri, 2, placement, inject2, attempt=2))
    report2 = storage.read_json(storage.join(out, "launch.json"))
    assert rc2 == PREEMPTED_EXIT_CODE and report2["preemption"]["key"] == f"kill@step{saved + 5}"
    assert report2["resumed_from"] == saved and report2["first_step_at"] is not None
    assert backend.teardown("r") is False  # no cluster record; progress/injection files removed
