"""Checkpoint save/restore speed for a model of >= 100 MB of state (gpt_25m + AdamW moments).

Each repeat measures, in rotating order, a sync save and two plain fsspec writes of the same bytes,
then an async save inside real training steps, then a restore. Every figure is the median over
repeats.

- sync_save_s: ``CheckpointManager.save`` end to end: state_dict, DCP planning, data files
  (written from the tensors' buffers with crc32c computed on the fly), ``.metadata``, commit
  marker (and per-rank sidecars when several ranks save). As in training, every save after a
  run's first reuses the previous save's DCP plan and metadata while the state's structure is
  unchanged (here the untimed first save, an async one, plans it). Retiring checkpoints beyond
  ``keep_latest_k`` runs in the background afterwards, as in training, and is not counted.
  On a local root (the default) the timed sync saves write into recycled files: the data files
  of the checkpoint rotated out of ``keep_latest_k`` by the previous save, overwritten in place
  (their blocks and cached pages reused), as in training from a run's fourth save on (an untimed
  save before the repeats gets there); recycled_files says whether every timed sync save did.
  sync_save_first_s is the run's first sync save (after the async one, nothing recycled yet; not
  in the median). ``--no-recycle`` measures saves into new files (``recycle=False``, as on object
  stores), like the raw baseline. On this VM a write into never-touched guest memory is several
  times slower than one into pages freed earlier (the first saves of any run take ~0.5 s for this
  reason, recycled or not); recycling makes the steady state independent of where the kernel
  finds free pages.
- write_mb_s vs raw_fsspec_write_mb_s: checkpoint bytes per second of that sync save (end to
  end, as above), against plain fsspec writes of the same bytes (the checkpoint's files, held in
  memory, single thread) to the same filesystem, timed the same way. The plain writes create new
  files while the sync save overwrites recycled ones, so write_fraction_of_raw credits the
  checkpoint with file recycling (``--no-recycle``: new files on both sides). Two plain writes are timed,
  each file in 8 MiB ``write`` calls (raw_fsspec_8mib_writes_mb_s; the checkpoint writes 1 MiB) and in
  one ``write`` call (raw_fsspec_one_write_mb_s); on this shared VM either can be the faster one
  from run to run, so the baseline (raw_fsspec_write_mb_s, write_fraction_of_raw) is the faster
  of the two medians.
  Neither fsyncs (the checkpoint writes with ``sync_files=False``: a file torn by a machine crash
  fails its crc32c and an older checkpoint is used). Untimed, before each timed write: the raw
  bytes are read once (so they are as hot in memory as the model the checkpoint writes from, which
  every training step reads), the background retirement of old checkpoints is waited for, and
  ``os.sync()`` runs, so that no write pays for dirty pages or file deletions the bench itself
  left behind (other processes' I/O can still slow either).
  ``--threads 1`` gives the single-threaded checkpoint writer's figure.
- async_stall_s: what a training step loses to ``save_async(pipelined=True)`` (the trainer's
  mode), timed inside real gpt_25m training steps: the ``save_async`` call (hands the state to
  the background thread, which takes the state dicts and copies them into the staging buffers
  while the next forward/backward runs) + ``wait_staged`` before the optimizer step (waits only
  if that copy is not done) + the ``poll`` that collects the committed result.
- async_loop_overhead_s: the same loss measured as wall time: the steps from the save until it is
  committed, minus as many plain steps (median). It also counts the background copy and write
  competing with training for CPU and memory bandwidth, so it is noisy on a loaded machine.
- restore_s: find the newest checkpoint, verify every file's crc32c, load into the model/optimizer.

Run: .venv/bin/python bench/checkpoint.py [--uri file:///tmp/x] [--repeat 7] [--model gpt_25m]
     [--tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", help="checkpoint root (default: a temporary file:// folder)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--model", default="gpt_25m")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per training step (1 sequence)")
    parser.add_argument("--threads", type=int, default=2, help="checkpoint writer threads (trainer: 2)")
    parser.add_argument(
        "--no-recycle", action="store_true", help="write every checkpoint into new files (recycle=False)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bench").setLevel(logging.INFO)

    import crc32c
    import torch

    from sailor_tasks import storage
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager
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

    root = args.uri or f"file://{tempfile.mkdtemp(prefix='sailor-bench-ckpt-')}"
    mgr = CheckpointManager(
        storage.join(root, "ckpt"), keep_latest_k=2, thread_count=args.threads, recycle=not args.no_recycle
    )
    step = 0

    def state() -> dict:
        return {"app": _ModelOptimState(model, optimizer), "trainer": {"step": step}}

    def train_step() -> float:
        """One training step as the trainer runs it; returns seconds blocked on the checkpoint."""
        forward_backward()
        t = time.perf_counter()
        mgr.wait_staged()
        blocked = time.perf_counter() - t
        optimizer.step()
        return blocked

    def settle() -> None:
        """Untimed: finish the background deletion of old checkpoints, and flush dirty pages and
        the journal (with its discards of deleted files), so a timed write does not pay for work
        the bench left behind."""
        mgr.wait()
        os.sync()

    def timed_sync_save() -> tuple[float, int, int]:
        """(seconds, bytes, data files written into recycled files) of one sync save."""
        nonlocal step
        step += 1
        settle()
        t = time.perf_counter()
        info = mgr.save(step, state())
        return time.perf_counter() - t, info.bytes, info.recycled_files

    def timed_raw_write(blobs: dict[str, bytes], chunk: int | None) -> float:
        fs, base = storage.filesystem(storage.join(root, f"raw-{step}-{chunk}"))
        for blob in blobs.values():  # untimed read of every byte: the source is as hot in memory
            crc32c.crc32c(blob)  # as the model the checkpoint writes from (used every step)
        settle()
        t = time.perf_counter()
        for name, blob in blobs.items():
            with fs.open(f"{base}/{name}", "wb") as f:
                if chunk is None:
                    f.write(blob)
                else:
                    view = memoryview(blob)
                    for start in range(0, len(view), chunk):
                        f.write(view[start : start + chunk])
        seconds = time.perf_counter() - t
        fs.rm(base, recursive=True)
        return seconds

    def timed_async_save() -> tuple[float, float, float]:
        """(stall, loop overhead, plain step median) of one pipelined async save."""
        nonlocal step
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

    # First saves, not counted (reported): the staging buffers are allocated by the first async
    # save, and the first sync save's files are the bytes of every raw write. With only one
    # committed checkpoint before it, nothing is recycled yet: it writes new files.
    mgr.save_async(0, state())
    mgr.wait()
    first_sync_s, _, first_recycled = timed_sync_save()
    if first_recycled:
        raise RuntimeError(f"the first sync save reused {first_recycled} files: use an empty --uri")
    marker = storage.read_json(storage.join(mgr.step_uri(step), MARKER))
    blobs = {n: storage.read_bytes(storage.join(mgr.step_uri(step), n)) for n in marker["files"]}
    # One more untimed save: its commit retires the first checkpoint (keep_latest_k=2), so, as in
    # training from the fourth save on, every timed save finds recycled files on a local root.
    step += 1
    mgr.save(step, state())

    sync, raw, raw_single, stall, loop, plain, restore = [], [], [], [], [], [], []
    recycled: list[int] = []
    nbytes = 0
    for i in range(max(1, args.repeat)):
        writes = ["sync", "raw", "raw_single"]
        for what in writes[i % 3 :] + writes[: i % 3]:  # rotate which write goes first
            if what == "sync":
                seconds, nbytes, reused = timed_sync_save()
                sync.append(seconds)
                recycled.append(reused)
            elif what == "raw":
                raw.append(timed_raw_write(blobs, _CHUNK))
            else:
                raw_single.append(timed_raw_write(blobs, None))

        s, o, p = timed_async_save()
        stall.append(s)
        loop.append(o)
        plain.append(p)

        t = time.perf_counter()
        latest = mgr.latest_valid_step()
        mgr.load(latest, state())
        restore.append(time.perf_counter() - t)
    mgr.wait()
    logging.getLogger("bench").info(
        "per repeat: sync %s raw %s raw_single %s stall %s loop %s restore %s; recycled files per sync %s",
        *([round(v, 3) for v in series] for series in (sync, raw, raw_single, stall, loop, restore)),
        recycled,
    )
    if sum(len(b) for b in blobs.values()) != nbytes:
        raise RuntimeError("raw writes and checkpoint differ in size")

    sync_s, stall_s = statistics.median(sync), statistics.median(stall)
    raw_chunked_s, raw_single_s = statistics.median(raw), statistics.median(raw_single)
    raw_s = min(raw_chunked_s, raw_single_s)  # the baseline: the faster plain write
    print(
        json.dumps(
            {
                "sync_save_s": round(sync_s, 3),
                "sync_save_first_s": round(first_sync_s, 3),
                "recycled_files": all(recycled),
                "recycle": not args.no_recycle,
                "async_stall_s": round(stall_s, 4),
                "async_stall_fraction_of_sync": round(stall_s / sync_s, 3),
                "async_loop_overhead_s": round(statistics.median(loop), 3),
                "train_step_s": round(statistics.median(plain), 3),
                "restore_s": round(statistics.median(restore), 3),
                "bytes": nbytes,
                "write_mb_s": round(nbytes / sync_s / 1e6, 1),
                "raw_fsspec_write_mb_s": round(nbytes / raw_s / 1e6, 1),
                "write_fraction_of_raw": round(raw_s / sync_s, 3),
                "raw_fsspec_8mib_writes_mb_s": round(nbytes / raw_chunked_s / 1e6, 1),
                "raw_fsspec_one_write_mb_s": round(nbytes / raw_single_s / 1e6, 1),
                "fsync": False,
                "writer_threads": args.threads,
                "model": args.model,
                "tokens_per_step": x.numel(),
                "repeat": max(1, args.repeat),
                "uri": root,
            }
        )
    )


if __name__ == "__main__":
    main()
