"""model_optim_state_dict: get_state_dict's exact output, with FQNs resolved once."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.nn.parallel import DistributedDataParallel

from sailor_tasks.train import state_dicts
from sailor_tasks.train.state_dicts import _same, model_optim_state_dict


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()


def test_repeated_calls_return_get_state_dicts_keys_order_and_tensors():
    model, optimizer = _model_and_optimizer()
    _step(model, optimizer)
    for _ in range(3):
        fast = model_optim_state_dict(model, optimizer)
        assert model in state_dicts._CACHE  # the cached path is what is compared below
        assert _same(fast, get_state_dict(model, optimizer))
        assert list(fast[1]["state"]) == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]
        _step(model, optimizer)


def test_an_optimizer_without_state_is_initialised_as_get_state_dict_does():
    model, optimizer = _model_and_optimizer()
    fast = model_optim_state_dict(model, optimizer)
    model2, optimizer2 = _model_and_optimizer()
    assert not optimizer2.state
    reference = get_state_dict(model2, optimizer2)
    assert list(fast[1]["state"]) == list(reference[1]["state"])
    assert torch.equal(fast[1]["state"]["0.weight"]["exp_avg"], reference[1]["state"]["0.weight"]["exp_avg"])


def test_a_changed_parameter_list_is_resolved_again():
    model, optimizer = _model_and_optimizer()
    _step(model, optimizer)
    model_optim_state_dict(model, optimizer)
    extra = torch.nn.Linear(2, 3)
    model.append(extra)
    optimizer.add_param_group({"params": list(extra.parameters()), "lr": 1e-3})
    _step(model, optimizer)
    fast = model_optim_state_dict(model, optimizer)
    assert _same(fast, get_state_dict(model, optimizer))
    assert fast[1]["param_groups"][1]["params"] == ["3.weight", "3.bias"]


@pytest.fixture
def one_rank_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_keys_lose_the_module_prefix_exactly_as_get_state_dict(one_rank_group):
    model, _ = _model_and_optimizer()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    _step(ddp, optimizer)
    model_optim_state_dict(ddp, optimizer)
    fast = model_optim_state_dict(ddp, optimizer)
    assert ddp in state_dicts._CACHE
    assert _same(fast, get_state_dict(ddp, optimizer))
    assert "0.weight" in fast[0] and not any(k.startswith("module.") for k in fast[0])
