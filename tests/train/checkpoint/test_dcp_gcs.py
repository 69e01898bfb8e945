"""torch.distributed.checkpoint through CheckpointManager on gs:// against a real GCS API server."""

from __future__ import annotations

import time

import pytest
import torch

from sailor_tasks import storage
from sailor_tasks.train.checkpoint.dcp import CheckpointManager
from sailor_tasks.train.checkpoint.store import MARKER

pytestmark = pytest.mark.gcs


def _state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": torch.tensor(seed)}


def test_checkpoint_round_trip_on_gcs(gcs):
    root = f"{gcs()}/runs/r1/checkpoints"
    mgr = CheckpointManager(root, keep_latest_k=2)
    started = time.monotonic()
    for step in (10, 20, 30):
        mgr.save(step, _state(step))
    # .metadata is written in place: no rename, so no gcsfs moveTo retry loop (~35 s on the emulator).
    assert time.monotonic() - started < 20
    mgr.wait()  # old checkpoints are deleted in the background
    assert mgr.committed_steps() == [20, 30]  # keep_latest_k=2
    assert mgr.latest_valid_step() == 30
    marker = storage.read_json(f"{root}/step-00000030/{MARKER}")
    for name, meta in marker["files"].items():  # the marker's crc32c is what GCS stored
        assert storage.stored_crc32c(f"{root}/step-00000030/{name}") == meta["crc32c"]

    expected = _state(30)
    restored = _state(0)
    mgr.load(30, restored)
    for key, value in expected["model"].items():
        assert torch.equal(restored["model"][key], value), key
    assert torch.equal(restored["step"], torch.tensor(30))
    exp_opt, got_opt = expected["optim"]["state"], restored["optim"]["state"]
    for pid in exp_opt:
        assert torch.equal(got_opt[pid]["exp_avg"], exp_opt[pid]["exp_avg"])


def test_replaced_checkpoint_object_is_skipped_for_the_previous_one(gcs):
    root = f"{gcs()}/ckpt"
    mgr = CheckpointManager(root, keep_latest_k=2)
    mgr.save(1, _state(1))
    mgr.save(2, _state(2))
    marker = storage.read_json(f"{root}/step-00000002/{MARKER}")
    victim = next(n for n in marker["files"] if n.endswith(".distcp"))
    data = bytearray(storage.read_bytes(f"{root}/step-00000002/{victim}"))
    data[len(data) // 2] ^= 0xFF
    storage.write_bytes(f"{root}/step-00000002/{victim}", bytes(data))
    assert not mgr.verify(2)
    assert mgr.latest_valid_step() == 1


def test_uncommitted_step_on_gcs_is_never_loaded(gcs):
    root = f"{gcs()}/ckpt"
    mgr = CheckpointManager(root, keep_latest_k=2)
    mgr.save(5, _state(5))
    storage.write_bytes(f"{root}/step-00000009/__0_0.distcp", b"partial")  # killed mid-save
    assert mgr.committed_steps() == [5]
    assert mgr.latest_valid_step() == 5
