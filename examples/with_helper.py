"""The same DDP training as ``plain_ddp.py``, through SAILOR's runtime helper (``sailor_tasks.runtime``).

Run by SAILOR as ``command: ["python", "with_helper.py"]``. Self-contained like its twin (a file
to copy into a training image): the model, data and batches are ``plain_ddp.py``'s. ``Run.from_env()`` reads the run
contract and catches the notice; ``run.load_latest``/``run.save`` checkpoint with
torch.distributed.checkpoint and SAILOR's commit marker (crc32c of every file, written last), so
the checkpoint is verified before every resume and when the run moves to another region;
``run.should_save()`` turns true on every rank once the notice came.
"""

from __future__ import annotations

from sailor_tasks.runtime import Run

run = Run.from_env()  # first: it catches SIGTERM (the notice) from here on

import os  # noqa: E402
import sys  # noqa: E402

import fsspec  # noqa: E402
import torch  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

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


def main() -> int:
    every = int(os.environ.get("CHECKPOINT_EVERY", "10"))
    lr = float(os.environ.get("LEARNING_RATE", "0.01"))
    torch.set_num_threads(1)
    device = run.init_distributed()  # nccl on this worker's GPU, else gloo on the CPU (run.device_plan)

    data = read_dataset(run.data_dir)
    torch.manual_seed(run.seed)
    model = NextByte().to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids) if run.world_size > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def state(step: int) -> dict:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        return {"model": model_sd, "optim": optim_sd, "step": step}

    step = 0
    # get_state_dict gives an optimizer without state one (an AdamW step at lr 0, counted in its
    # bias correction): build the dict to load into only when there is a checkpoint to load.
    if run.latest_step() is not None:
        loaded = state(0)
        if run.load_latest(loaded) is not None:
            set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
            step = int(loaded["step"])

    while step < run.total_steps:
        x, y = batch(data, run.seed, step, run.rank, run.world_size)
        with run.autocast():  # bf16 where the GPU supports it
            loss = ddp(run.to_device(x), run.to_device(y))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        run.report_step(step)
        if run.rank == 0 and step % 10 == 0:
            print(f"step {step}/{run.total_steps} loss {loss.item():.4f}", flush=True)
        stop = run.should_save()
        if step % every == 0 or step == run.total_steps or stop:
            run.save(step, state(step))
        if stop and step < run.total_steps:
            break
    del ddp  # before run.close() leaves the process group (see Run.close)
    if step < run.total_steps:
        run.exit_preempted()  # 75: saved on the notice
    run.close()  # waits for checkpoint retention, leaves the process group
    return 0


if __name__ == "__main__":
    sys.exit(main())
