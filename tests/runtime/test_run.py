"""``Run.from_env()`` in one process: the contract's variables, the notice, and checkpoints that carry
SAILOR's marker (the multi-rank path runs in tests/examples)."""

from __future__ import annotations

import os
import re
import signal

import pytest
import torch

from sailor_tasks.runtime import Run, contract
from sailor_tasks.train.checkpoint.store import MARKER


@pytest.fixture
def environ(tmp_path):
    return {
        contract.RUN_ID: "run-1",
        contract.ATTEMPT: "2",
        contract.DATA_DIR: f"file://{tmp_path}/data",
        contract.CHECKPOINT_DIR: f"file://{tmp_path}/ckpt",
        contract.TOTAL_STEPS: "30",
        contract.SEED: "4",
        contract.NOTICE_FILE: str(tmp_path / "notice.json"),
        contract.PROGRESS_FILE: str(tmp_path / "progress.json"),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }


def test_missing_contract_variables_are_named(environ):
    del environ[contract.CHECKPOINT_DIR], environ[contract.SEED]
    with pytest.raises(ValueError, match="SAILOR_CHECKPOINT_DIR, SAILOR_SEED unset"):
        Run.from_env(environ, handle_sigterm=False)


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        (contract.ATTEMPT, "2x", "SAILOR_ATTEMPT='2x': need an integer >= 1"),
        (contract.ATTEMPT, "0", "SAILOR_ATTEMPT='0': need an integer >= 1"),
        (contract.TOTAL_STEPS, "-5", "SAILOR_TOTAL_STEPS='-5': need an integer >= 1"),
        (contract.SEED, "-1", "SAILOR_SEED='-1': need an integer >= 0"),
        ("WORLD_SIZE", "0", "WORLD_SIZE='0': need an integer >= 1"),
        ("RANK", "1", "RANK=1, WORLD_SIZE=1: need RANK < WORLD_SIZE"),
    ],
)
def test_a_malformed_contract_variable_is_named_with_its_value(environ, name, value, said):
    environ[name] = value
    with pytest.raises(ValueError, match=re.escape(said)):
        Run.from_env(environ, handle_sigterm=False)


def test_run_reads_the_contract(environ, tmp_path):
    run = Run.from_env(environ, handle_sigterm=False)
    assert (run.run_id, run.attempt, run.total_steps, run.seed) == ("run-1", 2, 30, 4)
    assert run.checkpoint_dir == f"file://{tmp_path}/ckpt" and (run.rank, run.world_size) == (0, 1)


def test_the_device_follows_the_machine_and_the_nodes_worker_count(environ, monkeypatch):
    from sailor_tasks.train import device

    seen = []

    def detect(local_rank, local_world_size):
        seen.append((local_rank, local_world_size))
        return device.CPU_PLAN

    monkeypatch.setattr(device, "detect_device_plan", detect)
    run = Run.from_env({**environ, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, handle_sigterm=False)
    assert run.device_plan is device.CPU_PLAN and run.device == torch.device("cpu")
    assert seen == [(1, 2)]  # asked once, with torchrun's local rank and node size
    x = torch.ones(3)
    assert run.to_device(x) is x
    with run.autocast():
        assert not torch.is_autocast_enabled("cpu")
    # one worker: no process group to join, the device to train on
    assert run.world_size == 1 and run.init_distributed() == torch.device("cpu")
    assert not torch.distributed.is_initialized()


def test_notice_file_makes_should_save_true_and_gives_the_deadline(environ):
    run = Run.from_env(environ, handle_sigterm=False)
    assert not run.should_save() and run.notice_deadline is None
    written = contract.write_notice(environ[contract.NOTICE_FILE], 30.0)
    assert run.should_save() and run.notice_deadline == written.deadline


def test_sigterm_makes_should_save_true(environ):
    previous = signal.getsignal(signal.SIGTERM)
    try:
        run = Run.from_env(environ)
        assert not run.should_save()
        os.kill(os.getpid(), signal.SIGTERM)
        assert run.noticed and run.should_save()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_saves_carry_the_marker_and_resume_skips_a_damaged_newest(environ, tmp_path):
    run = Run.from_env(environ, handle_sigterm=False)
    assert run.load_latest({"w": torch.zeros(3), "step": 0}) is None
    run.save(5, {"w": torch.arange(3.0), "step": 5})
    run.save(10, {"w": torch.arange(3.0) * 2, "step": 10})
    assert (tmp_path / "ckpt" / "step-00000010" / MARKER).exists()
    newest = tmp_path / "ckpt" / "step-00000010"
    data = sorted(p for p in newest.iterdir() if p.suffix == ".distcp")[0]
    data.write_bytes(b"\0" * data.stat().st_size)  # corrupted at rest

    again = Run.from_env(environ, handle_sigterm=False)
    state = {"w": torch.zeros(3), "step": 0}
    assert again.load_latest(state) == 5
    assert torch.equal(state["w"], torch.arange(3.0)) and state["step"] == 5
    run.close()
    again.close()


def test_saving_the_step_it_resumed_from_keeps_that_checkpoint_as_it_is(environ, tmp_path, monkeypatch):
    """A save on the notice right after resuming names the step already committed: it is kept as
    it is (rewriting it would delete it first, and a failing save would then lose it)."""
    run = Run.from_env(environ, handle_sigterm=False)
    run.save(10, {"w": torch.arange(3.0), "step": 10})
    run.close()
    again = Run.from_env(environ, handle_sigterm=False)
    state = {"w": torch.zeros(3), "step": 0}
    assert again.load_latest(state) == 10

    def failing(*args, **kwargs):
        raise OSError(27, "File too large")

    monkeypatch.setattr(again.checkpoints, "save", failing)  # any write now fails
    info = again.save(10, state)
    assert info.step == 10 and info.bytes > 0 and info.uri.endswith("step-00000010")
    assert again.checkpoints.latest_valid_step() == 10
    with pytest.raises(OSError, match="too large"):
        again.save(11, state)  # a new step is written (and here fails) as before
    assert again.checkpoints.latest_valid_step() == 10
    again.close()


def test_a_fenced_out_attempt_saves_nothing_not_even_the_step_it_resumed_from(environ, tmp_path):
    """A stale worker of attempt 2 (attempt 3 claimed the root) that saves its resumed step is
    refused as a save of any other step is, rather than told it saved."""
    from sailor_tasks.train.checkpoint.store import CheckpointStore, StaleAttemptError

    run = Run.from_env(environ, handle_sigterm=False)
    run.save(10, {"w": torch.arange(3.0), "step": 10})
    CheckpointStore(environ[contract.CHECKPOINT_DIR]).claim(3)  # the next attempt took over
    with pytest.raises(StaleAttemptError):
        run.save(10, {"w": torch.arange(3.0), "step": 10})
    with pytest.raises(StaleAttemptError):
        run.save(11, {"w": torch.arange(3.0), "step": 11})
    run.close()


def test_resuming_reports_the_step_reached_before_any_new_step(environ, tmp_path):
    """A preemption between the resume and the first new step must find the resumed step in the
    progress file (it found none, and the attempt was recorded at step 0)."""
    import json

    run = Run.from_env(environ, handle_sigterm=False)
    run.save(6, {"w": torch.arange(3.0), "step": 6})
    run.close()
    os.remove(environ[contract.PROGRESS_FILE])
    again = Run.from_env(environ, handle_sigterm=False)
    assert again.load_latest({"w": torch.zeros(3), "step": 0}) == 6
    with open(environ[contract.PROGRESS_FILE]) as f:
        progress = json.load(f)
    assert progress["step"] == 6 and progress["resumed_from"] == 6
    again.close()


def test_a_save_after_a_failed_async_save_still_saves_its_step(environ, monkeypatch):
    """The async save of step 20 fails (a full disk, for a moment): the notice's save of step 25
    is still written, not refused with the async save's error."""
    from sailor_tasks.train.checkpoint import dcp as dcp_mod

    run = Run.from_env(environ, handle_sigterm=False)
    run.save(10, {"w": torch.arange(3.0), "step": 10})
    real, failed = dcp_mod.ChecksummingFsspecWriter._write_file, []

    def failing_once(self, *a, **k):
        if not failed:
            failed.append(1)
            raise OSError(28, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(dcp_mod.ChecksummingFsspecWriter, "_write_file", failing_once)
    run.checkpoints.save_async(20, {"w": torch.arange(3.0) + 1, "step": 20})
    info = run.save(25, {"w": torch.arange(3.0) + 2, "step": 25})
    assert failed and info.step == 25 and run.checkpoints.latest_valid_step() == 25
    run.close()


def test_several_workers_without_a_process_group_cannot_resume_and_are_told_why(environ):
    run = Run.from_env({**environ, "WORLD_SIZE": "2"}, handle_sigterm=False)
    with pytest.raises(RuntimeError, match=r"2 workers and no process group: call run.init_distributed\(\)"):
        run.load_latest({"w": torch.zeros(3)})


def test_checkpoints_are_refused_without_a_group_and_rebuilt_once_one_exists(environ, tmp_path):
    """A manager built before the user's own ``init_process_group`` would save as a single
    process on every rank (every rank writing rank 0's files into one folder)."""
    import socket

    import torch.distributed as dist

    run = Run.from_env({**environ, "WORLD_SIZE": "2"}, handle_sigterm=False)
    with pytest.raises(RuntimeError, match="2 workers and no process group"):
        run.checkpoints  # noqa: B018 - the property is what refuses
    run = Run.from_env(environ, handle_sigterm=False)
    assert run.checkpoints.keep_latest_k >= 1 and not run.checkpoints.distributed
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        assert run.checkpoints.distributed
        info = run.save(3, {"w": torch.ones(4)})
        assert info.step == 3 and run.latest_step() == 3
    finally:
        run.close()  # leaves the group too
        if dist.is_initialized():
            dist.destroy_process_group()
