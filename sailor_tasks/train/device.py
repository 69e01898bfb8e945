"""Where a training worker computes: one pure choice from what the machine has, and its torch side.

``device_plan`` decides from plain inputs (CUDA present, GPUs on the node, this worker's local
rank and the node's worker count, bf16 support): ``nccl`` and ``cuda:LOCAL_RANK`` with pinned-memory
host-to-GPU copies when every worker of the node has a GPU of its own, bf16 autocast where that GPU
supports it; ``gloo`` on the CPU in full fp32 otherwise (bit-identical resumes there).
``detect_device_plan`` asks torch for those inputs; the built-in trainer (``train.__main__``) and
the runtime helper (``runtime.Run.init_distributed``) both use it.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """How one worker trains: process-group backend, device, autocast dtype, host-memory pinning."""

    backend: str
    """``torch.distributed`` backend: ``nccl`` on GPUs, ``gloo`` on the CPU."""
    device: str
    """``cuda:N`` (N = the worker's local rank) or ``cpu``."""
    autocast_dtype: str | None
    """``bfloat16`` when the forward pass runs under ``torch.autocast``; None for full fp32."""
    pin_memory: bool
    """Batches are copied from page-locked host memory with ``non_blocking`` copies."""
    reason: str
    """Why this plan (one line for the worker's log)."""

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def device_type(self) -> str:
        return self.device.split(":", 1)[0]


CPU_PLAN = DevicePlan("gloo", "cpu", None, False, "CPU")


def device_plan(
    *,
    cuda_available: bool,
    device_count: int,
    local_rank: int,
    local_world_size: int,
    bf16_supported: bool,
    nccl_available: bool = True,
) -> DevicePlan:
    """The plan of the worker with ``local_rank`` among ``local_world_size`` workers on its node.

    GPUs only when each worker of the node gets one of its own (NCCL refuses two ranks on one GPU,
    and every worker decides alike, so the whole node agrees on one backend): with fewer GPUs than
    workers, or without NCCL, the node trains on the CPU with gloo and says why.

    Raises:
        ValueError: ``local_rank`` outside ``[0, local_world_size)``, or a negative count.
    """
    if local_world_size < 1 or device_count < 0:
        raise ValueError(
            f"local_world_size={local_world_size} must be >= 1 and device_count={device_count} >= 0"
        )
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank={local_rank} must be in [0, {local_world_size}) (local_world_size)")
    if not cuda_available or device_count == 0:
        return CPU_PLAN
    if device_count < local_world_size:
        return DevicePlan(
            "gloo",
            "cpu",
            None,
            False,
            f"CPU: {local_world_size} workers on this node but {device_count} GPU(s); one GPU per worker needed",
        )
    if not nccl_available:
        return DevicePlan("gloo", "cpu", None, False, "CPU: this torch build has CUDA but no NCCL")
    return DevicePlan(
        "nccl",
        f"cuda:{local_rank}",
        "bfloat16" if bf16_supported else None,
        True,
        f"GPU {local_rank} of {device_count}" + (", bf16 autocast" if bf16_supported else ", fp32 (no bf16)"),
    )


def detect_device_plan(local_rank: int, local_world_size: int) -> DevicePlan:
    """``device_plan`` with what this machine has (torch's view of CUDA)."""
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    return device_plan(
        cuda_available=cuda,
        device_count=count,
        local_rank=local_rank,
        local_world_size=local_world_size,
        bf16_supported=0 <= local_rank < count and native_bf16(local_rank),
        nccl_available=dist.is_available() and dist.is_nccl_available(),
    )


def native_bf16(index: int) -> bool:
    """Whether GPU ``index`` computes in bf16 natively (compute capability 8.0 or newer: A100, L4,
    H100). ``torch.cuda.is_bf16_supported()`` also says yes where bf16 is only emulated (T4, V100:
    it merely creates a bf16 tensor, on the current GPU, which makes a CUDA context there); the
    capability is read without one."""
    return torch.cuda.get_device_capability(index)[0] >= 8


def select_device(plan: DevicePlan) -> torch.device:
    """Make the plan's GPU this process's current one (NCCL and DCP's collectives use it)."""
    device = torch.device(plan.device)
    if plan.is_cuda:
        torch.cuda.set_device(device)
    return device


def to_device(tensor: torch.Tensor, plan: DevicePlan) -> torch.Tensor:
    """``tensor`` on the plan's device: through pinned memory and a non-blocking copy on a GPU
    (ordered on the current stream before the kernels that use it); unchanged on the CPU."""
    if not plan.is_cuda:
        return tensor
    if plan.pin_memory:
        return tensor.pin_memory().to(plan.device, non_blocking=True)
    return tensor.to(plan.device)


def autocast(plan: DevicePlan) -> Any:
    """The forward pass's autocast context (a no-op context in full fp32)."""
    if plan.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=plan.device_type, dtype=getattr(torch, plan.autocast_dtype))


COLLECTIVE_TIMEOUT_ENV = "SAILOR_COLLECTIVE_TIMEOUT_S"
"""Seconds a collective may wait for a peer (set by the gke backend); unset: torch's default."""


def collective_timeout(environ: Mapping[str, str] | None = None) -> datetime.timedelta | None:
    """The process groups' timeout from ``SAILOR_COLLECTIVE_TIMEOUT_S`` in ``environ`` (default:
    this process's environment); None: torch's default.

    Raises:
        ValueError: the value is not a positive number of seconds (names it).
    """
    raw = (os.environ if environ is None else environ).get(COLLECTIVE_TIMEOUT_ENV, "")
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{COLLECTIVE_TIMEOUT_ENV}={raw!r} is not a positive, finite number of seconds")
    return datetime.timedelta(seconds=seconds)


def _timeout_kwargs(timeout: datetime.timedelta | None) -> dict[str, datetime.timedelta]:
    return {"timeout": timeout} if timeout else {}


def init_process_group(plan: DevicePlan, timeout: datetime.timedelta | None = None) -> None:
    """Join the default process group with the plan's backend (``timeout``: ``collective_timeout``;
    None: torch's default)."""
    import torch.distributed as dist

    dist.init_process_group(backend=plan.backend, **_timeout_kwargs(timeout))


def gloo_group(timeout: datetime.timedelta | None = None) -> Any:
    """A new gloo group of every rank (creating it is a collective: every rank calls this at the
    same point). Give it the default group's ``timeout``: torch gives a new group its backend's
    default (30 minutes), not the default group's."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", **_timeout_kwargs(timeout))


def vote_group(timeout: datetime.timedelta | None = None) -> Any:
    """The group ``any_rank`` votes on: None (the default group) when that is gloo; over NCCL a new
    gloo group of every rank (creating it is a collective: every rank calls this at the same point),
    as a vote on a GPU tensor read back every step would make the host wait for the GPU to drain
    its queue."""
    import torch.distributed as dist

    return gloo_group(timeout) if dist.get_backend() == "nccl" else None


def any_rank(flag: bool, group: Any = None) -> bool:
    """True on every rank of ``group`` when ``flag`` is true on any: an all-reduce of a CPU tensor,
    so it never waits for a GPU (``group`` from ``vote_group``)."""
    import torch.distributed as dist

    vote = torch.tensor([1 if flag else 0])
    dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=group)
    return bool(vote.item())
