"""``Run.from_env()``: the run contract as an object for training code, with SAILOR's checkpoints.

A worker started by SAILOR (under torchrun, with the ``SAILOR_*`` variables of
``runtime.contract``) builds one ``Run``: it knows the run's folders, attempt, step budget and
seed, catches the preemption notice (SIGTERM and the notice file), reports progress, and saves and
loads ``torch.distributed.checkpoint`` state through ``train.checkpoint.dcp.CheckpointManager``, so
every checkpoint carries SAILOR's commit marker and checksums and SAILOR's recovery (copy to
another region, verify, resume) works on it. Imports torch, fsspec and SAILOR's torch-side
checkpoint code; never Airflow.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from sailor_tasks.runtime import contract
from sailor_tasks.train import device as devices
from sailor_tasks.train.checkpoint.dcp import CheckpointManager, SaveInfo
from sailor_tasks.train.device import DevicePlan
from sailor_tasks.train.progress import write_progress

logger = logging.getLogger(__name__)

_REQUIRED = (
    contract.RUN_ID,
    contract.ATTEMPT,
    contract.DATA_DIR,
    contract.CHECKPOINT_DIR,
    contract.TOTAL_STEPS,
    contract.SEED,
)


@dataclass
class Run:
    """One worker's view of its run (build it with ``Run.from_env()``)."""

    run_id: str
    attempt: int
    """1 for the first launch; each recovery after a preemption counts up."""
    data_dir: str
    """URI of the placed dataset (``file://`` or ``gs://``)."""
    checkpoint_dir: str
    """URI of the run's checkpoint root in its region's bucket."""
    total_steps: int
    seed: int
    notice_file: str | None = None
    progress_file: str | None = None
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    """Workers on this node (torchrun's ``LOCAL_WORLD_SIZE``): GPUs are used when each has one."""
    keep_latest_k: int = 2
    """Committed checkpoints kept (older ones are retired after each save)."""
    collective_timeout: datetime.timedelta | None = None
    """How long a collective of the groups ``init_distributed`` makes may wait for a peer
    (``SAILOR_COLLECTIVE_TIMEOUT_S``, set on ``gke``); None: torch's default."""
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _checkpoints: CheckpointManager | None = field(default=None, repr=False)
    _resumed_from: int | None = field(default=None, repr=False)
    _first_step_at: float | None = field(default=None, repr=False)
    _checkpoint_step: int | None = field(default=None, repr=False)
    _plan: DevicePlan | None = field(default=None, repr=False)
    _vote: Any = field(default=None, repr=False)
    _ckpt_group: Any = field(default=None, repr=False)
    """Process group of async saves' background collectives (made by ``init_distributed``)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, handle_sigterm: bool = True) -> Run:
        """The run this process belongs to, from the contract's environment.

        Args:
            environ: the environment (default ``os.environ``).
            handle_sigterm: catch SIGTERM (the preemption notice) so ``should_save`` turns true
                instead of the process dying; only possible from the main thread.

        Raises:
            ValueError: a contract variable is missing or malformed (names each one).
        """
        env = os.environ if environ is None else environ
        missing = [n for n in _REQUIRED if not env.get(n)]
        if missing:
            raise ValueError(
                f"not started by SAILOR: {', '.join(missing)} unset (docs/run-contract.md lists the variables)"
            )

        def integer(name: str, default: str | None = None, least: int = 0) -> int:
            raw = env.get(name, default)
            try:
                value = int(raw)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                value = None
            if value is None or value < least:
                raise ValueError(
                    f"malformed run contract variable {name}={raw!r}: need an integer >= {least}"
                )
            return value

        try:
            timeout = devices.collective_timeout(env)
        except ValueError as exc:
            raise ValueError(f"malformed run contract variable: {exc}") from exc
        world_size = integer("WORLD_SIZE", "1", least=1)
        rank = integer("RANK", "0")
        if rank >= world_size:
            raise ValueError(
                f"malformed run contract variables RANK={rank}, WORLD_SIZE={world_size}: need RANK < WORLD_SIZE"
            )
        run = cls(
            run_id=env[contract.RUN_ID],
            attempt=integer(contract.ATTEMPT, least=1),
            data_dir=env[contract.DATA_DIR],
            checkpoint_dir=env[contract.CHECKPOINT_DIR],
            total_steps=integer(contract.TOTAL_STEPS, least=1),
            seed=integer(contract.SEED),
            notice_file=env.get(contract.NOTICE_FILE) or None,
            progress_file=env.get(contract.PROGRESS_FILE) or None,
            rank=rank,
            world_size=world_size,
            local_rank=integer("LOCAL_RANK", "0"),
            local_world_size=integer("LOCAL_WORLD_SIZE", "1", least=1),
            collective_timeout=timeout,
        )
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: run._stop.set())
        return run

    # --- the notice -------------------------------------------------------------------------
    @property
    def notice(self) -> contract.Notice | None:
        """The preemption notice, once the backend has written it (None before)."""
        return contract.read_notice(self.notice_file)

    @property
    def notice_deadline(self) -> float | None:
        """Epoch seconds by which this attempt must have saved and exited; None without a notice."""
        notice = self.notice
        return notice.deadline if notice else None

    @property
    def noticed(self) -> bool:
        """This process got the notice (SIGTERM, or the notice file)."""
        return self._stop.is_set() or self.notice is not None

    def should_save(self) -> bool:
        """True on every rank once any rank got the notice: save, then ``exit_preempted()``.

        With several ranks this is a collective: call it on every rank at the same point of each
        step (after the optimizer step), as the ranks must agree on the step they save.
        """
        if not (dist.is_available() and dist.is_initialized()):
            return self.noticed
        return devices.any_rank(self.noticed, self._vote_group())

    def _vote_group(self) -> Any:
        """The group the per-step vote runs on (``devices.vote_group``), made on the first vote,
        which every rank takes at the same point."""
        if self._vote is None:
            self._vote = devices.vote_group(self.collective_timeout)
        return self._vote

    # --- the device -------------------------------------------------------------------------
    @property
    def device_plan(self) -> DevicePlan:
        """Where this worker trains, from what the machine has (``train.device.device_plan``):
        nccl on ``cuda:LOCAL_RANK`` with bf16 autocast where supported and pinned-memory copies
        when every worker of the node has a GPU; gloo on the CPU otherwise."""
        if self._plan is None:
            self._plan = devices.detect_device_plan(self.local_rank, self.local_world_size)
        return self._plan

    @property
    def device(self) -> torch.device:
        return torch.device(self.device_plan.device)

    def init_distributed(self) -> torch.device:
        """Make the plan's GPU current and, with several workers, join the process group with the
        plan's backend and ``collective_timeout``. Returns the device to put the model and batches on."""
        device = devices.select_device(self.device_plan)
        if self.world_size > 1 and not dist.is_initialized():
            devices.init_process_group(self.device_plan, self.collective_timeout)
        if dist.is_available() and dist.is_initialized() and self._ckpt_group is None:
            # Async saves run their collectives in a background thread: on the training group they
            # would pair up with other ranks' training collectives (a hang). Every rank is here,
            # whatever it did before (``latest_step`` builds the manager on every rank too).
            self._ckpt_group = devices.gloo_group(self.collective_timeout)
            if self._checkpoints is not None:
                # Built before the group (``load_latest`` first): saves go through the group from now on.
                self._checkpoints.wait()
                self._checkpoints = None
        return device

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on this worker's device (pinned memory and a non-blocking copy on a GPU)."""
        return devices.to_device(tensor, self.device_plan)

    def autocast(self) -> Any:
        """Context for the forward pass: bf16 autocast where the plan has it, else nothing."""
        return devices.autocast(self.device_plan)

    def exit_preempted(self) -> NoReturn:
        """Leave (``close``) and exit with the contract's status for "saved on a notice" (75)."""
        self.close()
        sys.exit(contract.PREEMPTED_EXIT_CODE)

    # --- checkpoints ------------------------------------------------------------------------
    @property
    def checkpoints(self) -> CheckpointManager:
        """SAILOR's checkpoint manager on the run's checkpoint root (built on first use, and again
        once a process group exists that it was built without).

        Raises:
            RuntimeError: several workers and no process group yet: every rank would write the
                same files into the same folder.
        """
        grouped = self._grouped(
            "using run.checkpoints, so that each rank saves its own part of every checkpoint"
        )
        if self._checkpoints is not None and self._checkpoints.distributed != grouped:
            self._checkpoints.wait()  # its pending save ends as it began
            self._checkpoints = None
        if self._checkpoints is None:
            self._checkpoints = CheckpointManager(
                self.checkpoint_dir,
                rank=self.rank,
                keep_latest_k=self.keep_latest_k,
                distributed=grouped,
                process_group=self._ckpt_group,
                attempt=self.attempt,
            )
        return self._checkpoints

    def _grouped(self, before: str) -> bool:
        """Whether a process group exists; raises RuntimeError, saying to make one ``before``
        what, when several workers have none."""
        grouped = dist.is_available() and dist.is_initialized()
        if self.world_size > 1 and not grouped:
            raise RuntimeError(
                f"{self.world_size} workers and no process group: call run.init_distributed() (or "
                f"torch.distributed.init_process_group) before {before}"
            )
        return grouped

    def latest_step(self) -> int | None:
        """The newest checkpoint that verifies against its marker (rank 0 decides, every rank agrees).

        Raises:
            RuntimeError: several workers and no process group yet: the ranks could not agree.
        """
        self._grouped("latest_step/load_latest, so that every rank resumes from the step rank 0 finds")
        checkpoints = self.checkpoints  # built on every rank: the group choice must not differ
        if self.rank == 0:
            checkpoints.claim(self.attempt)  # older attempts' workers may write no more
        step = checkpoints.latest_valid_step() if self.rank == 0 else None
        if dist.is_available() and dist.is_initialized():
            box = [step]
            dist.broadcast_object_list(box, src=0)
            step = box[0]
        return step

    def load_latest(self, state: dict[str, Any]) -> int | None:
        """Load the newest verified checkpoint into ``state`` in place (DCP: the dict's structure
        names what to load; ``Stateful`` values allowed). Returns its step, or None when there is
        none (a fresh run). Every rank calls this."""
        step = self.latest_step()
        if step is not None:
            self.checkpoints.load(step, state)
            self._checkpoint_step = step
        self._resumed_from = step
        self._report(step)  # the step reached: a preemption before the next step loses nothing
        return step

    def save(self, step: int, state: dict[str, Any]) -> SaveInfo:
        """Save ``state`` as checkpoint ``step`` with DCP and commit it (marker with every file's
        crc32c and size, written last by rank 0). Every rank calls this.

        The step this run last saved or resumed from is not saved again (a save on the notice
        right after resuming, say): its committed checkpoint is kept as it is, and the call
        returns at once. Writing it anew would first delete it, and a save failing then would
        leave the run an older checkpoint. An attempt a newer one fenced out saves nothing, that
        step included (``StaleAttemptError``)."""
        if step == self._checkpoint_step:
            self.checkpoints.check_fence()
            uri = self.checkpoints.step_uri(step)
            size = 0
            if self.rank == 0:
                size = sum(int(f["size"]) for f in self.checkpoints.marker(step)["files"].values())
                logger.info("checkpoint step %d is already committed at %s; not saved again", step, uri)
            self._report(step)
            return SaveInfo(step=step, uri=uri, bytes=size, seconds=0.0)
        info = self.checkpoints.save(step, state)
        self._checkpoint_step = step
        self._report(step)
        return info

    # --- progress ---------------------------------------------------------------------------
    def report_step(self, step: int) -> None:
        """Tell SAILOR the step reached (rank 0 writes the progress file; others do nothing).
        The local backend fires step-triggered preemption injections and times recovery with it."""
        if self._first_step_at is None:
            self._first_step_at = time.time()
        self._report(step)

    def _report(self, step: int | None = None) -> None:
        if self.rank != 0 or not self.progress_file:
            return
        fields: dict[str, Any] = {
            "resumed_from": self._resumed_from,
            "checkpoint_step": self._checkpoint_step,
            "first_step_at": self._first_step_at,
        }
        if step is not None:
            fields["step"] = step
        write_progress(self.progress_file, **fields)

    def close(self) -> None:
        """Wait for background checkpoint work (retention), then leave the process group if one is
        initialized. Drop your ``DistributedDataParallel`` wrapper first (``del ddp``): whoever drops
        the group's last reference joins gloo's worker threads, which may still be freeing the last
        collective's tensors (a save ends with one) and need the GIL for it; DDP's reducer drops its
        reference holding the GIL (a deadlock when it is the last one: seen with torch 2.13, gloo),
        the group's own Python object releases it first."""
        if self._checkpoints is not None:
            self._checkpoints.wait()
        if dist.is_available() and dist.is_initialized():
            gc.collect()  # a wrapper left in a reference cycle goes now, not after the group
            dist.barrier()
            dist.destroy_process_group()
