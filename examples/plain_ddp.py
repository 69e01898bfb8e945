"""Plain PyTorch DDP training under SAILOR's run contract, importing nothing of SAILOR.

Run by SAILOR as ``command: ["python", "plain_ddp.py"]`` (torchrun sets RANK, WORLD_SIZE, ...;
SAILOR adds the SAILOR_* variables, docs/run-contract.md). A next-byte model over the placed
dataset; batches are a pure function of (seed, step, rank), so resuming from a checkpoint gives
the same parameters as a run that was never interrupted. On a GPU per worker it trains with nccl,
bf16 autocast (where supported) and pinned-memory copies; on the CPU with gloo in fp32.

Checkpoints: torch.distributed.checkpoint into ``$SAILOR_CHECKPOINT_DIR/step-NNNNNNNN/`` every
``CHECKPOINT_EVERY`` steps (an ``env`` param of the run), at the end, and on the preemption notice
(SIGTERM), then exit 75. A folder counts once DCP has written its ``.metadata`` (DCP writes it
last, through a rename); SAILOR adds its commit marker with checksums after the attempt, which is
what it verifies and copies when the run moves to another region.
"""

from __future__ import annotations

import signal
import threading

# The notice may arrive while torch is still importing: catch it first.
STOP = threading.Event()
signal.signal(signal.SIGTERM, lambda signum, frame: STOP.set())

import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

import fsspec  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

PREEMPTED = 75
"""Exit status after saving on a notice (any non-zero status after a notice means preempted)."""
CONTEXT = 8
"""Bytes of context the model predicts the next byte from."""
BATCH = 16
"""Sequences per rank per step."""


class NextByte(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 16)
        self.hidden = torch.nn.Linear(CONTEXT * 16, 64)
        self.out = torch.nn.Linear(64, 256)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.hidden(self.embed(x).flatten(1)))
        return torch.nn.functional.cross_entropy(self.out(h), y)


def read_dataset(uri: str) -> torch.Tensor:
    """Every data file of the placed dataset (not SAILOR's manifest), in name order, as bytes."""
    fs, root = fsspec.core.url_to_fs(uri)
    files = sorted(p for p in fs.find(root) if not os.path.basename(p).startswith("_SAILOR"))
    blob = b"".join(fs.cat_file(p) for p in files)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).long()


def batch(data: torch.Tensor, seed: int, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the global batch of ``step``: the same in every attempt."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, data.numel() - CONTEXT - 1, (BATCH * world,), generator=g)[rank::world]
    window = data[starts[:, None] + torch.arange(CONTEXT + 1)[None, :]]
    return window[:, :-1], window[:, -1]


def pick_device(local_rank: int, local_world: int) -> tuple[str, torch.device, torch.dtype | None]:
    """(backend, device, autocast dtype): nccl on this worker's GPU when every worker of the node
    has one (bf16 autocast where supported), gloo on the CPU in fp32 otherwise."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world and dist.is_nccl_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return "nccl", device, torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return "gloo", torch.device("cpu"), None


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host-to-GPU through pinned memory, without blocking the host; the CPU tensor as is."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def writer(uri: str) -> dcp.StorageWriter:
    """DCP's writer for a checkpoint folder: a local path, or fsspec's for gs:// (GKE)."""
    if uri.startswith("file://") or "://" not in uri:
        return dcp.FileSystemWriter(uri.removeprefix("file://"))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(uri)


def reader(uri: str) -> dcp.StorageReader:
    if uri.startswith("file://") or "://" not in uri:
        return dcp.FileSystemReader(uri.removeprefix("file://"))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(uri)


def newest_checkpoint(root_uri: str) -> int | None:
    """The newest step folder DCP finished: its .metadata exists (DCP writes it last)."""
    fs, root = fsspec.core.url_to_fs(root_uri)
    names = [os.path.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)] if fs.isdir(root) else []
    steps = [
        int(m.group(1))
        for name in names
        if (m := re.fullmatch(r"step-(\d{8})", name)) and fs.exists(f"{root}/{name}/.metadata")
    ]
    return max(steps) if steps else None


def report(progress_file: str | None, rank: int, **fields: object) -> None:
    """Optional part of the contract: rank 0 writes the step reached to SAILOR_PROGRESS_FILE."""
    if rank == 0 and progress_file:
        with open(progress_file + ".tmp", "w") as f:
            json.dump(fields, f)
        os.replace(progress_file + ".tmp", progress_file)


def main() -> int:
    env = os.environ
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    total, seed = int(env["SAILOR_TOTAL_STEPS"]), int(env["SAILOR_SEED"])
    every = int(env.get("CHECKPOINT_EVERY", "10"))
    lr = float(env.get("LEARNING_RATE", "0.01"))
    root = env["SAILOR_CHECKPOINT_DIR"].rstrip("/")
    progress = env.get("SAILOR_PROGRESS_FILE")
    torch.set_num_threads(1)
    backend, device, amp = pick_device(int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", "1")))
    if world > 1:
        dist.init_process_group(backend)

    data = read_dataset(env["SAILOR_DATA_DIR"])
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = NextByte().to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids) if world > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def state(step: int) -> dict:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        return {"model": model_sd, "optim": optim_sd, "step": step}

    def save(step: int) -> None:
        dcp.save(state(step), storage_writer=writer(f"{root}/step-{step:08d}"))

    step = 0
    newest = newest_checkpoint(root) if rank == 0 else None
    if world > 1:
        box = [newest]
        dist.broadcast_object_list(box, src=0)
        newest = box[0]
    if newest is not None:
        loaded = state(0)
        dcp.load(loaded, storage_reader=reader(f"{root}/step-{newest:08d}"))
        set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
        step = int(loaded["step"])
    report(progress, rank, step=step, resumed_from=newest)

    while step < total:
        x, y = batch(data, seed, step, rank, world)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = ddp(to_device(x, device), to_device(y, device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        report(progress, rank, step=step, resumed_from=newest)
        if rank == 0 and step % 10 == 0:
            print(f"step {step}/{total} loss {loss.item():.4f}", flush=True)
        stop = torch.tensor([1 if STOP.is_set() else 0], device=device)
        if world > 1:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank saves the same step
        if step % every == 0 or step == total or stop.item():
            save(step)
        if stop.item() and step < total:
            if rank == 0:
                print(f"preemption notice: saved step {step}, exiting {PREEMPTED}", flush=True)
            break
    del ddp  # before the group goes (see shutdown)
    shutdown(world)
    return PREEMPTED if step < total else 0


def shutdown(world: int) -> None:
    """Leave the process group, once the DDP wrapper is gone.

    Whoever drops the group's last reference joins gloo's worker threads, and a worker may still be
    freeing the last collective's tensors (DCP's save ends with one), which takes the GIL. DDP's
    reducer drops its reference holding the GIL (a deadlock when it is the last one: seen with torch
    2.13, gloo); the group's own Python object releases the GIL first. So the wrapper goes first
    (``gc.collect`` for any reference cycle), then the group is destroyed."""
    if world > 1:
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
