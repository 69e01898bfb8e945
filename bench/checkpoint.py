"""Checkpoint save/restore speed for a model of >= 100 MB of state (gpt_25m + AdamW moments).

- sync_save_s: ``CheckpointManager.save`` (DCP write with checksums computed while writing,
  per-rank sidecars, commit marker, retention), median of --repeat.
- async_stall_s: how long ``save_async`` blocks the training loop (staging to CPU memory and
  starting the background write), median; the write itself overlaps training. The first async
  save also allocates the reused staging buffers (``async_stall_first_s``).
- restore_s: find the newest checkpoint, verify every file's crc32c, load into the model/optimizer.
- write_mb_s vs raw_fsspec_write_mb_s: checkpoint bytes per second of sync save, against plain
  fsspec writes of the same bytes (the checkpoint's files, read into memory beforehand) to the
  same filesystem.

Run: .venv/bin/python bench/checkpoint.py [--uri file:///tmp/x] [--repeat 3] [--model gpt_25m]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", help="checkpoint root (default: a temporary file:// folder)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", default="gpt_25m")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import torch

    from sailor_tasks import storage
    from sailor_tasks.train.checkpoint import MARKER, CheckpointManager
    from sailor_tasks.train.models import build_model
    from sailor_tasks.train.specs import MODEL_SPECS
    from sailor_tasks.train.trainer import _ModelOptimState

    torch.set_num_threads(1)  # as in a training worker (SAILOR_THREADS_PER_WORKER, default 1)
    torch.manual_seed(0)
    spec = MODEL_SPECS[args.model]
    model = build_model(spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (1, 32))
    model(x, x).backward()
    optimizer.step()  # materialises the AdamW moments: state = 3x the weights

    def state() -> dict:
        return {"app": _ModelOptimState(model, optimizer), "trainer": {"step": 1}}

    root = args.uri or f"file://{tempfile.mkdtemp(prefix='sailor-bench-ckpt-')}"
    mgr = CheckpointManager(storage.join(root, "ckpt"), keep_latest_k=2)

    sync, stall, restore, raw = [], [], [], []
    step, nbytes = 0, 0
    for _ in range(max(1, args.repeat)):
        step += 1
        info = mgr.save(step, state())
        sync.append(info.seconds)
        nbytes = info.bytes
        marker = storage.read_json(storage.join(mgr.step_uri(step), MARKER))

        step += 1
        t = time.perf_counter()
        mgr.save_async(step, state())
        stall.append(time.perf_counter() - t)
        mgr.wait()

        t = time.perf_counter()
        latest = mgr.latest_valid_step()
        target = state()
        mgr.load(latest, target)
        optimizer.load_state_dict(optimizer.state_dict())
        restore.append(time.perf_counter() - t)

        # Raw fsspec writes of the same bytes: the checkpoint's files, read into memory first.
        names = [n for n in marker["files"]]
        blobs = [storage.read_bytes(storage.join(mgr.step_uri(step - 1), n)) for n in names]
        fs, base = storage.filesystem(storage.join(root, f"raw-{step}"))
        t = time.perf_counter()
        for name, blob in zip(names, blobs, strict=True):
            with fs.open(f"{base}/{name}", "wb") as f:
                f.write(blob)
        raw.append(time.perf_counter() - t)
        del blobs
        fs.rm(base, recursive=True)

    sync_s, raw_s = statistics.median(sync), statistics.median(raw)
    print(
        json.dumps(
            {
                "sync_save_s": round(sync_s, 3),
                "async_stall_s": round(statistics.median(stall), 3),
                "async_stall_fraction_of_sync": round(statistics.median(stall) / sync_s, 3),
                "async_stall_first_s": round(stall[0], 3),
                "restore_s": round(statistics.median(restore), 3),
                "bytes": nbytes,
                "write_mb_s": round(nbytes / sync_s / 1e6, 1),
                "raw_fsspec_write_mb_s": round(nbytes / raw_s / 1e6, 1),
                "write_fraction_of_raw": round(raw_s / sync_s, 3),
                "model": args.model,
                "repeat": max(1, args.repeat),
                "uri": root,
            }
        )
    )


if __name__ == "__main__":
    main()
