"""Fencing: a checkpoint write carries its attempt, and an attempt that a newer one superseded
(a worker that outlived its agent) can neither replace, commit nor retire a checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from sailor_tasks import storage
from sailor_tasks.errors import StaleAttemptError
from sailor_tasks.train.checkpoint.dcp import CheckpointManager, diff_states
from sailor_tasks.train.checkpoint.store import FENCE, MARKER, CheckpointStore


def _state(fill: float) -> dict:
    return {"w": torch.full((64, 64), fill), "meta": {"fill": fill}}


def test_a_stale_attempt_cannot_commit_over_a_newer_attempts_checkpoint(tmp_path):
    root = f"file://{tmp_path}/ckpt"
    old = CheckpointManager(root, attempt=1)
    old.claim(1)
    old.save(10, _state(1.0))
    old.wait()

    new = CheckpointManager(root, attempt=2)
    new.claim(2)
    assert new.latest_valid_step() == 10  # the older attempt's checkpoint, committed before the claim
    new.save(20, _state(2.0))
    new.wait()
    marker = storage.read_json(storage.join(new.step_uri(20), MARKER))
    assert marker["attempt"] == 2

    # The old attempt's orphan goes on: the same step (would replace the folder) and a newer one.
    with pytest.raises(StaleAttemptError, match="attempt 1 .* attempt 2 claimed"):
        old.save(20, _state(9.0))
    with pytest.raises(StaleAttemptError):
        old.save(30, _state(9.0))
    assert new.step_dirs() == [10, 20]  # nothing of the orphan's
    assert new.latest_valid_step() == 20
    loaded = _state(0.0)
    new.load(20, loaded)
    assert diff_states(loaded, _state(2.0)) == []
    with pytest.raises(StaleAttemptError):
        old.retain()  # nor retire anything of the newer attempt's
    with pytest.raises(StaleAttemptError, match="attempt 1"):
        CheckpointStore(root).claim(1)


def test_a_save_the_fence_refused_is_not_sealed_by_the_newer_attempt(tmp_path):
    """An older attempt's save that the claim cut off at its commit leaves a whole folder behind;
    the newer attempt's end (``seal``) must not commit it under its own number."""
    root = f"file://{tmp_path}/ckpt"
    old = CheckpointManager(root, attempt=1)
    old.claim(1)
    old.save(10, _state(1.0))
    old.wait()
    new = CheckpointStore(root, attempt=2)
    commit = old.commit

    def claimed_while_writing(*args, **kwargs):
        new.claim(2)
        return commit(*args, **kwargs)

    old.commit = claimed_while_writing
    with pytest.raises(StaleAttemptError):
        old.save(99, _state(-1.0))
    assert new.dcp_complete(99)
    assert new.seal() == [] and new.committed_steps() == [10] and new.latest_valid_step() == 10


def test_a_marker_an_old_attempt_slipped_in_after_the_claim_is_not_loadable(tmp_path):
    """On an object store the fence check and the marker write are not atomic: a stale marker that
    lands in between is refused when read."""
    root = f"file://{tmp_path}/ckpt"
    old = CheckpointManager(root, attempt=1)
    old.claim(1)
    old.save(10, _state(1.0))
    old.wait()
    old.save(20, _state(1.5))  # written before the claim...
    old.wait()
    marker_uri = storage.join(old.step_uri(20), MARKER)
    marker = storage.read_bytes(marker_uri)
    storage.remove(marker_uri)  # ...its marker not yet
    CheckpointStore(root).claim(2)
    storage.write_bytes(marker_uri, marker)  # lands after the claim
    store = CheckpointStore(root)
    assert store.committed_steps() == [10, 20]
    assert not store.verify(20) and store.latest_valid_step() == 10
    assert json.loads(storage.read_bytes(f"{root}/{FENCE}")) == {"attempt": 2, "inherited": [10]}


def test_claims_are_idempotent_and_only_move_forward(tmp_path):
    root = f"file://{tmp_path}/ckpt"
    store = CheckpointStore(root)
    assert store.fence() is None
    store.claim(3)
    store.claim(3)  # a retried claim of the same attempt
    with pytest.raises(StaleAttemptError) as info:
        CheckpointStore(root).claim(2)
    assert (info.value.attempt, info.value.newer) == (2, 3)
    CheckpointStore(root).claim(4)
    assert store.fence()["attempt"] == 4


def test_a_checkpoint_copied_into_a_claimed_root_stays_loadable(tmp_path):
    """Recovery copies the newest checkpoint into the new region's root between attempts."""
    src, dst = f"file://{tmp_path}/a", f"file://{tmp_path}/b"
    first = CheckpointManager(src, attempt=1)
    first.claim(1)
    first.save(10, _state(1.0))
    first.wait()
    CheckpointStore(dst).claim(2)  # the root an earlier attempt left in region b
    assert CheckpointStore(src).copy_latest_to(dst) == 10
    assert CheckpointStore(dst).latest_valid_step() == 10


def test_a_claim_on_a_local_root_is_durable_before_any_checkpoint_of_the_attempt(tmp_path, monkeypatch):
    """A fence a crash left empty would make every checkpoint of the root unverifiable: the claim
    fsyncs the fence file and the root folder that names it."""
    import os

    from sailor_tasks.train.checkpoint import store as store_module

    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        store_module.os,
        "fsync",
        lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)),
    )
    CheckpointStore(f"file://{tmp_path}/ck").claim(2)
    assert synced == [str(tmp_path / "ck" / FENCE), str(tmp_path / "ck")]
