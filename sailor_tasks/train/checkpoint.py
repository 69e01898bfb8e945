"""Atomic, verified checkpoints with torch.distributed.checkpoint over fsspec.

Layout under the run's checkpoint root (a ``file://`` or ``gs://`` URI)::

    step-00000050/          DCP files (.metadata, __0_0.distcp, ...)
    step-00000050/COMMITTED.json   commit marker: step, world size, crc32c and size of every file

The marker is written last, by global rank 0, after every rank's data is on storage. A folder
without a marker (killed mid-save) or whose files no longer match the marker (corruption) is never
loaded: ``load_latest`` falls back to the previous committed step. The newest ``keep_latest_k``
committed checkpoints are kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as DcpFsspecFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

from sailor_tasks import storage

logger = logging.getLogger(__name__)

MARKER = "COMMITTED.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")
_CHUNK = 8 * 1024 * 1024


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def crc32c_of(uri: str) -> tuple[str, int]:
    """(hex crc32c, size) of a file; crc32c is what GCS itself reports for objects, so on ``gs://``
    it comes from the object's metadata instead of reading the checkpoint back."""
    return storage.crc32c(uri, _CHUNK)


class _ObjectStoreFileSystem(DcpFsspecFileSystem):
    """DCP's fsspec filesystem whose final ``.metadata`` rename goes through ``storage.rename``
    (copy + delete on object stores, which have no rename)."""

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        storage.rename(str(path), str(new_path))


def _writer(uri: str) -> FsspecWriter:
    writer = FsspecWriter(uri, sync_files=False, **storage.fs_options(storage.scheme_of(uri)))
    if storage.scheme_of(uri) not in ("", "file"):
        fs = _ObjectStoreFileSystem()
        fs.fs = writer.fs.fs
        writer.fs = fs
    return writer


def _reader(uri: str) -> FsspecReader:
    return FsspecReader(uri, **storage.fs_options(storage.scheme_of(uri)))


@dataclass(frozen=True, slots=True)
class SaveInfo:
    step: int
    uri: str
    bytes: int
    seconds: float


class CheckpointManager:
    def __init__(self, root_uri: str, *, rank: int = 0, keep_latest_k: int = 2, distributed: bool = False):
        self.root_uri = root_uri.rstrip("/")
        self.rank = rank
        self.keep_latest_k = keep_latest_k
        self.distributed = distributed

    def step_uri(self, step: int) -> str:
        return storage.join(self.root_uri, step_dir_name(step))

    def _step_dirs(self) -> list[int]:
        steps = []
        for name in storage.listdir(self.root_uri):
            m = _STEP_DIR.match(name)
            if m:
                steps.append(int(m.group(1)))
        return sorted(steps)

    def committed_steps(self) -> list[int]:
        """Steps whose commit marker exists (not yet verified), oldest first."""
        return [s for s in self._step_dirs() if storage.exists(storage.join(self.step_uri(s), MARKER))]

    def verify(self, step: int) -> bool:
        """True when every file listed in the step's marker exists with the recorded crc32c and size."""
        uri = self.step_uri(step)
        try:
            marker = storage.read_json(storage.join(uri, MARKER))
            for name, meta in marker["files"].items():
                crc, size = crc32c_of(storage.join(uri, name))
                if crc != meta["crc32c"] or size != meta["size"]:
                    logger.warning(
                        "checkpoint %s: %s fails its checksum; skipping this checkpoint", uri, name
                    )
                    return False
        except (OSError, KeyError, ValueError) as exc:
            logger.warning("checkpoint %s unreadable (%s); skipping it", uri, exc)
            return False
        return True

    def save(self, step: int, state: dict[str, Any]) -> SaveInfo:
        """Save ``state`` (DCP state dict, Stateful values allowed) as step ``step`` and commit it."""
        start = time.monotonic()
        uri = self.step_uri(step)
        fs, path = storage.filesystem(uri)
        if self.rank == 0 and fs.exists(path):
            fs.rm(path, recursive=True)  # a partial folder from a killed save of the same step
        dcp.save(state, storage_writer=_writer(uri), no_dist=not self.distributed)
        nbytes = 0
        if self.rank == 0:
            nbytes = self._commit(step)
            self._retain()
        info = SaveInfo(step=step, uri=uri, bytes=nbytes, seconds=time.monotonic() - start)
        if self.rank == 0:
            logger.info(
                "checkpoint step %d saved to %s (%.1f MB in %.2f s)", step, uri, nbytes / 1e6, info.seconds
            )
        return info

    def _commit(self, step: int) -> int:
        uri = self.step_uri(step)
        files = {}
        for name in storage.listdir(uri):
            if name == MARKER:
                continue
            crc, size = crc32c_of(storage.join(uri, name))
            files[name] = {"crc32c": crc, "size": size}
        marker = {"step": step, "files": files, "committed_at": time.time()}
        storage.write_bytes(storage.join(uri, MARKER), json.dumps(marker, indent=1).encode())
        return sum(f["size"] for f in files.values())

    def _retain(self) -> None:
        committed = self.committed_steps()
        keep = set(committed[-self.keep_latest_k :])
        newest = committed[-1] if committed else -1
        for step in self._step_dirs():
            # Older committed beyond K, and uncommitted leftovers older than the newest commit.
            if step not in keep and step < newest:
                storage.remove(self.step_uri(step), recursive=True)

    def latest_valid_step(self) -> int | None:
        for step in reversed(self.committed_steps()):
            if self.verify(step):
                return step
        return None

    def load(self, step: int, state: dict[str, Any]) -> None:
        """Load step ``step`` into ``state`` in place (every rank calls this)."""
        dcp.load(state, storage_reader=_reader(self.step_uri(step)), no_dist=not self.distributed)
        if self.rank == 0:
            logger.info("restored checkpoint step %d from %s", step, self.step_uri(step))
