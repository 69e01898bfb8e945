"""Saving a step that is already committed and valid keeps that checkpoint: writing it anew would
first delete it, and a failure then (a full disk, the hard kill of the notice window) would leave
the run an older checkpoint. Both documented routes to it: a notice save of the step an async save
just committed, and a save of the step a run resumed from by ``latest_step`` and ``load``."""

from __future__ import annotations

import pytest
import torch

from sailor_tasks.errors import StaleAttemptError
from sailor_tasks.runtime import Run, contract
from sailor_tasks.train.checkpoint import dcp as dcp_mod
from sailor_tasks.train.checkpoint.dcp import CheckpointManager


@pytest.fixture
def environ(tmp_path):
    return {
        contract.RUN_ID: "run-1",
        contract.ATTEMPT: "1",
        contract.DATA_DIR: f"file://{tmp_path}/data",
        contract.CHECKPOINT_DIR: f"file://{tmp_path}/ckpt",
        contract.TOTAL_STEPS: "30",
        contract.SEED: "4",
        contract.NOTICE_FILE: str(tmp_path / "notice.json"),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }


@pytest.fixture
def writes(monkeypatch):
    """Every data file write from now on fails, as on a full disk; the list counts the tries."""
    tried = []

    def failing(self, *a, **k):
        tried.append(1)
        raise OSError(28, "No space left on device")

    return lambda: (monkeypatch.setattr(dcp_mod.ChecksummingFsspecWriter, "_write_file", failing), tried)[1]


def test_a_notice_save_of_the_step_an_async_save_committed_keeps_it(environ, writes):
    run = Run.from_env(environ, handle_sigterm=False)
    run.save(10, {"w": torch.arange(3.0), "step": 10})
    run.checkpoints.save_async(20, {"w": torch.arange(3.0) + 1, "step": 20})
    run.checkpoints.wait()
    tried = writes()
    info = run.save(20, {"w": torch.arange(3.0) + 1, "step": 20})  # the notice's save
    assert info.step == 20 and info.bytes > 0 and tried == []
    assert run.checkpoints.latest_valid_step() == 20


def test_a_save_of_the_step_resumed_by_latest_step_and_load_keeps_it(environ, writes):
    run = Run.from_env(environ, handle_sigterm=False)
    run.save(10, {"w": torch.arange(3.0), "step": 10})
    run.close()
    again = Run.from_env({**environ, contract.ATTEMPT: "2"}, handle_sigterm=False)
    step = again.latest_step()
    state = {"w": torch.zeros(3), "step": 0}
    again.checkpoints.load(step, state)
    tried = writes()
    assert again.save(step, state).step == 10 and tried == []
    assert again.checkpoints.latest_valid_step() == 10


def test_a_torn_checkpoint_of_the_step_is_written_anew_and_a_stale_attempt_still_refused(tmp_path):
    root = f"file://{tmp_path}/ckpt"
    mgr = CheckpointManager(root, attempt=1)
    mgr.save(10, {"w": torch.arange(4.0)})
    data = next(p for p in (tmp_path / "ckpt").rglob("*.distcp"))
    data.write_bytes(b"torn")  # fails its crc32c: not a checkpoint to keep
    info = mgr.save(10, {"w": torch.arange(4.0)})
    assert info.seconds > 0 and mgr.verify(10)
    newer = CheckpointManager(root, attempt=2)
    newer.claim(2)
    with pytest.raises(StaleAttemptError):
        mgr.save(10, {"w": torch.arange(4.0)})
