"""Entrypoint of one training worker: ``python -m sailor_tasks.train --config URI``.

Launched by ``torchrun`` (one process per worker) on every backend. Reads RANK/WORLD_SIZE here
and nowhere else, and picks the worker's device from what the machine has (``device.py``: nccl on
this worker's GPU, gloo on the CPU otherwise). A SIGTERM (the cloud's preemption notice) asks the
trainer to finish its step, checkpoint, and exit with ``PREEMPTED_EXIT_CODE``.
"""

from __future__ import annotations

import signal
import threading

# The preemption notice may come while this process is still importing torch (a restart right
# into a capacity crunch): catch it before anything slow, or SIGTERM's default action kills us.
STOP = threading.Event()
signal.signal(signal.SIGTERM, lambda signum, frame: STOP.set())

import argparse  # noqa: E402
import gc  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from sailor_tasks import storage  # noqa: E402
from sailor_tasks.errors import PREEMPTED_EXIT_CODE  # noqa: E402
from sailor_tasks.train.config import TrainConfig  # noqa: E402
from sailor_tasks.train.device import (  # noqa: E402
    collective_timeout,
    detect_device_plan,
    init_process_group,
    select_device,
)
from sailor_tasks.train.progress import PROGRESS_ENV  # noqa: E402
from sailor_tasks.train.trainer import Trainer  # noqa: E402


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )


@record
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sailor_tasks.train")
    parser.add_argument("--config", required=True, help="URI of a TrainConfig JSON file (file:// or gs://)")
    args = parser.parse_args(argv)

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    _setup_logging(rank)
    torch.set_num_threads(max(1, int(os.environ.get("SAILOR_THREADS_PER_WORKER", "1"))))
    config = TrainConfig.from_json(storage.read_bytes(args.config).decode())

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    plan = detect_device_plan(local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    select_device(plan)
    logging.getLogger(__name__).info("device %s, %s backend: %s", plan.device, plan.backend, plan.reason)
    stop = STOP
    timeout = collective_timeout(os.environ)
    if world_size > 1:
        init_process_group(plan, timeout)
    trainer = Trainer(
        config,
        rank=rank,
        world_size=world_size,
        stop_event=stop,
        progress_path=os.environ.get(PROGRESS_ENV) or None,
        device_plan=plan,
        collective_timeout=timeout,
    )
    try:
        status = trainer.train().status
    finally:
        # The DDP wrapper goes before the group: whoever drops the group's last reference joins
        # gloo's worker threads, which may still need the GIL to free the last collective's
        # tensors; DDP's reducer drops its reference holding the GIL, the group's own Python
        # object releases it first (torch 2.13, gloo).
        del trainer
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
    return PREEMPTED_EXIT_CODE if status == "preempted" else 0


if __name__ == "__main__":
    sys.exit(main())
