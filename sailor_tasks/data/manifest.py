"""Dataset manifests: the checksummed file list that marks a copy complete (written last)."""

from __future__ import annotations

import hashlib

from sailor_tasks import storage
from sailor_tasks.errors import DataIntegrityError
from sailor_tasks.model import DatasetManifest

MANIFEST_NAME = "_SAILOR_MANIFEST.json"
CHUNK_BYTES = 4 * 1024 * 1024


def manifest_uri(dataset_root: str) -> str:
    return storage.join(dataset_root, MANIFEST_NAME)


def read_manifest(dataset_root: str) -> DatasetManifest | None:
    """The manifest of a complete copy at ``dataset_root``, or None when the copy is incomplete.

    Raises:
        DataIntegrityError: the manifest is there but is no SAILOR manifest (cut short, edited,
            written by something else), naming its URI.
    """
    uri = manifest_uri(dataset_root)
    if not storage.exists(uri):
        return None
    try:
        return DatasetManifest.from_json(storage.read_json(uri))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DataIntegrityError(
            uri, "a SAILOR dataset manifest", f"{type(exc).__name__}: {exc}"[:300], what="unreadable manifest"
        ) from exc


def sha256_of(uri: str) -> tuple[str, int]:
    """(hex sha256, size) of one file, streamed in chunks."""
    sha, size, _ = checksums_of(uri)
    return sha, size


def checksums_of(uri: str) -> tuple[str, int, str]:
    """(hex sha256, size, hex crc32c) of one file, from one streamed read."""
    import crc32c_rs

    fs, path = storage.filesystem(uri)
    digest, crc, size = hashlib.sha256(), 0, 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            crc = crc32c_rs.crc32c(chunk, crc)
            size += len(chunk)
    return digest.hexdigest(), size, f"{crc:08x}"


def verify(dataset_root: str, manifest: DatasetManifest) -> None:
    """Re-read every file under ``dataset_root`` and compare with the manifest; raise on mismatch."""
    for entry in manifest.files:
        uri = storage.join(dataset_root, entry.path)
        actual, size = sha256_of(uri)
        if actual != entry.sha256 or size != entry.size:
            raise DataIntegrityError(uri, f"{entry.sha256} ({entry.size} B)", f"{actual} ({size} B)")
