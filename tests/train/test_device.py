"""The device choice is a pure function of what the machine has: each case is its inputs, no GPU
pretended. The torch side (``to_device``, ``autocast``) is checked on the CPU plan only."""

from __future__ import annotations

import pytest
import torch

from sailor_tasks.train.device import CPU_PLAN, DevicePlan, autocast, device_plan, to_device


def plan(**kw) -> DevicePlan:
    inputs = dict(cuda_available=True, device_count=8, local_rank=3, local_world_size=8, bf16_supported=True)
    return device_plan(**{**inputs, **kw})


def test_a_gpu_per_worker_gives_nccl_on_the_local_ranks_gpu_with_bf16_and_pinned_copies():
    p = plan()
    assert (p.backend, p.device, p.autocast_dtype, p.pin_memory) == ("nccl", "cuda:3", "bfloat16", True)
    assert p.is_cuda and p.device_type == "cuda"


def test_a_gpu_without_bf16_trains_in_fp32_on_the_gpu():
    p = plan(bf16_supported=False, local_rank=0)
    assert (p.backend, p.device, p.autocast_dtype, p.pin_memory) == ("nccl", "cuda:0", None, True)
    assert "fp32" in p.reason


def test_more_gpus_than_workers_is_fine():
    assert plan(device_count=8, local_world_size=2, local_rank=1).device == "cuda:1"


@pytest.mark.parametrize(
    "inputs",
    [
        dict(cuda_available=False, device_count=0),
        dict(cuda_available=False, device_count=4),  # driver missing: devices listed but unusable
        dict(cuda_available=True, device_count=0),
    ],
)
def test_no_usable_cuda_gives_gloo_on_the_cpu_in_fp32(inputs):
    assert plan(**inputs, local_rank=0, local_world_size=2) == CPU_PLAN
    assert (CPU_PLAN.backend, CPU_PLAN.device, CPU_PLAN.autocast_dtype, CPU_PLAN.pin_memory) == (
        "gloo",
        "cpu",
        None,
        False,
    )


def test_fewer_gpus_than_workers_puts_every_worker_of_the_node_on_the_cpu():
    # Every local rank decides alike (NCCL refuses two ranks on one GPU; a mixed node cannot agree
    # on a backend): rank 0, which would have a GPU, goes to the CPU too.
    plans = [plan(device_count=2, local_world_size=4, local_rank=r) for r in range(4)]
    assert {(p.backend, p.device) for p in plans} == {("gloo", "cpu")}
    assert "4 workers" in plans[0].reason and "2 GPU(s)" in plans[0].reason


def test_a_cuda_build_without_nccl_trains_on_the_cpu():
    p = plan(nccl_available=False)
    assert (p.backend, p.device) == ("gloo", "cpu") and "NCCL" in p.reason


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(local_rank=8, local_world_size=8), r"local_rank=8 must be in \[0, 8\)"),
        (dict(local_rank=-1), r"local_rank=-1"),
        (dict(local_world_size=0, local_rank=0), r"local_world_size=0"),
        (dict(device_count=-1), r"device_count=-1"),
    ],
)
def test_impossible_inputs_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        plan(**kw)


def test_on_the_cpu_plan_batches_stay_put_and_autocast_is_off():
    x = torch.arange(6).reshape(2, 3)
    assert to_device(x, CPU_PLAN) is x
    with autocast(CPU_PLAN):
        y = torch.ones(2, 2) @ torch.ones(2, 2)
        assert not torch.is_autocast_enabled("cpu")
    assert y.dtype == torch.float32


@pytest.mark.parametrize(
    ("capability", "dtype"), [((7, 5), None), ((7, 0), None), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")]
)
def test_bf16_autocast_only_where_the_workers_gpu_computes_it_natively(monkeypatch, capability, dtype):
    """T4 (7.5) and V100 (7.0) only emulate bf16, which ``torch.cuda.is_bf16_supported()`` counts as
    support (and checks by making a tensor on the current GPU): they train in fp32, as the device
    table says. torch's answers about the machine are stood in for; the decision is SAILOR's."""
    import torch.distributed as dist

    from sailor_tasks.train import device

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: asked.append(i) or capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: pytest.fail("emulation counts"))
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    p = device.detect_device_plan(1, 2)
    assert (p.device, p.autocast_dtype) == ("cuda:1", dtype) and asked == [1]
