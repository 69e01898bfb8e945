"""A replica is what its manifest says and nothing else: files the source dropped are removed,
lost files are copied again, a dataset that is one file or none is refused, a folder has one
spelling, a source that contradicts its manifest changes nothing, and the ledger lists a replica
only while it is complete."""

from __future__ import annotations

import os
import threading

import pytest

from sailor_tasks import paths, storage
from sailor_tasks.data import copier
from sailor_tasks.data.copier import copy_dataset, list_files, seal
from sailor_tasks.data.manifest import read_manifest
from sailor_tasks.errors import InvalidRequestError


def _dataset(root: str, files: dict[str, bytes], sealed: bool = True) -> str:
    for rel, data in files.items():
        storage.write_bytes(storage.join(root, rel), data)
    if sealed:
        seal(root)
    return root


def test_a_file_removed_from_the_source_is_removed_from_the_replica(tmp_path):
    src = _dataset(f"file://{tmp_path}/src", {"a.bin": b"a" * 1000, "b.bin": b"b" * 1000})
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    os.unlink(f"{tmp_path}/src/b.bin")  # the owner drops a file and reseals
    seal(src)
    copy_dataset(src, dst)
    assert [f.path for f in read_manifest(dst).files] == ["a.bin"]
    # a user script reads every file of SAILOR_DATA_DIR (examples/plain_ddp.py): b.bin is still data
    assert list_files(dst) == [("a.bin", 1000)]


def test_a_replica_that_lost_a_file_is_not_reported_complete(tmp_path):
    src = _dataset(f"file://{tmp_path}/src", {"a.bin": b"a" * 1000, "b.bin": b"b" * 1000})
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    os.unlink(f"{tmp_path}/dst/b.bin")  # lost (lifecycle rule, operator, disk)
    again = copy_dataset(src, dst)
    assert os.path.exists(f"{tmp_path}/dst/b.bin"), f"not repaired: {again}"
    assert (again.bytes_copied, again.bytes_skipped) == (1000, 1000)  # only what it lacked
    assert read_manifest(dst) == read_manifest(src)


def test_a_replica_file_overwritten_at_the_same_size_is_copied_again(tmp_path):
    """Bytes changed in place after the replica was completed (its size unchanged): the next copy
    finds it damaged from the listing (local: modified after the manifest) and copies that file
    again, so a run placed there does not fail its checksum."""
    from sailor_tasks.data.manifest import verify

    src = _dataset(f"file://{tmp_path}/src", {"a.bin": b"a" * 1000, "b.bin": b"b" * 1000})
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    sealed = os.stat(f"{tmp_path}/dst/_SAILOR_MANIFEST.json").st_mtime
    with open(f"{tmp_path}/dst/a.bin", "r+b") as f:
        f.write(b"\0" * 10)
    os.utime(f"{tmp_path}/dst/a.bin", (sealed + 1, sealed + 1))  # even within the clock's resolution
    again = copy_dataset(src, dst)
    assert (again.bytes_copied, again.bytes_skipped) == (1000, 1000)
    verify(dst, read_manifest(dst))  # every file matches its manifest again


def test_an_object_whose_stored_crc32c_is_not_the_manifests_is_damaged():
    """On an object store the listing carries each object's crc32c: one that differs from the
    manifest's marks the replica damaged, with nothing read."""
    import base64

    from sailor_tasks.model import DatasetManifest, ManifestEntry

    entry = ManifestEntry("a.bin", 1000, "0" * 64, crc32c="0a0b0c0d")
    manifest = DatasetManifest("file:///src", (entry,))
    same = {"a.bin": {"size": 1000, "crc32c": base64.b64encode(bytes.fromhex("0a0b0c0d")).decode()}}
    other = {"a.bin": {"size": 1000, "crc32c": base64.b64encode(bytes.fromhex("ffffffff")).decode()}}
    assert copier._damaged(manifest, same) is None
    assert "a.bin holds other bytes (crc32c ffffffff, not 0a0b0c0d)" == copier._damaged(manifest, other)


def test_a_dataset_that_is_one_file_or_none_is_refused_and_nothing_is_placed(tmp_path):
    one = f"file://{tmp_path}/src/only.bin"
    storage.write_bytes(one, b"x" * 5000)
    empty = f"file://{tmp_path}/empty"
    os.makedirs(f"{tmp_path}/empty")
    for src, reason in ((one, "names a file; a dataset is a folder of files"), (empty, "has no files")):
        dst = f"file://{tmp_path}/dst-{os.path.basename(src)}"
        with pytest.raises(InvalidRequestError, match=reason):
            copy_dataset(src, dst)
        assert not os.path.exists(dst.removeprefix("file://"))


def test_validate_refuses_a_dataset_that_is_one_file_or_an_empty_folder(ctx):
    from sailor_tasks import stages

    storage.write_bytes(storage.resolve("sailor://source/one.bin", ctx.settings), b"x" * 50_000)
    os.makedirs(storage.filesystem(storage.resolve("sailor://source/empty", ctx.settings))[1])
    for uri, reason in (
        ("sailor://source/one.bin", "names a file"),
        ("sailor://source/empty", "has no files"),
    ):
        with pytest.raises(InvalidRequestError, match=f"dataset_uri={uri!r}.*{reason}"):
            stages.validate({"dataset_uri": uri, "num_workers": 1}, f"run-{uri[-5:]}", ctx)
        assert ctx.ledger.get_run(f"run-{uri[-5:]}")["status"] == "rejected"
    assert ctx.ledger.replica_rows() == [] and ctx.ledger.live_reservations() == []


def test_an_empty_folder_is_not_sealed_and_a_manifest_listing_no_file_is_refused(ctx, tmp_path):
    """A manifest listing no file names a version with no data: ``seal`` refuses to write one,
    and a folder that holds one (sealed empty, files added since) is refused by ``validate`` and
    by the copy, naming it, instead of becoming a replica of no file recorded complete."""
    from sailor_tasks import stages
    from sailor_tasks.data.manifest import MANIFEST_NAME

    os.makedirs(f"{tmp_path}/empty")
    with pytest.raises(InvalidRequestError, match="has no files"):
        seal(f"file://{tmp_path}/empty")
    assert os.listdir(f"{tmp_path}/empty") == []
    root = storage.resolve("sailor://source/late", ctx.settings)
    storage.write_json(storage.join(root, MANIFEST_NAME), {"dataset_uri": root, "files": []})
    storage.write_bytes(storage.join(root, "data.bin"), b"d" * 1000)  # added after the sealing
    with pytest.raises(InvalidRequestError, match="lists no files: seal the folder again"):
        copy_dataset(root, f"file://{tmp_path}/dst")
    assert not os.path.exists(f"{tmp_path}/dst")
    with pytest.raises(InvalidRequestError, match="dataset_uri='sailor://source/late'.*lists no files"):
        stages.validate({"dataset_uri": "sailor://source/late", "num_workers": 1}, "run-late", ctx)
    assert ctx.ledger.replica_rows() == []
    seal(root)  # sealed again: its one file is the dataset
    assert [f.path for f in copy_dataset(root, f"file://{tmp_path}/dst").manifest.files] == ["data.bin"]


def test_a_trailing_slash_names_the_same_dataset_and_replica(ctx):
    from sailor_tasks import stages

    root = storage.resolve("sailor://source/ds", ctx.settings)
    _dataset(root, {"a.bin": b"a" * 10_000})
    one = stages.replicate_dataset({"dataset_uri": "sailor://source/ds", "region": "europe-west4"}, ctx)
    two = stages.replicate_dataset({"dataset_uri": "sailor://source/ds/", "region": "europe-west4"}, ctx)
    assert two["uri"] == one["uri"] and two["bytes_copied"] == 0


def test_data_residency_declared_with_a_trailing_slash_is_respected(ctx):
    from sailor_tasks import stages
    from sailor_tasks.errors import StageSkipped

    root = storage.resolve("sailor://source/eu", ctx.settings)
    _dataset(root, {"a.bin": b"a" * 10_000})
    # validate accepts both spellings of the one folder
    stages.validate({"dataset_uri": "sailor://source/eu/", "data_residency": ["EU"]}, "eu-run", ctx)
    stages.validate({"dataset_uri": "sailor://source/eu"}, "other-run", ctx)
    with pytest.raises(StageSkipped):  # the rebalance plans the copy under the other spelling
        stages.replicate_dataset({"dataset_uri": "sailor://source/eu", "region": "us-central1"}, ctx)


def test_a_replica_is_not_listed_while_another_copy_is_changing_it(ctx, monkeypatch):
    """replicate_dataset records the replica after copy_dataset released the replica lease: a copy
    that took the lease meanwhile (here: a place_data of the same unsealed dataset) has removed the
    manifest and forgotten the row, and the late record_replica lists a half-written replica."""
    from sailor_tasks import stages
    from sailor_tasks.stages import rebalance

    uri, region = "sailor://source/raw", "europe-west4"
    src = storage.resolve(uri, ctx.settings)
    _dataset(src, {"a.bin": b"a" * 1000, "b.bin": b"b" * 1000}, sealed=False)
    dst = paths.replica_uri(region, uri, ctx.settings)
    real_copy, real_one = copier.copy_dataset, copier._copy_one
    b_inside, release_b, b_running = threading.Event(), threading.Event(), threading.Event()

    def blocking_one(s, d):
        if b_running.is_set():
            b_inside.set()
            release_b.wait(30)
        return real_one(s, d)

    monkeypatch.setattr(copier, "_copy_one", blocking_one)
    errors: list[BaseException] = []

    def copy_b():
        try:
            real_copy(
                src, dst, lease=ctx.ledger.lease, on_invalidate=lambda: ctx.ledger.forget_replica(uri, region)
            )
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def copy_a_then_b_starts(*a, **kw):
        result = real_copy(*a, **kw)  # A done, lease released
        b_running.set()
        storage.write_bytes(storage.join(src, "b.bin"), b"B" * 1000)  # source changed (or unsealed)
        t = threading.Thread(target=copy_b)
        t.start()
        assert b_inside.wait(30)
        copy_a_then_b_starts.thread = t
        return result

    monkeypatch.setattr(rebalance, "copy_dataset", copy_a_then_b_starts)
    try:
        stages.replicate_dataset({"dataset_uri": uri, "region": region}, ctx)
        listed = region in ctx.ledger.replicas([uri]).get(uri, ())
        complete = read_manifest(dst) is not None
    finally:
        release_b.set()
        copy_a_then_b_starts.thread.join(30)
    assert not errors
    assert not (listed and not complete), "ledger lists a replica whose manifest is gone (copy in progress)"


def test_a_source_whose_sizes_disagree_with_its_manifest_leaves_the_replica_as_it_was(tmp_path):
    from sailor_tasks.errors import DataIntegrityError

    src = _dataset(f"file://{tmp_path}/src", {"a.bin": b"a" * 5000, "b.bin": b"b" * 5000})
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    before = read_manifest(dst)
    _dataset(src, {"a.bin": b"A" * 5000, "b.bin": b"B" * 5000})  # v2, sealed
    storage.write_bytes(f"{src}/b.bin", b"tampered")  # then changed: its size disagrees with the manifest
    with pytest.raises(DataIntegrityError):
        copy_dataset(src, dst, max_workers=1)
    # like a source missing a listed file (tested), a source whose listing already contradicts its
    # manifest should be refused before the complete v1 replica is invalidated and overwritten
    assert read_manifest(dst) == before
