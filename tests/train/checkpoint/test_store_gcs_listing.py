"""A gs:// checkpoint root written by other processes (the workers) is seen as it is now.

gcsfs caches every listing it makes, never expiring it, and clears it only for writes made through
the same instance: a process that listed a checkpoint root once (the orchestrator: a claim, a seal,
a recovery's size estimate) then misses every step the workers commit, and still lists steps
retention deleted."""

from __future__ import annotations

import json
import time

import crc32c_rs
import pytest

from sailor_tasks import storage
from sailor_tasks.train.checkpoint.store import MARKER, CheckpointStore

pytestmark = pytest.mark.gcs


def _other_process_fs():
    """A GCS filesystem with its own listing cache, as in a worker process."""
    import gcsfs

    return gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True)


def _commit_elsewhere(fs, root: str, step: int, data: bytes) -> None:
    folder = f"{root.removeprefix('gs://')}/step-{step:08d}"
    fs.pipe_file(f"{folder}/__0_0.distcp", data)
    crc = f"{crc32c_rs.crc32c(data):08x}"
    marker = {
        "step": step,
        "files": {"__0_0.distcp": {"crc32c": crc, "size": len(data)}},
        "committed_at": time.time(),
    }
    fs.pipe_file(f"{folder}/{MARKER}", json.dumps(marker).encode())


def test_a_step_another_process_committed_after_this_one_listed_the_root_is_seen(gcs):
    root = f"{gcs()}/runs/r/checkpoints"
    other = _other_process_fs()
    _commit_elsewhere(other, root, 10, b"a" * 100)
    assert CheckpointStore(root).latest_valid_step() == 10  # this process lists the root once

    _commit_elsewhere(other, root, 20, b"b" * 100)  # the workers commit step 20 ...
    other.rm(f"{root.removeprefix('gs://')}/step-00000010", recursive=True)  # ... and retire step 10

    store = CheckpointStore(root)
    assert store.committed_steps() == [20]
    assert store.latest_valid_step() == 20
    assert store.committed_bytes() == 100


def test_a_claim_inherits_the_steps_other_processes_committed_since_this_one_listed_the_root(gcs):
    """The next attempt's claim lists the committed steps to inherit: one it missed in a stale
    listing is then refused by ``verify`` as a stale attempt's, for every later reader."""
    root = f"{gcs()}/runs/r/checkpoints"
    other = _other_process_fs()
    _commit_elsewhere(other, root, 10, b"a" * 100)
    assert CheckpointStore(root).latest_valid_step() == 10  # this process lists the root once
    marker = {
        "step": 20,
        "files": {"__0_0.distcp": {"crc32c": f"{crc32c_rs.crc32c(b'b' * 100):08x}", "size": 100}},
        "committed_at": time.time(),
        "attempt": 1,
    }
    folder = f"{root.removeprefix('gs://')}/step-00000020"
    other.pipe_file(f"{folder}/__0_0.distcp", b"b" * 100)  # attempt 1's workers commit step 20
    other.pipe_file(f"{folder}/{MARKER}", json.dumps(marker).encode())

    CheckpointStore(root).claim(2)  # the orchestrator starts attempt 2
    assert 20 in storage.read_json(f"{root}/ATTEMPT.json")["inherited"]
    _other_process_fs().invalidate_cache()
    assert CheckpointStore(root).latest_valid_step() == 20
