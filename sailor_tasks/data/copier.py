"""Copy a dataset between buckets with fsspec: streamed, checksummed, resumable, manifest last.

The same copier serves ``place_data`` (source → the run's region) and the nightly replication.
A copy is complete only when the destination's manifest exists; files already present with the
right checksum are not copied again, so a retried task resumes instead of starting over.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sailor_tasks import storage
from sailor_tasks.data.manifest import CHUNK_BYTES, MANIFEST_NAME, read_manifest, sha256_of
from sailor_tasks.errors import DataIntegrityError, InvalidRequestError
from sailor_tasks.model import DatasetManifest, ManifestEntry

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, float], None]
"""Called with (bytes done, bytes total, seconds elapsed)."""


@dataclass(frozen=True, slots=True)
class CopyResult:
    manifest: DatasetManifest
    bytes_copied: int
    bytes_skipped: int
    seconds: float


def list_files(root: str) -> list[tuple[str, int]]:
    """(relative path, size) of every file under ``root`` except the manifest, sorted."""
    fs, base = storage.filesystem(root)
    if not fs.exists(base):
        raise InvalidRequestError("dataset_uri", root, "dataset not found (no such folder or object)")
    found = fs.find(base, detail=True)
    base = base.rstrip("/")
    files = []
    for path, info in found.items():
        rel = path[len(base) :].lstrip("/") if path.startswith(base) else path
        if rel and rel != MANIFEST_NAME and info.get("type", "file") == "file":
            files.append((rel, int(info["size"])))
    return sorted(files)


def _log_progress(done: int, total: int, elapsed: float) -> None:
    rate = done / elapsed / 1e6 if elapsed > 0 else 0.0
    logger.info(
        "copied %.1f / %.1f MB (%.0f%%) at %.1f MB/s",
        done / 1e6,
        total / 1e6,
        100.0 * done / max(total, 1),
        rate,
    )


def _copy_one(src: str, dst: str) -> tuple[str, int]:
    """Stream ``src`` to ``dst`` hashing on the way; return (sha256, size)."""
    sfs, spath = storage.filesystem(src)
    dfs, dpath = storage.filesystem(dst)
    digest, size = hashlib.sha256(), 0
    with sfs.open(spath, "rb") as fin, dfs.open(dpath, "wb") as fout:
        while chunk := fin.read(CHUNK_BYTES):
            digest.update(chunk)
            fout.write(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def copy_dataset(src_root: str, dst_root: str, progress: ProgressFn | None = _log_progress) -> CopyResult:
    """Copy every file of ``src_root`` to ``dst_root`` and write the manifest last.

    Args:
        src_root: concrete URI of the dataset folder (``file://`` or ``gs://``).
        dst_root: concrete URI of the destination folder.
        progress: called after each file with bytes done / total / seconds.

    Returns:
        The manifest written, and how many bytes were copied or already in place.

    Raises:
        DataIntegrityError: a file changed while being copied, or the source manifest disagrees.
    """
    start = time.monotonic()
    src_manifest = read_manifest(src_root)
    files = list_files(src_root)
    total = sum(size for _, size in files)
    existing = read_manifest(dst_root)
    if existing is not None and src_manifest is not None and existing.files == src_manifest.files:
        logger.info("%s already holds a complete copy (%d files); nothing to do", dst_root, len(files))
        return CopyResult(existing, 0, existing.total_bytes, time.monotonic() - start)
    expected = {e.path: e for e in src_manifest.files} if src_manifest else {}

    entries, copied, skipped = [], 0, 0
    for rel, size in files:
        src, dst = storage.join(src_root, rel), storage.join(dst_root, rel)
        want = expected.get(rel)
        if want is not None and storage.exists(dst):
            have, have_size = sha256_of(dst)
            if have == want.sha256 and have_size == want.size:
                entries.append(want)
                skipped += size
                continue
        sha, n = _copy_one(src, dst)
        if want is not None and (sha != want.sha256 or n != want.size):
            raise DataIntegrityError(src, want.sha256, sha)
        entries.append(ManifestEntry(path=rel, size=n, sha256=sha))
        copied += n
        if progress:
            progress(copied + skipped, total, time.monotonic() - start)
    manifest = DatasetManifest(dataset_uri=src_root, files=tuple(entries))
    storage.write_json(storage.join(dst_root, MANIFEST_NAME), manifest.to_json())
    return CopyResult(manifest, copied, skipped, time.monotonic() - start)


def seal(root: str) -> DatasetManifest:
    """Write a manifest for a dataset produced in place (e.g. the demo corpus); return it."""
    entries = []
    for rel, _ in list_files(root):
        sha, size = sha256_of(storage.join(root, rel))
        entries.append(ManifestEntry(path=rel, size=size, sha256=sha))
    manifest = DatasetManifest(dataset_uri=root, files=tuple(entries))
    storage.write_json(storage.join(root, MANIFEST_NAME), manifest.to_json())
    return manifest
