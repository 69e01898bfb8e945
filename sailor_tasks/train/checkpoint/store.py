"""Checkpoint folders on storage, without torch: layout, commit markers, verification, copy, retention.

The orchestrator finds, verifies and moves checkpoints (``stages.attempts``) but never loads one,
so it works on the folders alone and never imports torch. ``dcp.CheckpointManager`` builds on
``CheckpointStore`` to write and read the folders' contents. A folder is loadable only once its
commit marker, written last and holding every file's crc32c and size, exists and matches its
files; ``docs/checkpoints.md`` describes the layout and the file recycling on local roots.

Fencing: each attempt of a run claims the checkpoint root (``claim``: ``ATTEMPT.json`` names the
newest attempt and the steps committed before it), and every marker names the attempt that wrote
it. A process of an older attempt (a worker that outlived its agent) can then neither replace a
step folder nor commit or retire anything (``StaleAttemptError``), and a marker it still managed
to write after the claim is not a valid checkpoint (``verify``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickletools
import posixpath
import re
import time
from collections.abc import Iterable
from typing import Any

from sailor_tasks import storage
from sailor_tasks.errors import DataIntegrityError, StaleAttemptError

logger = logging.getLogger(__name__)

MARKER = "COMMITTED.json"
SIDECAR_SUFFIX = "crc32c.json"
"""Per-rank checksum sidecars (``__0_crc32c.json``); not part of the checkpoint itself."""
DATA_SUFFIX = ".distcp"
"""Suffix of the data files, DCP's ``filesystem.DEFAULT_SUFFIX`` (``dcp`` checks that they agree)."""
DCP_METADATA = ".metadata"
"""DCP's metadata file: the coordinator writes it once every rank's data files are written."""
FENCE = "ATTEMPT.json"
"""At the checkpoint root: ``{"attempt": N, "inherited": [steps committed before N claimed it]}``."""
RAW_TENSOR_FORMAT = "sailor-raw-tensor-v1"
"""DCP storage tag of a tensor entry SAILOR's writer stores as its raw bytes (dtype and shape in the
metadata). A ``.metadata`` naming it comes from SAILOR's writer, which commits its own saves."""
RECYCLE_DIR = ".recycle"
"""Folder of recycled data files under a local checkpoint root (never a step folder's name)."""
_STEP_DIR = re.compile(r"^step-(\d{8})$")
_CHUNK = 8 * 1024 * 1024
"""Read/copy size: large enough for full-speed I/O."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def crc32c_of(uri: str) -> tuple[str, int]:
    """(hex crc32c, size) of a file; crc32c is what GCS itself reports for objects, so on ``gs://``
    it comes from the object's metadata instead of reading the checkpoint back."""
    return storage.crc32c(uri)


def _fsync(*targets: tuple[str, int]) -> None:
    """fsync each (path, ``os.open`` flags): files, then the folders that name them."""
    for path, flags in targets:
        fd = os.open(path, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class CheckpointStore:
    """The ``step-NNNNNNNN/`` folders under one checkpoint root (a ``file://``, plain-path or
    ``gs://`` URI): which steps exist and are committed, verifying, committing, copying and
    retiring them.

    Args:
        root_uri: the run's checkpoint root.
        keep_latest_k: committed checkpoints ``retain`` keeps.
        recycle: on a local root, ``retain`` moves retired checkpoints' data files into
            ``RECYCLE_DIR`` for later saves to overwrite (False: delete them, as on object stores).
        attempt: the run's attempt writing through this store (recorded in its markers; fenced
            off once a newer attempt claims the root). None: a reader, or a writer that is not fenced.
    """

    def __init__(
        self, root_uri: str, *, keep_latest_k: int = 2, recycle: bool = True, attempt: int | None = None
    ):
        self.root_uri = root_uri.rstrip("/")
        self.keep_latest_k = keep_latest_k
        self.attempt = attempt
        self.local = storage.scheme_of(self.root_uri) in ("", "file")
        """A local root: retention fsyncs what it keeps (object stores publish objects durably)."""
        self.recycle_dir: str | None = None
        """Local folder of recycled data files; None on object stores (files are deleted)."""
        if recycle and self.local:
            self.recycle_dir = storage.filesystem(storage.join(self.root_uri, RECYCLE_DIR))[1]
        self._verified: set[int] = set()
        """Steps ``retain`` verified: a step is written once per process, so it is read back once."""
        self._durable: set[int] = set()
        """Local steps ``retain`` fsynced."""

    def step_uri(self, step: int) -> str:
        return storage.join(self.root_uri, step_dir_name(step))

    def marker(self, step: int) -> dict[str, Any]:
        """The step's commit marker (``MARKER``) as written.

        Raises:
            OSError: no marker (uncommitted or gone); ValueError: not JSON.
        """
        return storage.read_json(storage.join(self.step_uri(step), MARKER))

    # --- fencing ---------------------------------------------------------------------------
    def fence(self) -> dict[str, Any] | None:
        """The root's claim (``{"attempt": N, "inherited": [...]}``), or None when unclaimed."""
        uri = storage.join(self.root_uri, FENCE)
        try:
            return storage.read_json(uri)
        except FileNotFoundError:
            return None

    def claim(self, attempt: int) -> None:
        """Make ``attempt`` the newest attempt writing under this root (idempotent for the same
        attempt): from now on older attempts cannot write, commit or retire here. Steps committed
        so far by older attempts stay valid (``inherited``).

        Raises:
            StaleAttemptError: a newer attempt claimed the root already.
        """
        with self._fence_lock():
            fence = self.fence()
            newest = int(fence["attempt"]) if fence else 0
            if newest > attempt:
                raise StaleAttemptError(self.root_uri, attempt, newest)
            if newest == attempt:
                self.attempt = attempt
                return
            inherited = [s for s in self.committed_steps() if not self._stale(s, fence)]
            uri = storage.join(self.root_uri, FENCE)
            storage.write_json(uri, {"attempt": attempt, "inherited": inherited})
            if self.local:
                # Durable before any checkpoint of this attempt: a fence a crash left empty or torn
                # would make every checkpoint of the root unverifiable.
                path = storage.filesystem(uri)[1]
                _fsync((path, os.O_RDONLY), (posixpath.dirname(path), os.O_RDONLY | os.O_DIRECTORY))
        self.attempt = attempt

    def check_fence(self) -> None:
        """Raise ``StaleAttemptError`` when a newer attempt than this store's claimed the root."""
        if self.attempt is None:
            return
        fence = self.fence()
        if fence and int(fence["attempt"]) > self.attempt:
            raise StaleAttemptError(self.root_uri, self.attempt, int(fence["attempt"]))

    def _stale(self, step: int, fence: dict[str, Any] | None, marker: dict[str, Any] | None = None) -> bool:
        """Whether the step's marker was written by an older attempt after ``fence`` was claimed."""
        if not fence:
            return False
        if marker is None:
            try:
                marker = self.marker(step)
            except (OSError, ValueError):
                return False
        written_by = marker.get("attempt")
        return (
            written_by is not None
            and int(written_by) < int(fence["attempt"])
            and step not in fence.get("inherited", ())
        )

    @contextlib.contextmanager
    def _fence_lock(self) -> Any:
        """On a local root, an exclusive ``flock`` beside the fence: a claim and a commit's check
        of the fence followed by its marker write do not interleave. Object stores: no lock (a
        marker written in that window is caught by ``verify``)."""
        if not self.local:
            yield
            return
        import fcntl

        root = storage.filesystem(self.root_uri)[1]
        os.makedirs(root, exist_ok=True)
        with open(posixpath.join(root, f"{FENCE}.lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def step_dirs(self) -> list[int]:
        """Steps with a folder under the root, committed or not, oldest first."""
        steps = []
        for name in storage.listdir(self.root_uri):
            m = _STEP_DIR.match(name)
            if m:
                steps.append(int(m.group(1)))
        return sorted(steps)

    def committed_steps(self) -> list[int]:
        """Steps whose commit marker exists (not yet verified), oldest first."""
        return [s for s in self.step_dirs() if storage.exists(storage.join(self.step_uri(s), MARKER))]

    def verify(self, step: int) -> bool:
        """True when every file listed in the step's marker exists with the recorded crc32c and size."""
        uri = self.step_uri(step)
        try:
            marker = self.marker(step)
            if self._stale(step, self.fence(), marker):
                logger.warning(
                    "checkpoint %s: committed by attempt %s after a newer attempt claimed the root; skipping it",
                    uri,
                    marker.get("attempt"),
                )
                return False
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

    def committed_bytes(self) -> int | None:
        """Bytes of the newest committed checkpoint as its marker lists them (not verified: what a
        move would copy, for planning), or None when there is none."""
        for step in reversed(self.committed_steps()):
            try:
                marker = self.marker(step)
                return sum(int(meta["size"]) for meta in marker["files"].values())
            except (OSError, KeyError, TypeError, ValueError):
                continue
        return None

    def latest_valid_step(self) -> int | None:
        """The newest committed step that verifies, or None when there is none."""
        for step in reversed(self.committed_steps()):
            if self.verify(step):
                return step
        return None

    def commit(
        self,
        step: int,
        own_sums: dict[str, dict[str, Any]] | None = None,
        *,
        complete: bool = False,
        required: Iterable[str] = (),
    ) -> int:
        """Write the step's marker: checksums from the writers' sidecars (files with none are read
        back). Called by global rank 0 once every rank's data is on storage.

        Args:
            step: the step folder to commit.
            own_sums: crc32c and size of the files this process wrote, by file name.
            complete: ``own_sums`` covers every file of the folder: it is not listed.
            required: files the checkpoint cannot load without (the data files DCP's metadata
                names): with one missing, nothing is committed.

        Returns:
            The checkpoint's size in bytes (the files the marker lists).

        Raises:
            StaleAttemptError: a newer attempt claimed the root: nothing is committed.
            RuntimeError: a ``required`` file is not in the folder: nothing is committed.
        """
        uri = self.step_uri(step)
        names = list(own_sums or {}) if complete else storage.listdir(uri)
        missing = sorted(set(required) - set(names))
        if missing:
            raise RuntimeError(f"checkpoint {uri} not committed: {', '.join(missing)} missing from the folder")
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
        if self.attempt is not None:
            marker["attempt"] = self.attempt
        with self._fence_lock() if self.attempt is not None else contextlib.nullcontext():
            self.check_fence()
            storage.write_bytes(storage.join(uri, MARKER), json.dumps(marker, indent=1).encode())
        return sum(f["size"] for f in files.values())

    def dcp_complete(self, step: int) -> bool:
        """True when DCP finished the step's folder: its ``.metadata``, which DCP writes after every
        rank's data files, is there and is a whole pickle (read without unpickling it: no torch)."""
        return self._dcp_metadata(step) is not None

    def _dcp_metadata(self, step: int) -> bytes | None:
        """The step's ``.metadata`` bytes when they are a whole pickle, else None (missing, or cut
        short by a kill during its write)."""
        try:
            data = storage.read_bytes(storage.join(self.step_uri(step), DCP_METADATA))
            last = None
            for opcode, _arg, pos in pickletools.genops(data):
                last = (opcode.name, pos)
        except (OSError, ValueError):
            return None
        return data if last is not None and last == ("STOP", len(data) - 1) else None

    def seal(self) -> list[int]:
        """Commit the step folders a process group left complete but without a marker: those newer
        than the newest committed step that DCP finished (``dcp_complete``). Checkpoints written by
        plain ``torch.distributed.checkpoint`` (no SAILOR marker of their own) become verifiable,
        copyable and resumable this way. Called once the process group has exited, never while it
        writes. Returns the steps sealed, oldest first.

        A folder SAILOR's writer wrote (its ``.metadata`` names ``RAW_TENSOR_FORMAT``) is never
        sealed: that writer commits its own saves, so one it left without a marker failed, was
        killed or was fenced off by a newer attempt, and its ``.metadata`` says nothing of its data
        files (a single process writes it while its last data file may still be written)."""
        committed = self.committed_steps()
        newest = committed[-1] if committed else -1
        sealed = []
        for step in self.step_dirs():
            if step <= newest or step in committed:
                continue
            metadata = self._dcp_metadata(step)
            if metadata is None:
                continue
            if RAW_TENSOR_FORMAT.encode() in metadata:
                logger.warning(
                    "checkpoint %s: a save of SAILOR's writer that never committed (it failed, was "
                    "killed or was fenced off); not sealed",
                    self.step_uri(step),
                )
                continue
            size = self.commit(step)
            logger.info(
                "sealed DCP checkpoint %s (%.1f MB): commit marker written",
                self.step_uri(step),
                size / 1e6,
            )
            sealed.append(step)
        return sealed

    def copy_latest_to(self, dest_root: str) -> int | None:
        """Copy the newest verified checkpoint to ``dest_root`` (files first, marker last) and verify it.

        Returns:
            The step copied, or None when there is no valid checkpoint to copy.

        Raises:
            DataIntegrityError: the copy does not match the marker.
        """
        step = self.latest_valid_step()
        if step is None:
            return None
        dest = CheckpointStore(dest_root, keep_latest_k=self.keep_latest_k)
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
        fence = dest.fence()
        if fence and step not in fence.get("inherited", ()):  # placed between attempts, on purpose
            fence["inherited"] = sorted({*fence.get("inherited", ()), step})
            storage.write_json(storage.join(dest.root_uri, FENCE), fence)
        if not dest.verify(step):
            raise DataIntegrityError(dst_uri, "files listed in the source marker", "a mismatching copy")
        return step

    def retain(self) -> None:
        """Keep the newest ``keep_latest_k`` *verified* checkpoints; retire committed ones older than
        the oldest of them, and uncommitted leftovers older than the newest of them.

        A committed checkpoint that fails verification (a torn or corrupt save) never counts toward
        K, so it cannot push out the last good one; it is left alone until K good ones are newer.
        On a local root the kept checkpoints' files, markers and folders are fsynced before anything
        is retired (a crash then cannot take both the new checkpoint's unwritten pages and the old
        one), and a retired checkpoint's data files are recycled (``_recycle``), the recycle folder
        being cut back to as many files as the newest kept checkpoint has.
        """
        committed = self.committed_steps()
        kept: list[int] = []  # newest first
        for step in reversed(committed):
            if len(kept) == self.keep_latest_k:
                break
            if step in self._verified or self.verify(step):
                self._verified.add(step)
                kept.append(step)
        if not kept:
            return  # nothing known good: retire nothing
        self.check_fence()  # an older attempt retires nothing of a newer one's root
        oldest_kept = kept[-1] if len(kept) == self.keep_latest_k else -1
        retire = [
            s
            for s in self.step_dirs()
            if s not in kept and (s < oldest_kept if s in committed else s < kept[0])
        ]
        if retire and self.local:
            for step in kept:
                self._make_durable(step)
        for step in retire:
            if self.recycle_dir is not None and step in committed:
                self._recycle(step)
            storage.remove(self.step_uri(step), recursive=True)
            self._verified.discard(step)
        if self.recycle_dir is not None:
            self._bound_recycled(kept[0])

    def _make_durable(self, step: int) -> None:
        """fsync a local checkpoint's files (those its marker lists, and the marker), its folder and
        the root, once per step: after this, a power loss cannot tear it."""
        if step in self._durable:
            return
        folder = storage.filesystem(self.step_uri(step))[1]
        names = [*self.marker(step)["files"], MARKER]
        _fsync(
            *((posixpath.join(folder, n), os.O_RDONLY) for n in names),
            (folder, os.O_RDONLY | os.O_DIRECTORY),
            (posixpath.dirname(folder), os.O_RDONLY | os.O_DIRECTORY),
        )
        self._durable.add(step)

    def _recycle(self, step: int) -> None:
        """Move a retired checkpoint's data files into the recycle folder, its marker removed first:
        from then on the folder is uncommitted, so a recycled file never belongs to a loadable
        checkpoint (a kill -9 in between leaves an uncommitted leftover, deleted next time)."""
        assert self.recycle_dir is not None
        uri = self.step_uri(step)
        marker_uri = storage.join(uri, MARKER)
        try:
            names = [n for n in self.marker(step)["files"] if n.endswith(DATA_SUFFIX)]
        except (OSError, KeyError, ValueError):
            names = []
        storage.remove(marker_uri)
        folder = storage.filesystem(uri)[1]
        os.makedirs(self.recycle_dir, exist_ok=True)
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.rename(
                    posixpath.join(folder, name),
                    posixpath.join(self.recycle_dir, f"{step_dir_name(step)}.{name}"),
                )

    def _bound_recycled(self, newest: int) -> None:
        """Keep at most as many recycled files as the newest committed checkpoint has data files
        (all ranks'): the most recently recycled ones; delete the rest."""
        assert self.recycle_dir is not None
        try:
            recycled = sorted(n for n in os.listdir(self.recycle_dir) if n.endswith(DATA_SUFFIX))
        except FileNotFoundError:
            return
        try:
            files = self.marker(newest)["files"]
            limit = sum(1 for n in files if n.endswith(DATA_SUFFIX))
        except (OSError, KeyError, ValueError):
            limit = 0  # no committed checkpoint to size the folder by
        for name in recycled[: max(0, len(recycled) - limit)]:  # names sort oldest step first
            with contextlib.suppress(FileNotFoundError):  # taken by a writing rank meanwhile
                os.unlink(posixpath.join(self.recycle_dir, name))
