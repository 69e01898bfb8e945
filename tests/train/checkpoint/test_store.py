"""The torch-free checkpoint store: commit markers, verification, newest valid step, copy, retention."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sailor_tasks import storage
from sailor_tasks.train.checkpoint.store import (
    MARKER,
    RECYCLE_DIR,
    SIDECAR_SUFFIX,
    CheckpointStore,
    crc32c_of,
)


def _write_step(store: CheckpointStore, step: int, files: dict[str, bytes], *, commit: bool = True) -> None:
    """A step folder holding ``files``, committed with checksums read back from storage."""
    for name, data in files.items():
        storage.write_bytes(storage.join(store.step_uri(step), name), data)
    if commit:
        store.commit(step)


def _files(step: int, n_data: int = 2) -> dict[str, bytes]:
    """What a DCP checkpoint folder holds: ``.metadata`` and a data file per writer thread."""
    data = {f"__0_{i}.distcp": bytes([step, i]) * (1000 + 100 * i) for i in range(n_data)}
    return {".metadata": f"metadata of step {step}".encode(), **data}


def _flip_a_byte(uri: str) -> None:
    data = bytearray(storage.read_bytes(uri))
    data[len(data) // 2] ^= 0xFF
    storage.write_bytes(uri, bytes(data))


def test_the_store_and_the_stages_never_import_torch():
    code = (
        "import sys, sailor_tasks.stages, sailor_tasks.airflow_glue.stage, sailor_tasks.train.checkpoint.store;"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:5])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_commit_records_every_files_checksum_and_size_and_skips_sidecars(tmp_path):
    store = CheckpointStore(f"file://{tmp_path}/ck")
    files = _files(1)
    _write_step(store, 1, {**files, "leftover.tmp": b"partial"}, commit=False)
    # A rank's sidecar: its sums are taken as written, without reading the files back.
    sidecar = {"__0_1.distcp": {"crc32c": "0badc0de", "size": len(files["__0_1.distcp"])}}
    storage.write_bytes(
        storage.join(store.step_uri(1), f"__0_{SIDECAR_SUFFIX}"), json.dumps(sidecar).encode()
    )

    assert store.commit(1) == sum(len(d) for d in files.values())
    marker = storage.read_json(storage.join(store.step_uri(1), MARKER))
    assert marker["step"] == 1 and set(marker["files"]) == set(files)
    assert marker["files"]["__0_1.distcp"] == sidecar["__0_1.distcp"]
    for name in (".metadata", "__0_0.distcp"):
        crc, size = crc32c_of(storage.join(store.step_uri(1), name))
        assert marker["files"][name] == {"crc32c": crc, "size": size}
    assert not store.verify(1)  # the sidecar's checksum was wrong: verification reads the files

    # A single process hands over every file's sums: the folder is not listed.
    own = {
        n: dict(zip(("crc32c", "size"), crc32c_of(storage.join(store.step_uri(1), n)), strict=True))
        for n in files
    }
    assert store.commit(1, own, complete=True) == sum(len(d) for d in files.values())
    assert storage.read_json(storage.join(store.step_uri(1), MARKER))["files"] == own
    assert store.verify(1)


def test_uncommitted_or_corrupt_steps_fall_back_to_the_previous_one(tmp_path):
    root = tmp_path / "ck"
    store = CheckpointStore(f"file://{root}")
    assert store.step_dirs() == [] and store.latest_valid_step() is None
    for step in (1, 2, 3):
        _write_step(store, step, _files(step))
    _write_step(store, 4, _files(4), commit=False)  # killed mid-save
    (root / "notes").mkdir()  # not a step folder
    assert [p.name for p in sorted(root.iterdir()) if p.name.startswith("step-")] == [
        f"step-{s:08d}" for s in (1, 2, 3, 4)
    ]
    assert store.step_dirs() == [1, 2, 3, 4] and store.committed_steps() == [1, 2, 3]
    assert store.latest_valid_step() == 3

    _flip_a_byte(storage.join(store.step_uri(3), "__0_1.distcp"))  # same size, other bytes
    assert not store.verify(3) and store.latest_valid_step() == 2
    os.unlink(root / "step-00000002" / "__0_0.distcp")
    assert not store.verify(2) and store.latest_valid_step() == 1
    (root / "step-00000001" / MARKER).write_text("{not json")
    assert not store.verify(1) and store.latest_valid_step() is None


def test_a_step_missing_a_data_file_dcps_metadata_names_is_not_committed(tmp_path):
    """Another rank's data file missing (its save went to another folder): no marker, so the step
    never becomes the newest valid checkpoint that no rank can load."""
    store = CheckpointStore(f"file://{tmp_path}/ck")
    _write_step(store, 1, _files(1), commit=False)
    with pytest.raises(RuntimeError, match="__1_0.distcp missing"):
        store.commit(1, required=["__0_0.distcp", "__1_0.distcp"])
    assert not storage.exists(storage.join(store.step_uri(1), MARKER))
    assert store.commit(1, required=["__0_0.distcp", "__0_1.distcp"]) > 0


def test_committed_bytes_is_the_newest_marker_total(tmp_path):
    store = CheckpointStore(f"file://{tmp_path}/r1")
    assert store.committed_bytes() is None
    _write_step(store, 3, {"__0_0.distcp": b"x" * 10, ".metadata": b"m"})
    _write_step(store, 5, {"__0_0.distcp": b"x" * 40, "__1_0.distcp": b"y" * 2, ".metadata": b"mm"})
    _write_step(store, 7, {"__0_0.distcp": b"half"}, commit=False)  # not committed: not counted
    assert store.committed_bytes() == 44
    (tmp_path / "r1" / "step-00000005" / MARKER).write_text("{not json")
    assert store.committed_bytes() == 11  # an unreadable marker: the next newest


def test_copy_latest_moves_a_verified_checkpoint(tmp_path):
    src = CheckpointStore(f"file://{tmp_path}/r1")
    assert src.copy_latest_to(f"file://{tmp_path}/r2") is None  # nothing to copy
    for step in (3, 5):
        _write_step(src, step, _files(step))
    _write_step(src, 7, _files(7), commit=False)
    assert src.copy_latest_to(f"file://{tmp_path}/r2") == 5
    dst = CheckpointStore(f"file://{tmp_path}/r2")
    assert dst.step_dirs() == [5] and dst.latest_valid_step() == 5
    for name in (*_files(5), MARKER):  # byte-identical, marker included
        assert (tmp_path / "r2" / "step-00000005" / name).read_bytes() == (
            tmp_path / "r1" / "step-00000005" / name
        ).read_bytes()
    assert src.copy_latest_to(f"file://{tmp_path}/r2") == 5  # idempotent on retry

    # The newest source checkpoint fails its checksum, and a killed copy left a partial folder.
    _flip_a_byte(storage.join(src.step_uri(5), "__0_0.distcp"))
    _write_step(dst, 3, {"__0_0.distcp": b"half"}, commit=False)
    assert src.copy_latest_to(f"file://{tmp_path}/r2") == 3
    assert dst.verify(3) and sorted(os.listdir(tmp_path / "r2" / "step-00000003")) == sorted(
        [*_files(3), MARKER]
    )


def test_retention_keeps_the_newest_k_and_deletes_older_and_uncommitted_folders(tmp_path):
    root = tmp_path / "ck"
    store = CheckpointStore(f"file://{root}", keep_latest_k=2, recycle=False)
    assert store.recycle_dir is None
    for step in (1, 2, 4, 5):
        _write_step(store, step, _files(step))
    _write_step(store, 3, _files(3), commit=False)  # a killed save, older than the newest commit
    _write_step(store, 6, _files(6), commit=False)  # a save still being written
    store.retain()
    assert store.step_dirs() == [4, 5, 6] and store.committed_steps() == [4, 5]
    assert not (root / RECYCLE_DIR).exists()


@pytest.mark.parametrize("recycle", [False, True], ids=["delete", "recycle"])
def test_retention_counts_only_verified_checkpoints_toward_k(tmp_path, recycle):
    store = CheckpointStore(f"file://{tmp_path}/ck", keep_latest_k=2, recycle=recycle)
    for step in (1, 2, 3, 4):
        _write_step(store, step, _files(step))
    for step in (3, 4):  # the two newest saves are committed but corrupt
        _flip_a_byte(storage.join(store.step_uri(step), "__0_0.distcp"))
    store.retain()
    # The last two good checkpoints are kept; the corrupt ones count for nothing (left for now).
    assert store.latest_valid_step() == 2 and store.verify(1)
    assert store.step_dirs() == [1, 2, 3, 4]

    _write_step(store, 5, _files(5))
    store.retain()
    assert store.step_dirs() == [2, 3, 4, 5] and store.latest_valid_step() == 5 and store.verify(2)
    _write_step(store, 6, _files(6))
    store.retain()  # the corrupt ones are now older than K good ones: retired
    assert store.step_dirs() == [5, 6]


def test_retention_fsyncs_the_kept_checkpoints_before_retiring_an_older_one(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    store = CheckpointStore(f"file://{root}", keep_latest_k=1)
    for step in (1, 2):
        _write_step(store, step, _files(step))
    events: list[tuple[str, str]] = []
    real_fsync, real_remove = os.fsync, storage.remove

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def remove(uri, recursive=False):
        events.append(("retire", uri))
        real_remove(uri, recursive=recursive)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(storage, "remove", remove)
    store.retain()
    first_retire = next(i for i, (kind, _) in enumerate(events) if kind == "retire")
    synced = {path for kind, path in events[:first_retire] if kind == "fsync"}
    kept = root / "step-00000002"
    assert {str(kept / n) for n in (*_files(2), MARKER)} | {str(kept), str(root)} <= synced, events
    assert store.step_dirs() == [2]


def _inodes(folder) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in folder.iterdir() if p.suffix == ".distcp"}


def test_retention_on_a_local_root_recycles_data_files_and_bounds_the_recycle_folder(tmp_path):
    root = tmp_path / "ck"
    store = CheckpointStore(f"file://{root}", keep_latest_k=1)
    assert store.recycle_dir == str(root / RECYCLE_DIR)
    store.retain()  # nothing yet: no recycle folder either
    assert not (root / RECYCLE_DIR).exists()
    for step in (1, 2):
        _write_step(store, step, _files(step))
    inodes = {step: _inodes(root / f"step-{step:08d}") for step in (1, 2)}
    store.retain()
    # Step 1's marker went first, then its data files moved (same inodes); the rest is deleted.
    assert store.step_dirs() == [2] and not (root / "step-00000001").exists()
    assert _inodes(root / RECYCLE_DIR) == {f"step-00000001.{n}": i for n, i in inodes[1].items()}

    _write_step(store, 3, _files(3, n_data=1))
    store.retain()
    # The newest checkpoint has one data file: the folder keeps the most recently recycled one.
    assert store.step_dirs() == [3]
    assert _inodes(root / RECYCLE_DIR) == {"step-00000002.__0_1.distcp": inodes[2]["__0_1.distcp"]}


@pytest.mark.gcs
def test_store_on_gcs_verifies_from_stored_checksums_copies_to_a_local_root_and_deletes(gcs, tmp_path):
    root = f"{gcs()}/runs/r1/checkpoints"
    store = CheckpointStore(root, keep_latest_k=2)
    assert store.recycle_dir is None  # objects are deleted, never recycled
    for step in (1, 2, 3):
        _write_step(store, step, _files(step))
    _write_step(store, 4, _files(4), commit=False)
    marker = storage.read_json(f"{root}/step-00000003/{MARKER}")
    for name, meta in marker["files"].items():  # the marker's crc32c is what GCS stored
        assert storage.stored_crc32c(f"{root}/step-00000003/{name}") == meta["crc32c"]
    assert store.committed_steps() == [1, 2, 3] and store.latest_valid_step() == 3

    assert store.copy_latest_to(f"file://{tmp_path}/r2") == 3
    assert CheckpointStore(f"file://{tmp_path}/r2").latest_valid_step() == 3

    store.retain()
    assert storage.listdir(root) == ["step-00000002", "step-00000003", "step-00000004"]
    _flip_a_byte(f"{root}/step-00000003/__0_0.distcp")
    assert not store.verify(3) and store.latest_valid_step() == 2
