"""The run contract's names and files, torch-free: what a backend gives every worker of a run.

A backend launches the run's command under torchrun with ``contract_env`` added to the
environment; on a preemption it writes the notice file (``write_notice``), then sends SIGTERM.
``docs/run-contract.md`` is the reference; ``runtime.run.Run`` reads the same names for user code.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sailor_tasks.errors import PREEMPTED_EXIT_CODE
from sailor_tasks.train.checkpoint.store import MARKER, step_dir_name
from sailor_tasks.train.progress import PROGRESS_ENV

RUN_ID = "SAILOR_RUN_ID"
ATTEMPT = "SAILOR_ATTEMPT"
DATA_DIR = "SAILOR_DATA_DIR"
CHECKPOINT_DIR = "SAILOR_CHECKPOINT_DIR"
TOTAL_STEPS = "SAILOR_TOTAL_STEPS"
SEED = "SAILOR_SEED"
NOTICE_FILE = "SAILOR_NOTICE_FILE"
PROGRESS_FILE = PROGRESS_ENV
"""Optional for the command: rank 0 may write ``{"step": N}`` there after each step (atomically)."""

__all__ = [
    "ATTEMPT",
    "CHECKPOINT_DIR",
    "DATA_DIR",
    "MARKER",
    "NOTICE_FILE",
    "PREEMPTED_EXIT_CODE",
    "PROGRESS_FILE",
    "RUN_ID",
    "SEED",
    "TOTAL_STEPS",
    "Notice",
    "contract_env",
    "ignore_notice",
    "read_notice",
    "step_dir_name",
    "write_notice",
]


def contract_env(
    *,
    run_id: str,
    attempt: int,
    data_dir: str,
    checkpoint_dir: str,
    total_steps: int,
    seed: int,
    notice_file: str,
    progress_file: str | None = None,
) -> dict[str, str]:
    """The ``SAILOR_*`` variables of one attempt's workers (added to torchrun's own)."""
    env = {
        RUN_ID: run_id,
        ATTEMPT: str(attempt),
        DATA_DIR: data_dir,
        CHECKPOINT_DIR: checkpoint_dir,
        TOTAL_STEPS: str(total_steps),
        SEED: str(seed),
        NOTICE_FILE: notice_file,
    }
    if progress_file:
        env[PROGRESS_FILE] = progress_file
    return env


@dataclass(frozen=True, slots=True)
class Notice:
    """A preemption notice: the workers must have saved and exited by ``deadline``."""

    deadline: float
    """Epoch seconds after which the capacity is gone (the hard kill)."""
    notice_s: float
    """Length of the notice window the backend gave, in seconds."""
    reason: str = "preemption"

    def seconds_left(self, now: float | None = None) -> float:
        return self.deadline - (time.time() if now is None else now)


def write_notice(path: str, notice_s: float, reason: str = "preemption", now: float | None = None) -> Notice:
    """Write the notice file atomically (the backend does this just before SIGTERM)."""
    notice = Notice(deadline=(time.time() if now is None else now) + notice_s, notice_s=notice_s, reason=reason)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"deadline": notice.deadline, "notice_s": notice.notice_s, "reason": notice.reason}, f)
    os.replace(tmp, path)
    return notice


def read_notice(path: str | None) -> Notice | None:
    """The notice in ``path``, or None when there is none (no file: no notice was given)."""
    if not path:
        return None
    try:
        with open(path) as f:
            data: Mapping = json.load(f)
        return Notice(float(data["deadline"]), float(data["notice_s"]), str(data.get("reason", "preemption")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def unblock_sigterm() -> None:
    """Unblock SIGTERM in this process (a child of an ``ignore_notice`` worker: see there)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def ignore_notice(worker_id: int | None = None) -> None:
    """Let this DataLoader worker process outlive the notice: pass it as ``worker_init_fn``.

    The notice's SIGTERM reaches every process of a training worker, as a VM's shutdown does and
    as torchrun's stop does (it signals each worker's whole process group), a DataLoader's worker
    processes included. Torch's worker processes die of any SIGTERM their trainer did not send,
    and the trainer then fails ("DataLoader worker exited unexpectedly") in the middle of the step
    or the save it was to finish. With ``DataLoader(..., worker_init_fn=ignore_notice)`` (or a
    call from your own ``worker_init_fn``) a worker process keeps loading through the notice and
    still exits as torch's own do when its trainer stops it (a SIGTERM from the trainer, as the
    DataLoader and ``multiprocessing`` send when the trainer exits), when the trainer dies, or at
    the hard kill. ``worker_id`` is DataLoader's argument, unused.

    How: SIGTERM is blocked in this process (threads started from here on inherit that) and a
    thread takes each one with ``sigwaitinfo``, which names the sender: the trainer's ends the
    process, any other is the notice and is dropped. A process forked from it by Python (``os.fork``,
    ``multiprocessing``) unblocks SIGTERM, so ``terminate()`` stops it; a program started with
    ``subprocess`` inherits the blocked signal (a signal mask survives ``exec``): pass
    ``preexec_fn=unblock_sigterm`` to stop it with SIGTERM. Without ``sigwaitinfo`` (not Linux) it
    does nothing.
    """
    if not hasattr(signal, "sigwaitinfo"):
        return
    import multiprocessing
    import threading

    parent = multiprocessing.parent_process()
    trainer = parent.pid if parent is not None and parent.pid else os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    os.register_at_fork(after_in_child=unblock_sigterm)

    def take_sigterms() -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == trainer:
                os._exit(0)  # what torch's own handler does on its trainer's SIGTERM

    threading.Thread(target=take_sigterms, name="sailor-ignore-notice", daemon=True).start()
