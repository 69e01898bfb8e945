"""The training loop: resume first, deterministic steps, checkpoints, preemption notice handling.

The Trainer is driven by ``__main__`` (which owns the environment and the process group) and by
tests directly on one CPU process. Everything that must survive a restart is in ``state()``:
model and optimizer (through DCP's state_dict helpers, so DDP wrapping does not matter), LR
schedule, step, tokens seen, the loss measured before training, and this rank's RNG state.
"""

from __future__ import annotations

import datetime
import logging
import math
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from sailor_tasks import storage
from sailor_tasks.train.checkpoint.dcp import CheckpointManager, unless_fenced
from sailor_tasks.train.config import TrainConfig
from sailor_tasks.train.data import ByteCorpus
from sailor_tasks.train.device import (
    CPU_PLAN,
    DevicePlan,
    any_rank,
    autocast,
    gloo_group,
    to_device,
    vote_group,
)
from sailor_tasks.train.models import build_model
from sailor_tasks.train.progress import write_progress
from sailor_tasks.train.specs import MODEL_SPECS

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrainResult:
    run_id: str
    status: str
    """``completed`` or ``preempted``."""
    step: int
    total_steps: int
    resumed_from_step: int | None
    initial_loss: float
    final_loss: float | None
    checkpoint_uri: str | None
    samples_per_s: float
    wall_s: float
    world_size: int


_WRAPPER_ATOMS = frozenset({"module", "_orig_mod"})
"""Key atoms of DDP's and torch.compile's wrappers, which ``get_state_dict`` drops from FQNs."""


def _same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same state: tensors over the same memory, containers alike in type
    and key order, other values equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            type(a) is type(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.stride() == b.stride()
            and a.data_ptr() == b.data_ptr()
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and (a == b or (a != a and b != b))  # NaN == NaN here


@dataclass(frozen=True, slots=True)
class _Renames:
    """How ``get_state_dict`` renamed ``model.state_dict()`` and ``optimizer.state_dict()`` for
    one model and optimizer, checked against its result (``learn``)."""

    params: tuple[int, ...]
    """``id`` of the model's parameters, in order."""
    optim_params: tuple[int, ...]
    """``id`` of the optimizer's parameters, in its param groups' order (its state dict's ids)."""
    model_keys: dict[str, str]
    """``model.state_dict()`` key -> FQN."""
    fqn_of: tuple[str, ...]
    """Optimizer state dict parameter id -> FQN."""

    @classmethod
    def learn(
        cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_sd: Any, optim_sd: Any
    ) -> _Renames | None:
        """The renames that turn the plain state dicts into ``get_state_dict``'s ``model_sd`` and
        ``optim_sd``, or None when they do not reproduce them exactly (FSDP, a submodule named
        like a wrapper...)."""
        renames = cls(
            params=tuple(map(id, model.parameters())),
            optim_params=tuple(id(p) for g in optimizer.param_groups for p in g["params"]),
            model_keys={
                k: ".".join(a for a in k.split(".") if a not in _WRAPPER_ATOMS) for k in model.state_dict()
            },
            fqn_of=tuple(fqn for g in optim_sd["param_groups"] for fqn in g["params"]),
        )
        try:
            renamed = renames.apply(model, optimizer)
            same = renamed is not None and _same(renamed, {"model": model_sd, "optim": optim_sd})
        except Exception:  # values that do not compare (or rename) plainly: keep get_state_dict
            same = False
        if not same:
            logger.debug("get_state_dict's state dicts are not the plain ones renamed: called on every save")
            return None
        return renames

    def apply(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """``get_state_dict``'s state dicts, from the plain ones renamed; None when the model's or
        the optimizer's parameters or keys changed, or the optimizer has no state yet (which
        ``get_state_dict`` initialises)."""
        if (
            not optimizer.state
            or tuple(map(id, model.parameters())) != self.params
            or tuple(id(p) for g in optimizer.param_groups for p in g["params"]) != self.optim_params
        ):
            return None
        model_sd = model.state_dict()
        if model_sd.keys() != self.model_keys.keys():
            return None
        for key in list(model_sd):  # renamed in place, in get_state_dict's order
            fqn = self.model_keys[key]
            if fqn != key:
                model_sd[fqn] = model_sd.pop(key)
        osd = optimizer.state_dict()
        state = osd["state"]
        for pid in list(state):
            state[self.fqn_of[pid]] = state.pop(pid)
        for group in osd["param_groups"]:
            group["params"] = [self.fqn_of[pid] for pid in group["params"]]
        return {"model": model_sd, "optim": {"state": dict(state), "param_groups": list(osd["param_groups"])}}


class _ModelOptimState(Stateful):
    """DCP Stateful for model + optimizer; handles DDP-wrapped modules transparently.

    The state dicts are ``get_state_dict``'s (keys are FQNs, wrapper prefixes dropped). It maps
    every parameter to its FQN by walking the module tree on every call (9 ms for gpt_25m, 30x
    ``model.state_dict()`` + ``optimizer.state_dict()``), so its first result is compared with
    those two renamed (``_Renames``), and while the parameters and keys stay the same, later calls
    rename instead. Keep one instance per model and optimizer.

    Pipelined async saves call ``state_dict()`` in the checkpoint thread while the next
    forward/backward runs. It only reads there: ``get_state_dict`` writes (a zero-lr optimizer
    step) only to initialise an optimizer without state, and the trainer saves after optimizer steps.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        self._renames: _Renames | None = None

    def state_dict(self) -> dict[str, Any]:
        if self._renames is not None:
            renamed = self._renames.apply(self.model, self.optimizer)
            if renamed is not None:
                return renamed
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        self._renames = _Renames.learn(self.model, self.optimizer, model_sd, optim_sd)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        stop_event: threading.Event | None = None,
        progress_path: str | None = None,
        device_plan: DevicePlan = CPU_PLAN,
        collective_timeout: datetime.timedelta | None = None,
    ):
        """``collective_timeout``: that of the groups it makes (the default group's, from
        ``SAILOR_COLLECTIVE_TIMEOUT_S``); None: torch's default."""
        self.config, self.rank, self.world_size = config, rank, world_size
        self.plan = device_plan
        self.distributed = world_size > 1 or (dist.is_available() and dist.is_initialized())
        self.stop_event = stop_event or threading.Event()
        self.progress_path = progress_path if rank == 0 else None
        self._resumed_from: int | None = None
        self._first_step_at: float | None = None
        self._loop_start: float | None = None
        self._loop_first_step = 0
        spec = MODEL_SPECS[config.model]
        torch.manual_seed(config.seed)  # identical init on every rank
        model = build_model(spec).to(device_plan.device)
        if self.distributed:
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[torch.device(device_plan.device).index] if device_plan.is_cuda else None
            )
        self.model = model
        # On a GPU, AdamW's fused kernels update every parameter in a few launches (the default
        # multi-tensor path launches several kernels per group of tensors per step).
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.learning_rate, weight_decay=0.01, fused=self.plan.is_cuda or None
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self._app_state = _ModelOptimState(self.model, self.optimizer)
        torch.manual_seed(config.seed * 7_919 + rank)  # per-rank dropout stream
        self.corpus = ByteCorpus.load(config.data_uri, spec.seq_len, config.seed)
        # Async saves run their collectives in a background thread: give them their own group.
        ckpt_group = gloo_group(collective_timeout) if config.async_checkpoint and self.distributed else None
        # The per-step preemption vote runs on the CPU (over NCCL, a gloo group of its own).
        self._vote_group = vote_group(collective_timeout) if self.distributed else None
        self.checkpoints = CheckpointManager(
            config.checkpoint_uri,
            rank=rank,
            keep_latest_k=config.keep_latest_k,
            distributed=self.distributed,
            process_group=ckpt_group,
            attempt=config.attempt,
        )
        self.step = 0
        self.tokens_seen = 0
        self.initial_loss = float("nan")
        self.last_checkpoint_step: int | None = None
        self._async_failed = False
        """A background save failed since the last save committed (the next is made in the foreground)."""

    # --- state -------------------------------------------------------------------------------
    def _lr_factor(self, step: int) -> float:
        warm = max(1, self.config.warmup_steps)
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, self.config.total_steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def state(self) -> dict[str, Any]:
        rng = {f"rng_rank{self.rank}": torch.get_rng_state()}
        if self.plan.is_cuda:  # dropout on the GPU draws from the device's own generator
            rng[f"cuda_rng_rank{self.rank}"] = torch.cuda.get_rng_state(self.plan.device)
        return {
            "app": self._app_state,
            "scheduler": self.scheduler.state_dict(),
            "trainer": {
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "initial_loss": self.initial_loss,
            },
            **rng,
        }

    def _apply(self, state: dict[str, Any]) -> None:
        # The optimizer's loaded groups carry the saving attempt's kernel choice: use this one's.
        for group in self.optimizer.param_groups:
            group["fused"] = self.plan.is_cuda or None
        self.scheduler.load_state_dict(state["scheduler"])
        meta = state["trainer"]
        self.step, self.tokens_seen = int(meta["step"]), int(meta["tokens_seen"])
        self.initial_loss = float(meta["initial_loss"])
        torch.set_rng_state(state[f"rng_rank{self.rank}"])
        if f"cuda_rng_rank{self.rank}" in state:
            torch.cuda.set_rng_state(state[f"cuda_rng_rank{self.rank}"], self.plan.device)

    def resume(self) -> int | None:
        """Load the newest verified checkpoint, if any; return its step. Rank 0 picks, all load."""
        if self.rank == 0:
            self.checkpoints.claim(self.config.attempt)  # older attempts' workers may write no more
        step = self.checkpoints.latest_valid_step() if self.rank == 0 else None
        if self.distributed:
            box = [step]
            dist.broadcast_object_list(box, src=0)
            step = box[0]
        if step is None:
            return None
        state = self.state()
        cuda_rng = f"cuda_rng_rank{self.rank}"
        if cuda_rng in state and cuda_rng not in self.checkpoints.saved_keys(step):
            # saved on a machine without GPUs: the GPU's generator keeps its seeded state
            del state[cuda_rng]
        self.checkpoints.load(step, state)
        self._apply(state)
        self.last_checkpoint_step = step
        return step

    # --- loop --------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        losses = []
        for x, y in self.corpus.eval_batches(self.config.num_eval_batches, self.config.batch_size):
            with autocast(self.plan):
                losses.append(float(self.model(to_device(x, self.plan), to_device(y, self.plan))))
        self.model.train()
        return sum(losses) / len(losses)

    def _stop_requested(self) -> bool:
        """Whether any rank got a preemption notice (every rank gets the same answer)."""
        if not self.distributed:
            return self.stop_event.is_set()
        return any_rank(self.stop_event.is_set(), self._vote_group)

    def save(self, *, blocking: bool = True) -> None:
        """Checkpoint the current step; in the background when configured and not ``blocking``,
        unless a background save failed since the last one committed: then in the foreground,
        so that an error that lasts (a full disk, a read-only bucket) stops the run rather than
        leave it training on with no checkpoint to resume from. One that passes (a store's
        transient error) costs one foreground save."""
        if self.config.async_checkpoint and not blocking:
            _, collected = unless_fenced(
                self._collect_async_now, f"async checkpoint failed; saving step {self.step} anyway"
            )
            self._async_failed |= not collected
            foreground = self._async_failed
            if self.distributed:  # a collective save: every rank takes the same branch
                foreground = any_rank(foreground, self._vote_group)
            if not foreground:
                self.checkpoints.save_async(self.step, self.state(), pipelined=True)
                return
            logger.warning(
                "an async checkpoint failed (last committed: step %s): saving step %d in the foreground",
                self.last_checkpoint_step,
                self.step,
            )
        info = self.checkpoints.save(self.step, self.state())  # waits for a pending async save first
        self._async_failed = False
        self.last_checkpoint_step = info.step
        self._report_progress()

    def _collect_async_now(self) -> None:
        self._collect_async(wait=True)

    def _collect_async(self, wait: bool = False) -> None:
        info = self.checkpoints.wait() if wait else self.checkpoints.poll()
        if info is not None:
            self.last_checkpoint_step = info.step
            self._report_progress()

    def _save_on_notice(self) -> None:
        """The notice's checkpoint: the pending async save, when it commits this step, else a
        blocking save of it. A failed async save (its error logged) does not prevent the blocking
        one, which would leave the run only its last committed step. The save is collective: every
        rank takes the same branch."""
        _, collected = unless_fenced(
            self._collect_async_now, f"async checkpoint failed; saving step {self.step} now"
        )
        save = not collected or self.last_checkpoint_step != self.step
        if self.distributed:
            save = any_rank(save, self._vote_group)
        if save:
            self.save()

    def _report_progress(self) -> None:
        if self.progress_path:
            write_progress(
                self.progress_path,
                step=self.step,
                checkpoint_step=self.last_checkpoint_step,
                resumed_from=self._resumed_from,
                first_step_at=self._first_step_at,
            )

    def train_step(self) -> torch.Tensor:
        """One optimizer step on this rank's slice of step ``self.step``'s batch; returns the loss
        (on the plan's device: reading it waits for the GPU)."""
        x, y = self.corpus.train_batch(self.step, self.rank, self.world_size, self.config.batch_size)
        with autocast(self.plan):
            loss = self.model(to_device(x, self.plan), to_device(y, self.plan))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        # A pipelined async save copies the weights and optimizer state while this step's
        # forward/backward runs; the optimizer step changes them in place, so it waits.
        self.checkpoints.wait_staged()
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.tokens_seen += x.numel() * self.world_size
        return loss.detach()

    def run_step(self) -> bool:
        """One step as ``train`` runs it: ``train_step``, the progress file, the periodic log line,
        the checkpoint when one is due and the preemption vote. Returns True when a notice stops
        the run (after its step is saved)."""
        cfg = self.config
        if self._loop_start is None:
            self._loop_start, self._loop_first_step = time.monotonic(), self.step
        loss_t = self.train_step()
        if self._first_step_at is None:
            self._first_step_at = time.time()  # end of recovery: the first step of this attempt
        self._report_progress()
        if self.rank == 0 and (self.step % cfg.log_every_steps == 0 or self.step == cfg.total_steps):
            now = time.monotonic()
            done = self.step - self._loop_first_step
            rate = done * cfg.batch_size * self.world_size / max(now - self._loop_start, 1e-9)
            eta = (cfg.total_steps - self.step) * (now - self._loop_start) / max(done, 1)
            logger.info(
                "step %d/%d loss %.4f samples/s %.1f lr %.2e eta %.0fs",
                self.step,
                cfg.total_steps,
                loss_t.item(),
                rate,
                self.scheduler.get_last_lr()[0],
                eta,
            )
        # A background save that failed (a store's transient error) is logged; training goes on
        # from the last committed step, and a notice in this step is still saved.
        _, collected = unless_fenced(self._collect_async, "async checkpoint failed; training goes on")
        self._async_failed |= not collected
        if self.step == cfg.total_steps:
            self.save()
        elif self.step % cfg.checkpoint_every_steps == 0:
            self.save(blocking=False)
        if self.step < cfg.total_steps and self._stop_requested():
            self._save_on_notice()
            if self.rank == 0:
                logger.warning("preemption notice: saved step %d, stopping", self.step)
            return True
        return False

    def train(self) -> TrainResult:
        cfg = self.config
        start = time.monotonic()
        resumed = self._resumed_from = self.resume()
        self._report_progress()
        if resumed is None:
            self.initial_loss = self.evaluate()
            if self.rank == 0:
                logger.info(
                    "initial eval loss %.4f (%s, %d workers)", self.initial_loss, cfg.model, self.world_size
                )
        elif self.rank == 0:
            logger.info("resumed from step %d of %d", resumed, cfg.total_steps)
        self._loop_start, self._loop_first_step = start, self.step
        status = "completed"
        while self.step < cfg.total_steps:
            if self.run_step():
                status = "preempted"
                break
        self.checkpoints.wait()  # old checkpoints beyond keep_latest_k are deleted in the background
        final_loss = self.evaluate() if status == "completed" else None
        wall = time.monotonic() - start
        done = self.step - self._loop_first_step
        result = TrainResult(
            run_id=cfg.run_id,
            status=status,
            step=self.step,
            total_steps=cfg.total_steps,
            resumed_from_step=resumed,
            initial_loss=self.initial_loss,
            final_loss=final_loss,
            checkpoint_uri=self.checkpoints.step_uri(self.last_checkpoint_step)
            if self.last_checkpoint_step is not None
            else None,
            samples_per_s=done * cfg.batch_size * self.world_size / max(wall, 1e-9),
            wall_s=wall,
            world_size=self.world_size,
        )
        if self.rank == 0:
            storage.write_json(cfg.result_uri, asdict(result))
            if final_loss is not None:
                logger.info("done: step %d, eval loss %.4f -> %.4f", self.step, self.initial_loss, final_loss)
        return result
