"""Checkpoint save/restore speed for a model of >= 100 MB of state (gpt_25m + AdamW moments).

Every write below stores the same state (the same bytes) to the same filesystem, and every figure
is the median over repeats. Each repeat times, in an order shuffled per repeat (seeded):

- ``sailor``: ``CheckpointManager.save`` (SAILOR's writer: raw tensor bytes with crc32c computed on
  the fly, the first save's DCP plan reused, commit marker) into **new files** (``recycle=False``),
  ``--threads`` writer threads, no fsync.
- ``public``: the public PyTorch path: ``get_state_dict(model, optimizer)`` + ``dcp.save`` with
  DCP's ``FileSystemWriter`` (``thread_count=--threads``), into new files, no fsync.
- ``raw``: plain fsspec writes of the very files the checkpoint wrote (held in memory), into new
  files, spread over ``--threads`` threads (one file per thread at a time, as the checkpoint
  writes them); three ways, each file in 8 MiB ``write`` calls (``raw_8mib``), in one ``write``
  call (``raw_one``), or allocated first (``fallocate``, as SAILOR's writer does) and then written
  in one call (``raw_falloc``); the fastest of the three medians is the baseline.
- the durable variant of each: ``sailor_fsync`` (``sync_files=True``), ``public_fsync``
  (``FileSystemWriter(sync_files=True)``) and ``raw_fsync`` (one ``write`` call, then fsync, per
  file; ``raw_fsync_falloc`` allocated first, the faster of the two is the durable baseline):
  every side fsyncs its data files (and the DCP sides their ``.metadata``).
- ``sailor_recycled``: the trainer's steady state on a local root, reported separately: saves into
  the data files of the checkpoint retired by the previous save (``recycle=True``), overwritten in
  place; its manager makes only these sync saves, as a trainer without async saves does (the async
  saves below have a manager of their own, so that each figure measures one mode). Compared with
  ``raw`` it is not like for like (the raw writes create new files).

The headline ``write_fraction_of_raw`` = raw seconds / sailor seconds (``raw_way``: the fastest
raw way), new files and the same threads on both sides, no fsync (target ≥ 0.8);
``cpu_fraction_of_raw`` the same in CPU seconds; ``durable_fraction_of_raw`` the same with fsync
on both sides (``raw_fsync_way``). ``sailor_vs_public`` = public seconds / sailor seconds (> 1:
SAILOR's writer is faster), new files, with and without fsync.

Untimed, before each timed write: the background retirement of old checkpoints is waited for and
``os.sync()`` runs, so that no write pays for dirty pages or deletions the bench itself left behind
(other processes' I/O can still slow any of them), and the raw bytes are read once (resident in
memory as the model the checkpoints write from is). Then, on every CPU this process may run on, a
thread pinned to that CPU writes the checkpoint's bytes to a ballast folder and deletes them, so
that every write, whichever CPUs its threads run on, takes its page-cache pages from memory freed
just before it. Without this the order of the writes decides who pays for cold memory: a VM whose
guest reports free memory to the hypervisor (Linux free page reporting, as on the dev VM) gets
memory left free for a few seconds taken back, and a write whose pages land there costs several
times its usual kernel CPU. The ballast is freed on every CPU because freed pages stay on the
freeing CPU's free lists (the kernel's per-CPU page lists, up to 616 MiB per CPU on the dev VM):
with the ballast written and deleted by one thread, a writer thread on another CPU took memory the
hypervisor had taken back, at about 8x its usual kernel CPU for its whole file, in 8 of 21 raw
writes and 3 of 21 SAILOR saves (2026-11-27, interleaved; none of either with the ballast on every
CPU): the raw side paid for cold memory more often than SAILOR. The ballast does not undo
everything a write leaves behind (a ``public`` save allocates and frees far more memory than the
bytes it writes, and the write right after it is slower), so the order is shuffled in every repeat:
in a fixed rotation each write would always follow the same other one. Last, a buffer of twice the
CPU's largest cache (at least 256 MiB) is read, so that every write reads its source from memory,
none from cache: without it the raw writes, whose bytes the ballast was just written from, found
part of them in the last-level cache, and the checkpoint writes, whose tensors were last read
before the ballast, found none (on a VM with 260 MiB of L3 and this 306 MB checkpoint, 3 ms of a 33
ms raw write, 2026-11-27).

``seconds`` is each write's median wall time and ``cpu_seconds`` its median CPU time (all threads
of this process, user + system, so the kernel's copy into the page cache counts): on a shared
machine the wall figures move with other processes' load, the CPU figures much less.
``load_average`` is the 1-, 5- and 15-minute load average when the timed writes began and ended.
``min_seconds``, ``min_cpu_seconds`` and ``min_fraction_of_raw`` (fastest repeat of the headline's
raw way / fastest sailor repeat: as many repeats on both sides) are the least disturbed repeats. The default is 15 repeats: on the dev VM up to 7 of 31
writes of a side took 20-70% longer than its median (2026-11-27), and a median of 5 then moves by
more than the gap it measures.

``sailor`` saves the trainer's state as the trainer does: one ``_ModelOptimState`` for the run
(which learns ``get_state_dict``'s renaming once), so from the second save on the state dicts are
the plain ones renamed and DCP's plan of the first save is reused.

Then, per repeat:

- async_stall_s: what a training step loses to ``save_async(pipelined=True)`` (the trainer's mode,
  recycled files as in training, a manager of its own), timed inside real gpt_25m training steps:
  the ``save_async`` call + ``wait_staged`` before the optimizer step + the ``poll`` that collects
  the result.
- async_loop_overhead_s: the same loss as wall time: the steps from the save until it is
  committed, minus as many plain steps (median); it counts the background copy and write competing
  with training for CPU and memory bandwidth, so it is noisy on a loaded machine.
- restore_s: find the newest checkpoint, verify every file's crc32c, load into model/optimizer.

Run: .venv/bin/python bench/checkpoint.py [--repeat 15] [--threads 2] [--uri file:///tmp/x]
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import atexit
import glob
import json
import logging
import os
import random
import resource
import shutil
import statistics
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

WRITES = (
    "sailor",
    "public",
    "raw_8mib",
    "raw_one",
    "raw_falloc",
    "sailor_fsync",
    "public_fsync",
    "raw_fsync",
    "raw_fsync_falloc",
    "sailor_recycled",
)
RAW = ("raw_8mib", "raw_one", "raw_falloc")
RAW_FSYNC = ("raw_fsync", "raw_fsync_falloc")
TARGET_FRACTION_OF_RAW = 0.8
TARGET_STALL_OF_SYNC = 0.1
"""``target_met``: write >= this fraction of the raw write, and an async save stalls training for
at most this fraction of a sync save."""


def largest_cache_bytes() -> int:
    """Size of the CPU's largest cache (Linux sysfs), 0 where unknown."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for folder in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{folder}/size") as f:
                text = f.read().strip()
            sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (OSError, ValueError, KeyError):
            continue
    return max(sizes, default=0)


def cpu_s() -> float:
    """CPU seconds of this process, every thread (the kernel's copy into the page cache included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", help="checkpoint root, local (default: a temporary file:// folder)")
    parser.add_argument("--repeat", type=int, default=15, help="timed writes of each side (medians)")
    parser.add_argument("--model", default="gpt_25m")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per training step (1 sequence)")
    parser.add_argument("--threads", type=int, default=2, help="writer threads of every side (trainer: 2)")
    args = parser.parse_args()
    if args.threads < 1 or args.repeat < 1:
        parser.error(f"--threads {args.threads}, --repeat {args.repeat}: need >= 1")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bench").setLevel(logging.INFO)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")

    import crc32c_rs
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from sailor_tasks import storage
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager, preallocate
    from sailor_tasks.train.checkpoint.store import _CHUNK, MARKER
    from sailor_tasks.train.models import build_model
    from sailor_tasks.train.specs import MODEL_SPECS
    from sailor_tasks.train.trainer import _ModelOptimState

    torch.set_num_threads(1)  # as in a training worker (SAILOR_THREADS_PER_WORKER, default 1)
    torch.manual_seed(0)
    spec = MODEL_SPECS[args.model]
    model = build_model(spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (1, min(args.tokens, spec.seq_len)))

    def forward_backward() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x, x).backward()

    forward_backward()
    optimizer.step()  # materialises the AdamW moments: state = 3x the weights

    if args.uri:
        root = args.uri
    else:  # the bench's own folder (GBs of checkpoints): removed when it ends
        folder = tempfile.mkdtemp(prefix="sailor-bench-ckpt-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        root = f"file://{folder}"
    if storage.scheme_of(root) not in ("", "file"):
        parser.error(f"--uri {root}: the raw and public baselines write local files; give a file:// root")
    fs, base = storage.filesystem(root)
    managers = {
        "sailor": CheckpointManager(
            storage.join(root, "new"), keep_latest_k=2, thread_count=args.threads, recycle=False
        ),
        "sailor_fsync": CheckpointManager(
            storage.join(root, "fsync"),
            keep_latest_k=2,
            thread_count=args.threads,
            recycle=False,
            sync_files=True,
        ),
        "sailor_recycled": CheckpointManager(
            storage.join(root, "recycled"), keep_latest_k=2, thread_count=args.threads, recycle=True
        ),
        # Only async saves (the stall figures), apart from the sync saves timed above.
        "async": CheckpointManager(
            storage.join(root, "async"), keep_latest_k=2, thread_count=args.threads, recycle=True
        ),
    }
    pool = ThreadPoolExecutor(args.threads, thread_name_prefix="bench-raw")
    step = 0

    app_state = _ModelOptimState(model, optimizer)  # one per run, as in the trainer

    def state() -> dict:
        return {"app": app_state, "trainer": {"step": step}}

    # Read after every ballast: no write finds its source in the CPU's caches (module docstring).
    flush = b"\xa5" * max(2 * largest_cache_bytes(), 256 << 20)  # real pages, not the zero page
    blobs: dict[str, bytes] = {}
    """The checkpoint's files (once known): the raw writes' data, and the ballast ``settle`` writes
    and deletes before every timed write."""

    def ballast(folder: str, cpu: int | None) -> None:
        """Write the checkpoint's files into ``folder`` and delete them, pinned to ``cpu`` (None:
        wherever this thread runs): the pages come back on that CPU's free lists."""
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})  # this thread only (Linux)
        fs.makedirs(folder, exist_ok=True)
        for name, blob in blobs.items():
            with fs.open(f"{folder}/{name}", "wb") as f:
                f.write(blob)
        fs.rm(folder, recursive=True)

    ballast_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else [None]

    def settle() -> None:
        for mgr in managers.values():
            mgr.wait()
        os.sync()
        if blobs:  # the same memory state before every write: see the module docstring
            with ThreadPoolExecutor(len(ballast_cpus), thread_name_prefix="bench-ballast") as ballasts:
                for fut in [
                    ballasts.submit(ballast, f"{base}/ballast-{i}", c) for i, c in enumerate(ballast_cpus)
                ]:
                    fut.result()
            os.sync()
        crc32c_rs.crc32c(flush)

    def sailor_save(name: str) -> tuple[float, float, int, int]:
        """(seconds, CPU seconds, bytes, data files written into recycled files) of one sync save."""
        nonlocal step
        step += 1
        settle()
        t, c = time.perf_counter(), cpu_s()
        info = managers[name].save(step, state())
        return time.perf_counter() - t, cpu_s() - c, info.bytes, info.recycled_files

    def public_save(sync_files: bool) -> tuple[float, float]:
        nonlocal step
        step += 1
        path = f"{base}/public-{step}"
        settle()
        t, c = time.perf_counter(), cpu_s()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save(
            {"app": {"model": model_sd, "optim": optim_sd}, "trainer": {"step": step}},
            storage_writer=FileSystemWriter(path, thread_count=args.threads, sync_files=sync_files),
        )
        seconds, cpu = time.perf_counter() - t, cpu_s() - c
        fs.rm(path, recursive=True)
        return seconds, cpu

    def raw_write(
        blobs: dict[str, bytes], chunk: int | None, fsync: bool, falloc: bool = False
    ) -> tuple[float, float]:
        folder = f"{base}/raw-{step}"
        fs.makedirs(folder, exist_ok=True)
        for blob in blobs.values():  # untimed read of every byte: resident, as the model's tensors
            crc32c_rs.crc32c(blob)
        settle()

        def one(name: str) -> None:
            blob = blobs[name]
            with fs.open(f"{folder}/{name}", "wb") as f:
                if falloc and not preallocate(f, len(blob)):
                    raise RuntimeError(f"{folder}: fallocate failed; raw_falloc would not allocate")
                if chunk is None:
                    f.write(blob)
                else:
                    view = memoryview(blob)
                    for start in range(0, len(view), chunk):
                        f.write(view[start : start + chunk])
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())

        t, c = time.perf_counter(), cpu_s()
        for fut in [pool.submit(one, n) for n in sorted(blobs, key=lambda n: -len(blobs[n]))]:
            fut.result()
        seconds, cpu = time.perf_counter() - t, cpu_s() - c
        fs.rm(folder, recursive=True)
        return seconds, cpu

    def timed_async_save(mgr: CheckpointManager) -> tuple[float, float, float]:
        """(stall, loop overhead, plain step median) of one pipelined async save."""
        nonlocal step

        def train_step() -> float:
            forward_backward()
            t = time.perf_counter()
            mgr.wait_staged()
            blocked = time.perf_counter() - t
            optimizer.step()
            return blocked

        plain = []
        for _ in range(3):
            t = time.perf_counter()
            train_step()
            plain.append(time.perf_counter() - t)
        step += 1
        settle()
        t0 = time.perf_counter()
        mgr.save_async(step, state(), pipelined=True)
        stall = time.perf_counter() - t0
        steps = 0
        while True:
            stall += train_step()
            steps += 1
            t = time.perf_counter()
            done = mgr.poll()
            stall += time.perf_counter() - t
            if done is not None:
                break
        loop = time.perf_counter() - t0
        return stall, loop - steps * statistics.median(plain), statistics.median(plain)

    # Untimed warm-up: the first async save allocates the staging buffers and plans; two saves per
    # manager so that the recycling one has a retired checkpoint's files to reuse from then on.
    for mgr in managers.values():
        step += 1
        mgr.save_async(step, state())
        mgr.wait()
        step += 1
        mgr.save(step, state())
    public_save(False)
    new = managers["sailor"]
    newest = new.step_uri(new.committed_steps()[-1])
    marker = storage.read_json(storage.join(newest, MARKER))
    blobs = {n: storage.read_bytes(storage.join(newest, n)) for n in marker["files"]}
    step += 1
    managers["sailor_recycled"].save(step, state())  # retires one more: files to recycle

    load_start = os.getloadavg()
    times: dict[str, list[float]] = {w: [] for w in WRITES}
    cpus: dict[str, list[float]] = {w: [] for w in WRITES}
    recycled: list[int] = []
    stall, loop, plain, restore = [], [], [], []
    nbytes = 0
    for i in range(args.repeat):
        order = random.Random(i).sample(WRITES, len(WRITES))
        for what in order:
            if what.startswith("sailor"):
                seconds, cpu, nbytes, reused = sailor_save(what)
                if what == "sailor_recycled":
                    recycled.append(reused)
                elif reused:
                    raise RuntimeError(f"{what} wrote {reused} recycled files with recycle=False")
            elif what.startswith("public"):
                seconds, cpu = public_save(what == "public_fsync")
            elif what == "raw_8mib":
                seconds, cpu = raw_write(blobs, _CHUNK, False)
            elif what == "raw_one":
                seconds, cpu = raw_write(blobs, None, False)
            elif what == "raw_falloc":
                seconds, cpu = raw_write(blobs, None, False, falloc=True)
            else:
                seconds, cpu = raw_write(blobs, None, True, falloc=what == "raw_fsync_falloc")
            times[what].append(seconds)
            cpus[what].append(cpu)

        s, o, p = timed_async_save(managers["async"])
        stall.append(s)
        loop.append(o)
        plain.append(p)

        t = time.perf_counter()
        latest = new.latest_valid_step()
        new.load(latest, state())
        restore.append(time.perf_counter() - t)
    settle()
    load_end = os.getloadavg()
    pool.shutdown()
    logging.getLogger("bench").info(
        "per repeat (s): %s; CPU s %s; stall %s; restore %s; recycled files per save %s",
        {w: [round(v, 3) for v in ts] for w, ts in times.items()},
        {w: [round(v, 3) for v in ts] for w, ts in cpus.items()},
        [round(v, 4) for v in stall],
        [round(v, 3) for v in restore],
        recycled,
    )
    if sum(len(b) for b in blobs.values()) != nbytes:
        raise RuntimeError("raw writes and checkpoint differ in size")

    med = {w: statistics.median(ts) for w, ts in times.items()}
    med_cpu = {w: statistics.median(ts) for w, ts in cpus.items()}
    raw_way = min(RAW, key=med.__getitem__)
    raw_s = med[raw_way]
    raw_fsync_way = min(RAW_FSYNC, key=med.__getitem__)

    def mb_s(seconds: float) -> float:
        return round(nbytes / seconds / 1e6, 1)

    fraction = raw_s / med["sailor"]
    stall_fraction = statistics.median(stall) / med["sailor_recycled"]
    print(
        json.dumps(
            {
                "write_fraction_of_raw": round(fraction, 3),
                "durable_fraction_of_raw": round(med[raw_fsync_way] / med["sailor_fsync"], 3),
                "sailor_vs_public": round(med["public"] / med["sailor"], 3),
                "sailor_vs_public_fsync": round(med["public_fsync"] / med["sailor_fsync"], 3),
                "target_met": fraction >= TARGET_FRACTION_OF_RAW and stall_fraction <= TARGET_STALL_OF_SYNC,
                "seconds": {w: round(v, 3) for w, v in med.items()},
                "mb_s": {w: mb_s(v) for w, v in med.items()},
                "cpu_seconds": {w: round(v, 3) for w, v in med_cpu.items()},
                "raw_s": round(raw_s, 3),
                "raw_way": raw_way,
                "raw_fsync_way": raw_fsync_way,
                "cpu_fraction_of_raw": round(med_cpu[raw_way] / med_cpu["sailor"], 3),
                "min_fraction_of_raw": round(min(times[raw_way]) / min(times["sailor"]), 3),
                "min_seconds": {w: round(min(v), 3) for w, v in times.items()},
                "min_cpu_seconds": {w: round(min(v), 3) for w, v in cpus.items()},
                "load_average": {
                    "start": [round(v, 2) for v in load_start],
                    "end": [round(v, 2) for v in load_end],
                },
                "recycled_fraction_of_raw_new_files": round(raw_s / med["sailor_recycled"], 3),
                "recycled_files": all(recycled),
                "async_stall_s": round(statistics.median(stall), 4),
                "async_stall_fraction_of_sync": round(stall_fraction, 3),
                "async_loop_overhead_s": round(statistics.median(loop), 3),
                "train_step_s": round(statistics.median(plain), 3),
                "restore_s": round(statistics.median(restore), 3),
                "bytes": nbytes,
                "files": len(blobs),
                "writer_threads": args.threads,
                "model": args.model,
                "tokens_per_step": x.numel(),
                "repeat": args.repeat,
                "uri": root,
            }
        )
    )


if __name__ == "__main__":
    main()
