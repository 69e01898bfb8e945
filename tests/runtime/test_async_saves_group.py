"""``Run.checkpoints.save_async`` with several workers: the background save's collectives run on a
group of their own, so they never pair up with another rank's training collectives."""

from __future__ import annotations

import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow


def _run(rank: int, port: int, ckpt: str):
    """Rank ``rank`` of two workers: torchrun's variables and the run contract's, then its Run."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
    )  # fmt: skip
    from sailor_tasks.runtime.run import Run

    env = dict(
        os.environ, SAILOR_RUN_ID="r", SAILOR_ATTEMPT="1", SAILOR_DATA_DIR="file:///x",
        SAILOR_CHECKPOINT_DIR=f"file://{ckpt}", SAILOR_TOTAL_STEPS="10", SAILOR_SEED="0",
    )  # fmt: skip
    return Run.from_env(env, handle_sigterm=False)


def _worker(rank: int, port: int, ckpt: str, out: str) -> None:
    run = _run(rank, port, ckpt)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))  # a hang shows as an error
    run.init_distributed()
    grad = torch.full((1000,), float(rank + 1))
    # The ranks reach the async save and their next gradient all-reduce in opposite orders, as
    # ordinary skew between ranks makes them do.
    if rank == 1:
        dist.all_reduce(grad)
        time.sleep(0.5)
        run.checkpoints.save_async(1, {"w": torch.zeros(1000)})
    else:
        run.checkpoints.save_async(1, {"w": torch.zeros(1000)})
        time.sleep(0.5)
        dist.all_reduce(grad)
    run.checkpoints.wait()
    with open(os.path.join(out, f"rank-{rank}"), "w") as f:
        f.write(str(grad[:3].tolist()))
    os._exit(0)


def test_an_async_save_and_a_training_all_reduce_in_either_order_on_two_ranks(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "out").mkdir()
    mp.spawn(_worker, args=(port, str(tmp_path / "ckpt"), str(tmp_path / "out")), nprocs=2)
    for rank in (0, 1):
        assert (tmp_path / "out" / f"rank-{rank}").read_text() == "[3.0, 3.0, 3.0]"


def _resuming_worker(rank: int, port: int, ckpt: str, out: str) -> None:
    run = _run(rank, port, ckpt)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))  # a hang shows as an error
    state = {"w": torch.zeros(1000)}
    resumed = run.load_latest(state)  # before init_distributed: the manager exists on rank 0 only
    run.init_distributed()
    run.checkpoints.save_async(1, {"w": torch.full((1000,), 1.0)})
    info = run.save(2, {"w": torch.full((1000,), 2.0)})
    run.close()
    with open(os.path.join(out, f"rank-{rank}"), "w") as f:
        f.write(f"{resumed} {info.step}")
    os._exit(0)


def test_resuming_before_init_distributed_then_saving_on_two_ranks(tmp_path):
    """The documented order with a group made by hand: ``load_latest`` first, then
    ``init_distributed`` for async saves; every rank makes the same groups and both saves commit."""
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "out").mkdir()
    mp.spawn(_resuming_worker, args=(port, str(tmp_path / "ckpt"), str(tmp_path / "out")), nprocs=2)
    for rank in (0, 1):
        assert (tmp_path / "out" / f"rank-{rank}").read_text() == "None 2"
    assert CheckpointManager(f"file://{tmp_path / 'ckpt'}").committed_steps() == [1, 2]


def _failing_fence_worker(rank: int, port: int, ckpt: str, out: str) -> None:
    """Rank 1's fence check fails once, in its first async save's background thread."""
    run = _run(rank, port, ckpt)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))  # a hang shows as an error
    run.init_distributed()
    manager = run.checkpoints
    if rank == 1:
        real, calls = manager.check_fence, []

        def flaky() -> None:
            calls.append(1)
            if len(calls) == 1:
                raise OSError("transient storage error reading the fence")
            real()

        manager.check_fence = flaky
    outcomes = []
    for step in (1, 2, 3):
        manager.save_async(step, {"w": torch.full((1000,), float(step)), f"rank{rank}": torch.ones(3)})
        try:
            manager.wait()
            outcomes.append("ok")
        except Exception as exc:  # noqa: BLE001 - the test records which save failed where
            outcomes.append(type(exc).__name__)
    with open(os.path.join(out, f"rank-{rank}"), "w") as f:
        f.write(" ".join(outcomes))
    os._exit(0)


def test_one_ranks_failure_before_an_async_saves_collectives_fails_that_save_on_every_rank(tmp_path):
    """Every rank fails step 1 together, and steps 2 and 3 commit with both ranks' files: one
    rank leaving the save's collectives made the others wait there, then pair each later save
    with another step's, committing steps without the other rank's data."""
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "out").mkdir()
    mp.spawn(_failing_fence_worker, args=(port, str(tmp_path / "ckpt"), str(tmp_path / "out")), nprocs=2)
    assert (tmp_path / "out" / "rank-0").read_text() == "RuntimeError ok ok"
    assert (tmp_path / "out" / "rank-1").read_text() == "OSError ok ok"
    manager = CheckpointManager(f"file://{tmp_path / 'ckpt'}")
    assert manager.committed_steps() == [2, 3]
    for step in (2, 3):
        files = manager.marker(step)["files"]
        assert any(n.startswith("__0_") for n in files) and any(n.startswith("__1_") for n in files)
        assert manager.verify(step)


def _failing_snapshot_worker(rank: int, port: int, ckpt: str, out: str) -> None:
    """Rank 1's state fails to resolve (its ``state_dict()`` raises) in the first sync save."""
    from torch.distributed.checkpoint.stateful import Stateful

    class Flaky(Stateful):
        calls = 0

        def state_dict(self):
            Flaky.calls += 1
            if rank == 1 and Flaky.calls == 1:
                raise ValueError("a user's state_dict failed")
            return {"w": torch.full((1000,), float(Flaky.calls))}

        def load_state_dict(self, state):
            pass

    run = _run(rank, port, ckpt)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))  # a hang shows as an error
    run.init_distributed()
    outcomes = []
    for step in (1, 2):
        try:
            run.checkpoints.save(step, {"app": Flaky(), f"rank{rank}": torch.ones(3)})
            outcomes.append("ok")
        except Exception as exc:  # noqa: BLE001 - the test records which save failed where
            outcomes.append(type(exc).__name__)
        dist.all_reduce(torch.ones(1))  # training goes on between saves
    with open(os.path.join(out, f"rank-{rank}"), "w") as f:
        f.write(" ".join(outcomes))
    os._exit(0)


def test_one_ranks_failure_resolving_its_state_fails_that_sync_save_on_every_rank(tmp_path):
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "out").mkdir()
    mp.spawn(_failing_snapshot_worker, args=(port, str(tmp_path / "ckpt"), str(tmp_path / "out")), nprocs=2)
    assert (tmp_path / "out" / "rank-0").read_text() == "RuntimeError ok"
    assert (tmp_path / "out" / "rank-1").read_text() == "ValueError ok"
    manager = CheckpointManager(f"file://{tmp_path / 'ckpt'}")
    assert manager.committed_steps() == [2] and manager.verify(2)
