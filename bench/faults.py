"""Fault injection against real components: each scenario injects one fault, then observes what
became of the run, the data and the capacity. Prints one JSON object last.

Components: the SQLite ledger (and a PostgreSQL address nothing listens on, for "ledger down"),
the GCS emulator (``testing/gcs_emulator.py``), real ``torchrun`` process groups of the local
backend, DCP checkpoints, the dataset copier. Every scenario has a time bound; one that overruns
is stopped (SIGALRM) and counted in ``hung``.

Totals:
- ``data_lost``: runs that neither resumed from a verified checkpoint nor failed clearly, plus
  verified data (checkpoints, replicas) a fault destroyed;
- ``corrupt_loaded``: torn or corrupt bytes a loader accepted (checkpoint or dataset);
- ``leaked_pools``: clusters (local cluster records, torchrun processes) left after teardown;
- ``leaked_reservations``: live ledger reservations left after teardown;
- ``hung``: scenarios that overran their bound;
- ``unmeasured``: scenarios that crashed or overran before they could count the above (their
  counters are null, left out of the totals; such a scenario has failed).

Run: .venv/bin/python bench/faults.py [--quick] [--only NAME[,NAME]]
(``--quick`` skips the scenarios that train through the whole pipeline.)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = {
    "job_name": "faults",
    "team": "qa",
    "model": "tiny_gpt",
    "num_workers": 1,
    "total_steps": 20,
    "checkpoint_every_steps": 10,
    "batch_size": 4,
}
"""A run that trains in seconds on one CPU process."""


@dataclasses.dataclass
class Outcome:
    ok: bool
    detail: str
    data_lost: int = 0
    corrupt_loaded: int = 0
    leaked_pools: int = 0
    leaked_reservations: int = 0


COUNTERS = ("data_lost", "corrupt_loaded", "leaked_pools", "leaked_reservations")
"""What a scenario counts; null for one that crashed or overran before it could (``unmeasured``)."""


class Harness:
    """A fresh state folder (its own SQLite ledger and region buckets) per scenario."""

    def __init__(self, gcs_url: str | None):
        from sailor_tasks.settings import Settings
        from sailor_tasks.stages import StageContext

        self.dir = tempfile.mkdtemp(prefix="sailor-faults-")
        os.environ["SAILOR_STATE_DIR"] = os.path.join(self.dir, "state")
        os.environ.pop("SAILOR_LEDGER_URL", None)
        os.environ.pop("SAILOR_BUCKET_TEMPLATE", None)
        self.settings = Settings.from_env()
        self.ctx = StageContext(self.settings)
        self.gcs_url = gcs_url
        dead = f"postgresql+psycopg://sailor:x@127.0.0.1:{_free_port()}/sailor"
        self.down = StageContext(dataclasses.replace(self.settings, ledger_url=dead))
        """The same settings with the ledger at an address nothing listens on."""

    def dataset(self) -> str:
        from sailor_tasks import storage
        from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset

        write_demo_dataset(storage.resolve(DEMO_DATASET, self.settings), num_shards=2, shard_bytes=64_000)
        return DEMO_DATASET

    def leaks(self, run_id: str) -> tuple[int, int]:
        """(pools, reservations) the run left: cluster records and processes; live reservations."""
        from sailor_tasks.backends.local import run_processes
        from sailor_tasks.model import run_key

        clusters = self.settings.clusters_dir
        records = [n for n in os.listdir(clusters)] if os.path.isdir(clusters) else []
        procs = run_processes(run_key(run_id))
        live = [r for r in self.ctx.ledger.live_reservations() if r.run_id == run_id]
        return len(records) + len(procs), len(live)

    def bucket(self) -> str:
        import uuid

        from sailor_tasks.storage import filesystem

        name = f"f-{uuid.uuid4().hex[:12]}"
        fs, _ = filesystem(f"gs://{name}")
        fs.mkdir(name)
        return f"gs://{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ok(h: Harness, run_id: str, result: dict | None) -> tuple[bool, str]:
    """The run ended success with every step trained and a verified checkpoint to show for it."""
    from sailor_tasks import paths
    from sailor_tasks.train.checkpoint.store import CheckpointStore

    run = h.ctx.ledger.get_run(run_id)
    if run is None or run["status"] != "success":
        return False, f"run status {run and run['status']}"
    if run["steps"] != TINY["total_steps"] or not math.isfinite(run["final_loss"] or math.nan):
        return False, f"steps {run['steps']}, final loss {run['final_loss']}"
    attempts = h.ctx.ledger.attempts(run_id)
    root = paths.checkpoint_uri(h.ctx.run_uri(attempts[-1]["region"], run_id))
    step = CheckpointStore(root).latest_valid_step()
    if step != TINY["total_steps"]:
        return False, f"newest verified checkpoint {step}"
    return True, f"success after {len(attempts)} attempt(s), checkpoint {step} verified"


# --- the pipeline with the ledger down at one stage ------------------------------------------------
STAGES = ("validate", "plan", "place_data", "provision", "train", "finalize", "teardown")


def ledger_down_at(stage: str) -> Callable[[Harness], Outcome]:
    def scenario(h: Harness) -> Outcome:
        from sailor_tasks import stages

        run_id = f"manual__ledger-down-{stage}"
        params = {**TINY, "dataset_uri": h.dataset()}
        refused: list[str] = []

        def call(name: str, fn: Callable[[Any], Any]) -> Any:
            if name == stage:
                try:
                    fn(h.down)
                except Exception as exc:  # the stage failed with the ledger down, as it should
                    refused.append(f"{type(exc).__name__}")
                else:
                    refused.append("completed")
            return fn(h.ctx)  # the ledger is back: Airflow's retry of the task

        out: dict[str, Any] = {}
        try:
            out["request"] = call("validate", lambda c: stages.validate(params, run_id, c))
            out["placement"] = call("plan", lambda c: stages.plan(out["request"], run_id, c))
            out["data"] = call(
                "place_data", lambda c: stages.place_data(out["request"], out["placement"], run_id, c)
            )
            call("provision", lambda c: stages.provision(out["request"], out["placement"], run_id, c))
            out["result"] = call(
                "train",
                lambda c: stages.train(out["request"], out["placement"], out["data"], run_id, c),
            )
            call(
                "finalize",
                lambda c: stages.finalize(
                    out["request"], out["placement"], out["data"], out["result"], run_id, c
                ),
            )
        finally:
            if stage == "teardown":
                try:
                    stages.teardown(run_id, h.down)
                    refused.append("completed")
                except Exception as exc:  # the release failed with the ledger down, as it should
                    refused.append(type(exc).__name__)
                pools_while_down, _ = h.leaks(run_id)  # the backend goes first, ledger or not
            stages.teardown(run_id, h.ctx)
        ok, detail = _run_ok(h, run_id, out.get("result"))
        pools, reservations = h.leaks(run_id)
        if stage == "teardown" and pools_while_down:
            return Outcome(
                False, f"teardown with the ledger down left {pools_while_down} pool(s)", 0, 0, 1, reservations
            )
        return Outcome(
            ok and refused[0] != "completed",
            f"{stage} with the ledger down: {refused[0]}; retried: {detail}",
            data_lost=0 if ok else 1,
            leaked_pools=pools,
            leaked_reservations=reservations,
        )

    return scenario


# --- training processes ---------------------------------------------------------------------------
def preemption(kind: str) -> Callable[[Harness], Outcome]:
    """A noticed preemption at a checkpoint step (the notice lands during the save), or a kill
    without notice between checkpoints: the run resumes from a verified checkpoint and completes.
    A notice is a signal: it lands during the step-10 save or the step after it, and the trainer
    saves the step it stops at, so the run must resume exactly where its first attempt stopped
    (at step 10 or later) with no step lost; a kill at step 15 resumes from the step-10 checkpoint."""

    def scenario(h: Harness) -> Outcome:
        from sailor_tasks.testing.run_inline import run_inline

        run_id = f"manual__{kind}"
        inject = {"inject_preemptions": [10]} if kind == "notice_during_save" else {"inject_kills": [15]}
        result = run_inline({**TINY, **inject, "dataset_uri": h.dataset()}, run_id, h.ctx)
        ok, detail = _run_ok(h, run_id, result)
        preempted = h.ctx.ledger.preemptions(run_id)
        pools, reservations = h.leaks(run_id)
        attempts = h.ctx.ledger.attempts(run_id)
        resumed = [a["resumed_from_step"] for a in attempts]
        stopped = attempts[0]["step"]
        lost = [p["steps_lost"] for p in preempted]
        good = ok and len(preempted) == 1
        if kind == "notice_during_save":
            expected = stopped  # the step the first attempt saved when it stopped (>= 10)
            good = good and lost == [0] and stopped is not None and stopped >= 10
        else:
            expected = 10
        good = good and resumed[-1] == expected
        return Outcome(
            good,
            f"{detail}; preemptions {len(preempted)}, first attempt stopped at step {stopped}, "
            f"resumed from {resumed} (expected {expected}), steps lost {lost}",
            data_lost=0 if ok else 1,
            leaked_pools=pools,
            leaked_reservations=reservations,
        )

    return scenario


def kill9_train_task(h: Harness) -> Outcome:
    """kill -9 of the process running the train stage: torchrun and its worker go on; teardown stops
    them and releases the reservation; the run's checkpoints stay verified."""
    from sailor_tasks import paths, stages
    from sailor_tasks.backends.local import run_processes
    from sailor_tasks.model import run_key
    from sailor_tasks.train.checkpoint.store import CheckpointStore

    run_id = "manual__kill9-task"
    params = {**TINY, "total_steps": 100_000, "dataset_uri": h.dataset()}
    request = stages.validate(params, run_id, h.ctx)
    placement = stages.plan(request, run_id, h.ctx)
    data = stages.place_data(request, placement, run_id, h.ctx)
    stages.provision(request, placement, run_id, h.ctx)
    script = (
        "import json, sys\nfrom sailor_tasks import stages\n"
        "request, placement, data = json.loads(sys.argv[1])\nstages.train(request, placement, data, sys.argv[2])\n"
    )
    task = subprocess.Popen([sys.executable, "-c", script, json.dumps([request, placement, data]), run_id])
    root = paths.checkpoint_uri(h.ctx.run_uri(placement["region"], run_id))
    try:
        deadline = time.monotonic() + 120
        while CheckpointStore(root).latest_valid_step() is None:
            if task.poll() is not None or time.monotonic() > deadline:
                return Outcome(False, "training did not reach a checkpoint", data_lost=1)
            time.sleep(0.2)
        task.send_signal(signal.SIGKILL)
        task.wait()
        orphans = len(run_processes(run_key(run_id)))
    finally:
        stages.teardown(run_id, h.ctx)
    pools, reservations = h.leaks(run_id)
    step = CheckpointStore(root).latest_valid_step()
    return Outcome(
        orphans >= 1 and step is not None,
        f"{orphans} process(es) outlived the task; teardown stopped them; checkpoint {step} verified",
        data_lost=0 if step is not None else 1,
        leaked_pools=pools,
        leaked_reservations=reservations,
    )


WORKER = """\
import os, sys, time
with open(os.path.join(sys.argv[1], f"worker-{os.environ['RANK']}.pid"), "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def kill9_agent(h: Harness) -> Outcome:
    """kill -9 of the torchrun agent: its workers (sessions of their own) die with it."""
    import psutil

    from sailor_tasks.backends.base import TrainLaunch
    from sailor_tasks.backends.local import LocalBackend
    from sailor_tasks.model import Placement
    from sailor_tasks.settings import Settings
    from sailor_tasks.train.config import TrainConfig

    code = os.path.join(h.dir, "code")
    pids = os.path.join(h.dir, "pids")
    os.makedirs(code)
    os.makedirs(pids)
    with open(os.path.join(code, "worker.py"), "w") as f:
        f.write(WORKER)
    os.environ["SAILOR_COMMAND_ROOTS"] = code
    try:
        backend = LocalBackend(Settings.from_env())
    finally:
        del os.environ["SAILOR_COMMAND_ROOTS"]
    here = Placement("r", "local", "us-central1", "us-central1-a", "cpu", 2, 1, 2, "spot", "local", 0.0)
    config = TrainConfig(
        run_id="orphans",
        model="tiny_gpt",
        data_uri=f"file://{h.dir}/data",
        output_uri=f"file://{h.dir}/runs/orphans",
        total_steps=10,
        checkpoint_every_steps=5,
        seed=1,
        command=("python", "worker.py", pids),
    )
    launch = TrainLaunch("orphans", "orphans-key", f"file://{h.dir}/train_config.json", 2, here)
    agent = subprocess.Popen(
        backend.command(launch, config),
        env=backend.environment(launch, config),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(pids)) < 2:
            if agent.poll() is not None or time.monotonic() > deadline:
                return Outcome(False, "workers did not start")
            time.sleep(0.05)
        workers = [psutil.Process(int(open(os.path.join(pids, n)).read())) for n in os.listdir(pids)]
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        _, alive = psutil.wait_procs(workers, timeout=10)
    finally:
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if p.environ().get("SAILOR_LOCAL_RUN_KEY") == "orphans-key":
                    p.kill()
    return Outcome(
        not alive,
        f"{len(workers)} workers, {len(alive)} left after the agent's SIGKILL",
        leaked_pools=len(alive),
    )


# --- dataset copies -------------------------------------------------------------------------------
@contextlib.contextmanager
def _faulty_filesystem(prefix: str, open_file: Callable[[Any, str, str, dict], Any]):
    """While inside: every fsspec filesystem that ``storage`` hands out for a URI starting with
    ``prefix`` opens files through ``open_file(fs, path, mode, kwargs)`` (which may raise or return
    a file that fails later); everything else of the filesystem is the real one."""
    from sailor_tasks import storage

    real = storage.filesystem

    class Faulty:
        def __init__(self, fs):
            self.fs = fs

        def open(self, path, mode="rb", **kw):
            return open_file(self.fs, path, mode, kw)

        def __getattr__(self, name):
            return getattr(self.fs, name)

    def filesystem(uri):
        fs, path = real(uri)
        return (Faulty(fs), path) if uri.startswith(prefix) else (fs, path)

    storage.filesystem = filesystem
    try:
        yield
    finally:
        storage.filesystem = real


def _failing_uploads(suffix: str) -> Callable[[Any, str, str, dict], Any]:
    """An ``open_file`` for ``_faulty_filesystem``: writing a file whose path ends with ``suffix``
    fails as an unavailable GCS API would."""

    def open_file(fs, path, mode, kw):
        if "w" in mode and path.endswith(suffix):
            raise OSError(503, "injected: Service Unavailable during upload")
        return fs.open(path, mode, **kw)

    return open_file


def _sealed_source(h: Harness, files: int = 3, size: int = 300_000) -> str:
    from sailor_tasks import storage
    from sailor_tasks.data.copier import seal

    src = f"file://{h.dir}/src"
    for i in range(files):
        storage.write_bytes(f"{src}/part-{i}.bin", os.urandom(size))
    seal(src)
    return src


def _replica_outcome(src: str, dst: str, what: str) -> Outcome:
    from sailor_tasks.data.manifest import read_manifest, verify
    from sailor_tasks.errors import DataIntegrityError

    manifest = read_manifest(dst)
    if manifest is None or manifest.files != read_manifest(src).files:
        return Outcome(False, f"{what}: replica incomplete after the retry", data_lost=1)
    try:
        verify(dst, manifest)
    except DataIntegrityError as exc:
        return Outcome(False, f"{what}: {exc}", corrupt_loaded=1)
    return Outcome(True, f"{what}; the retried copy verified")


def gcs_error_mid_copy(h: Harness) -> Outcome:
    """The GCS API fails an upload mid-copy: no manifest; the retry resumes and verifies."""
    from sailor_tasks.data.copier import copy_dataset
    from sailor_tasks.data.manifest import read_manifest

    src, dst = _sealed_source(h), f"{h.bucket()}/datasets/d"
    try:
        with _faulty_filesystem("gs://", _failing_uploads("part-1.bin")):
            copy_dataset(src, dst, max_workers=1)
        return Outcome(False, "the copy ignored the failed upload", data_lost=1)
    except OSError:
        pass
    if read_manifest(dst) is not None:
        return Outcome(False, "a manifest was written over a failed copy", corrupt_loaded=1)
    again = copy_dataset(src, dst, max_workers=1)
    out = _replica_outcome(
        src, dst, f"503 mid-copy; retry copied {again.bytes_copied} B, kept {again.bytes_skipped} B"
    )
    out.ok = out.ok and again.bytes_skipped > 0
    return out


def kill9_copier(store: str) -> Callable[[Harness], Outcome]:
    """kill -9 of a copier mid-file (holding the replica's ledger lease): nothing partial is taken
    for data; the next copy waits out the lease, cleans up and completes."""

    def scenario(h: Harness) -> Outcome:
        from sailor_tasks import storage
        from sailor_tasks.data.copier import copy_dataset, list_files

        src = _sealed_source(h, files=2, size=1_000_000)
        dst = f"{h.bucket()}/datasets/d" if store == "gcs" else f"file://{h.dir}/replica"
        url = h.settings.ledger_url
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
            while h.ctx.ledger.lease_holder(f"replica:{dst}") is None or not _copy_underway(dst):
                if proc.poll() is not None or time.monotonic() > deadline:
                    return Outcome(False, "the copier ended before it was killed")
                time.sleep(0.01)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        listed = {rel for rel, _ in list_files(dst)} if storage.exists(dst) else set()
        partial = [
            rel for rel in listed if storage.read_bytes(f"{dst}/{rel}") != storage.read_bytes(f"{src}/{rel}")
        ]
        again = copy_dataset(src, dst, lease=lambda n: h.ctx.ledger.lease(n, ttl_s=1.5, poll_s=0.05))
        out = _replica_outcome(src, dst, f"killed mid-file; {len(partial)} partial file(s) listed")
        leftovers = [p for p in _local_files(dst) if storage.is_temporary(p)]
        out.ok = out.ok and not partial and not leftovers and again.manifest is not None
        out.corrupt_loaded += len(partial)
        out.detail += f"; temporaries left {len(leftovers)}; leases live {len(h.ctx.ledger.live_leases())}"
        return out

    return scenario


def _copy_underway(dst: str) -> bool:
    from sailor_tasks import storage

    if dst.startswith("gs://"):
        return storage.exists(f"{dst}/part-0.bin")
    return any(storage.is_temporary(p) and os.path.getsize(p) > 100_000 for p in _local_files(dst))


def _local_files(dst: str) -> list[str]:
    if not dst.startswith("file://"):
        return []
    base = dst[len("file://") :]
    return [os.path.join(d, n) for d, _, names in os.walk(base) for n in names]


def concurrent_copies(h: Harness) -> Outcome:
    """Two place_data of one dataset into one gs:// replica at once (two ledgers, one database)."""
    from sailor_tasks.data.copier import copy_dataset
    from sailor_tasks.ledger import Ledger

    src, dst = _sealed_source(h, files=4), f"{h.bucket()}/datasets/d"
    results: list[Any] = []

    def copy() -> None:
        ledger = Ledger(h.settings.ledger_url)
        results.append(copy_dataset(src, dst, max_workers=1, lease=lambda n: ledger.lease(n, poll_s=0.05)))

    threads = [threading.Thread(target=copy) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    moved = sorted(r.bytes_copied for r in results)
    out = _replica_outcome(src, dst, f"bytes copied by each: {moved}")
    out.ok = out.ok and moved[0] == 0
    return out


def torn_replica(h: Harness) -> Outcome:
    """A replica file changes under its manifest: the trainer's loader refuses it."""
    from sailor_tasks import storage
    from sailor_tasks.data.copier import copy_dataset
    from sailor_tasks.errors import DataIntegrityError
    from sailor_tasks.train.data import ByteCorpus

    src, dst = _sealed_source(h, files=2, size=50_000), f"file://{h.dir}/replica"
    copy_dataset(src, dst)
    path = f"{dst}/part-1.bin"
    data = bytearray(storage.read_bytes(path))
    data[len(data) // 2 :] = b"\0" * (len(data) - len(data) // 2)  # half of it never arrived
    storage.write_bytes(path, bytes(data))
    try:
        ByteCorpus.load(dst, seq_len=64, seed=0)
    except DataIntegrityError as exc:
        return Outcome(True, f"loader refused the torn replica: {str(exc)[:80]}")
    return Outcome(False, "the loader accepted a torn replica", corrupt_loaded=1)


def source_changed(h: Harness) -> Outcome:
    """A source file changes after sealing (mid-copy for the copier): refused, no manifest."""
    from sailor_tasks import storage
    from sailor_tasks.data.copier import copy_dataset
    from sailor_tasks.data.manifest import read_manifest
    from sailor_tasks.errors import DataIntegrityError

    src, dst = _sealed_source(h), f"{h.bucket()}/datasets/d"
    storage.write_bytes(f"{src}/part-2.bin", b"changed after sealing")
    try:
        copy_dataset(src, dst)
    except DataIntegrityError:
        ok = read_manifest(dst) is None
        return Outcome(
            ok,
            "copy refused with DataIntegrityError; no manifest" if ok else "manifest written",
            corrupt_loaded=0 if ok else 1,
        )
    return Outcome(False, "a changed source was copied as good", corrupt_loaded=1)


def interrupted_read(h: Harness) -> Outcome:
    """The source read breaks mid-file: no manifest; the retry keeps the finished files."""
    from sailor_tasks.data.copier import copy_dataset
    from sailor_tasks.data.manifest import read_manifest

    src, dst = _sealed_source(h), f"file://{h.dir}/replica"

    def broken_read(fs, path, mode, kw):
        f = fs.open(path, mode, **kw)
        if "r" in mode and path.endswith("part-2.bin"):
            f.read = lambda n=-1: (_ for _ in ()).throw(ConnectionResetError("injected: connection reset"))
        return f

    try:
        with _faulty_filesystem(src, broken_read):
            copy_dataset(src, dst, max_workers=1)
        return Outcome(False, "the copy ignored a broken read", data_lost=1)
    except ConnectionResetError:
        pass
    if read_manifest(dst) is not None:
        return Outcome(False, "a manifest was written over a broken copy", corrupt_loaded=1)
    again = copy_dataset(src, dst, max_workers=1)
    out = _replica_outcome(
        src, dst, f"read broken mid-copy; retry copied {again.bytes_copied} B, kept {again.bytes_skipped} B"
    )
    out.ok = out.ok and again.bytes_skipped == 600_000
    return out


# --- checkpoints ----------------------------------------------------------------------------------
def _state(fill: float, n: int = 256) -> dict:
    import torch

    return {"w": torch.full((n, n), float(fill)), "meta": {"fill": float(fill)}}


def _loaded_is(mgr: Any, step: int, fill: float, n: int = 256) -> bool:
    from sailor_tasks.train.checkpoint.dcp import diff_states

    got = _state(-1.0, n)
    mgr.load(step, got)
    return diff_states(got, _state(fill, n)) == []


def _flip(uri: str) -> None:
    from sailor_tasks import storage

    data = bytearray(storage.read_bytes(uri))
    data[len(data) // 2] ^= 0xFF
    storage.write_bytes(uri, bytes(data))


def corrupt_newest(h: Harness) -> Outcome:
    """The newest checkpoint's data is corrupt: resume loads the one before, bit for bit."""
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager

    mgr = CheckpointManager(f"file://{h.dir}/ckpt", keep_latest_k=3)
    for step in (10, 20):
        mgr.save(step, _state(step))
    mgr.wait()
    (data,) = [n for n in os.listdir(f"{h.dir}/ckpt/step-00000020") if n.endswith(".distcp")][:1]
    _flip(f"file://{h.dir}/ckpt/step-00000020/{data}")
    step = mgr.latest_valid_step()
    ok = step == 10 and _loaded_is(mgr, 10, 10)
    return Outcome(
        ok, f"resumes from {step}", corrupt_loaded=0 if step != 20 else 1, data_lost=0 if step == 10 else 1
    )


def torn_marker(h: Harness) -> Outcome:
    """The commit marker was cut short (a kill during its write): that step is not loadable."""
    from sailor_tasks import storage
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager
    from sailor_tasks.train.checkpoint.store import MARKER

    mgr = CheckpointManager(f"file://{h.dir}/ckpt", keep_latest_k=3)
    for step in (10, 20):
        mgr.save(step, _state(step))
    mgr.wait()
    uri = storage.join(mgr.step_uri(20), MARKER)
    storage.write_bytes(uri, storage.read_bytes(uri)[:40])
    step = mgr.latest_valid_step()
    return Outcome(
        step == 10 and _loaded_is(mgr, 10, 10), f"resumes from {step}", corrupt_loaded=int(step == 20)
    )


SAVER = """\
import sys, resource, signal, torch
from sailor_tasks.train.checkpoint.dcp import CheckpointManager
root, n = sys.argv[1], int(sys.argv[2])
mgr = CheckpointManager(root, keep_latest_k=2)
for step in range(1, 10_000):
    mgr.save(step * 10, {"w": torch.full((n, n), float(step * 10)), "meta": {"fill": float(step * 10)}})
    mgr.wait()
    print(step * 10, flush=True)
"""


def kill9_during_save(h: Harness) -> Outcome:
    """kill -9 of a process while it writes checkpoints (8 MB each, back to back): the newest
    verified checkpoint loads bit for bit."""
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager

    root = f"file://{h.dir}/ckpt"
    proc = subprocess.Popen([sys.executable, "-c", SAVER, root, "1448"], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # three saves done, the fourth underway
            proc.stdout.readline()
        time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    mgr = CheckpointManager(root)
    step = mgr.latest_valid_step()
    ok = step is not None and step >= 30 and _loaded_is(mgr, step, step, 1448)
    return Outcome(
        ok, f"killed mid-save; steps on disk {mgr.step_dirs()}, resumes from {step}", data_lost=0 if ok else 1
    )


DISK_FULL = """\
import sys, torch
from sailor_tasks.train.checkpoint.dcp import CheckpointManager
mgr = CheckpointManager(sys.argv[1], keep_latest_k=2)
mgr.save(10, {"w": torch.full((256, 256), 10.0), "meta": {"fill": 10.0}})
try:
    mgr.save(20, {"w": torch.full((2048, 2048), 20.0), "meta": {"fill": 20.0}})
except BaseException as exc:  # DCP's CheckpointException (a BaseException) wraps the OSError (EFBIG)
    print("save failed:", type(exc).__name__, "EFBIG" if "File too large" in str(exc) else str(exc)[:200])
    sys.exit(3)
"""


def disk_full(h: Harness) -> Outcome:
    """The disk fills during a save (RLIMIT_FSIZE: writes past 4 MiB fail with EFBIG): the save
    fails, nothing is committed, the previous checkpoint still loads."""
    import resource

    from sailor_tasks.train.checkpoint.dcp import CheckpointManager

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))

    root = f"file://{h.dir}/ckpt"
    proc = subprocess.run(
        [sys.executable, "-c", DISK_FULL, root], preexec_fn=limit, capture_output=True, text=True, timeout=120
    )
    mgr = CheckpointManager(root)
    step = mgr.latest_valid_step()
    ok = proc.returncode == 3 and "EFBIG" in proc.stdout and step == 10 and _loaded_is(mgr, 10, 10)
    return Outcome(
        ok,
        f"exit {proc.returncode} ({proc.stdout.strip()[:60]}); committed {mgr.committed_steps()}, resumes from {step}",
        data_lost=0 if step == 10 else 1,
        corrupt_loaded=int(step == 20),
    )


def stale_attempt_commit(h: Harness) -> Outcome:
    """An orphaned worker of attempt 1 saves after attempt 2 claimed the root: refused, and attempt
    2's checkpoint of the same step stays as it wrote it."""
    from sailor_tasks.errors import StaleAttemptError
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager

    root = f"file://{h.dir}/ckpt"
    old = CheckpointManager(root, attempt=1)
    old.claim(1)
    old.save(10, _state(10))
    new = CheckpointManager(root, attempt=2)
    new.claim(2)
    new.save(20, _state(20))
    new.wait()
    refused = 0
    for step in (20, 30):
        try:
            old.save(step, _state(99))
        except StaleAttemptError:
            refused += 1
    ok = (
        refused == 2
        and new.latest_valid_step() == 20
        and _loaded_is(new, 20, 20)
        and new.step_dirs() == [10, 20]
    )
    return Outcome(
        ok,
        f"{refused}/2 stale saves refused; newest {new.latest_valid_step()}",
        corrupt_loaded=0 if ok else 1,
    )


def stale_marker(h: Harness) -> Outcome:
    """A stale attempt's marker lands after the newer attempt's claim (the object-store window): not loadable."""
    from sailor_tasks import storage
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager
    from sailor_tasks.train.checkpoint.store import MARKER, CheckpointStore

    root = f"file://{h.dir}/ckpt"
    old = CheckpointManager(root, attempt=1, keep_latest_k=3)
    old.claim(1)
    old.save(10, _state(10))
    old.save(20, _state(99))
    old.wait()
    uri = storage.join(old.step_uri(20), MARKER)
    marker = storage.read_bytes(uri)
    storage.remove(uri)
    CheckpointStore(root).claim(2)
    storage.write_bytes(uri, marker)
    step = CheckpointStore(root).latest_valid_step()
    return Outcome(step == 10, f"resumes from {step}", corrupt_loaded=int(step == 20))


def retention_corrupt_newest(h: Harness) -> Outcome:
    """keep_latest_k=2 with a corrupt newest checkpoint: the next save keeps the last good one."""
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager

    mgr = CheckpointManager(f"file://{h.dir}/ckpt", keep_latest_k=2)
    for step in (10, 20):
        mgr.save(step, _state(step))
    mgr.wait()
    data = [n for n in os.listdir(f"{h.dir}/ckpt/step-00000020") if n.endswith(".distcp")][0]
    _flip(f"file://{h.dir}/ckpt/step-00000020/{data}")
    fresh = CheckpointManager(f"file://{h.dir}/ckpt", keep_latest_k=2)  # a restarted process
    fresh.save(30, _state(30))
    fresh.wait()
    dirs = fresh.step_dirs()
    # Step 30 then 10 are the verified ones: 10 must survive; then step 30 is corrupted too.
    data = [n for n in os.listdir(f"{h.dir}/ckpt/step-00000030") if n.endswith(".distcp")][0]
    _flip(f"file://{h.dir}/ckpt/step-00000030/{data}")
    step = fresh.latest_valid_step()
    ok = 10 in dirs and step == 10 and _loaded_is(fresh, 10, 10)
    return Outcome(
        ok,
        f"after the next save: {dirs}; with the two newest corrupt, resumes from {step}",
        data_lost=0 if ok else 1,
    )


def checkpoint_copy_interrupted(h: Harness) -> Outcome:
    """Recovery's copy of the newest checkpoint to the new region breaks mid-file: no marker there;
    the retried copy verifies."""
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager
    from sailor_tasks.train.checkpoint.store import CheckpointStore

    src, dst = f"file://{h.dir}/a", f"{h.bucket()}/ckpt"
    mgr = CheckpointManager(src)
    mgr.save(10, _state(10))
    mgr.wait()
    try:
        with _faulty_filesystem("gs://", _failing_uploads(".distcp")):
            CheckpointStore(src).copy_latest_to(dst)
        return Outcome(False, "the copy ignored the failed upload", data_lost=1)
    except OSError:
        pass
    dest = CheckpointStore(dst)
    if dest.latest_valid_step() is not None:
        return Outcome(False, "a broken copy verified", corrupt_loaded=1)
    step = CheckpointStore(src).copy_latest_to(dst)
    ok = step == 10 and _loaded_is(CheckpointManager(dst), 10, 10)
    return Outcome(ok, f"retried copy: step {step} verified on gs://", data_lost=0 if ok else 1)


def lease_holder_killed_ledger_down(h: Harness) -> Outcome:
    """The ledger is down when a copy needs its replica's lease: the copy fails clearly before any
    byte moves; nothing is left half-written."""
    from sailor_tasks.data.copier import copy_dataset

    src, dst = _sealed_source(h), f"file://{h.dir}/replica"
    try:
        copy_dataset(src, dst, lease=lambda n: h.down.ledger.lease(n))
    except Exception as exc:
        left = _local_files(dst)
        return Outcome(not left, f"refused ({type(exc).__name__}); {len(left)} file(s) written")
    return Outcome(False, "copied without the lease")


# --- the runner -----------------------------------------------------------------------------------
PIPELINE = [
    *((f"ledger_down_at_{s}", 180, ledger_down_at(s)) for s in STAGES),
    ("notice_during_save", 240, preemption("notice_during_save")),
    ("kill_without_notice", 240, preemption("kill_without_notice")),
    ("kill9_train_task", 180, kill9_train_task),
]
QUICK = [
    ("kill9_torchrun_agent", 90, kill9_agent),
    ("gcs_error_mid_copy", 60, gcs_error_mid_copy),
    ("kill9_copier_gcs", 60, kill9_copier("gcs")),
    ("kill9_copier_local", 60, kill9_copier("local")),
    ("concurrent_copies_one_gcs_replica", 60, concurrent_copies),
    ("torn_replica", 30, torn_replica),
    ("source_changed_mid_copy", 30, source_changed),
    ("read_broken_mid_copy", 30, interrupted_read),
    ("ledger_down_for_copy_lease", 30, lease_holder_killed_ledger_down),
    ("corrupt_newest_checkpoint", 60, corrupt_newest),
    ("torn_commit_marker", 60, torn_marker),
    ("kill9_during_save", 120, kill9_during_save),
    ("disk_full_during_checkpoint", 120, disk_full),
    ("stale_attempt_commit", 60, stale_attempt_commit),
    ("stale_marker_after_claim", 60, stale_marker),
    ("retention_with_corrupt_newest", 60, retention_corrupt_newest),
    ("checkpoint_copy_interrupted", 60, checkpoint_copy_interrupted),
]


class _Overrun(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Overrun()


def run_scenario(name: str, bound_s: int, fn: Callable[[Harness], Outcome], gcs_url: str) -> dict[str, Any]:
    started = time.monotonic()
    hung, measured = False, True
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(bound_s)
    harness: Harness | None = None
    try:
        harness = Harness(gcs_url)
        out = fn(harness)
    except _Overrun:
        hung, measured = True, False
        out = Outcome(False, f"did not end within {bound_s} s")
    except Exception as exc:
        measured = False
        out = Outcome(
            False, f"{type(exc).__name__}: {exc}"[:300] + " | " + traceback.format_exc(limit=3)[-300:]
        )
    finally:
        signal.alarm(0)
        if harness is not None:
            shutil.rmtree(harness.dir, ignore_errors=True)
    seconds = round(time.monotonic() - started, 2)
    row = {"scenario": name, **dataclasses.asdict(out), "hung": hung, "seconds": seconds, "bound_s": bound_s}
    if not measured:  # it stopped before it could count what was lost or leaked: not 0, unknown
        row.update(dict.fromkeys(COUNTERS))
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="skip the scenarios that train through the pipeline"
    )
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    sys.path.insert(0, ROOT)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

    from sailor_tasks.testing.gcs_emulator import gcs_emulator

    chosen = QUICK if args.quick else [*PIPELINE, *QUICK]
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {n for n, _, _ in (*PIPELINE, *QUICK)}
        if unknown:
            parser.error(
                f"unknown scenario(s) {sorted(unknown)}; valid: {[n for n, _, _ in (*PIPELINE, *QUICK)]}"
            )
        chosen = [s for s in (*PIPELINE, *QUICK) if s[0] in names]
    started = time.monotonic()
    with gcs_emulator() as url:
        os.environ["STORAGE_EMULATOR_HOST"] = url
        rows = [run_scenario(name, bound, fn, url) for name, bound, fn in chosen]
    total = {key: sum(int(r[key]) for r in rows if r[key] is not None) for key in (*COUNTERS, "hung")}
    print(
        json.dumps(
            {
                "benchmark": "faults",
                "scenarios": len(rows),
                "passed": sum(r["ok"] for r in rows),
                "failed": [r["scenario"] for r in rows if not r["ok"]],
                **total,
                "unmeasured": [r["scenario"] for r in rows if r["data_lost"] is None],
                "seconds": round(time.monotonic() - started, 1),
                "outcomes": {
                    r["scenario"]: {"ok": r["ok"], "seconds": r["seconds"], "detail": r["detail"]}
                    for r in rows
                },
            }
        )
    )


if __name__ == "__main__":
    main()
