"""Dataset copies on gs:// against a real GCS API server: placement, replication between region
buckets, resume, and checksum verification from object metadata."""

from __future__ import annotations

import os

import pytest

from sailor_tasks import storage
from sailor_tasks.data.copier import copy_dataset, seal
from sailor_tasks.data.manifest import MANIFEST_NAME, read_manifest, verify
from sailor_tasks.errors import DataIntegrityError

pytestmark = pytest.mark.gcs


@pytest.fixture
def local_src(tmp_path):
    root = f"file://{tmp_path}/src"
    for i in range(6):
        storage.write_bytes(f"{root}/part-{i}.bin", os.urandom(30_000 + i))
    storage.write_bytes(f"{root}/sub/meta.txt", b"meta" * 100)
    seal(root)
    return root


def test_local_to_gcs_copy_matches_manifest_and_stored_crc32c(gcs, local_src):
    dst = f"{gcs()}/datasets/d"
    result = copy_dataset(local_src, dst, max_workers=4)
    assert read_manifest(dst).files == read_manifest(local_src).files
    verify(dst, read_manifest(dst))  # sha256 of every object, read back from GCS
    for entry in read_manifest(dst).files:
        local_crc, _ = storage.crc32c(storage.join(local_src, entry.path))
        assert storage.stored_crc32c(storage.join(dst, entry.path)) == local_crc
    assert result.bytes_copied == read_manifest(local_src).total_bytes


def test_replication_between_region_buckets_is_server_side_and_resumes(gcs, local_src):
    west, east = gcs(), gcs()
    a, b = f"{west}/datasets/d", f"{east}/datasets/d"
    copy_dataset(local_src, a)
    first = copy_dataset(a, b)  # gs:// → gs:// with a source manifest: server-side, crc32c-checked
    assert read_manifest(b).files == read_manifest(a).files
    verify(b, read_manifest(b))
    assert first.bytes_copied == read_manifest(a).total_bytes

    assert copy_dataset(a, b).bytes_copied == 0  # complete copy: nothing to do
    # Killed before the manifest, with one object missing: only that object moves again.
    storage.remove(f"{b}/{MANIFEST_NAME}")
    storage.remove(f"{b}/part-3.bin")
    again = copy_dataset(a, b)
    assert again.bytes_copied == 30_003
    assert again.bytes_skipped == read_manifest(a).total_bytes - 30_003
    verify(b, read_manifest(b))


def test_stale_object_in_destination_is_replaced_not_trusted(gcs, local_src):
    dst = f"{gcs()}/d"
    copy_dataset(local_src, dst)
    storage.remove(f"{dst}/{MANIFEST_NAME}")
    storage.write_bytes(f"{dst}/part-0.bin", b"x" * 30_000)  # same size, other bytes
    again = copy_dataset(local_src, dst)
    assert again.bytes_copied == 30_000
    verify(dst, read_manifest(dst))


def test_source_changed_since_sealing_fails_and_leaves_nothing_behind(gcs, local_src, tmp_path):
    storage.write_bytes(f"{local_src}/part-2.bin", b"tampered")
    dst = f"{gcs()}/d"
    with pytest.raises(DataIntegrityError, match="part-2.bin"):
        copy_dataset(local_src, dst, max_workers=1)
    assert not storage.exists(f"{dst}/part-2.bin")
    assert read_manifest(dst) is None


def test_gcs_source_changed_in_place_since_its_manifest_fails_the_server_side_copy(gcs, local_src):
    """The source's objects are copied inside GCS, so no byte passes the copier's sha256: the copy
    is checked against the crc32c the source manifest recorded, not the changed source's own."""
    a, b = f"{gcs()}/datasets/d", f"{gcs()}/datasets/d"
    copy_dataset(local_src, a)
    storage.write_bytes(f"{a}/part-2.bin", os.urandom(30_002))  # same size, other bytes
    with pytest.raises(DataIntegrityError, match="part-2.bin"):
        copy_dataset(a, b, max_workers=1)
    assert not storage.exists(f"{b}/part-2.bin")
    assert read_manifest(b) is None


def test_a_replica_object_matching_a_changed_source_is_not_taken_for_the_listed_bytes(gcs, local_src):
    """A resumed copy skips destination objects already there; "there" means the bytes the source
    manifest lists, not whatever the source holds now."""
    a, b = f"{gcs()}/datasets/d", f"{gcs()}/datasets/d"
    copy_dataset(local_src, a)
    copy_dataset(a, b)
    changed = os.urandom(30_002)
    storage.write_bytes(f"{a}/part-2.bin", changed)  # same size, other bytes
    storage.write_bytes(f"{b}/part-2.bin", changed)
    storage.remove(f"{b}/{MANIFEST_NAME}")
    with pytest.raises(DataIntegrityError, match="part-2.bin"):
        copy_dataset(a, b, max_workers=1)
    assert read_manifest(b) is None


def test_a_source_manifest_without_crc32c_is_streamed_and_checked_by_sha256(gcs, local_src):
    """A manifest written before crc32c was recorded: nothing to check a server-side copy against,
    so the bytes are streamed (sha256-checked), and the replica's manifest records crc32c."""
    a = f"{gcs()}/datasets/d"
    copy_dataset(local_src, a)
    old = storage.read_json(f"{a}/{MANIFEST_NAME}")
    for entry in old["files"]:
        del entry["crc32c"]
    storage.write_json(f"{a}/{MANIFEST_NAME}", old)
    b = f"{gcs()}/datasets/d"
    copy_dataset(a, b)
    assert all(e.crc32c is not None for e in read_manifest(b).files)
    verify(b, read_manifest(b))
    invalidated = []
    again = copy_dataset(a, b, on_invalidate=lambda: invalidated.append(b))
    assert again.bytes_copied == 0 and invalidated == []  # the old manifest matches the new one

    storage.write_bytes(f"{a}/part-2.bin", os.urandom(30_002))  # same size, other bytes
    c = f"{gcs()}/datasets/d"
    with pytest.raises(DataIntegrityError, match="part-2.bin"):
        copy_dataset(a, c, max_workers=1)
    assert not storage.exists(f"{c}/part-2.bin")


def test_manifests_record_the_crc32c_of_every_file(gcs, local_src):
    for entry in read_manifest(local_src).files:
        assert entry.crc32c == storage.crc32c(storage.join(local_src, entry.path))[0]
    dst = f"{gcs()}/raw"
    storage.write_bytes(f"{dst}/a.txt", b"alpha" * 500)
    placed = copy_dataset(dst, f"{gcs()}/placed").manifest  # streamed: crc32c computed on the way
    assert [e.crc32c for e in placed.files] == [storage.stored_crc32c(f"{dst}/a.txt")]


def test_gcs_source_without_manifest_is_streamed_and_sealed_at_destination(gcs, tmp_path):
    src = f"{gcs()}/raw"
    storage.write_bytes(f"{src}/a.txt", b"alpha" * 500)
    storage.write_bytes(f"{src}/b/c.txt", b"gamma" * 700)
    dst = f"{gcs()}/placed"
    result = copy_dataset(src, dst)
    assert [f.path for f in result.manifest.files] == ["a.txt", "b/c.txt"]
    verify(dst, read_manifest(dst))


def test_a_retried_copy_between_buckets_of_an_unsealed_source_reads_no_placed_file_from_the_source(
    gcs, monkeypatch
):
    from sailor_tasks.data import copier

    src = f"{gcs()}/raw"
    storage.write_bytes(f"{src}/a.txt", b"alpha" * 500)
    storage.write_bytes(f"{src}/b/c.txt", b"gamma" * 700)
    dst = f"{gcs()}/placed"
    copy_dataset(src, dst)
    storage.remove(f"{dst}/{MANIFEST_NAME}")  # as if killed before the manifest was written
    storage.remove(f"{dst}/b/c.txt")
    streamed, hashed = [], []
    real_copy, real_sums = copier._copy_one, copier.checksums_of
    monkeypatch.setattr(copier, "_copy_one", lambda s, d: streamed.append(s) or real_copy(s, d))
    monkeypatch.setattr(copier, "checksums_of", lambda u: hashed.append(u) or real_sums(u))
    again = copy_dataset(src, dst)
    assert (again.bytes_copied, again.bytes_skipped) == (3500, 2500)
    assert streamed == [f"{src}/b/c.txt"] and hashed == [f"{dst}/a.txt"]  # a.txt: read in the replica only
    verify(dst, read_manifest(dst))


def test_concurrent_copies_into_one_gcs_replica_run_one_after_the_other(
    gcs, local_src, tmp_path, monkeypatch
):
    """Two place_data of one dataset and region on two machines: each holds the replica's ledger
    lease (a Ledger per machine on one database), so the second copies nothing."""
    import threading
    import time

    from sailor_tasks.data import copier
    from sailor_tasks.ledger import Ledger

    dst = f"{gcs()}/datasets/d"
    url = f"sqlite:///{tmp_path}/ledger.db"
    events: list[tuple[str, str]] = []
    real_copy_one = copier._copy_one

    def slow_copy_one(s, d):
        who = threading.current_thread().name
        events.append((who, "start"))
        time.sleep(0.05)
        out = real_copy_one(s, d)
        events.append((who, "end"))
        return out

    monkeypatch.setattr(copier, "_copy_one", slow_copy_one)
    results = {}

    def copy(name):
        ledger = Ledger(url)
        results[name] = copy_dataset(
            local_src, dst, max_workers=1, lease=lambda n: ledger.lease(n, poll_s=0.05)
        )

    threads = [threading.Thread(target=copy, args=(n,), name=n) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    who = [w for w, _ in events]
    assert len(who) == 14 and who == sorted(who, key=who.index)  # one copy's 7 files, no interleaving
    total = read_manifest(local_src).total_bytes
    assert sorted(r.bytes_copied for r in results.values()) == [0, total]  # the second found it done
    verify(dst, read_manifest(dst))
    assert Ledger(url).live_leases() == []


def test_copier_killed_mid_copy_into_gcs_lets_the_next_copy_finish(gcs, tmp_path):
    """kill -9 of a copier holding the replica's lease: nothing partial is published, its lease
    expires, and the next copier takes it over and completes a verified replica."""
    import signal
    import subprocess
    import sys
    import time

    from sailor_tasks.ledger import Ledger

    src = f"file://{tmp_path}/src"
    for i in range(3):
        storage.write_bytes(f"{src}/part-{i}.bin", os.urandom(400_000))
    seal(src)
    dst = f"{gcs()}/datasets/d"
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger(url)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sailor_tasks.testing.faults",
            "copy",
            src,
            dst,
            url,
            "--ttl",
            "1.5",
            "--delay",
            "0.002",
        ]
    )
    try:
        deadline = time.monotonic() + 60
        while ledger.lease_holder(f"replica:{dst}") is None or not storage.exists(f"{dst}/part-0.bin"):
            assert proc.poll() is None and time.monotonic() < deadline, (
                "the copier ended before it was killed"
            )
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert ledger.lease_holder(f"replica:{dst}") is not None  # the dead copier's lease, not yet expired
    assert read_manifest(dst) is None
    for name in storage.listdir(dst):  # whatever is there is a whole file
        assert storage.read_bytes(f"{dst}/{name}") == storage.read_bytes(f"{src}/{name}")
    started = time.monotonic()
    result = copy_dataset(src, dst, lease=lambda n: ledger.lease(n, ttl_s=1.5, poll_s=0.05))
    assert time.monotonic() - started < 10
    assert result.bytes_skipped >= 400_000  # the killed copier's finished file is kept
    verify(dst, read_manifest(dst))
    assert ledger.live_leases() == []


def test_names_with_glob_characters_are_names_on_gcs(gcs, tmp_path):
    """fsspec reads a path given to rm or copy as a glob pattern: '?', '*' and '[...]' in an object's
    name would match other objects. Removing, renaming and copying one touch that object only."""
    bucket = gcs()
    for name in ("a?.txt", "ab.txt", "x[1].txt", "x1.txt", "d[1]/f", "d1/f", "s*.txt", "sx.txt"):
        storage.write_bytes(f"{bucket}/{name}", name.encode())
    storage.remove(f"{bucket}/a?.txt")
    storage.remove(f"{bucket}/x[1].txt")
    storage.remove(f"{bucket}/d[1]", recursive=True)
    storage.rename(f"{bucket}/s*.txt", f"{bucket}/moved/s*.txt")
    storage.copy_object(f"{bucket}/sx.txt", f"{bucket}/copied/what?.txt")
    fs, root = storage.filesystem(bucket)
    left = sorted(p[len(root) + 1 :] for p in fs.find(root))
    assert left == ["ab.txt", "copied/what?.txt", "d1/f", "moved/s*.txt", "sx.txt", "x1.txt"]
    assert storage.read_bytes(f"{bucket}/copied/what?.txt") == b"sx.txt"


def test_a_dropped_file_with_a_glob_name_leaves_the_rest_of_the_replica(gcs, tmp_path):
    """The source drops 'a?.txt'; the next copy removes it from the replica, not 'ab.txt' too."""
    src = f"file://{tmp_path}/src"
    storage.write_bytes(f"{src}/ab.txt", b"b" * 100)
    storage.write_bytes(f"{src}/a?.txt", b"q" * 100)
    dst = f"{gcs()}/datasets/d"
    copy_dataset(src, dst)
    os.remove(tmp_path / "src" / "a?.txt")
    copy_dataset(src, dst)
    assert [e.path for e in read_manifest(dst).files] == ["ab.txt"]
    verify(dst, read_manifest(dst))


def test_a_folder_placeholder_in_a_gcs_dataset_is_no_file(gcs, tmp_path):
    """The Cloud Console's "create folder" leaves a zero-byte object named "sub/": copies, seal
    and server-side replication skip it instead of failing on it or listing it as a file."""
    bucket = gcs()
    fs, root = storage.filesystem(bucket)
    storage.write_bytes(f"{bucket}/ds/sub/x.txt", b"x" * 100)
    storage.write_bytes(f"{bucket}/ds/top.txt", b"t" * 50)
    fs.pipe_file(f"{root}/ds/sub/", b"")
    src = f"{bucket}/ds"
    files = ["sub/x.txt", "top.txt"]
    assert [e.path for e in copy_dataset(src, f"file://{tmp_path}/dst").manifest.files] == files
    assert [e.path for e in copy_dataset(src, f"{gcs()}/datasets/d").manifest.files] == files
    assert [e.path for e in seal(src).files] == files
    east = f"{gcs()}/datasets/e"
    assert [e.path for e in copy_dataset(src, east).manifest.files] == files
    verify(east, read_manifest(east))


def test_an_object_name_ending_in_hash_digits_is_a_name_not_a_version(gcs, tmp_path):
    """gcsfs reads "name#123" in a URL as generation 123 of "name": SAILOR's paths are names."""
    src = f"file://{tmp_path}/src"
    storage.write_bytes(f"{src}/chapter#2", b"second" * 10)
    storage.write_bytes(f"{src}/chapter", b"first" * 10)
    dst = f"{gcs()}/datasets/d"
    copy_dataset(src, dst)
    fs, root = storage.filesystem(dst)
    assert sorted(p[len(root) + 1 :] for p in fs.find(root)) == [MANIFEST_NAME, "chapter", "chapter#2"]
    assert storage.read_bytes(f"{dst}/chapter#2") == b"second" * 10
    verify(dst, read_manifest(dst))


def test_an_object_name_with_an_empty_segment_is_refused_naming_it(gcs):
    """``ds//x`` is not ``ds/x`` (another object) and no file path names it: the dataset is
    refused, naming the object, instead of one object silently overwriting the other or every
    copy failing on a name it cannot find."""
    from sailor_tasks.errors import InvalidRequestError

    root = f"{gcs()}/ds"
    storage.write_bytes(f"{root}/x", b"plain")
    fs, path = storage.filesystem(root)
    fs.pipe_file(f"{path}//x", b"doubled")
    with pytest.raises(InvalidRequestError, match=r"empty segment .*ds//x'.*without '//'"):
        copy_dataset(root, f"{gcs()}/dst")
