from __future__ import annotations

import os

import pytest

from sailor_tasks import storage
from sailor_tasks.data.copier import copy_dataset, seal
from sailor_tasks.data.manifest import MANIFEST_NAME, read_manifest, verify
from sailor_tasks.errors import DataIntegrityError


@pytest.fixture
def src(tmp_path):
    root = f"file://{tmp_path}/src"
    storage.write_bytes(f"{root}/a.txt", b"alpha" * 1000)
    storage.write_bytes(f"{root}/sub/b.bin", os.urandom(50_000))
    seal(root)
    return root


def test_copy_writes_files_and_matching_manifest_last(src, tmp_path):
    dst = f"file://{tmp_path}/dst"
    result = copy_dataset(src, dst)
    assert [f.path for f in result.manifest.files] == ["a.txt", "sub/b.bin"]
    assert read_manifest(dst).files == read_manifest(src).files
    verify(dst, read_manifest(dst))
    assert result.bytes_copied == 5000 + 50_000


def test_second_copy_is_a_no_op_and_partial_copy_resumes(src, tmp_path):
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    assert copy_dataset(src, dst).bytes_copied == 0
    storage.remove(f"{dst}/{MANIFEST_NAME}")  # as if killed before the manifest was written
    storage.remove(f"{dst}/sub/b.bin")
    again = copy_dataset(src, dst)
    assert again.bytes_skipped == 5000 and again.bytes_copied == 50_000


class _ConnectionLost(OSError):
    pass


class _BreakingReader:
    """A file opened for reading that delivers ``good_bytes`` bytes, then fails (connection lost)."""

    def __init__(self, f, good_bytes: int, failures: list[str], name: str):
        self._f, self._left, self._failures, self._name = f, good_bytes, failures, name

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            self._failures.append(self._name)
            raise _ConnectionLost(f"connection lost reading {self._name}")
        chunk = self._f.read(self._left if n < 0 else min(n, self._left))
        self._left -= len(chunk)
        return chunk

    def __enter__(self) -> _BreakingReader:
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()


class _FailingReads:
    """A filesystem whose reads of one path break after ``good_bytes``; all else is the real one."""

    def __init__(self, fs, failing_path: str, good_bytes: int, failures: list[str]):
        self._fs, self._failing_path = fs, failing_path
        self._good_bytes, self._failures = good_bytes, failures

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def open(self, path, mode="rb", **kw):
        f = self._fs.open(path, mode, **kw)
        if path == self._failing_path and "r" in mode:
            return _BreakingReader(f, self._good_bytes, self._failures, path)
        return f


def test_copy_interrupted_mid_file_leaves_no_manifest_and_a_rerun_completes(src, tmp_path, monkeypatch):
    dst = f"file://{tmp_path}/dst"
    real_filesystem = storage.filesystem
    b_uri = storage.join(src, "sub/b.bin")
    failures: list[str] = []

    def filesystem(uri):
        fs, path = real_filesystem(uri)
        if uri == b_uri:  # the copier's read of sub/b.bin breaks after 1,000 of its 50,000 bytes
            return _FailingReads(fs, path, 1000, failures), path
        return fs, path

    monkeypatch.setattr(storage, "filesystem", filesystem)
    with pytest.raises(_ConnectionLost, match="b.bin"):
        copy_dataset(src, dst, max_workers=1)
    assert len(failures) == 1 and failures[0].endswith("sub/b.bin")  # the copier's own read broke
    # a.txt was copied, b.bin is at most a stub, and nothing claims the copy is complete
    assert (tmp_path / "dst" / "a.txt").read_bytes() == b"alpha" * 1000
    stub = tmp_path / "dst" / "sub" / "b.bin"
    assert not stub.exists() or stub.stat().st_size < 50_000
    assert read_manifest(dst) is None
    assert not (tmp_path / "dst" / MANIFEST_NAME).exists()

    monkeypatch.setattr(storage, "filesystem", real_filesystem)
    again = copy_dataset(src, dst, max_workers=1)
    assert again.bytes_skipped == 5000 and again.bytes_copied == 50_000  # a.txt kept, b.bin recopied
    assert read_manifest(dst).files == read_manifest(src).files
    verify(dst, read_manifest(dst))
    assert stub.read_bytes() == (tmp_path / "src" / "sub" / "b.bin").read_bytes()


def test_source_that_changed_since_sealing_is_rejected(src, tmp_path):
    storage.write_bytes(f"{src}/a.txt", b"tampered")
    with pytest.raises(DataIntegrityError, match="a.txt"):
        copy_dataset(src, f"file://{tmp_path}/dst")


def test_source_missing_a_file_its_manifest_lists_is_refused_and_the_replica_left_as_it_was(src, tmp_path):
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    storage.write_bytes(f"{src}/a.txt", b"omega" * 1000)
    seal(src)  # a new version of the dataset...
    before = read_manifest(dst)
    storage.remove(f"{src}/sub/b.bin")  # ...that then lost a file its manifest lists
    with pytest.raises(DataIntegrityError, match=r"source incomplete for .*sub/b\.bin.*no such file"):
        copy_dataset(src, dst)
    assert read_manifest(dst) == before  # the old complete replica still stands
    with pytest.raises(DataIntegrityError, match=r"sub/b\.bin"):
        copy_dataset(src, f"file://{tmp_path}/fresh")
    assert read_manifest(f"file://{tmp_path}/fresh") is None  # never marked complete


def test_verify_detects_a_flipped_byte(src, tmp_path):
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    path = tmp_path / "dst" / "sub" / "b.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataIntegrityError, match="b.bin"):
        verify(dst, read_manifest(dst))


def _reseal_with_new_bytes(src: str) -> None:
    """The source dataset is rewritten (new bytes in every file) and sealed again."""
    storage.write_bytes(f"{src}/a.txt", b"omega" * 1000)
    storage.write_bytes(f"{src}/sub/b.bin", os.urandom(50_000))
    seal(src)


def test_a_recopy_removes_the_old_manifest_before_it_overwrites_a_file(src, tmp_path, monkeypatch):
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    _reseal_with_new_bytes(src)
    real_filesystem = storage.filesystem
    b_uri = storage.join(src, "sub/b.bin")

    def filesystem(uri):
        fs, path = real_filesystem(uri)
        return (_FailingReads(fs, path, 1000, []), path) if uri == b_uri else (fs, path)

    monkeypatch.setattr(storage, "filesystem", filesystem)
    with pytest.raises(_ConnectionLost):
        copy_dataset(src, dst, max_workers=1)
    # a.txt holds the new bytes: the old manifest must not vouch for the folder any more
    assert (tmp_path / "dst" / "a.txt").read_bytes() == b"omega" * 1000
    assert read_manifest(dst) is None


def copy_with_b_broken(src: str, dst: str, monkeypatch) -> None:
    """Copy ``src`` to ``dst`` while reading ``sub/b.bin`` breaks after 1,000 bytes (the copy
    raises); ``storage.filesystem`` is the real one again afterwards."""
    real_filesystem = storage.filesystem
    b_uri = storage.join(src, "sub/b.bin")

    def filesystem(uri):
        fs, path = real_filesystem(uri)
        return (_FailingReads(fs, path, 1000, []), path) if uri == b_uri else (fs, path)

    monkeypatch.setattr(storage, "filesystem", filesystem)
    try:
        with pytest.raises(_ConnectionLost):
            copy_dataset(src, dst, max_workers=1)
    finally:
        monkeypatch.setattr(storage, "filesystem", real_filesystem)


def test_an_interrupted_file_never_appears_under_its_name(src, tmp_path, monkeypatch):
    dst = f"file://{tmp_path}/dst"
    copy_with_b_broken(src, dst, monkeypatch)
    assert sorted(p.name for p in (tmp_path / "dst" / "sub").iterdir()) == []  # no stub, no temporary


def test_unchanged_files_of_a_source_without_manifest_are_not_copied_again(tmp_path):
    src, dst = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    storage.write_bytes(f"{src}/a.txt", b"alpha" * 1000)
    storage.write_bytes(f"{src}/sub/b.bin", os.urandom(50_000))
    first = copy_dataset(src, dst)
    assert first.bytes_copied == 55_000 and read_manifest(src) is None
    invalidated, completed = [], []
    again = copy_dataset(src, dst, on_invalidate=lambda: invalidated.append(1), on_complete=completed.append)
    assert (again.bytes_copied, again.bytes_skipped) == (0, 55_000)
    # Nothing changed: the replica stayed complete throughout, its manifest as it was.
    assert invalidated == [] and completed == [read_manifest(dst)] == [first.manifest]
    storage.write_bytes(f"{src}/a.txt", b"gamma" * 1000)  # same size, other bytes
    third = copy_dataset(src, dst, on_invalidate=lambda: invalidated.append(1))
    assert (third.bytes_copied, third.bytes_skipped) == (5000, 50_000) and invalidated == [1]
    verify(dst, read_manifest(dst))
    assert (tmp_path / "dst" / "a.txt").read_bytes() == b"gamma" * 1000


def test_a_retried_copy_of_a_source_without_manifest_keeps_the_files_already_placed(tmp_path, monkeypatch):
    src, dst = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    storage.write_bytes(f"{src}/a.txt", b"alpha" * 1000)
    storage.write_bytes(f"{src}/sub/b.bin", os.urandom(50_000))
    copy_with_b_broken(src, dst, monkeypatch)  # a.txt placed, then the copy died: no manifest anywhere
    assert read_manifest(dst) is None and (tmp_path / "dst" / "a.txt").exists()
    again = copy_dataset(src, dst, max_workers=1)
    assert (again.bytes_copied, again.bytes_skipped) == (50_000, 5000)
    fresh = copy_dataset(src, f"file://{tmp_path}/fresh")
    assert read_manifest(dst).files == fresh.manifest.files
    verify(dst, read_manifest(dst))
    # A file the source changed between the tries (same size, other bytes) is copied again.
    storage.remove(f"{dst}/{MANIFEST_NAME}")
    storage.write_bytes(f"{src}/a.txt", b"gamma" * 1000)
    third = copy_dataset(src, dst, max_workers=1)
    assert (third.bytes_copied, third.bytes_skipped) == (5000, 50_000)
    assert (tmp_path / "dst" / "a.txt").read_bytes() == b"gamma" * 1000
    verify(dst, read_manifest(dst))


def test_concurrent_copies_of_one_replica_run_one_after_the_other(src, tmp_path, monkeypatch):
    import threading
    import time

    from sailor_tasks.data import copier

    dst = f"file://{tmp_path}/dst"
    events: list[tuple[str, str]] = []
    real_copy_one = copier._copy_one

    def slow_copy_one(s, d):
        who = threading.current_thread().name
        events.append((who, "start"))
        time.sleep(0.2)
        out = real_copy_one(s, d)
        events.append((who, "end"))
        return out

    monkeypatch.setattr(copier, "_copy_one", slow_copy_one)
    results = {}

    def copy(name):
        results[name] = copy_dataset(src, dst, max_workers=1)

    threads = [threading.Thread(target=copy, args=(n,), name=n) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    who = [w for w, _ in events]
    assert who == sorted(who, key=who.index)  # one copy's files, then (if any) the other's
    assert sorted(r.bytes_copied for r in results.values()) == [0, 55_000]  # the second found it done
    verify(dst, read_manifest(dst))


def test_temporaries_of_a_killed_copier_are_never_data_and_are_removed(tmp_path):
    """kill -9 of a copier writing a local replica leaves a temporary file: it is not listed as a
    dataset file, and the next copy into the replica deletes it and completes."""
    import signal
    import subprocess
    import sys
    import time

    from sailor_tasks.data.copier import list_files

    src = f"file://{tmp_path}/src"
    storage.write_bytes(f"{src}/big.bin", os.urandom(2_000_000))
    seal(src)
    dst = f"file://{tmp_path}/dst"
    url = f"sqlite:///{tmp_path}/ledger.db"
    proc = subprocess.Popen([sys.executable, "-m", "sailor_tasks.testing.faults", "copy", src, dst, url])
    folder = tmp_path / "dst"
    try:
        deadline = time.monotonic() + 60
        while not any(storage.is_temporary(p.name) and p.stat().st_size > 100_000 for p in folder.glob("*")):
            assert proc.poll() is None and time.monotonic() < deadline, (
                "the copier ended before it was killed"
            )
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (leftover,) = [p for p in folder.glob("*") if storage.is_temporary(p.name)]
    assert 0 < leftover.stat().st_size < 2_000_000
    assert list_files(dst) == []  # a partial temporary is no dataset file
    again = copy_dataset(src, dst, max_workers=1)
    assert again.bytes_copied == 2_000_000 and not leftover.exists()
    assert [p.name for p in folder.glob("*") if storage.is_temporary(p.name)] == []
    assert list_files(dst) == [("big.bin", 2_000_000)]
    verify(dst, read_manifest(dst))


def test_a_failed_refresh_of_a_replica_is_forgotten_by_the_ledger_until_a_copy_completes(
    ctx, demo_dataset, monkeypatch
):
    """The replica's manifest goes before its files change; the ledger's row must go with it, or
    the rebalance and the placement keep counting a half-refreshed replica as complete."""
    from sailor_tasks import paths, stages
    from sailor_tasks.data import copier

    copy = {"dataset_uri": demo_dataset, "region": "europe-west4", "bytes": 128_000}
    stages.replicate_dataset(copy, ctx=ctx)
    assert ctx.ledger.replicas([demo_dataset]) == {demo_dataset: ("europe-west4",)}
    src = storage.resolve(demo_dataset, ctx.settings)
    for name in sorted(os.listdir(storage.filesystem(src)[1])):
        if name != MANIFEST_NAME:
            storage.write_bytes(storage.join(src, name), os.urandom(1000))  # the owner rewrites it
    seal(src)
    real, calls = copier._copy_one, []

    def reset_on_second(s, d):
        calls.append(d)
        if len(calls) == 2:
            raise OSError("connection reset")
        return real(s, d)

    monkeypatch.setattr(copier, "_copy_one", reset_on_second)
    with pytest.raises(OSError, match="connection reset"):
        stages.replicate_dataset(copy, ctx=ctx)
    dst = paths.replica_uri("europe-west4", demo_dataset, ctx.settings)
    assert read_manifest(dst) is None and ctx.ledger.replicas([demo_dataset]) == {}
    monkeypatch.setattr(copier, "_copy_one", real)
    stages.replicate_dataset(copy, ctx=ctx)  # the next copy completes it: listed again
    assert ctx.ledger.replicas([demo_dataset]) == {demo_dataset: ("europe-west4",)}
    assert read_manifest(dst).files == read_manifest(src).files


def test_a_copy_that_waited_for_the_lease_copies_the_source_as_it_is_then(src, tmp_path):
    """While this copy waited for the replica's lease, the source was sealed anew and another copy
    placed that version: this one finds the replica complete, instead of judging it by the
    manifest it read before waiting (it would invalidate the good replica and fail)."""
    import contextlib

    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)

    @contextlib.contextmanager
    def lease_after_another_copy(name):
        storage.write_bytes(f"{src}/a.txt", b"beta" * 1000)  # the owner's new version
        seal(src)
        copy_dataset(src, dst)  # the copy that held the lease meanwhile
        yield None

    result = copy_dataset(src, dst, lease=lease_after_another_copy)
    assert result.bytes_copied == 0
    assert read_manifest(dst).files == read_manifest(src).files
    verify(dst, read_manifest(dst))


def test_an_unreadable_source_manifest_is_named_and_a_damaged_replica_manifest_is_copied_again(src, tmp_path):
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    storage.write_bytes(f"{dst}/{MANIFEST_NAME}", b'{"dataset_uri": "x", "files": [')  # cut short
    assert copy_dataset(src, dst).bytes_copied == 0  # its files were sound: checked, not re-sent
    verify(dst, read_manifest(dst))

    manifest = storage.read_json(f"{src}/{MANIFEST_NAME}")
    manifest["files"][0]["md5"] = "00"  # a field SAILOR does not write
    storage.write_json(f"{src}/{MANIFEST_NAME}", manifest)
    with pytest.raises(DataIntegrityError, match=f"unreadable manifest for {src}/{MANIFEST_NAME}"):
        copy_dataset(src, f"file://{tmp_path}/other")


def test_files_a_sealed_source_does_not_list_are_not_copied(src, tmp_path):
    """Files added to a sealed source after sealing are not part of that version: copied, the
    replica would never equal the source's manifest and every copy would redo it."""
    storage.write_bytes(f"{src}/later.txt", b"l" * 500)
    dst = f"file://{tmp_path}/dst"
    first = copy_dataset(src, dst)
    assert [e.path for e in first.manifest.files] == ["a.txt", "sub/b.bin"]
    assert not storage.exists(f"{dst}/later.txt")
    assert copy_dataset(src, dst).bytes_copied == 0  # complete: nothing invalidated or copied again


@pytest.mark.parametrize(("before", "after"), [("a", "a/part"), ("a/part", "a")])
def test_a_path_that_turned_from_file_to_folder_or_back_is_copied(tmp_path, before, after):
    """The source's "a" became a folder "a/part" (or the reverse): the replica's old path is in the
    way of the new one, and goes before it is written (else every retry failed)."""
    src, dst = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    storage.write_bytes(f"{src}/keep.txt", b"k" * 100)
    storage.write_bytes(f"{src}/{before}", b"old" * 100)
    copy_dataset(src, dst)
    storage.remove(f"{src}/a", recursive=True)
    storage.write_bytes(f"{src}/{after}", b"new" * 100)
    copy_dataset(src, dst)
    assert [e.path for e in read_manifest(dst).files] == sorted([after, "keep.txt"])
    assert storage.read_bytes(f"{dst}/{after}") == b"new" * 100
    verify(dst, read_manifest(dst))


def test_a_dataset_holding_symbolic_links_is_refused_naming_them(tmp_path):
    """Links are never followed (one could lead out of the dataset), and never silently dropped:
    a folder of links (a Hugging Face snapshot) was refused as "no files", a mix copied partly."""
    from sailor_tasks.data.copier import list_files
    from sailor_tasks.errors import InvalidRequestError

    root = tmp_path / "src"
    (root / "blobs").mkdir(parents=True)
    (root / "blobs" / "x").write_bytes(b"x" * 100)
    (root / "real.txt").write_bytes(b"r" * 100)
    (root / "train.txt").symlink_to("blobs/x")
    for call in (
        lambda: list_files(f"file://{root}"),
        lambda: copy_dataset(f"file://{root}", f"file://{tmp_path}/d"),
    ):
        with pytest.raises(InvalidRequestError, match=r"holds 1 symbolic link\(s\) \(train.txt\)"):
            call()
    assert not os.path.exists(tmp_path / "d")


def test_a_local_file_whose_name_holds_a_double_colon_is_copied_as_itself(tmp_path):
    """fsspec reads ``a::b.txt`` in a URL as a chain of filesystems (the file ``a``): the copy
    and its manifest name the file itself, so the replica holds both files, byte for byte."""
    root = f"file://{tmp_path}/src"
    storage.write_bytes(f"{root}/a", b"AAAA")
    storage.write_bytes(f"{root}/a::b.txt", b"the real b")
    assert storage.read_bytes(f"{root}/a::b.txt") == b"the real b"
    seal(root)
    dst = f"file://{tmp_path}/dst"
    result = copy_dataset(root, dst)
    assert {f.path: f.size for f in result.manifest.files} == {"a": 4, "a::b.txt": 10}
    assert (tmp_path / "dst" / "a::b.txt").read_bytes() == b"the real b"
    verify(dst, read_manifest(dst))


def test_once_the_lease_is_lost_no_file_is_copied_or_removed(src, tmp_path):
    """Another copier may own the replica once this one's lease is lost: the copy stops before
    the next file, and a file that does not match its manifest entry is left for the new owner
    instead of removed (on an object store it may be the new owner's good copy)."""
    from sailor_tasks.data.copier import _place_file
    from sailor_tasks.errors import LeaseLostError
    from sailor_tasks.model import ManifestEntry

    def lost():
        raise LeaseLostError("replica:x", "me")

    dst = f"file://{tmp_path}/dst"
    info = {"size": 5000, "type": "file"}
    with pytest.raises(LeaseLostError):
        _place_file("a.txt", f"{src}/a.txt", f"{dst}/a.txt", None, False, info, None, fence=lost)
    assert not os.path.exists(f"{tmp_path}/dst/a.txt")  # nothing copied
    calls = []

    def lost_after_the_copy():
        calls.append(1)
        if len(calls) > 1:
            lost()

    stale = ManifestEntry(path="a.txt", size=5000, sha256="0" * 64)  # the version it was asked for
    with pytest.raises(LeaseLostError):
        _place_file(
            "a.txt", f"{src}/a.txt", f"{dst}/a.txt", stale, False, info, None, fence=lost_after_the_copy
        )
    assert (tmp_path / "dst" / "a.txt").read_bytes() == b"alpha" * 1000  # not removed


def test_a_copy_whose_lease_is_lost_stops_and_writes_no_manifest(src, tmp_path):
    from contextlib import contextmanager

    from sailor_tasks.errors import LeaseLostError

    class Held:
        def __init__(self):
            self.fences = 0

        def raise_if_lost(self):
            self.fences += 1
            if self.fences > 1:  # lost once the first file is under way
                raise LeaseLostError("replica:x", "me")

        def check(self):
            self.raise_if_lost()

    @contextmanager
    def lease(name):
        yield Held()

    dst = f"file://{tmp_path}/dst"
    with pytest.raises(LeaseLostError):
        copy_dataset(src, dst, lease=lease, max_workers=1)
    assert not storage.exists(f"{dst}/{MANIFEST_NAME}")
    assert [p for p in ("a.txt", "sub/b.bin") if storage.exists(f"{dst}/{p}")] == ["a.txt"]
