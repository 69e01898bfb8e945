"""Atomic, verified checkpoints with torch.distributed.checkpoint over fsspec.

Layout under the run's checkpoint root (a ``file://`` or ``gs://`` URI)::

    step-00000050/          DCP files (.metadata, __0_0.distcp, ...)
    step-00000050/COMMITTED.json   commit marker: step, world size, crc32c and size of every file

The marker is written last, by global rank 0, after every rank's data is on storage. A folder
without a marker (killed mid-save) or whose files no longer match the marker (corruption) is never
loaded: ``latest_valid_step`` falls back to the previous committed step. The newest
``keep_latest_k`` committed checkpoints are kept.

Checksums are computed from the bytes as DCP writes them (a pass-through stream), not by reading
the files back: each rank leaves a small ``__<rank>_crc32c.json`` sidecar with its files' crc32c and
size, and rank 0 merges them into the marker. Verification on load reads the files (that is where
corruption is caught).

``save_async`` stages the state to CPU memory and writes it in a background thread
(``torch.distributed.checkpoint.async_save``); the marker is written when the write completes
(``poll``/``wait``), so an unfinished async save is simply an uncommitted folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import posixpath
import re
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import crc32c
import torch
import torch.distributed.checkpoint as dcp
import torch.utils.serialization.config as torch_serialization_config
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as _FsspecFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from sailor_tasks import storage

logger = logging.getLogger(__name__)

MARKER = "COMMITTED.json"
SIDECAR_SUFFIX = "crc32c.json"
"""Per-rank checksum sidecars (``__0_crc32c.json``); not part of the checkpoint itself."""
_STEP_DIR = re.compile(r"^step-(\d{8})$")
_CHUNK = 8 * 1024 * 1024


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def crc32c_of(uri: str) -> tuple[str, int]:
    """(hex crc32c, size) of a file; crc32c is what GCS itself reports for objects, so on ``gs://``
    it comes from the object's metadata instead of reading the checkpoint back."""
    return storage.crc32c(uri, _CHUNK)


def _reader(uri: str) -> FsspecReader:
    return FsspecReader(uri, **storage.fs_options(storage.scheme_of(uri)))


class _ChecksumStream:
    """Write-through proxy of a DCP output stream that keeps the crc32c and size of what it wrote."""

    def __init__(self, raw: Any):
        self._raw, self.crc, self.size = raw, 0, 0

    def write(self, data: Any) -> int:
        # ``crc32c`` reads any buffer in place: DCP hands memoryviews of tensor storage, and
        # google_crc32c would need a bytes copy of each (2x slower than the write itself).
        self.crc = crc32c.crc32c(data, self.crc)
        self.size += memoryview(data).nbytes
        return self._raw.write(data)

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close, ...
        return getattr(self._raw, name)


class _ChecksummingFileSystem(_FsspecFileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            proxy = _ChecksumStream(stream)
            yield proxy
            self.sums[posixpath.basename(str(path))] = {"crc32c": f"{proxy.crc:08x}", "size": proxy.size}

    def rename(self, path: Any, new_path: Any) -> None:
        if storage.scheme_of(str(path)) in ("", "file"):
            super().rename(path, new_path)
        else:  # object stores have no rename: copy + delete (gcsfs's moveTo is not universal)
            storage.rename(str(path), str(new_path))
        old = self.sums.pop(posixpath.basename(str(path)), None)
        if old is not None:
            self.sums[posixpath.basename(str(new_path))] = old


class ChecksummingFsspecWriter(FsspecWriter):
    """``FsspecWriter`` that records each written file's crc32c/size in a per-rank sidecar."""

    def __init__(self, path: str, **kwargs: Any):
        super().__init__(path, **kwargs)
        fs = _ChecksummingFileSystem()
        fs.fs = self.fs.fs
        self.fs = fs

    def write_data(self, plan: Any, planner: Any) -> Any:
        # The zip records' CRC32 would be a second checksum pass over every byte; crc32c above
        # already covers the files end to end (and is what GCS reports), so skip it.
        with torch_serialization_config.patch({"save.compute_crc32": False}):
            fut = super().write_data(plan, planner)
        fut.wait()  # FsspecWriter writes synchronously; the future is already resolved
        prefix = plan.storage_data.prefix  # "__<rank>_": unique per rank
        sums = {name: meta for name, meta in self.fs.sums.items() if name.startswith(prefix)}
        with self.fs.fs.open(posixpath.join(str(self.path), f"{prefix}{SIDECAR_SUFFIX}"), "w") as f:
            json.dump(sums, f)
        return fut


class _ReusedBufferStager(BlockingAsyncStager):
    """Stages into CPU buffers allocated once and reused by every async save of the run: after the
    first save, staging is a plain memory copy (no allocation, no page faults). Unpinned, so it
    works without CUDA. A new save starts only after the previous one finished writing."""

    def __init__(self) -> None:
        super().__init__(cache_staged_state_dict=True)

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        if self.state_dict_cache is None:
            self.state_dict_cache = _create_cpu_state_dict(state_dict)
        # Hundreds of memory-bound tensor copies: the intra-op pool's fork/join per copy costs
        # more than it gains (measured 10x slower with 2 threads on a busy 2-core machine).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _copy_state_dict(state_dict, self.state_dict_cache)
        finally:
            torch.set_num_threads(threads)


@dataclass(frozen=True, slots=True)
class SaveInfo:
    step: int
    uri: str
    bytes: int
    seconds: float


class CheckpointManager:
    def __init__(
        self,
        root_uri: str,
        *,
        rank: int = 0,
        keep_latest_k: int = 2,
        distributed: bool = False,
        process_group: Any = None,
        thread_count: int = 2,
    ):
        self.root_uri = root_uri.rstrip("/")
        self.rank = rank
        self.keep_latest_k = keep_latest_k
        self.distributed = distributed
        self.process_group = process_group
        """Process group of async saves (keep it apart from training collectives)."""
        self.thread_count = thread_count
        self._pending: tuple[int, Future, ChecksummingFsspecWriter, float] | None = None
        self._stager: _ReusedBufferStager | None = None

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

    def _writer(self, step: int) -> ChecksummingFsspecWriter:
        uri = self.step_uri(step)
        fs, path = storage.filesystem(uri)
        if self.rank == 0 and fs.exists(path):
            fs.rm(path, recursive=True)  # a partial folder from a killed save of the same step
        return ChecksummingFsspecWriter(
            uri,
            sync_files=False,
            thread_count=self.thread_count,
            **storage.fs_options(storage.scheme_of(uri)),
        )

    def save(self, step: int, state: dict[str, Any]) -> SaveInfo:
        """Save ``state`` (DCP state dict, Stateful values allowed) as step ``step`` and commit it."""
        self.wait()
        start = time.monotonic()
        writer = self._writer(step)
        dcp.save(state, storage_writer=writer, no_dist=not self.distributed)
        return self._finish(step, writer, start)

    def save_async(self, step: int, state: dict[str, Any]) -> None:
        """Stage ``state`` and write it in the background; committed by ``poll``/``wait``."""
        self.wait()
        start = time.monotonic()
        writer = self._writer(step)
        if self._stager is None:
            self._stager = _ReusedBufferStager()
        fut = dcp.async_save(
            state,
            storage_writer=writer,
            no_dist=not self.distributed,
            process_group=self.process_group,
            async_stager=self._stager,
        )
        self._pending = (step, fut, writer, start)

    @property
    def pending_step(self) -> int | None:
        return self._pending[0] if self._pending else None

    def poll(self) -> SaveInfo | None:
        """Commit the pending async save if its write has finished."""
        if self._pending and self._pending[1].done():
            return self.wait()
        return None

    def wait(self) -> SaveInfo | None:
        """Block until the pending async save is written, then commit it."""
        if not self._pending:
            return None
        step, fut, writer, start = self._pending
        self._pending = None
        fut.result()
        return self._finish(step, writer, start)

    def _finish(self, step: int, writer: ChecksummingFsspecWriter, start: float) -> SaveInfo:
        uri = self.step_uri(step)
        nbytes = 0
        if self.rank == 0:
            nbytes = self._commit(step, writer.fs.sums)
            self._retain()
        info = SaveInfo(step=step, uri=uri, bytes=nbytes, seconds=time.monotonic() - start)
        if self.rank == 0:
            logger.info(
                "checkpoint step %d saved to %s (%.1f MB in %.2f s)", step, uri, nbytes / 1e6, info.seconds
            )
        return info

    def _commit(self, step: int, own_sums: dict[str, dict[str, Any]] | None = None) -> int:
        """Write the marker: checksums from the writers' sidecars (files with none are read back)."""
        uri = self.step_uri(step)
        names = storage.listdir(uri)
        known: dict[str, dict[str, Any]] = dict(own_sums or {})
        for name in names:
            if name.endswith(SIDECAR_SUFFIX):
                known.update(storage.read_json(storage.join(uri, name)))
        files = {}
        for name in names:
            if name == MARKER or name.endswith(SIDECAR_SUFFIX) or name.endswith(".tmp"):
                continue
            if name in known:
                files[name] = known[name]
            else:
                crc, size = crc32c_of(storage.join(uri, name))
                files[name] = {"crc32c": crc, "size": size}
        marker = {"step": step, "files": files, "committed_at": time.time()}
        storage.write_bytes(storage.join(uri, MARKER), json.dumps(marker, indent=1).encode())
        return sum(f["size"] for f in files.values())

    def copy_latest_to(self, dest_root: str) -> int | None:
        """Copy the newest verified checkpoint to ``dest_root`` (files first, marker last) and verify it.

        Returns the step copied, or None when there is no valid checkpoint to copy.

        Raises:
            DataIntegrityError: the copy does not match the marker.
        """
        from sailor_tasks.errors import DataIntegrityError

        step = self.latest_valid_step()
        if step is None:
            return None
        dest = CheckpointManager(dest_root, keep_latest_k=self.keep_latest_k)
        src_uri, dst_uri = self.step_uri(step), dest.step_uri(step)
        if storage.exists(storage.join(dst_uri, MARKER)) and dest.verify(step):
            return step  # already there (a retried recovery)
        storage.remove(dst_uri, recursive=True)
        marker = storage.read_bytes(storage.join(src_uri, MARKER))
        for name in json.loads(marker)["files"]:
            sfs, spath = storage.filesystem(storage.join(src_uri, name))
            dfs, dpath = storage.filesystem(storage.join(dst_uri, name))
            with sfs.open(spath, "rb") as fin, dfs.open(dpath, "wb") as fout:
                while chunk := fin.read(_CHUNK):
                    fout.write(chunk)
        storage.write_bytes(storage.join(dst_uri, MARKER), marker)
        if not dest.verify(step):
            raise DataIntegrityError(dst_uri, "files listed in the source marker", "a mismatching copy")
        return step

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

    def load_all(self, step: int) -> dict[str, Any]:
        """Everything saved at ``step`` (all ranks' entries) as a plain nested dict, in one process."""
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

        state: dict[str, Any] = {}
        dcp.load(
            state,
            storage_reader=_reader(self.step_uri(step)),
            planner=_EmptyStateDictLoadPlanner(),
            no_dist=True,
        )
        return state

    def load(self, step: int, state: dict[str, Any]) -> None:
        """Load step ``step`` into ``state`` in place (every rank calls this)."""
        dcp.load(state, storage_reader=_reader(self.step_uri(step)), no_dist=not self.distributed)
        if self.rank == 0:
            logger.info("restored checkpoint step %d from %s", step, self.step_uri(step))


def diff_states(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Keys whose values differ between two nested state dicts (tensors compared bit for bit)."""
    import torch

    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{prefix}{k} (missing on one side)" for k in sorted(set(a) ^ set(b), key=str)]
        for k in sorted(set(a) & set(b), key=str):
            out += diff_states(a[k], b[k], f"{prefix}{k}.")
        return out
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in diff_states(x, y, f"{prefix}{i}.")
        ]
    else:
        same = a == b or (a != a and b != b)  # NaN == NaN here
    return [] if same else [prefix.rstrip(".")]
