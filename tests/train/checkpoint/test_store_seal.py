"""Plain DCP checkpoint folders (no SAILOR marker) are sealed once complete, never when cut short."""

from __future__ import annotations

import pickle

from sailor_tasks.train.checkpoint.store import DCP_METADATA, MARKER, RAW_TENSOR_FORMAT, CheckpointStore


def dcp_folder(root, step: int, *, metadata: bytes | None) -> None:
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(bytes(range(256)) * 40)
    (folder / "__1_0.distcp").write_bytes(b"rank one" * 100)
    if metadata is not None:
        (folder / DCP_METADATA).write_bytes(metadata)


WHOLE = pickle.dumps({"state_dict_metadata": {"model.w": list(range(500))}, "version": "1"})


def test_complete_dcp_folders_newer_than_the_last_commit_are_sealed_and_verify(tmp_path):
    root = tmp_path / "ckpt"
    dcp_folder(root, 5, metadata=WHOLE)
    dcp_folder(root, 10, metadata=WHOLE)
    dcp_folder(root, 15, metadata=WHOLE[: len(WHOLE) // 2])  # killed while writing .metadata
    dcp_folder(root, 20, metadata=None)  # killed before DCP finished
    store = CheckpointStore(str(root))
    assert store.seal() == [5, 10]
    assert store.committed_steps() == [5, 10] and store.latest_valid_step() == 10
    assert not (root / "step-00000015" / MARKER).exists()
    assert store.seal() == []  # nothing new: sealing twice changes nothing


def test_sealed_checkpoint_is_copied_and_verified_elsewhere_and_corruption_is_caught(tmp_path):
    root = tmp_path / "ckpt"
    dcp_folder(root, 5, metadata=WHOLE)
    dcp_folder(root, 10, metadata=WHOLE)
    store = CheckpointStore(str(root))
    store.seal()
    (root / "step-00000010" / "__1_0.distcp").write_bytes(b"rank 0ne" * 100)  # same size, flipped bytes
    assert store.latest_valid_step() == 5  # the damaged newest one is skipped
    dest = tmp_path / "other-region"
    assert store.copy_latest_to(str(dest)) == 5
    assert (dest / "step-00000005" / DCP_METADATA).read_bytes() == WHOLE
    assert CheckpointStore(str(dest)).verify(5)


def test_folders_older_than_the_newest_commit_are_left_alone(tmp_path):
    root = tmp_path / "ckpt"
    dcp_folder(root, 10, metadata=WHOLE)
    store = CheckpointStore(str(root))
    store.commit(10)
    dcp_folder(root, 5, metadata=WHOLE)  # e.g. a retired folder being deleted
    assert store.seal() == [] and store.committed_steps() == [10]


def test_a_folder_of_sailors_writer_without_its_marker_is_not_sealed(tmp_path):
    """SAILOR's writer commits its own saves: a folder of its left uncommitted failed or was cut off."""
    root = tmp_path / "ckpt"
    dcp_folder(root, 5, metadata=WHOLE)
    tagged = pickle.dumps({"storage_data": {"model.w": ["__0_0.distcp", 0, 10, [RAW_TENSOR_FORMAT]]}})
    dcp_folder(root, 10, metadata=tagged)
    store = CheckpointStore(str(root))
    assert store.dcp_complete(10)
    assert store.seal() == [5]
    assert store.committed_steps() == [5] and not (root / "step-00000010" / MARKER).exists()
