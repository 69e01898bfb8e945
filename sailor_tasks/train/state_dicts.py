"""Model + optimizer state dicts in DCP's layout (``get_state_dict``), its key resolution cached.

``torch.distributed.checkpoint.state_dict.get_state_dict`` turns ``model.state_dict()`` and
``optimizer.state_dict()`` into fully-qualified-name (FQN) keyed dicts: wrapper prefixes (DDP's
``module.``, ``torch.compile``'s ``_orig_mod.``) dropped, optimizer state and param groups keyed by
FQN instead of parameter index. It re-derives every FQN on every call (option checks, module
walks): 10-30 ms for a 100-tensor model, each checkpoint. ``model_optim_state_dict`` does the same
renaming from FQNs resolved once per (model, optimizer) and checked against ``get_state_dict``'s
own output the first time; any model it does not cover (FSDP, DTensor parameters, an optimizer
whose state is not initialised yet, a changed parameter list) goes through ``get_state_dict``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import _get_fqns, get_state_dict
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True, slots=True)
class _Fqns:
    """FQNs of one (model, optimizer) pair, valid while the optimizer holds the same parameters."""

    optimizer_id: int
    param_ids: tuple[int, ...]
    """``id`` of every optimizer parameter, in ``param_groups`` order (the optimizer's indices)."""
    model_keys: dict[str, str]
    """``model.state_dict()`` key -> FQN."""
    param_fqns: tuple[str, ...]
    """FQN of optimizer parameter index i."""


_CACHE: weakref.WeakKeyDictionary[torch.nn.Module, _Fqns] = weakref.WeakKeyDictionary()


def _param_ids(optimizer: torch.optim.Optimizer) -> tuple[int, ...]:
    return tuple(id(p) for p in chain.from_iterable(g["params"] for g in optimizer.param_groups))


def _covered(model: torch.nn.Module) -> bool:
    """Plain modules and DDP: their ``state_dict()`` holds the tensors ``get_state_dict`` returns."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    if any(isinstance(p, DTensor) for p in inner.parameters()):
        return False
    return not any("FullyShard" in type(m).__name__ or "FSDP" in type(m).__name__ for m in inner.modules())


def _resolve(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> _Fqns | None:
    """Every FQN, the way ``get_state_dict`` derives it; None when a parameter has no single FQN."""
    keys = {key: next(iter(fqns)) for key in model.state_dict() if len(fqns := _get_fqns(model, key)) == 1}
    by_param: dict[int, str] = {}
    for key, param in model.named_parameters():
        fqns = _get_fqns(model, key)
        if len(fqns) != 1:
            return None
        by_param[id(param)] = next(iter(fqns))
    param_ids = _param_ids(optimizer)
    if any(pid not in by_param for pid in param_ids):
        return None
    return _Fqns(id(optimizer), param_ids, keys, tuple(by_param[pid] for pid in param_ids))


def _renamed(model: torch.nn.Module, optimizer: torch.optim.Optimizer, fqns: _Fqns) -> tuple[dict, dict]:
    """``get_state_dict``'s result, renaming keys as ``_get_model_state_dict`` and
    ``_get_optim_state_dict`` do (same order: a renamed key moves to the end)."""
    model_sd = model.state_dict()
    for key in list(model_sd):
        fqn = fqns.model_keys[key]
        if fqn != key:
            model_sd[fqn] = model_sd.pop(key)
    osd = optimizer.state_dict()
    state = osd["state"]
    for pid in list(state):
        state[fqns.param_fqns[pid]] = state.pop(pid)
    for group in osd["param_groups"]:
        group["params"] = [fqns.param_fqns[pid] for pid in group["params"]]
    return model_sd, {"state": dict(state), "param_groups": list(osd["param_groups"])}


def _same(a: Any, b: Any) -> bool:
    """Same keys in the same order, and the very same tensors (storage, shape, dtype) or values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            type(a) is type(b)
            and a.data_ptr() == b.data_ptr()
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.stride() == b.stride()
        )
    return type(a) is type(b) and a == b


@torch.no_grad()
def model_optim_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``get_state_dict(model, optimizer)`` (default options), without re-deriving FQNs each call.

    Args:
        model: the module, plain or wrapped in DDP.
        optimizer: its optimizer.

    Returns:
        (model state dict, optimizer state dict), keyed by FQN exactly as ``get_state_dict``.
    """
    fqns = _CACHE.get(model)
    if (
        fqns is not None
        and optimizer.state  # else get_state_dict initialises it (a zero-lr step)
        and fqns.optimizer_id == id(optimizer)
        and fqns.param_ids == _param_ids(optimizer)
    ):
        try:
            return _renamed(model, optimizer, fqns)
        except KeyError:  # a state_dict key or optimizer index not seen when resolved
            _CACHE.pop(model, None)
    full = get_state_dict(model, optimizer)
    if optimizer.state and _covered(model):
        fqns = _resolve(model, optimizer)
        if fqns is not None and _same(_renamed(model, optimizer, fqns), full):
            _CACHE[model] = fqns
    return full
