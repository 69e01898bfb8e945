"""Copy a dataset between buckets with fsspec: parallel, checksummed, resumable, manifest last.

The same copier serves ``place_data`` (source → the run's region) and the nightly replication.
A copy is complete only when the destination's manifest exists; files already present with the
right checksum are not copied again, so a retried task resumes instead of starting over.

Checksums: the manifest holds sha256 and crc32c per file (both computed on the way while
streaming). On GCS the copier also uses the crc32c the store records for every object, so nothing
is read back: an upload is verified against the crc32c computed while streaming, an existing
destination object is matched by metadata against the crc32c the source manifest lists, and a
``gs://`` → ``gs://`` copy with a source manifest is a server-side copy (bytes never pass through
the worker) whose result must carry that crc32c, so a source changed in place since its manifest
is refused. A manifest written before crc32c was recorded is streamed instead (sha256-checked), and
an existing object is matched against the source's current crc32c. Files are copied by
``max_workers`` threads.

A replica that will change loses its manifest before any file is touched; local files are written
under a temporary name and renamed. Copies into one replica are serialised: on a local disk by a
lock file, and on any store by a ledger lease when the caller passes one (``lease``; the stages
do), which a copier killed with kill -9 stops renewing so that it expires. Temporary files a
killed copier left are never listed as data, and the next copy into the replica deletes them. A
source without manifest is compared with the replica's previous manifest: unchanged files (size
and crc32c) are not copied again, and when no file changed the replica keeps its manifest (it is
never incomplete while another run may be reading it).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

import google_crc32c

from sailor_tasks import storage
from sailor_tasks.data.manifest import (
    CHUNK_BYTES,
    MANIFEST_NAME,
    checksums_of,
    manifest_uri,
    read_manifest,
    sha256_of,
)
from sailor_tasks.errors import DataIntegrityError, InvalidRequestError
from sailor_tasks.model import DatasetManifest, ManifestEntry

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, float], None]
"""Called with (bytes done, bytes total, seconds elapsed)."""
LeaseFn = Callable[[str], AbstractContextManager[Any]]
"""Given a lock name, a context manager holding it (``Ledger.lease``); what it yields may have a
``check()`` that raises when the lock was lost meanwhile (called before the manifest is written)."""

DEFAULT_COPY_WORKERS = 8
"""Files copied at once: object-store copies are latency-bound, so threads overlap round trips."""


@dataclass(frozen=True, slots=True)
class CopyResult:
    manifest: DatasetManifest
    bytes_copied: int
    bytes_skipped: int
    seconds: float


def _listing(root: str) -> dict[str, dict]:
    """relative path → fsspec info (size; on GCS also crc32c, md5Hash) of every file under ``root``
    except the manifest and folder placeholders, from one recursive listing.

    Raises:
        FileNotFoundError: ``root`` is absent.
        InvalidRequestError: ``root`` holds symbolic links (named).
    """
    fs, base = storage.filesystem(root)
    if not fs.exists(base):
        raise FileNotFoundError(root)
    found = fs.find(base, detail=True)
    base = base.rstrip("/")
    out = {}
    links, empty_segments = [], []
    for path, info in found.items():
        if path == base:
            continue  # ``root`` names one file: no dataset file (``empty_dataset_reason`` says so)
        rel = path[len(base) + 1 :] if path.startswith(f"{base}/") else path
        if rel.endswith("/") or info.get("name", path).endswith("/"):
            continue  # a folder placeholder (a zero-byte object "sub/" the Cloud Console makes)
        if info.get("islink"):
            links.append(rel)
            continue
        if "//" in f"/{rel}":  # an object name with an empty segment ("ds//x"): no path names it
            empty_segments.append(rel)
            continue
        if (
            rel
            and rel != MANIFEST_NAME
            and info.get("type", "file") == "file"
            and not storage.is_temporary(rel)
        ):
            out[rel] = info
    if empty_segments:
        # "ds//x" is neither "ds/x" (another object) nor a path a replica's folder can hold.
        raise InvalidRequestError(
            "dataset_uri",
            root,
            f"holds {len(empty_segments)} object(s) whose name has an empty segment "
            f"({', '.join(repr(f'{base}/{r}') for r in sorted(empty_segments)[:5])}): no file path "
            "names them; rename them without '//'",
        )
    if links:
        # Never followed (a link could lead out of the dataset), and never silently dropped.
        raise InvalidRequestError(
            "dataset_uri",
            root,
            f"holds {len(links)} symbolic link(s) ({', '.join(sorted(links)[:5])}): SAILOR copies files, "
            "not links; give a folder of the files themselves",
        )
    return out


def empty_dataset_reason(root: str) -> str:
    """Why ``root``, which lists no dataset file, is no dataset: it names one file, or a folder
    with no files."""
    fs, base = storage.filesystem(root)
    if fs.isfile(base):
        return "names a file; a dataset is a folder of files (give the folder that holds it)"
    return "the dataset folder has no files"


EMPTY_MANIFEST_REASON = f"its manifest ({MANIFEST_NAME}) lists no files: seal the folder again"
"""Why a sealed source whose manifest lists no file is no dataset (a copy of it would be an empty
replica, recorded complete)."""


def list_files(root: str) -> list[tuple[str, int]]:
    """(relative path, size) of every file under ``root`` except the manifest, sorted."""
    try:
        listing = _listing(root)
    except FileNotFoundError:
        raise InvalidRequestError(
            "dataset_uri", root, "dataset not found (no such folder or object)"
        ) from None
    return sorted((rel, int(info["size"])) for rel, info in listing.items())


def _log_progress(done: int, total: int, elapsed: float) -> None:
    rate = done / elapsed / 1e6 if elapsed > 0 else 0.0
    logger.info(
        "copied %.1f / %.1f MB (%.0f%%) at %.1f MB/s",
        done / 1e6,
        total / 1e6,
        100.0 * done / max(total, 1),
        rate,
    )


def _copy_one(src: str, dst: str) -> tuple[str, int, str]:
    """Stream ``src`` to ``dst`` hashing on the way; return (sha256, size, crc32c).

    On a local disk the bytes go to a temporary sibling renamed into place when complete, so a file
    under its own name is never partial; an object store publishes an object only once its upload
    completes.
    """
    sfs, spath = storage.filesystem(src)
    dfs, dpath = storage.filesystem(dst)
    local = not _is_object_store(dst)
    target = storage.temporary_name(dpath) if local else dpath
    digest, crc, size = hashlib.sha256(), google_crc32c.Checksum(), 0
    try:
        fout = dfs.open(target, "wb")
        try:
            with sfs.open(spath, "rb") as fin:
                while chunk := fin.read(CHUNK_BYTES):
                    digest.update(chunk)
                    crc.update(chunk)
                    fout.write(chunk)
                    size += len(chunk)
        except BaseException:
            if local:
                fout.close()  # the temporary, removed below
            else:
                _abandon_upload(fout)
            raise
        fout.close()  # an object store publishes the object here, complete
        if local:
            os.replace(target, dpath)
    except BaseException:
        if local:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
        raise
    return digest.hexdigest(), size, crc.hexdigest().decode()


def _abandon_upload(fout: Any) -> None:
    """Drop an unfinished object-store upload without publishing it: fsspec's buffered files
    commit what they hold when closed (``__exit__`` and ``__del__`` close them, even after an
    error), so the partial bytes would appear under the object's final name."""
    with contextlib.suppress(Exception):
        if hasattr(fout, "discard"):
            fout.discard()  # gcsfs: cancels a resumable upload already started
    fout.closed = True  # never flushed by a later close()


def _is_object_store(uri: str) -> bool:
    return storage.scheme_of(uri) not in ("", "file")


def _stored_crc(info: dict | None) -> str | None:
    """Hex crc32c from a GCS listing entry (base64 big-endian in the JSON API), if present."""
    value = (info or {}).get("crc32c")
    return base64.b64decode(value).hex() if value else None


def _already_there(src: str, dst: str, want: ManifestEntry, src_info: dict, dst_info: dict | None) -> bool:
    """Whether ``dst`` already holds the bytes of manifest entry ``want`` (copied by an earlier try).

    Object store: size and the stored crc32c match the entry's crc32c, from the listing (no reads);
    for an entry without one, the source's (a local source is hashed, which is cheap). Local disk:
    the destination's sha256 matches.
    """
    if dst_info is None or int(dst_info["size"]) != want.size:
        return False
    have_crc = _stored_crc(dst_info)
    if have_crc is not None:
        if want.crc32c is not None:
            return have_crc == want.crc32c
        src_crc = _stored_crc(src_info) or storage.crc32c(src)[0]
        return int(src_info["size"]) == want.size and src_crc == have_crc
    have, have_size = sha256_of(dst)
    return have == want.sha256 and have_size == want.size


def _same_bytes(
    src: str, dst: str, known: ManifestEntry, src_info: dict, dst_info: dict | None
) -> ManifestEntry | None:
    """``known`` (the replica's previous manifest entry for ``dst``, with its crc32c) when ``dst``
    still holds the bytes of a source file that has no manifest: equal sizes and crc32c (from the
    listings on an object store; computed on a local disk, a local read instead of a copy or
    egress); else None."""
    if dst_info is None or not int(src_info["size"]) == int(dst_info["size"]) == known.size:
        return None
    src_crc = _stored_crc(src_info) or storage.crc32c(src)[0]
    dst_crc = _stored_crc(dst_info) or storage.crc32c(dst)[0]
    if src_crc != dst_crc or known.crc32c not in (None, dst_crc):
        return None
    return replace(known, crc32c=dst_crc)


def _placed_before(
    rel: str, src: str, dst: str, src_info: dict, dst_info: dict | None
) -> ManifestEntry | None:
    """The entry of a file of a source without manifest that an earlier, interrupted copy already
    placed (no replica manifest records it): equal sizes and crc32c (from the listings on an
    object store, computed on a local disk); its sha256 from the local side when there is one,
    else read from the replica, in its own region (no egress). None when the replica lacks it or
    holds other bytes."""
    if dst_info is None or int(src_info["size"]) != int(dst_info["size"]):
        return None
    sums: tuple[str, int, str] | None = None
    src_crc = _stored_crc(src_info)
    if src_crc is None:
        sums = checksums_of(src)
        src_crc = sums[2]
    dst_crc = _stored_crc(dst_info)
    if dst_crc is None:
        sums = checksums_of(dst)
        dst_crc = sums[2]
    if src_crc != dst_crc:
        return None
    if sums is None:  # both on object stores: read the replica's copy, never the distant source
        sums = checksums_of(dst)
    sha, size, crc = sums
    if crc != dst_crc or size != int(dst_info["size"]):  # changed while it was read
        return None
    return ManifestEntry(path=rel, size=size, sha256=sha, crc32c=crc)


def _verify_stored(dst: str, crc: str, size: int) -> None:
    """An object store's recorded crc32c must equal what we sent (catches corrupted uploads)."""
    stored = storage.stored_crc32c(dst) if _is_object_store(dst) else None
    if stored is not None and stored != crc:
        storage.remove(dst)
        raise DataIntegrityError(dst, f"crc32c {crc} ({size} B) as uploaded", f"crc32c {stored} as stored")


def _place_file(
    rel: str,
    src: str,
    dst: str,
    want: ManifestEntry | None,
    server_side: bool,
    src_info: dict,
    dst_info: dict | None,
    known: ManifestEntry | None = None,
    fence: Callable[[], None] | None = None,
) -> tuple[ManifestEntry, bool]:
    """Copy one file unless already there; return its manifest entry and whether bytes moved.

    ``want`` is the source manifest's entry (the copy must match it); ``known`` the replica's
    previous manifest entry, used only to skip an unchanged file of a source without manifest.
    ``fence`` raises once the copy's lease is lost: called before the file is copied and before a
    copy that does not match is removed (by then another copier may own the replica, and the file
    may be its good one).
    """
    fence = fence or (lambda: None)
    fence()
    if want is not None and _already_there(src, dst, want, src_info, dst_info):
        return want, False
    if want is None and known is not None:
        same = _same_bytes(src, dst, known, src_info, dst_info)
        if same is not None:
            return same, False
    if want is None and known is None:
        placed = _placed_before(rel, src, dst, src_info, dst_info)
        if placed is not None:
            return placed, False
    if want is not None and server_side and want.crc32c is not None:
        expected = f"crc32c {want.crc32c} ({want.size} B), as the source manifest lists"
        src_crc = _stored_crc(src_info)
        if src_crc is not None and (src_crc != want.crc32c or int(src_info["size"]) != want.size):
            raise DataIntegrityError(src, expected, f"crc32c {src_crc} ({src_info['size']} B)")
        storage.copy_object(src, dst)
        dst_crc, dst_size = storage.crc32c(dst)
        if dst_crc != want.crc32c or dst_size != want.size:
            fence()
            storage.remove(dst)  # never leave bytes a later resume could mistake for a good copy
            raise DataIntegrityError(src, expected, f"crc32c {dst_crc} ({dst_size} B) copied")
        return want, True
    sha, n, crc = _copy_one(src, dst)
    if want is not None and (sha != want.sha256 or n != want.size):
        fence()
        storage.remove(dst)  # never leave bytes a later resume could mistake for a good copy
        raise DataIntegrityError(src, want.sha256, sha)
    _verify_stored(dst, crc, n)
    return ManifestEntry(path=rel, size=n, sha256=sha, crc32c=crc), True


def copy_dataset(
    src_root: str,
    dst_root: str,
    progress: ProgressFn | None = _log_progress,
    max_workers: int = DEFAULT_COPY_WORKERS,
    server_side: bool | None = None,
    lease: LeaseFn | None = None,
    on_invalidate: Callable[[], None] | None = None,
    on_complete: Callable[[DatasetManifest], None] | None = None,
    on_copied: Callable[[int], None] | None = None,
) -> CopyResult:
    """Copy every file of ``src_root`` to ``dst_root`` and write the manifest last.

    Args:
        src_root: concrete URI of the dataset folder (``file://`` or ``gs://``).
        dst_root: concrete URI of the destination folder.
        progress: called after each file with bytes done / total / seconds.
        max_workers: files copied concurrently.
        server_side: copy inside the object store (default: when both ends are ``gs://`` and the
            source has a manifest, whose sha256 values the destination manifest then repeats).
        lease: held (as ``replica:<dst_root>``) for the whole copy, so copies into one replica
            from several machines run one after the other (the stages pass ``Ledger.lease``).
        on_invalidate: called before the copy changes a complete replica (one whose manifest
            differs from the source's: its manifest is removed first), so the caller stops
            listing it as complete until the copy succeeds (the stages forget its ledger row).
        on_complete: called with the replica's manifest once it is complete (copied, or found
            complete), while the lease and lock are still held, so the caller lists it as complete
            (the stages record its ledger row) before another copy can change it again.
        on_copied: called with the size of each file copied (not found in place), from the
            thread that copied it, as soon as it is: also for the files a copy that then fails
            copied, which ``CopyResult`` cannot report.

    Returns:
        The manifest written, and how many bytes were copied or already in place.

    Raises:
        DataIntegrityError: a file changed while being copied, the source manifest disagrees, or
            the store recorded other bytes than were sent (the bad destination file is removed);
            or the source lacks a file its manifest lists (nothing is copied and the replica is
            left as it was).
        LeaseBusyError: another copy into the replica held the lease too long.
        LeaseLostError: the lease lapsed during the copy: no manifest is written.
    """
    if max_workers < 1:
        raise ValueError(f"max_workers={max_workers} must be >= 1")
    start = time.monotonic()

    def source() -> tuple[DatasetManifest | None, dict[str, dict]]:
        manifest = read_manifest(src_root)
        try:
            listing = _listing(src_root)
        except FileNotFoundError:
            raise InvalidRequestError(
                "dataset_uri", src_root, "dataset not found (no such folder or object)"
            ) from None
        if not listing:  # nothing would be placed, yet the replica would be recorded complete
            raise InvalidRequestError("dataset_uri", src_root, empty_dataset_reason(src_root))
        if manifest is not None and not manifest.files:  # the same: its version is no file
            raise InvalidRequestError("dataset_uri", src_root, EMPTY_MANIFEST_REASON)
        return manifest, listing

    source()  # a bad source fails now, not after waiting for another copy's lease
    with contextlib.ExitStack() as locks:
        held = locks.enter_context(lease(f"replica:{dst_root}")) if lease is not None else None
        locks.enter_context(_replica_lock(dst_root))
        # Read again under the lease: while this copy waited, the source may have been sealed
        # anew and another copy may have placed that version.
        src_manifest, src_listing = source()
        _remove_temporaries(dst_root)
        return _copy_locked(
            src_root,
            dst_root,
            src_manifest,
            src_listing,
            progress,
            max_workers,
            server_side,
            start,
            getattr(held, "check", None),
            on_invalidate,
            on_complete,
            getattr(held, "raise_if_lost", None),
            on_copied,
        )


def _parents(rel: str) -> list[str]:
    """The folders a relative path lies in: ``a/b/c`` → ``a``, ``a/b``."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _same_files(a: DatasetManifest, b: DatasetManifest) -> bool:
    """Whether two manifests list the same files with the same bytes (crc32c compared where both
    record it)."""

    def same(x: ManifestEntry, y: ManifestEntry) -> bool:
        crc_agrees = x.crc32c is None or y.crc32c is None or x.crc32c == y.crc32c
        return (x.path, x.size, x.sha256) == (y.path, y.size, y.sha256) and crc_agrees

    return len(a.files) == len(b.files) and all(same(x, y) for x, y in zip(a.files, b.files, strict=True))


def _damaged(
    manifest: DatasetManifest, listing: Mapping[str, Mapping[str, Any]], sealed_at: float | None = None
) -> str | None:
    """What the replica's files lack against its manifest, from the listing alone (nothing is
    read): a file gone or of another size, on an object store one whose stored crc32c is not the
    manifest's, on a local disk one modified after the manifest was written (``sealed_at``, its
    mtime: the copier writes the manifest last). None when every file is there as copied."""
    for e in manifest.files:
        info = listing.get(e.path)
        if info is None:
            return f"{e.path} is gone"
        if int(info["size"]) != e.size:
            return f"{e.path} has {int(info['size'])} B, not {e.size} B"
        stored = _stored_crc(dict(info))
        if stored is not None and e.crc32c is not None and stored != e.crc32c:
            return f"{e.path} holds other bytes (crc32c {stored}, not {e.crc32c})"
        mtime = info.get("mtime")
        if sealed_at is not None and isinstance(mtime, int | float) and mtime > sealed_at:
            return f"{e.path} was modified after the replica was completed"
    return None


def _sealed_at(root: str) -> float | None:
    """The mtime of the replica's manifest on a local disk (None elsewhere, or without one)."""
    if storage.scheme_of(root) not in ("", "file"):
        return None
    fs, base = storage.filesystem(manifest_uri(root))
    try:
        mtime = fs.info(base).get("mtime")
    except FileNotFoundError:
        return None
    return float(mtime) if isinstance(mtime, int | float) else None


def _unchanged_files(
    src_root: str,
    dst_root: str,
    existing: DatasetManifest,
    src_listing: Mapping[str, Mapping[str, Any]],
    dst_listing: Mapping[str, Mapping[str, Any]],
    max_workers: int,
) -> dict[str, ManifestEntry]:
    """The replica's manifest entries (crc32c filled in) of the files a source without manifest
    still has with the same bytes, the replica too (``_same_bytes``), checked in parallel."""
    known = [e for e in existing.files if e.path in src_listing]

    def same(e: ManifestEntry) -> ManifestEntry | None:
        return _same_bytes(
            storage.join(src_root, e.path),
            storage.join(dst_root, e.path),
            e,
            dict(src_listing[e.path]),
            None if e.path not in dst_listing else dict(dst_listing[e.path]),
        )

    if not known:
        return {}
    with ThreadPoolExecutor(max_workers=min(max_workers, len(known))) as pool:
        return {
            e.path: entry for e, entry in zip(known, pool.map(same, known), strict=True) if entry is not None
        }


def _remove_temporaries(dst_root: str) -> None:
    """Delete the temporary files a killed copier left in a local replica (called with the replica
    locked, so no live copier is writing them). Object stores have none: an upload is published
    whole or not at all."""
    if _is_object_store(dst_root):
        return
    fs, base = storage.filesystem(dst_root)
    if not fs.exists(base):
        return
    for path in fs.find(base):
        if storage.is_temporary(path):
            logger.warning("removing %s, left by an interrupted copy", path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


@contextlib.contextmanager
def _replica_lock(dst_root: str) -> Iterator[None]:
    """Serialise copies into one local replica: an exclusive ``flock`` on ``<replica>.lock`` beside
    the folder (two ``place_data`` of one dataset and region wait for each other; the second then
    finds the copy complete). Object stores are not locked here: every object is published whole
    and the manifest is removed before any file changes."""
    if _is_object_store(dst_root):
        yield
        return
    import fcntl

    path = storage.filesystem(dst_root)[1].rstrip("/") + ".lock"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _copy_locked(
    src_root: str,
    dst_root: str,
    src_manifest: DatasetManifest | None,
    src_listing: dict[str, dict],
    progress: ProgressFn | None,
    max_workers: int,
    server_side: bool | None,
    start: float,
    still_held: Callable[[], None] | None = None,
    on_invalidate: Callable[[], None] | None = None,
    on_complete: Callable[[DatasetManifest], None] | None = None,
    fence: Callable[[], None] | None = None,
    on_copied: Callable[[int], None] | None = None,
) -> CopyResult:
    """``copy_dataset`` under its lease and lock. ``still_held`` checks the lease with the ledger
    before the replica changes hands; ``fence`` (no ledger call) before each file and each removal
    of a file that does not match: once the lease is lost, no further file is copied or removed,
    and the copies in flight end."""
    if src_manifest is not None:
        # A sealed source is the files its manifest lists: others (added after sealing) are not
        # part of that version, and copying them would make the replica differ from it for ever.
        listed = {e.path for e in src_manifest.files}
        if extra := sorted(set(src_listing) - listed):
            logger.warning(
                "%s holds %d file(s) its manifest does not list (%s): not copied; seal it again to include them",
                src_root,
                len(extra),
                ", ".join(extra[:5]),
            )
        src_listing = {rel: info for rel, info in src_listing.items() if rel in listed}
    files = sorted((rel, int(info["size"])) for rel, info in src_listing.items())
    total = sum(size for _, size in files)
    try:
        existing = read_manifest(dst_root)
    except DataIntegrityError as exc:  # the replica's own manifest is damaged: copied again
        logger.warning("%s; copying the replica again", exc)
        if on_invalidate is not None:
            on_invalidate()
        storage.remove(manifest_uri(dst_root))
        existing = None
    try:
        dst_files = _listing(dst_root)
    except FileNotFoundError:
        dst_files = {}
    if existing is not None and src_manifest is not None and _same_files(existing, src_manifest):
        damaged = _damaged(existing, dst_files, _sealed_at(dst_root))
        if damaged is None:
            logger.info("%s already holds a complete copy (%d files); nothing to do", dst_root, len(files))
            if on_complete is not None:
                on_complete(existing)
            return CopyResult(existing, 0, existing.total_bytes, time.monotonic() - start)
        logger.warning("%s is no longer complete (%s); copying what it lacks", dst_root, damaged)
    expected = {e.path: e for e in src_manifest.files} if src_manifest else {}
    missing = sorted(set(expected) - set(src_listing))
    if missing:  # the replica would be marked complete without them: refused, nothing changed
        first = expected[missing[0]]
        raise DataIntegrityError(
            storage.join(src_root, missing[0]),
            f"the file its manifest lists ({first.size} B)"
            + (f" and {len(missing) - 1} more: {', '.join(missing[1:6])}" if len(missing) > 1 else ""),
            "no such file in the source",
            what="source incomplete",
        )
    resized = sorted(p for p, e in expected.items() if int(src_listing[p]["size"]) != e.size)
    if resized:  # the source contradicts its own manifest: refused before the replica changes
        want = expected[resized[0]]
        raise DataIntegrityError(
            storage.join(src_root, resized[0]),
            f"{want.size} B, as its manifest lists",
            f"{int(src_listing[resized[0]]['size'])} B"
            + (f" (and {len(resized) - 1} more files of other sizes)" if len(resized) > 1 else ""),
            what="source changed since its manifest was written",
        )
    unchanged: dict[str, ManifestEntry] = {}
    if existing is not None and src_manifest is None:
        unchanged = _unchanged_files(src_root, dst_root, existing, src_listing, dst_files, max_workers)
        if len(unchanged) == len(files) == len(existing.files):
            # Every file of a source without manifest still holds the bytes the replica's
            # manifest lists: the replica stays complete, never invalidated to be written again.
            manifest = DatasetManifest(dataset_uri=src_root, files=tuple(unchanged[rel] for rel, _ in files))
            if still_held is not None:
                still_held()  # as before any manifest is written or the replica recorded
            if manifest != existing:  # a crc32c the old manifest lacked
                storage.write_json(storage.join(dst_root, MANIFEST_NAME), manifest.to_json())
            logger.info("%s already holds the source's files (%d); nothing to do", dst_root, len(files))
            if on_complete is not None:
                on_complete(manifest)
            return CopyResult(manifest, 0, total, time.monotonic() - start)
    if existing is not None:
        # The replica is about to change: from now on it is incomplete, so no reader trusts a
        # manifest whose files are being replaced.
        if on_invalidate is not None:
            on_invalidate()
        storage.remove(manifest_uri(dst_root))
    known = {e.path: e for e in existing.files} if existing is not None and not expected else {}
    if server_side is None:
        server_side = (
            src_manifest is not None and storage.scheme_of(src_root) == storage.scheme_of(dst_root) == "gs"
        )

    dst_listing = dst_files
    # A path that is a file on one side and a folder on the other (the source's "a" became
    # "a/part", or the reverse): the replica's goes first, or the source's could never be written.
    src_dirs = {d for rel in src_listing for d in _parents(rel)}
    dst_dirs = {d for rel in dst_files for d in _parents(rel)}
    for rel in sorted(set(dst_files) & src_dirs):
        logger.info("removing %s from %s: a folder in the source", rel, dst_root)
        storage.remove(storage.join(dst_root, rel))
        del dst_files[rel]
    for folder in sorted(dst_dirs & set(src_listing)):
        logger.info("removing folder %s from %s: a file in the source", folder, dst_root)
        storage.remove(storage.join(dst_root, folder), recursive=True)
        for rel in [r for r in dst_files if r.startswith(f"{folder}/")]:
            del dst_files[rel]

    entries: dict[str, ManifestEntry] = dict(unchanged)
    copied, skipped = 0, sum(e.size for e in unchanged.values())

    def place(*args: Any) -> tuple[ManifestEntry, bool]:
        entry, moved = _place_file(*args)
        if moved and on_copied is not None:
            on_copied(entry.size)
        return entry, moved

    with ThreadPoolExecutor(max_workers=min(max_workers, max(1, len(files)))) as pool:
        futures = {
            pool.submit(
                place,
                rel,
                storage.join(src_root, rel),
                storage.join(dst_root, rel),
                expected.get(rel),
                server_side,
                src_listing[rel],
                dst_listing.get(rel),
                known.get(rel),
                fence,
            ): (rel, size)
            for rel, size in files
            if rel not in unchanged
        }
        for future in as_completed(futures):
            rel, size = futures[future]
            try:
                entry, moved = future.result()
            except BaseException:
                for other in futures:  # what has not started never starts (the pool waits for the rest)
                    other.cancel()
                raise
            entries[rel] = entry
            if moved:
                copied += entry.size
            else:
                skipped += size
            if progress and moved:
                progress(copied + skipped, total, time.monotonic() - start)
    manifest = DatasetManifest(dataset_uri=src_root, files=tuple(entries[rel] for rel, _ in files))
    if still_held is not None:
        still_held()  # raises when another copier may have taken the replica over meanwhile
    # Files the source no longer has go before the manifest says the replica is complete: a
    # command that reads every file of its data folder must not train on them.
    for rel in sorted(set(dst_files) - set(entries)):
        logger.info("removing %s from %s: no longer in the source", rel, dst_root)
        storage.remove(storage.join(dst_root, rel))
    storage.write_json(storage.join(dst_root, MANIFEST_NAME), manifest.to_json())
    if on_complete is not None:
        on_complete(manifest)
    return CopyResult(manifest, copied, skipped, time.monotonic() - start)


def seal(root: str) -> DatasetManifest:
    """Write a manifest for a dataset produced in place (e.g. the demo corpus); return it.

    Raises:
        InvalidRequestError: ``root`` holds no file (a manifest listing none is no dataset)."""
    entries = []
    files = list_files(root)
    if not files:
        raise InvalidRequestError("dataset_uri", root, empty_dataset_reason(root))
    for rel, _ in files:
        sha, size, crc = checksums_of(storage.join(root, rel))
        entries.append(ManifestEntry(path=rel, size=size, sha256=sha, crc32c=crc))
    manifest = DatasetManifest(dataset_uri=root, files=tuple(entries))
    storage.write_json(storage.join(root, MANIFEST_NAME), manifest.to_json())
    return manifest
