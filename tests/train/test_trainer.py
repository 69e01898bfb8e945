"""CPU trainer: resume continues the step count and reproduces the uninterrupted run bit for bit."""

from __future__ import annotations

import pytest
import torch

from sailor_tasks import storage
from sailor_tasks.data.demo import write_demo_dataset
from sailor_tasks.train.checkpoint.dcp import CheckpointManager
from sailor_tasks.train.checkpoint.store import MARKER
from sailor_tasks.train.config import TrainConfig
from sailor_tasks.train.trainer import Trainer


class StopAfter:
    """A stop_event stand-in that fires once the trainer reaches ``step`` (a preemption notice)."""

    def __init__(self, step: int):
        self.step, self.trainer = step, None

    def is_set(self) -> bool:
        return self.trainer is not None and self.trainer.step >= self.step


@pytest.fixture
def data_uri(tmp_path):
    uri = f"file://{tmp_path}/data"
    write_demo_dataset(uri, num_shards=1, shard_bytes=40_000)
    return uri


def config(data_uri, out, **kw):
    base = dict(
        run_id="r",
        model="tiny_gpt",
        data_uri=data_uri,
        output_uri=out,
        total_steps=8,
        checkpoint_every_steps=3,
        batch_size=4,
        log_every_steps=100,
    )
    return TrainConfig(**{**base, **kw})


def params_of(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def test_resume_continues_step_count_and_matches_uninterrupted_run(data_uri, tmp_path):
    reference = Trainer(config(data_uri, f"file://{tmp_path}/ref"))
    ref_result = reference.train()
    assert ref_result.status == "completed" and ref_result.step == 8

    out = f"file://{tmp_path}/interrupted"
    stop = StopAfter(2)
    first = Trainer(config(data_uri, out), stop_event=stop)
    stop.trainer = first
    r1 = first.train()
    assert (r1.status, r1.step) == ("preempted", 2)

    second = Trainer(config(data_uri, out))
    r2 = second.train()
    assert r2.resumed_from_step == 2 and r2.step == 8
    assert r2.initial_loss == ref_result.initial_loss
    assert r2.final_loss == ref_result.final_loss
    for name, tensor in params_of(reference).items():
        assert torch.equal(tensor, params_of(second)[name]), name


def test_loss_falls_and_result_is_written(data_uri, tmp_path):
    cfg = config(data_uri, f"file://{tmp_path}/o", total_steps=40, checkpoint_every_steps=20, batch_size=8)
    result = Trainer(cfg).train()
    assert result.final_loss < result.initial_loss - 0.5
    assert storage.read_json(cfg.result_uri)["final_loss"] == result.final_loss


def test_uncommitted_or_corrupt_checkpoint_falls_back_to_previous(data_uri, tmp_path):
    cfg = config(data_uri, f"file://{tmp_path}/o", total_steps=6, checkpoint_every_steps=2, keep_latest_k=3)
    Trainer(cfg).train()
    mgr = CheckpointManager(cfg.checkpoint_uri, keep_latest_k=3)
    assert mgr.committed_steps() == [2, 4, 6]

    # Newest loses its marker (killed before the commit) → step 4 is the newest loadable.
    storage.remove(storage.join(mgr.step_uri(6), MARKER))
    assert mgr.latest_valid_step() == 4

    # A flipped byte in step 4's data → rejected by its checksum; step 2 is used.
    shard = next(
        p for p in (tmp_path / "o" / "checkpoints" / "step-00000004").iterdir() if p.suffix == ".distcp"
    )
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    assert mgr.latest_valid_step() == 2
    resumed = Trainer(cfg)
    assert resumed.resume() == 2 and resumed.step == 2


def test_retention_keeps_newest_k(data_uri, tmp_path):
    cfg = config(data_uri, f"file://{tmp_path}/o", total_steps=8, checkpoint_every_steps=2, keep_latest_k=2)
    Trainer(cfg).train()
    assert CheckpointManager(cfg.checkpoint_uri).committed_steps() == [6, 8]


def test_a_notice_after_a_failed_async_save_still_saves_its_step(data_uri, tmp_path, monkeypatch):
    """The async save of the notice's step fails (an object store's error): the notice still gets
    a blocking save of that step, not the last committed one."""
    cfg = config(
        data_uri, f"file://{tmp_path}/o", total_steps=8, checkpoint_every_steps=2, async_checkpoint=True
    )

    def failing(self, step, *a, **k):
        if step == 4:
            raise OSError("503 Service Unavailable")
        return real(self, step, *a, **k)

    real = CheckpointManager._stage_and_save
    monkeypatch.setattr(CheckpointManager, "_stage_and_save", failing)
    stop = StopAfter(4)
    trainer = Trainer(cfg, stop_event=stop)
    stop.trainer = trainer
    result = trainer.train()
    assert (result.status, result.step) == ("preempted", 4)
    assert result.checkpoint_uri == trainer.checkpoints.step_uri(4)
    assert CheckpointManager(cfg.checkpoint_uri).latest_valid_step() == 4


@pytest.mark.parametrize("notice_at", [None, 5])
def test_a_failed_periodic_async_save_fails_neither_the_run_nor_a_later_notice(
    data_uri, tmp_path, monkeypatch, notice_at
):
    """The background save of step 4 fails (a store's transient error), found one step later:
    training goes on (the worker must not exit as failed), and a notice in step 5 saves step 5
    (the work since step 2 is not lost)."""
    cfg = config(
        data_uri, f"file://{tmp_path}/o", total_steps=8, checkpoint_every_steps=2, async_checkpoint=True
    )

    def failing(self, step, *a, **k):
        if step == 4:
            raise OSError("503 Service Unavailable")
        return real(self, step, *a, **k)

    real = CheckpointManager._write_and_commit  # after the state was staged
    monkeypatch.setattr(CheckpointManager, "_write_and_commit", failing)
    stop = StopAfter(notice_at or 10**9)
    trainer = Trainer(cfg, stop_event=stop)
    stop.trainer = trainer
    result = trainer.train()
    if notice_at is None:
        assert (result.status, result.step) == ("completed", 8)
        assert CheckpointManager(cfg.checkpoint_uri).latest_valid_step() == 8
    else:
        assert (result.status, result.step) == ("preempted", 5)
        assert CheckpointManager(cfg.checkpoint_uri).latest_valid_step() == 5


def test_after_a_failed_async_save_the_next_one_is_made_in_the_foreground(data_uri, tmp_path, monkeypatch):
    """Every background save fails (a full disk, say): each next checkpoint is then made in the
    foreground, so the run keeps a checkpoint at least every other interval; once the foreground
    save fails too, the error stops the run instead of leaving it training with none."""
    import threading

    cfg = config(
        data_uri, f"file://{tmp_path}/o", total_steps=30, checkpoint_every_steps=3, async_checkpoint=True
    )
    full = {"disk": False}

    def failing(self, step, *a, **k):
        if full["disk"] or threading.current_thread() is not threading.main_thread():
            raise OSError(28, "No space left on device")
        return real(self, step, *a, **k)

    real = CheckpointManager._write_and_commit
    monkeypatch.setattr(CheckpointManager, "_write_and_commit", failing)
    trainer = Trainer(cfg)
    trainer.resume()
    trainer.initial_loss = trainer.evaluate()
    for _ in range(13):
        trainer.run_step()
    assert trainer.step == 13 and trainer.last_checkpoint_step == 12  # steps 6 and 12 in the foreground
    full["disk"] = True
    with pytest.raises(OSError, match="No space left on device"):
        for _ in range(17):
            trainer.run_step()
    assert trainer.step == 18  # the async save of 15 failed; 18, in the foreground, stopped the run


@pytest.mark.parametrize("async_checkpoint", [False, True])
def test_a_failed_retention_fails_neither_the_save_nor_the_run(
    data_uri, tmp_path, monkeypatch, async_checkpoint
):
    """Retiring old checkpoints fails (an object store's error): every save still commits, the run
    completes, and the old checkpoints are kept."""

    def failing(self):
        raise OSError("503 Service Unavailable")

    monkeypatch.setattr(CheckpointManager, "retain", failing)
    cfg = config(
        data_uri,
        f"file://{tmp_path}/o",
        total_steps=8,
        checkpoint_every_steps=2,
        keep_latest_k=2,
        async_checkpoint=async_checkpoint,
    )
    result = Trainer(cfg).train()
    assert (result.status, result.step) == ("completed", 8)
    assert CheckpointManager(cfg.checkpoint_uri).committed_steps() == [2, 4, 6, 8]


def test_config_rejects_keep_below_two():
    with pytest.raises(ValueError, match="keep_latest_k=1"):
        TrainConfig(
            run_id="r",
            model="tiny_gpt",
            data_uri="file:///x",
            output_uri="file:///y",
            total_steps=1,
            checkpoint_every_steps=1,
            keep_latest_k=1,
        )


@pytest.mark.parametrize("field", ["num_eval_batches", "log_every_steps"])
def test_config_rejects_zero_eval_batches_and_log_interval(field):
    with pytest.raises(ValueError, match=f"{field}=0 must be >= 1"):
        TrainConfig(
            run_id="r",
            model="tiny_gpt",
            data_uri="file:///x",
            output_uri="file:///y",
            total_steps=1,
            checkpoint_every_steps=1,
            **{field: 0},
        )


def test_a_corpus_whose_eval_split_cannot_hold_one_window_is_refused_naming_the_size():
    import torch

    from sailor_tasks.train.data import ByteCorpus

    with pytest.raises(
        ValueError, match=r"corpus of 1000 bytes is too small for seq_len=64 .* about 1320 bytes"
    ):
        ByteCorpus(torch.zeros(1000, dtype=torch.long), seq_len=64, seed=0)
    corpus = ByteCorpus(torch.arange(1400) % 256, seq_len=64, seed=0)
    assert corpus.eval_tokens.numel() >= 66 and corpus.eval_batches(1, 2)[0][0].shape == (2, 64)


def test_the_loader_refuses_a_replica_whose_files_do_not_match_the_manifest(data_uri):
    from sailor_tasks.data.manifest import read_manifest
    from sailor_tasks.errors import DataIntegrityError
    from sailor_tasks.train.data import ByteCorpus

    ByteCorpus.load(data_uri, seq_len=16, seed=0)
    first = read_manifest(data_uri).files[0]
    uri = storage.join(data_uri, first.path)
    data = bytearray(storage.read_bytes(uri))
    data[len(data) // 2] ^= 0xFF  # a torn or corrupt replica file, same size
    storage.write_bytes(uri, bytes(data))
    with pytest.raises(DataIntegrityError, match=first.path):
        ByteCorpus.load(data_uri, seq_len=16, seed=0)


def test_a_cpu_checkpoint_names_its_entries_and_holds_no_gpu_generator(data_uri, tmp_path):
    # A run resumed on a GPU loads its GPU generator only from a checkpoint that saved one.
    trainer = Trainer(config(data_uri, f"file://{tmp_path}/keys", total_steps=3))
    trainer.train()
    keys = trainer.checkpoints.saved_keys(3)
    assert {"app", "scheduler", "trainer", "rng_rank0"} <= keys and "cuda_rng_rank0" not in keys


def test_a_resumed_run_uses_its_own_devices_optimizer_kernels(data_uri, tmp_path):
    # A checkpoint saved on a GPU records AdamW's fused kernels in its param groups; resumed on
    # the CPU the run uses the CPU's choice.
    out = f"file://{tmp_path}/o"
    first = Trainer(config(data_uri, out, total_steps=4, checkpoint_every_steps=2))
    for _ in range(2):
        first.train_step()
    for group in first.optimizer.param_groups:
        group["fused"] = True  # as the GPU trainer saves it
    first.save()
    second = Trainer(config(data_uri, out, total_steps=4, checkpoint_every_steps=2))
    assert second.resume() == 2
    assert [g["fused"] for g in second.optimizer.param_groups] == [None] * len(second.optimizer.param_groups)
    assert second.train().step == 4
