"""Checkpoints written and read through torch.distributed.checkpoint (DCP): the trainer's saves and loads.

DCP plans each checkpoint (its default planner) and the ``.metadata`` format; the data files are
written here, every tensor's raw bytes straight from its buffer with the crc32c computed on the
same chunks (the commit marker's checksums, without reading the files back), into recycled files
on a local root. A single process's later saves of a state dict laid out as before (same keys,
shapes, dtypes) reuse the first save's plan and pickled metadata instead of planning again: the
planning and pickling cost more CPU than the crc32c of 300 MB.
``CheckpointManager`` adds sync and pipelined async saves and loads to the torch-free
``store.CheckpointStore``; ``docs/checkpoints.md`` describes the format.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import logging
import math
import os
import pickle
import posixpath
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace
from typing import Any

import crc32c_rs
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.utils.serialization.config as torch_serialization_config
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as _FsspecFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import (
    CURRENT_DCP_VERSION,
    DEFAULT_SUFFIX,
    _split_by_size_and_type,
    _StorageInfo,
)
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future as TorchFuture

from sailor_tasks import storage
from sailor_tasks.errors import StaleAttemptError
from sailor_tasks.train.checkpoint.store import (
    DATA_SUFFIX,
    MARKER,
    RAW_TENSOR_FORMAT,
    SIDECAR_SUFFIX,
    CheckpointStore,
    step_dir_name,
)

logger = logging.getLogger(__name__)


def unless_fenced(fn: Callable[[], Any], what: str, level: int = logging.ERROR) -> tuple[Any, bool]:
    """``(fn(), True)``; ``(None, False)`` when ``fn`` raised anything but ``StaleAttemptError``
    (a newer attempt's fence, which goes on up), logged with its traceback as ``what``: checkpoint
    work that may fail without losing what the caller does next. DCP's ``CheckpointException``
    (what a save across ranks raises on every rank when one rank's part failed) counts, although
    it is a ``BaseException``."""
    try:
        return fn(), True
    except StaleAttemptError:
        raise
    except (Exception, CheckpointException):
        logger.log(level, what, exc_info=True)
        return None, False


if DEFAULT_SUFFIX != DATA_SUFFIX:  # the store recycles data files by this suffix
    raise ImportError(f"DCP's data file suffix is {DEFAULT_SUFFIX!r}, the store expects {DATA_SUFFIX!r}")

_WRITE_CHUNK = 2 * 1024 * 1024
"""Write size of the checkpoint writer, the page cache's largest folio on x86-64 (a PMD, 2 MiB):
the page cache sizes a new file's folios by the length of each write, so 2 MiB writes get the
2 MiB folios a single large write gets. 1 MiB writes get 1 MiB folios, and on the dev VM most
such saves take 4-10x their usual kernel CPU (2026-11-25, interleaved, 306 MB with 2 threads:
1 MiB writes median 214 ms, 9 of 10 saves slow; 2 MiB 65 ms, 1 of 10; 8 MiB 70 ms, 2 of 10).

Each chunk's crc32c is computed over its first half just before the chunk is written and over its
second half just after: the first read of the first half (from memory) leaves it in cache for the
kernel's copy, and the second half is read back from cache right after the copy read it. On an
Intel Xeon VM (2 MiB of L2 per core), whole 306 MB saves with 2 threads into new files, 21
interleaved saves each (2026-11-27, medians): no checksum 38.0 ms, halves 43.3 ms, the whole
chunk before its write 44.3 ms, after it 46.7 ms."""
_SMALL_ENTRY = 64 * 1024
"""Entries smaller than this are copied together and written in one go
(``_WriteProgram.add_buffer``)."""
_METADATA = ".metadata"
"""DCP's metadata file (``filesystem._metadata_fn``)."""


def _fsync(f: Any) -> None:
    """Flush ``f`` and fsync it when it is a local file (object stores are durable once closed)."""
    f.flush()
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return
    os.fsync(fd)


def _fallocate() -> Any:
    """libc's ``fallocate(2)``, or None where there is none (not Linux)."""
    fallocate = getattr(ctypes.CDLL(None, use_errno=True), "fallocate", None)
    if fallocate is not None:
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return fallocate


_FALLOCATE = _fallocate()


def preallocate(f: Any, size: int) -> bool:
    """Allocate the first ``size`` bytes of the new local file ``f`` before writing them: the
    writes then skip the filesystem's delayed allocation of every block (ext4: 28% less CPU and
    25% less time writing 2 x 150 MB on the dev VM, 2026-11-24; with an fsync after, no slower).
    ``fallocate(2)`` itself, not ``os.posix_fallocate``, which writes zeros where the filesystem
    cannot allocate (FUSE, NFS): there, and for files that are not local, nothing happens.
    Returns whether it allocated."""
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return size > 0 and _FALLOCATE is not None and _FALLOCATE(fd, 0, 0, size) == 0


def _reader(uri: str) -> RawTensorFsspecReader:
    return RawTensorFsspecReader(uri, **storage.fs_options(storage.scheme_of(uri)))


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes as a flat buffer over its own storage (a copy only when not contiguous or
    not in host memory). The buffer keeps the tensor alive."""
    t = tensor if _in_place(tensor) else _host_copy(tensor)
    view = _address_view(t.data_ptr(), t.nbytes)
    view.obj._owner = t  # type: ignore[union-attr]
    return view


def _in_place(t: torch.Tensor) -> bool:
    """The tensor's bytes lie in host memory, in order, at ``data_ptr()``: written from there."""
    return t.is_cpu and t.layout == torch.strided and t.is_contiguous() and not t.is_conj() and not t.is_neg()


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().resolve_conj().resolve_neg()


def _address_view(address: int, nbytes: int) -> memoryview:
    """The ``nbytes`` bytes at ``address`` as a flat buffer, which keeps nothing alive. A view of
    a storage from its address: a quarter of the CPU of ``view(uint8).numpy()``, which matters at
    hundreds of tensors per save."""
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


def _placement(t: torch.Tensor) -> tuple[int, bool, bool, bool]:
    """What, besides the layout ``_walk`` records, decides where a tensor's bytes are read from."""
    return t.data_ptr(), t.is_contiguous(), t.is_conj(), t.is_neg()


class _ChecksumStream:
    """Write-through proxy of a DCP output stream that keeps the crc32c and size of what it wrote."""

    def __init__(self, raw: Any):
        self._raw, self.crc, self.size = raw, 0, 0

    def write(self, data: Any) -> int:
        # ``crc32c_rs`` reads any buffer in place (and releases the GIL).
        self.crc = crc32c_rs.crc32c(data, self.crc)
        self.size += memoryview(data).nbytes
        return self._raw.write(data)

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close, ...
        return getattr(self._raw, name)


class _ChecksummingFileSystem(_FsspecFileSystem):
    """DCP's fsspec filesystem, recording the crc32c/size of the files DCP itself writes (.metadata)."""

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
    """``FsspecWriter`` whose data files hold raw tensor bytes, checksummed while written.

    DCP's own writer serialises every tensor as a ``torch.save`` archive (pickler, zip records,
    dozens of small writes per tensor): 4-5x slower than writing the same bytes. Here each file is
    written by one thread in ``_WRITE_CHUNK`` writes taken straight from the tensors' buffers, and each
    chunk's crc32c is computed around its write, from cache (``_WRITE_CHUNK``; no read-back).
    Tensor entries are tagged ``RAW_TENSOR_FORMAT`` (dtype and shape are in DCP's metadata already);
    non-tensor entries stay DCP's ``torch.save`` bytes, written after the tensors of their file
    (so tensor offsets do not move when a pickled value changes size). With ``sidecar`` each rank
    writes a sidecar with its files' crc32c and size (a single process hands them over directly).

    Used by ``dcp.save`` (which plans), or, for a state dict laid out as a previous save's was, by
    ``write_cached`` with that save's ``_SavePlan``.

    Args:
        path: the checkpoint folder's URI.
        pool: threads for all files but the first (written by the calling thread); without it,
            threads are started for this save.
        sidecar: write the per-rank checksum sidecar.
        recycle_dir: local folder of recycled data files (``CheckpointManager``'s ``.recycle``;
            local filesystems only): each data file is written into one of them when one is left
            (renamed to the data file's name, overwritten from offset 0, truncated to what was
            written), else into a new file. None: always new files.
    """

    def __init__(
        self,
        path: str,
        *,
        pool: ThreadPoolExecutor | None = None,
        sidecar: bool = True,
        recycle_dir: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(path, **kwargs)
        fs = _ChecksummingFileSystem()
        fs.fs = self.fs.fs
        self.fs = fs
        self._pool, self._sidecar = pool, sidecar
        self._recycle_dir = recycle_dir
        self._local_dir = (
            storage.filesystem(str(self.path))[1]
            if storage.scheme_of(str(self.path)) in ("", "file")
            else None
        )
        """The checkpoint folder as a local path (``self.path`` is its URI), None when not local."""
        self.recycled: list[str] = []
        """Data files of this save written into recycled files."""
        self.files: list[tuple[str, list[WriteItem]]] = []
        """This save's data files and the items written into each, in order."""
        self.mappings: dict[str, Any] | None = None
        """The planner's flattening (FQN -> path in the state dict) when ``dcp.save`` planned."""
        self.metadata: Metadata | None = None
        self.pickled: tuple[Any, bytes] | None = None
        """(``_pickle_key`` of this save's results, the ``.metadata`` bytes written)."""
        self.programs: dict[str, _WriteProgram] = {}
        """The ``_WriteProgram`` worked out for each data file this save (not those it was given)."""

    def _split(self, items: list[Any]) -> list[list[Any]]:
        """Items per file (DCP's split by size over the writer threads), tensors first."""
        return [
            sorted(b, key=lambda wi: wi.type == WriteItemType.BYTE_IO)  # stable: tensors, then bytes
            for b in _split_by_size_and_type(self.thread_count, items)
            if b
        ]

    def write_data(self, plan: Any, planner: Any) -> Any:
        prefix = plan.storage_data.prefix  # "__<rank>_": unique per rank
        buckets = self._split(plan.items)
        self.files = [(f"{prefix}{i}{DEFAULT_SUFFIX}", b) for i, b in enumerate(buckets)]
        self.mappings = getattr(planner, "mappings", None)
        results = self._write_files(planner.resolve_data)
        if self._sidecar:
            with self.fs.fs.open(posixpath.join(str(self.path), f"{prefix}{SIDECAR_SUFFIX}"), "w") as f:
                json.dump({n: self.fs.sums[n] for n, _ in self.files}, f)
        fut: TorchFuture = TorchFuture()
        fut.set_result(results)
        return fut

    def write_cached(self, plan: _SavePlan, nodes: list[Any]) -> None:
        """Write this checkpoint with ``plan``, a previous save's, for a state dict of the same
        layout: ``nodes`` are its nodes in ``_walk`` order. The files are the ones ``dcp.save``
        would write (same items, files and offsets). Every file's tensors are written first; the
        first thread done with its tensors pickles the non-tensor entries (written last in each
        file) while the others still write. With their sizes every entry's offset is known, so
        ``.metadata`` (re-pickled only when a non-tensor entry's size moved an offset) is written
        by the first thread done with its data file, while the others may still write. Each file's
        tensors are written by its ``_WriteProgram``: the plan's, when the tensors are where they
        were (``_placement``), else one worked out anew and kept for the next save."""
        self.fs.mkdir(self.path)
        self.files = plan.files
        placements = [_placement(nodes[i]) for i in plan.tensor_nodes]
        programs = plan.programs if placements == plan.placements else {}
        saved: dict[int, bytes] = {}
        sizes = dict(plan.tensor_bytes)
        pickled: tuple[Any, bytes] | None = None
        lock = threading.Lock()
        failed: list[BaseException] = []

        def prepare() -> tuple[Any, bytes]:
            """The non-tensor entries' bytes (into ``saved``), once, in whichever thread asks first."""
            nonlocal pickled
            with lock:
                if failed:
                    raise RuntimeError(f"{self.path}: the non-tensor entries were not pickled") from failed[0]
                if pickled is None:
                    try:
                        key = []
                        with _torch_save_config():
                            for name, item, tensors_before in plan.byte_items:
                                data = plan.torch_saved(nodes[plan.node_of[id(item)]])
                                saved[id(item)] = data
                                pickles_before = sizes[name] - plan.tensor_bytes[name]
                                key.append((name, tensors_before + pickles_before, len(data)))
                                sizes[name] += len(data)
                        if plan.pickled is None or plan.pickled[0] != tuple(key):
                            results = _planned_results(plan.files, saved)
                            plan.pickled = (tuple(key), self._pickle_metadata(plan.metadata, results))
                        pickled = plan.pickled
                    except BaseException as e:
                        failed.append(e)
                        raise
                return pickled

        def resolve(item: WriteItem) -> Any:
            if item.type == WriteItemType.BYTE_IO:
                prepare()
                return io.BytesIO(saved[id(item)])
            return nodes[plan.node_of[id(item)]]

        self._write_files(
            resolve,
            results=False,
            then=lambda: self._write_metadata(prepare()[1]),
            reserved=plan.tensor_bytes,
            programs=programs,
        )
        if not plan.files:  # an empty state dict: no data file, no thread to write .metadata
            self._write_metadata(prepare()[1])
        written = {name: self.fs.sums[name]["size"] for name in sizes}
        if written != sizes:  # the layout check let through a state dict of other sizes
            raise RuntimeError(f"{self.path}: data files of {written} bytes, the plan's are {sizes}")
        self.pickled = pickled
        if self.programs:  # worked out anew: kept for the next save when they write every tensor
            reusable = all(p.reusable for p in self.programs.values())
            plan.programs = self.programs if reusable else {}
            plan.placements = placements if reusable else None

    def _write_files(
        self,
        resolve: Any,
        *,
        results: bool = True,
        then: Callable[[], None] | None = None,
        reserved: Mapping[str, int] | None = None,
        programs: Mapping[str, _WriteProgram] | None = None,
    ) -> list[WriteResult]:
        """Write ``self.files`` (the first in this thread, the others in the pool), each item's data
        from ``resolve``; returns every item's ``WriteResult`` (none when not ``results``).
        ``then`` runs once, in the first thread done with its own file, while the others may not be.
        ``reserved``: the tensor bytes of each file, when known (else summed from its items).
        ``programs``: the files' ``_WriteProgram`` to run, by name (the others are worked out)."""
        recycled = self._take_recycled([n for n, _ in self.files])
        if reserved is None:
            reserved = {n: sum(_tensor_nbytes(item) for item in b) for n, b in self.files}
        programs = programs or {}
        first_done = threading.Lock()

        def write(name: str, items: list[WriteItem]) -> list[WriteResult]:
            out = self._write_file(
                name, items, resolve, name in recycled, results, reserved[name], programs.get(name)
            )
            if then is not None and first_done.acquire(blocking=False):
                then()
            return out

        with contextlib.ExitStack() as stack:
            pool = self._pool
            if pool is None and len(self.files) > 1:
                pool = stack.enter_context(
                    ThreadPoolExecutor(len(self.files) - 1, thread_name_prefix="sailor-ckpt-write")
                )
            others = [pool.submit(write, n, b) for n, b in self.files[1:]]
            try:
                per_file = [write(n, b) for n, b in self.files[:1]]
            finally:
                wait_for(others)  # never leave a thread writing into the folder, whichever fails
            per_file += [f.result() for f in others]
        return [r for file_results in per_file for r in file_results]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Write ``.metadata`` as DCP does, but straight to its name (no temporary file and rename,
        a copy + delete on object stores): the commit marker, written after it, is what makes a
        checkpoint loadable."""
        flat = [wr for wr_list in results for wr in wr_list]
        self.metadata = metadata
        self.pickled = (_pickle_key(flat), self._pickle_metadata(metadata, flat))
        self._write_metadata(self.pickled[1])

    @staticmethod
    def _pickle_metadata(metadata: Metadata, results: list[WriteResult]) -> bytes:
        """DCP's ``.metadata`` bytes. No ``storage_meta``: its checkpoint id would name the folder
        the checkpoint was first written to (copies move it), and DCP's readers accept none."""
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {wr.index: wr.storage_data for wr in results}
        metadata.storage_meta = None
        return pickle.dumps(metadata)

    def _write_metadata(self, data: bytes) -> None:
        with self.fs.create_stream(self.fs.concat_path(self.path, _METADATA), "wb") as f:
            f.write(data)
            if self.sync_files:
                _fsync(f)

    def _take_recycled(self, names: list[str]) -> set[str]:
        """Rename a recycled file to each of ``names`` while any is left; returns the names that got
        one. A file recycled under the same name (same rank and file index, so about the same size)
        is preferred, then the newest. Renames are atomic: a file another rank took, or that
        retention evicted, meanwhile (several ranks; one process never writes while its retention
        runs) is simply skipped."""
        if self._recycle_dir is None or self._local_dir is None:
            return set()
        try:
            pool = sorted(
                (n for n in os.listdir(self._recycle_dir) if n.endswith(DEFAULT_SUFFIX)), reverse=True
            )
        except FileNotFoundError:
            return set()
        taken = set()
        for name in names:
            same = [c for c in pool if c.endswith(f".{name}")]
            for candidate in same + [c for c in pool if c not in same]:
                pool.remove(candidate)
                source = posixpath.join(self._recycle_dir, candidate)
                try:
                    os.rename(source, posixpath.join(self._local_dir, name))
                except FileNotFoundError:
                    if os.path.lexists(source):
                        raise  # not a file taken meanwhile: the destination is missing
                    continue
                taken.add(name)
                break
        self.recycled = sorted(taken)
        return taken

    def _write_file(
        self,
        name: str,
        items: list[WriteItem],
        resolve: Any,
        recycled: bool,
        want_results: bool,
        reserved: int,
        program: _WriteProgram | None = None,
    ) -> list[WriteResult]:
        """Write ``items`` into the data file ``name``; ``reserved``: their tensors' bytes.
        ``program``: the writes of its tensor entries (which come first), from an earlier save of
        tensors at the same addresses; else worked out here (into ``self.programs``)."""
        results = []
        writer = _ChunkWriter()
        held = []  # the tensors a program worked out here views (it keeps none alive)
        # A local file is written with unbuffered ``write(2)`` calls; a recycled one is overwritten
        # in place: its blocks and (still cached) pages are reused.
        if recycled:
            f: Any = open(posixpath.join(self._local_dir, name), "r+b", buffering=0)
        elif self._local_dir is not None:
            f = open(posixpath.join(self._local_dir, name), "wb", buffering=0)
        else:
            f = self.fs.fs.open(posixpath.join(str(self.path), name), "wb")
        # The torch.save settings are per thread: set here, in the thread writing the file.
        with f, _torch_save_config():
            if recycled:
                reserved = 0
            else:
                preallocate(f, reserved)
            if program is None:
                program = _WriteProgram()
                for item in items:
                    if item.type == WriteItemType.BYTE_IO:
                        break  # the tensors come first (``_split``); the rest is written below
                    tensor = resolve(item)
                    if not _in_place(tensor):
                        # Copied to host memory one at a time, below, not all before the first write.
                        program.reusable = False
                        break
                    offset = program.add(tensor)
                    if want_results:
                        results.append(_write_result(item, name, offset, tensor.nbytes, [RAW_TENSOR_FORMAT]))
                    program.count += 1
                    held.append(tensor)
                program.close()
                self.programs[name] = program
            program.run(f, writer)
            for item in items[program.count :]:
                data = resolve(item)
                if item.type == WriteItemType.BYTE_IO:
                    buf, descriptors = data.getbuffer(), None
                else:
                    buf, descriptors = _tensor_bytes(data), [RAW_TENSOR_FORMAT]
                if want_results:
                    results.append(_write_result(item, name, writer.size, buf.nbytes, descriptors))
                writer.add(f, buf)
                del buf, data
            writer.flush(f)
            if recycled or reserved > writer.offset:
                f.truncate(writer.offset)  # the recycled file may have been longer
            if self.sync_files:
                _fsync(f)
        self.fs.sums[name] = {"crc32c": f"{writer.crc:08x}", "size": writer.offset}
        return results


def _chunks(buf: memoryview, offset: int) -> list[tuple[memoryview, memoryview, memoryview]]:
    """``buf``, to be written at ``offset`` in its file, as (first half, chunk, second half) per
    write: chunks end at multiples of ``_WRITE_CHUNK`` in the file, so that the page cache takes
    every chunk into whole large folios rather than two partial ones."""
    out = []
    size, start = buf.nbytes, 0
    while start < size:
        end = min(size, start + _WRITE_CHUNK - (offset + start) % _WRITE_CHUNK)
        chunk = buf[start:end]
        half = (end - start) // 2  # checksummed half before, half after the write
        out.append((chunk[:half], chunk, chunk[half:]))
        start = end
    return out


class _WriteProgram:
    """The writes of a data file's tensor entries, worked out once: the tensors' buffers over
    their addresses, chunked (``_chunks``), the small ones (under ``_SMALL_ENTRY``) grouped to be
    copied together. A later save of the same plan whose tensors are at the same addresses
    (``_SavePlan.placements``) runs the same program: no Python per tensor while the threads
    write (they would take turns on the GIL). Its buffers view the tensors' storages without
    keeping them alive: the caller holds the tensors while it runs. ``reusable``: it writes every
    tensor entry of its file (none needed a copy into host memory)."""

    __slots__ = ("steps", "size", "count", "reusable", "_group", "_group_bytes")

    def __init__(self, offset: int = 0) -> None:
        self.count = 0
        """The file's items it writes (its first)."""
        self.steps: list[tuple[bool, int, list[Any]]] = []
        """(a group of small buffers?, bytes, the buffers, or the chunks of one buffer)."""
        self.size = offset
        """Where the file's bytes written by ``steps`` end (they start at ``offset``)."""
        self.reusable = True
        self._group: list[memoryview] = []
        self._group_bytes = 0

    @property
    def end(self) -> int:
        """Where the next buffer lands: after ``steps`` and the group still open."""
        return self.size + self._group_bytes

    def add(self, tensor: torch.Tensor) -> int:
        """Append the bytes of ``tensor`` (``_in_place``); returns their offset in the file."""
        return self.add_buffer(_address_view(tensor.data_ptr(), tensor.nbytes))

    def add_buffer(self, buf: memoryview) -> int:
        """Append ``buf``; returns its offset in the file."""
        offset = self.end
        if buf.nbytes < _SMALL_ENTRY:
            self._group.append(buf)
            self._group_bytes += buf.nbytes
            if self._group_bytes >= _WRITE_CHUNK:
                self.close()
            return offset
        self.close()
        self.steps.append((False, buf.nbytes, _chunks(buf, self.size)))
        self.size += buf.nbytes
        return offset

    def close(self) -> None:
        """End the current group of small buffers (before a large one, and after the last)."""
        if self._group:
            self.steps.append((True, self._group_bytes, self._group))
            self.size += self._group_bytes
            self._group, self._group_bytes = [], 0

    def run(self, f: Any, writer: _ChunkWriter) -> None:
        for group, nbytes, parts in self.steps:
            if group:
                data = memoryview(b"".join(parts))
                writer.write_chunks(f, _chunks(data, writer.offset), nbytes)
            else:
                writer.write_chunks(f, parts, nbytes)


class _ChunkWriter:
    """Writes buffers one after the other into a file in ``_WRITE_CHUNK`` writes and keeps the
    crc32c of everything written: a ``_WriteProgram``'s (``_WriteProgram.run``), then buffers
    added one at a time, grouped as a program groups them (buffers under ``_SMALL_ENTRY``,
    hundreds per save, written together, not one write and checksum each) and written as soon as
    their group is closed."""

    __slots__ = ("crc", "offset", "_held")

    def __init__(self) -> None:
        self.crc, self.offset = 0, 0
        self._held: _WriteProgram | None = None
        """The buffers added and not yet written."""

    @property
    def size(self) -> int:
        """Bytes added so far, those still held included: where the next buffer lands."""
        return self._held.end if self._held is not None else self.offset

    def add(self, f: Any, buf: memoryview) -> None:
        """Write ``buf`` after everything written or added before (``flush`` writes what is held)."""
        if self._held is None:
            self._held = _WriteProgram(self.offset)
        self._held.add_buffer(buf)
        self._write_held(f)

    def flush(self, f: Any) -> None:
        if self._held is not None:
            self._held.close()
            self._write_held(f)

    def _write_held(self, f: Any) -> None:
        if self._held is not None and self._held.steps:
            self._held.run(f, self)
            self._held.steps.clear()

    def write_chunks(
        self, f: Any, chunks: list[tuple[memoryview, memoryview, memoryview]], nbytes: int
    ) -> None:
        """Write ``nbytes`` at ``offset`` as ``_chunks`` split them (for this offset)."""
        crc = self.crc
        for before, chunk, after in chunks:
            crc = crc32c_rs.crc32c(before, crc)
            written = f.write(chunk)
            while written is not None and written < len(chunk):  # an unbuffered write may be short
                written += f.write(chunk[written:])
            crc = crc32c_rs.crc32c(after, crc)
        self.crc = crc
        self.offset += nbytes


class RawTensorFsspecReader(FsspecReader):
    """``FsspecReader`` that also reads ``RAW_TENSOR_FORMAT`` entries, straight into the destination
    tensor when it matches the stored chunk (no intermediate copy); other entries go to DCP."""

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._tensor_md = metadata.state_dict_metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        raw: dict[str, list[Any]] = {}
        rest = []
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            if tuple(info.transform_descriptors or ()) == (RAW_TENSOR_FORMAT,):
                raw.setdefault(info.relative_path, []).append(req)
            else:
                rest.append(req)
        for relative_path, reqs in raw.items():
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as stream:
                for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                    self._read_raw(stream, req, planner)
        if rest:
            super().read_data(replace(plan, items=rest), planner).wait()
        fut: TorchFuture = TorchFuture()
        fut.set_result(None)
        return fut

    def _read_raw(self, stream: Any, req: Any, planner: Any) -> None:
        info = self.storage_data[req.storage_index]
        md = self._tensor_md[req.storage_index.fqn]
        offsets = tuple(req.storage_index.offset or ())
        chunk = next(c for c in md.chunks if tuple(c.offsets) == offsets)
        target = planner.resolve_tensor(req).detach()
        whole = tuple(req.lengths) == tuple(chunk.sizes) and not any(req.storage_offsets)
        on_host = target.device.type == "cpu"
        if whole and on_host and target.is_contiguous() and target.dtype == md.properties.dtype:
            dest = target  # read in place (a GPU tensor is read into host memory, then copied)
        else:
            dest = torch.empty(tuple(chunk.sizes), dtype=md.properties.dtype)
        view = _tensor_bytes(dest) if dest.is_contiguous() else None
        if view is None or view.nbytes != info.length:
            raise ValueError(
                f"checkpoint entry {req.storage_index.fqn}: {info.length} bytes stored for a "
                f"{md.properties.dtype} chunk of shape {tuple(chunk.sizes)}"
            )
        stream.seek(info.offset)
        got = 0
        while got < info.length:
            n = stream.readinto(view[got:])
            if not n:
                raise EOFError(
                    f"{info.relative_path}: {info.length - got} bytes missing at offset {info.offset}"
                )
            got += n
        if dest is not target:
            part = dest
            for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                if length < dest.size(dim):
                    part = part.narrow(dim, start, length)  # the requested part of the stored chunk
            if part.size() != target.size():
                raise ValueError(f"{req.storage_index.fqn}: stored {part.size()} vs {target.size()}")
            target.copy_(part)
        planner.commit_tensor(req, target)


def _tensor_nbytes(item: WriteItem) -> int:
    """Bytes a tensor item writes (0 for a pickled value, whose size is known once pickled)."""
    if item.tensor_data is None:
        return 0
    return math.prod(item.tensor_data.chunk.sizes) * item.tensor_data.properties.dtype.itemsize


def _torch_save_config() -> Any:
    """``torch.save``'s settings for non-tensor entries (pickled as DCP does), in the calling
    thread only: no zip CRC32, a second checksum over bytes the data file's crc32c covers end to end."""
    return torch_serialization_config.patch({"save.compute_crc32": False})


def _write_result(item: WriteItem, name: str, offset: int, size: int, descriptors: Any) -> WriteResult:
    return WriteResult(
        index=item.index,
        size_in_bytes=size,
        storage_data=_StorageInfo(name, offset, size, transform_descriptors=descriptors),
    )


def _planned_results(files: list[tuple[str, list[WriteItem]]], saved: dict[int, bytes]) -> list[WriteResult]:
    """The ``WriteResult`` of every item of ``files`` written as ``_write_file`` writes them, the
    non-tensor items' bytes being ``saved`` (by the item's ``id``)."""
    out = []
    for name, items in files:
        offset = 0
        for item in items:
            if item.type == WriteItemType.BYTE_IO:
                size, descriptors = len(saved[id(item)]), None
            else:
                size, descriptors = _tensor_nbytes(item), [RAW_TENSOR_FORMAT]
            out.append(_write_result(item, name, offset, size, descriptors))
            offset += size
    return out


def _pickle_key(results: list[WriteResult]) -> tuple[Any, ...]:
    """What makes one save's ``.metadata`` differ from another's of the same ``_SavePlan``: where
    the non-tensor entries landed (their pickles change size with their values). Tensor entries
    keep their files and offsets: equal layouts, tensors first in every file."""
    return tuple(
        (info.relative_path, info.offset, info.length)
        for info in (wr.storage_data for wr in results)
        if info.transform_descriptors is None
    )


class _Uncacheable(Exception):
    """A state dict holding something whose plan ``_walk`` cannot vouch for: always planned by DCP."""


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _walk(obj: Any, layout: list[Any], nodes: list[Any]) -> None:
    """Append ``obj`` and everything inside it to ``nodes``, depth first in DCP's traversal order,
    and to ``layout`` all that DCP's flattening and planning read: each container's type and keys
    (or length), each tensor's type, dtype, shape and properties, each other value's type. Two
    state dicts with equal layouts are planned alike (DCP only pickles the other values)."""
    nodes.append(obj)
    kind = type(obj)
    if isinstance(obj, dict):
        # DCP reads a mapping's items alone: an OrderedDict (``module.state_dict()``) and the plain
        # dict of the same items (its staging copy in an async save) are planned alike.
        layout.append((dict if kind is OrderedDict else kind, tuple(obj)))
        for value in obj.values():
            _walk(value, layout, nodes)
    elif kind is list or kind is tuple:
        layout.append((kind, len(obj)))
        for value in obj:
            _walk(value, layout, nodes)
    elif isinstance(obj, torch.Tensor):
        if kind not in _PLAIN_TENSORS:
            raise _Uncacheable(kind)  # DTensor, ShardedTensor...: chunks planned by their own rules
        layout.append(
            (kind, obj.dtype, obj.shape, obj.layout, obj.requires_grad, obj.is_pinned(), obj.device)
        )
    elif isinstance(obj, (Mapping, list)):
        raise _Uncacheable(kind)  # DCP may descend into it: other mappings, list subclasses
    else:
        layout.append(kind)


def _dcp_paths(obj: Any, path: tuple[Any, ...], out: list[tuple[Any, ...]]) -> None:
    """DCP's flattening path (``str`` keys, ``int`` indices) of every node, in ``_walk`` order."""
    out.append(path)
    if isinstance(obj, dict):
        for key, value in obj.items():
            _dcp_paths(value, (*path, str(key)), out)
    elif type(obj) is list or type(obj) is tuple:
        for i, value in enumerate(obj):
            _dcp_paths(value, (*path, i), out)


@dataclass(eq=False, slots=True)
class _SavePlan:
    """A single-process save as ``dcp.save`` planned and wrote it, kept to write later saves of a
    state dict with the same ``layout`` without planning (``ChecksummingFsspecWriter.write_cached``).

    DCP's planner has plan caching of its own (``enable_plan_caching``), but it still flattens the
    state dict and builds and compares the local plan every save, and the metadata is pickled
    every save: about 20 ms of CPU for gpt_25m + AdamW (413 entries), a third of what the write of
    its 306 MB costs.
    """

    layout: list[Any]
    files: list[tuple[str, list[WriteItem]]]
    """Data files and their items, in order (the planned save's)."""
    node_of: dict[int, int]
    """``id`` of each item (held in ``files``) -> the position of its value among the ``_walk`` nodes."""
    metadata: Metadata
    pickled: tuple[Any, bytes] | None
    """(``_pickle_key``, ``.metadata`` bytes) of the latest save with this plan."""
    programs: dict[str, _WriteProgram] = field(default_factory=dict)
    """Each data file's ``_WriteProgram``, for tensors at ``placements``."""
    placements: list[Any] | None = None
    """``_placement`` of the tensors (``tensor_nodes``) the ``programs`` were worked out for."""
    saved_values: dict[bytes, bytes] = field(default_factory=dict)
    """``torch.save`` bytes of plain values (``_plain_value``) by their pickle: the optimizer's
    hyperparameters and the trainer's counters, pickled once per distinct value, not every save."""
    tensor_bytes: dict[str, int] = field(init=False)
    """Bytes of the tensor entries of each data file."""
    byte_items: list[tuple[str, WriteItem, int]] = field(init=False)
    """The non-tensor items in file and item order: (file, item, tensor bytes before it in the file)."""
    tensor_nodes: list[int] = field(init=False)
    """The ``_walk`` position of every tensor item's value, in file and item order."""

    def __post_init__(self) -> None:
        self.tensor_bytes, self.byte_items, self.tensor_nodes = {}, [], []
        for name, items in self.files:
            offset = 0
            for item in items:
                if item.type == WriteItemType.BYTE_IO:
                    self.byte_items.append((name, item, offset))
                else:
                    offset += _tensor_nbytes(item)
                    self.tensor_nodes.append(self.node_of[id(item)])
            self.tensor_bytes[name] = offset

    def torch_saved(self, obj: Any) -> bytes:
        """What ``DefaultSavePlanner.transform_object`` writes for the non-tensor value ``obj``
        (``torch.save`` bytes), from ``saved_values`` when ``obj`` is a plain value seen before."""
        key = pickle.dumps(obj, protocol=2) if _plain_value(obj) else None
        if key is not None and len(key) > _MAX_SAVED_VALUE_BYTES:
            key = None  # a long string: not worth holding twice
        data = self.saved_values.get(key) if key is not None else None
        if data is None:
            buf = io.BytesIO()
            torch.save(obj, buf)
            data = buf.getvalue()
            if key is not None:
                if len(self.saved_values) >= _MAX_SAVED_VALUES:  # a value that changes every save
                    self.saved_values.clear()
                self.saved_values[key] = data
        return data

    @classmethod
    def record(
        cls, layout: list[Any], state_dict: dict[str, Any], writer: ChecksummingFsspecWriter
    ) -> _SavePlan | None:
        """The plan ``writer`` just wrote ``state_dict`` with, or None when some item is not a
        whole plain tensor or a pickled value found at a node of the state dict."""
        if writer.mappings is None or writer.metadata is None:
            return None
        paths: list[tuple[Any, ...]] = []
        _dcp_paths(state_dict, (), paths)
        position = {p: i for i, p in enumerate(paths)}
        if len(position) != len(paths):
            return None  # keys equal as strings: DCP's own flattening would clash
        node_of = {}
        for _, items in writer.files:
            for item in items:
                if item.type == WriteItemType.TENSOR:
                    chunk = item.tensor_data.chunk
                    if any(chunk.offsets) or tuple(chunk.sizes) != tuple(item.tensor_data.size):
                        return None
                elif item.type != WriteItemType.BYTE_IO:
                    return None
                path = writer.mappings.get(item.index.fqn)
                if path not in position:
                    return None
                node_of[id(item)] = position[path]
        return cls(layout, writer.files, node_of, writer.metadata, writer.pickled)


_MAX_SAVED_VALUES = 1024
_MAX_SAVED_VALUE_BYTES = 4096
_PLAIN_SCALARS = (int, float, bool, str, type(None))


def _plain_value(obj: Any) -> bool:
    """``obj`` is a built-in scalar, string or None, a tuple of plain values or a list of scalars
    (a param group's parameter names): its pickle tells it apart from every other value (1, 1.0,
    True; 0.0 and -0.0; a list and a tuple), and ``torch.save`` writes equal bytes for equal
    pickles."""
    kind = type(obj)
    if kind is list:
        return all(type(v) in _PLAIN_SCALARS for v in obj)
    return kind in _PLAIN_SCALARS or (kind is tuple and all(map(_plain_value, obj)))


def _layout(obj: Any) -> Any:
    """Structure of a state dict with (shape, dtype) for tensors: equal layouts share staging buffers."""
    if isinstance(obj, torch.Tensor):
        return (tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return tuple((k, _layout(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return tuple(_layout(v) for v in obj)
    return type(obj)


def _on_gpu(obj: Any) -> bool:
    """Some tensor of the nested state ``obj`` is on a CUDA device."""
    if isinstance(obj, torch.Tensor):
        return obj.is_cuda
    if isinstance(obj, dict):
        return any(_on_gpu(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_on_gpu(v) for v in obj)
    return False


class _StagingBuffers:
    """CPU buffers allocated once and reused by every async save of the run: after the first save,
    staging is a plain memory copy (no allocation, no page faults). Reallocated only if the state's
    layout (keys, shapes, dtypes) changes. Pinned only for a state on a GPU (pinning needs CUDA). One save at a time:
    a new save starts only after the previous one finished writing."""

    def __init__(self) -> None:
        self._layout: Any = None
        self._buffers: dict[str, Any] | None = None

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        layout = _layout(state_dict)
        if self._buffers is None or layout != self._layout:
            # page-locked when the state lives on a GPU: device-to-host copies run at full speed
            self._buffers = _create_cpu_state_dict(state_dict, pin_memory=_on_gpu(state_dict))
            self._layout = layout
        return _copy_state_dict(state_dict, self._buffers)


def _resolve_stateful(state: dict[str, Any]) -> dict[str, Any]:
    """What DCP saves for ``state``: ``state_dict()`` of every top-level ``Stateful`` value."""
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state.items()}


@dataclass(frozen=True, slots=True)
class _PendingSave:
    step: int
    future: Future
    """Resolves to the ``SaveInfo`` once written and committed."""
    staged: threading.Event
    """Set once the state is copied into the staging buffers."""


@dataclass(frozen=True, slots=True)
class SaveInfo:
    step: int
    uri: str
    bytes: int
    seconds: float
    recycled_files: int = 0
    """Data files (this rank's) written into recycled files rather than new ones."""


class CheckpointManager(CheckpointStore):
    """A ``CheckpointStore`` that saves state dicts into its step folders and loads them back.

    Every rank of a process group has one; only global rank 0 commits and retires checkpoints.

    Args:
        root_uri: the run's checkpoint root.
        rank: this process's global rank.
        keep_latest_k: committed checkpoints kept after each save.
        distributed: save and load across the process group (False: this process alone).
        process_group: process group of async saves (keep it apart from training collectives).
        thread_count: writer threads per save (one data file each).
        recycle: on a local root, reuse retired checkpoints' data files (False: delete them and
            write new files, as on object stores).
        attempt: the run's attempt saving here: written into each marker; once a newer attempt
            claims the root (``claim``), this manager's saves raise ``StaleAttemptError``.
        sync_files: fsync every data file and ``.metadata`` before the commit marker is written
            (durable against a machine crash). False (the trainer's setting): a file torn by a
            crash fails its crc32c and an older checkpoint is used.
    """

    def __init__(
        self,
        root_uri: str,
        *,
        rank: int = 0,
        keep_latest_k: int = 2,
        distributed: bool = False,
        process_group: Any = None,
        thread_count: int = 2,
        recycle: bool = True,
        attempt: int | None = None,
        sync_files: bool = False,
    ):
        super().__init__(root_uri, keep_latest_k=keep_latest_k, recycle=recycle, attempt=attempt)
        self.sync_files = sync_files
        self.rank = rank
        self.distributed = distributed
        self.process_group = process_group
        self.thread_count = thread_count
        self._pending: _PendingSave | None = None
        self._staging = _StagingBuffers()
        self._executor: ThreadPoolExecutor | None = None
        self._write_pool: ThreadPoolExecutor | None = None
        self._retention: Future | None = None
        self._plan: _SavePlan | None = None
        """The last planned single-process save, for later saves of the same layout."""
        self._writing: ChecksummingFsspecWriter | None = None
        """The writer of the save in progress (``_abandon`` reclaims its files if it fails)."""

    def _writer(self, step: int) -> ChecksummingFsspecWriter:
        uri = self.step_uri(step)
        self._writing = None  # until this step's writer exists: nothing of an earlier save is abandoned
        self.check_fence()  # a stale attempt writes nothing into a root a newer one claimed
        if self.rank == 0:
            storage.remove(uri, recursive=True)  # a partial folder from a killed save of the same step
        if self._write_pool is None and self.thread_count > 1:
            self._write_pool = ThreadPoolExecutor(
                self.thread_count - 1, thread_name_prefix="sailor-ckpt-write"
            )
        self._writing = ChecksummingFsspecWriter(
            uri,
            sync_files=self.sync_files,
            thread_count=self.thread_count,
            pool=self._write_pool,
            sidecar=self.distributed,
            recycle_dir=self.recycle_dir,
            **storage.fs_options(storage.scheme_of(uri)),
        )
        return self._writing

    def _write_and_commit(
        self, step: int, state_dict: dict[str, Any], start: float, process_group: Any = None
    ) -> SaveInfo:
        """``_write`` then ``_finish``; a save that fails is abandoned (``_abandon``)."""
        try:
            info = self._finish(step, self._write(step, state_dict, process_group), start)
        except StaleAttemptError:
            raise  # a newer attempt owns the root: nothing of it is touched
        except BaseException:
            self._abandon(step)
            raise
        self._writing = None
        return info

    def _abandon(self, step: int) -> None:
        """After a save of ``step`` failed (a full disk, a writer's error): its files are no
        checkpoint, but hold the space of one, and the recycled files it took. On a local root, a
        single process moves the data files it wrote into the recycle folder (the next save
        reuses them) and removes the step's folder; each of several ranks puts back the recycled
        files it took (the folder goes at the step's next save or at retention)."""
        writer, self._writing = self._writing, None
        if writer is None or str(writer.path).rstrip("/") != self.step_uri(step).rstrip("/"):
            return  # no writer of this step: an earlier save's files are never touched
        try:
            if storage.exists(storage.join(self.step_uri(step), MARKER)):
                return  # committed after all: a checkpoint, not a leftover
            names = writer.recycled if self.distributed else [n for n, _ in writer.files]
            if self.recycle_dir is not None and writer._local_dir is not None:
                os.makedirs(self.recycle_dir, exist_ok=True)
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(
                            posixpath.join(writer._local_dir, name),
                            posixpath.join(self.recycle_dir, f"{step_dir_name(step)}.{name}"),
                        )
            if not self.distributed:
                storage.remove(self.step_uri(step), recursive=True)
        except Exception as exc:  # the save's own error is what the caller must see
            logger.warning("the files of the failed save of step %d stay: %s", step, exc)

    def _write(
        self, step: int, state_dict: dict[str, Any], process_group: Any = None
    ) -> ChecksummingFsspecWriter:
        """Write ``state_dict`` (Stateful values resolved) into the step's folder, ``.metadata``
        last: planned by ``dcp.save``, or, in a single process, with the previous save's plan when
        the layout is unchanged."""
        if self.distributed:
            # Every rank's own preparation (fence check, rank 0 clearing the folder) agreed on
            # before DCP's collectives, which keep the ranks together from there on.
            writer = self._together(lambda: self._writer(step), process_group, f"the save of step {step}")
            dcp.save(state_dict, storage_writer=writer, process_group=process_group)
            return writer
        writer = self._writer(step)
        layout: list[Any] | None = []
        nodes: list[Any] = []
        try:
            _walk(state_dict, layout, nodes)
        except _Uncacheable:
            layout = None
        if self._plan is not None and layout == self._plan.layout:
            writer.write_cached(self._plan, nodes)
            return writer
        dcp.save(state_dict, storage_writer=writer, no_dist=True)
        self._plan = _SavePlan.record(layout, state_dict, writer) if layout is not None else None
        return writer

    def save(self, step: int, state: dict[str, Any]) -> SaveInfo:
        """Save ``state`` (DCP state dict, Stateful values allowed) as step ``step`` and commit it;
        a step already committed and valid is kept as it is (``_kept``). A pending async save that
        failed (its error is logged) does not stop this one: a save on a notice still keeps the
        run's latest step. A newer attempt's fence does."""
        unless_fenced(self.wait, f"the pending async checkpoint failed; saving step {step} now")
        start = time.monotonic()
        failed: BaseException | None = None
        try:
            resolved = _resolve_stateful(state)
        except BaseException as exc:
            if not self.distributed:
                raise
            failed = exc  # the other ranks agree on it in ``_kept``, then every rank fails
        kept = self._kept(step, failed=failed)
        if kept is not None:
            return kept
        info = self._write_and_commit(step, resolved, start)
        if self.rank == 0:  # deleting old checkpoints need not hold up training
            self._retention = self._background().submit(self._retain_after_save)
        return info

    def save_async(self, step: int, state: dict[str, Any], *, pipelined: bool = False) -> None:
        """Snapshot ``state`` into reused staging buffers, then write and commit it in a background
        thread; ``poll``/``wait`` collect the result.

        Args:
            step: the step the checkpoint is named after.
            state: DCP state dict (Stateful values allowed).
            pipelined: take the snapshot (``state_dict()`` of Stateful values and the copy into
                the staging buffers) in the background too, overlapping the caller's next
                forward/backward. The caller must then call ``wait_staged`` before anything
                changes the saved state in place (the optimizer step), and the Stateful values'
                ``state_dict()`` must only read. Without it, the snapshot is complete when this
                returns.

        Raises:
            RuntimeError: a distributed manager without a ``process_group`` of its own: the
                background save's collectives would run on the default group and pair up with
                the training's (a hang until the collective timeout). ``Run.init_distributed``
                makes that group.
        """
        if self.distributed and self.process_group is None:
            raise RuntimeError(
                f"{self.root_uri}: an async save across ranks needs a process group of its own "
                "(process_group=...); with the run contract's Run, call run.init_distributed() on "
                "every rank first, also after making the default group yourself"
            )
        self.wait()
        start = time.monotonic()
        staged = threading.Event()
        fut = self._background().submit(self._stage_and_save, step, state, staged, start)
        self._pending = _PendingSave(step, fut, staged)
        if not pipelined:
            self.wait_staged()

    def _stage_and_save(
        self, step: int, state: dict[str, Any], staged: threading.Event, start: float
    ) -> SaveInfo:
        failed: BaseException | None = None
        try:
            snapshot = self._staging.stage(_resolve_stateful(state))
        except BaseException as exc:
            if not self.distributed:
                raise
            failed = exc  # the other ranks still agree on it in ``_kept``, then every rank fails
        finally:
            staged.set()  # also on failure: the error surfaces in poll()/wait(), never a hang
        del state
        # After the snapshot: the caller waits for it (wait_staged), and the check's collective
        # must not hold it while another rank is still in a training collective.
        kept = self._kept(step, self.process_group, failed)
        if kept is not None:
            return kept
        info = self._write_and_commit(step, snapshot, start, self.process_group)
        if self.rank == 0:
            self._retain_after_save()
        return info

    def _retain_after_save(self) -> None:
        """Retention after a committed save. Failing to retire old checkpoints (an object store's
        error, a full disk) keeps them until the next save's retention: it fails neither the save
        it follows nor the run. A newer attempt's fence still stops this one."""
        unless_fenced(
            self.retain, "retention failed: older checkpoints kept until the next save", logging.WARNING
        )

    def _kept(
        self, step: int, process_group: Any = None, failed: BaseException | None = None
    ) -> SaveInfo | None:
        """Step ``step``'s checkpoint when it is already committed and valid (a save on the notice
        of the step an async save just committed, or of the step the run resumed from): it is
        kept, since writing it anew would first delete it and a failure then would leave an older
        one. Rank 0 decides, every rank learns it. None: write it. ``failed``: this rank's save
        already failed (its snapshot); with several ranks every rank fails the save together."""
        marker_uri = storage.join(self.step_uri(step), MARKER)

        def check() -> int | None:
            if failed is not None:
                raise failed
            self.check_fence()  # a stale attempt saves nothing, even a step that is there
            if self.rank == 0 and storage.exists(marker_uri) and self.verify(step):
                return sum(int(f["size"]) for f in self.marker(step)["files"].values())
            return None

        size = self._together(check, process_group, f"the save of step {step}", share=True)
        if size is None:
            return None
        logger.info("checkpoint step %d is already committed at %s; kept, not saved again", step, marker_uri)
        return SaveInfo(step=step, uri=self.step_uri(step), bytes=size, seconds=0.0)

    def _together(self, fn: Callable[[], Any], process_group: Any, what: str, *, share: bool = False) -> Any:
        """``fn()`` on every rank, then one collective on ``process_group`` (with several ranks):
        when it raised on any rank, it raises on every rank (this rank's own error, or one naming
        the ranks that failed). Returns this rank's result, or with ``share`` rank 0's (pickled).
        A rank's own failure before a save's collectives (its fence check, a storage error, its
        snapshot) would otherwise leave the other ranks waiting in them, and pair each later save
        with another step's."""
        if not self.distributed:
            return fn()
        error: BaseException | None = None
        result = None
        try:
            result = fn()
        except BaseException as exc:
            error = exc
        outcomes: list[Any] = [None] * dist.get_world_size(process_group)
        mine = (None if error is None else repr(error), result if share else None)
        dist.all_gather_object(outcomes, mine, group=process_group)
        if error is not None:
            raise error
        failures = {rank: err for rank, (err, _) in enumerate(outcomes) if err is not None}
        if any(err.startswith("StaleAttemptError") for err in failures.values()):
            self.check_fence()  # a newer attempt claimed the root: the same error on every rank
        if failures:
            raise RuntimeError(
                f"{self.root_uri}: {what} failed on rank(s) "
                + "; ".join(f"{rank}: {err}" for rank, err in sorted(failures.items()))
            )
        return outcomes[0][1] if share else result

    def _background(self) -> ThreadPoolExecutor:
        """One worker: async saves and retention run one at a time, in order."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="sailor-ckpt")
        return self._executor

    def wait_staged(self) -> None:
        """Block until the pending async save's snapshot is copied (no-op when none is pending)."""
        if self._pending is not None:
            self._pending.staged.wait()

    @property
    def pending_step(self) -> int | None:
        return self._pending.step if self._pending else None

    def poll(self) -> SaveInfo | None:
        """The pending async save's result once it is written and committed, else None."""
        if self._pending and self._pending.future.done():
            return self.wait()
        return None

    def wait(self) -> SaveInfo | None:
        """Block until the pending async save is written and committed, and old checkpoints beyond
        ``keep_latest_k`` are deleted; re-raise their errors. Returns the async save's result."""
        info = None
        if self._pending:
            pending, self._pending = self._pending, None
            info = pending.future.result()
        if self._retention:
            retention, self._retention = self._retention, None
            retention.result()
        return info

    def _finish(self, step: int, writer: ChecksummingFsspecWriter, start: float) -> SaveInfo:
        uri = self.step_uri(step)
        nbytes = 0
        if self.rank == 0:
            # A single process wrote every file itself (no sidecars to collect, nothing to list).
            required = (
                {info.relative_path for info in writer.metadata.storage_data.values()}
                if self.distributed and writer.metadata is not None
                else ()
            )
            nbytes = self.commit(step, writer.fs.sums, complete=not self.distributed, required=required)
            if self.local and not self.distributed:
                # Every checksum in the marker was computed from the bytes this process wrote, and
                # on a local root reading them back (from the page cache) can only find those
                # bytes: retention need not read 300 MB back. Object stores are still checked
                # against the checksums they report, and a restarted process verifies anew.
                self._verified.add(step)
        info = SaveInfo(
            step=step,
            uri=uri,
            bytes=nbytes,
            seconds=time.monotonic() - start,
            recycled_files=len(writer.recycled),
        )
        if self.rank == 0:
            logger.info(
                "checkpoint step %d saved to %s (%.1f MB in %.2f s)", step, uri, nbytes / 1e6, info.seconds
            )
        return info

    def load_all(self, step: int) -> dict[str, Any]:
        """Everything saved at ``step`` (all ranks' entries) as a plain nested dict, in one process."""
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        # ``dcp.load`` only fills keys the given dict already has (an empty dict stays empty);
        # ``_load_state_dict`` fills the dict the planner builds from the metadata, as DCP's own
        # ``format_utils.dcp_to_torch_save`` does.
        state: dict[str, Any] = {}
        _load_state_dict(
            state,
            storage_reader=_reader(self.step_uri(step)),
            planner=_EmptyStateDictLoadPlanner(),
            no_dist=True,
        )
        if not state:
            raise ValueError(f"checkpoint {self.step_uri(step)} holds no entries")
        return state

    def saved_keys(self, step: int) -> set[str]:
        """The top-level keys saved at ``step`` (from DCP's metadata; nothing else is read)."""
        metadata = _reader(self.step_uri(step)).read_metadata()
        return {str(fqn).split(".", 1)[0] for fqn in metadata.state_dict_metadata}

    def load(self, step: int, state: dict[str, Any]) -> None:
        """Load step ``step`` into ``state`` in place (every rank calls this)."""
        dcp.load(state, storage_reader=_reader(self.step_uri(step)), no_dist=not self.distributed)
        if self.rank == 0:
            logger.info("restored checkpoint step %d from %s", step, self.step_uri(step))


def diff_states(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Keys whose values differ between two nested state dicts (tensors compared bit for bit)."""
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
