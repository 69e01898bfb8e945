"""Saves that reuse the previous save's plan, preallocated data files, and the trainer's
model + optimizer state dicts renamed as get_state_dict does."""

from __future__ import annotations

import math
import os
import pickle
from collections import OrderedDict

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

import sailor_tasks.train.checkpoint.dcp as dcp_mod
import sailor_tasks.train.trainer as trainer_mod
from sailor_tasks import storage
from sailor_tasks.train.checkpoint.dcp import CheckpointManager, diff_states
from sailor_tasks.train.checkpoint.store import MARKER
from sailor_tasks.train.trainer import _ModelOptimState, _same


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {f"layer{i}.weight": torch.randn(64, 32 + i, generator=g) for i in range(6)},
        "optim": {
            "state": {
                "layer0.weight": {"step": torch.tensor(float(step)), "exp_avg": torch.randn(5, generator=g)}
            },
            "param_groups": [{"lr": 0.1 / (step + 1), "betas": (0.9, 0.999), "params": ["layer0.weight"]}],
        },
        "trainer": {"step": step, "loss": 1.0 / step, "note": "run"},
        "rng": torch.get_rng_state(),
    }


@pytest.fixture
def planned(monkeypatch) -> list[str]:
    """Checkpoint folders ``dcp.save`` planned (the others reused a plan)."""
    calls: list[str] = []
    real = dcp_mod.dcp.save

    def save(state_dict, *, storage_writer, **kwargs):
        calls.append(os.path.basename(str(storage_writer.path)))
        return real(state_dict, storage_writer=storage_writer, **kwargs)

    monkeypatch.setattr(dcp_mod.dcp, "save", save)
    return calls


def _files(mgr: CheckpointManager, step: int) -> dict[str, bytes]:
    folder = storage.filesystem(mgr.step_uri(step))[1]
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder)) if n != MARKER}


def test_saves_of_an_unchanged_layout_write_what_dcp_would_plan_without_planning(tmp_path, planned):
    reused = CheckpointManager(f"file://{tmp_path}/reused", keep_latest_k=10)
    for step in (1, 2, 3):
        reused.save(step, _state(step))
    assert planned == ["step-00000001"]  # saves 2 and 3 reused the plan of save 1
    fresh = CheckpointManager(f"file://{tmp_path}/fresh", keep_latest_k=10)
    fresh.save(3, _state(3))  # planned by DCP
    assert planned == ["step-00000001", "step-00000003"]
    assert _files(reused, 3) == _files(fresh, 3)  # data files and .metadata, byte for byte
    for step in (1, 2, 3):
        assert diff_states(reused.load_all(step), _state(step)) == [], step
        assert reused.verify(step)


def _ordered(d: dict) -> OrderedDict:
    return OrderedDict((k, _ordered(v) if isinstance(v, dict) else v) for k, v in d.items())


def test_ordered_and_plain_dicts_of_the_same_items_share_a_plan(tmp_path, planned):
    """``module.state_dict()`` is an OrderedDict, an async save's staging copy a plain dict: DCP
    plans both alike, so one's plan is reused for the other, and the files are DCP's own."""
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    mgr.save(1, _ordered(_state(1)))
    mgr.save(2, _state(2))
    mgr.save(3, _ordered(_state(3)))
    assert planned == ["step-00000001"]
    fresh = CheckpointManager(f"file://{tmp_path}/fresh", keep_latest_k=10)
    fresh.save(2, _state(2))  # planned by DCP
    assert _files(mgr, 2) == _files(fresh, 2)
    for step in (1, 2, 3):
        assert diff_states(mgr.load_all(step), _state(step)) == [], step


def test_a_pickled_value_that_changes_size_moves_only_its_own_entry(tmp_path, planned):
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    small, big = _state(1), _state(1)
    big["trainer"]["note"] = "x" * 5000  # a longer pickle
    mgr.save(1, small)
    mgr.save(2, big)
    mgr.save(3, small)
    assert planned == ["step-00000001"]
    for step, state in ((1, small), (2, big), (3, small)):
        assert diff_states(mgr.load_all(step), state) == [], step
    meta = [pickle.loads(_files(mgr, s)[".metadata"]) for s in (1, 2)]
    moved = {i.fqn for i in meta[0].storage_data if meta[0].storage_data[i] != meta[1].storage_data[i]}
    assert moved and all(not isinstance(_lookup(small, fqn), torch.Tensor) for fqn in moved)


def test_plain_values_pickled_once_come_back_exactly(tmp_path, planned):
    """Values equal in Python but pickled differently (0.0 and -0.0) keep their own bytes."""
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    values = [0.0, -0.0, 0.0, float("nan"), -0.0, 1e300]
    for step, value in enumerate(values, 1):
        mgr.save(step, {"w": torch.ones(2), "v": value, "betas": (0.9, -0.0), "n": 2**70})
    assert planned == ["step-00000001"]
    for step, value in enumerate(values, 1):
        got = mgr.load_all(step)
        assert repr(got["v"]) == repr(value) and math.copysign(1, got["v"]) == math.copysign(1, value), step
        assert repr(got["betas"]) == "(0.9, -0.0)" and got["n"] == 2**70


def test_lists_of_plain_values_pickled_once_come_back_exactly(tmp_path, planned):
    """A list of scalars (a param group's parameter names) is pickled once per distinct pickle:
    lists equal in Python (0.0 and -0.0) keep their own bytes."""
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    values = [[0.0, "a"], [-0.0, "a"], [0.0, "b"], [-0.0, "a"], [float("nan"), "a"]]
    for step, value in enumerate(values, 1):
        mgr.save(step, {"w": torch.ones(2), "params": value})
    assert planned == ["step-00000001"]
    for step, value in enumerate(values, 1):
        got = mgr.load_all(step)["params"]
        assert type(got) is list and repr(got) == repr(value), step
        assert math.copysign(1, got[0]) == math.copysign(1, value[0]), step


class _Flaky:
    """A value whose pickling fails while ``fail`` is set."""

    fail = False

    def __reduce__(self):
        if _Flaky.fail:
            raise ValueError("this value cannot be pickled now")
        return (_Flaky, ())


def test_a_value_failing_to_pickle_fails_a_save_with_a_reused_plan_and_keeps_the_last_one(
    tmp_path, planned, monkeypatch
):
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10, thread_count=2)
    state = {"a": torch.randn(100_000), "b": torch.randn(100_000), "odd": _Flaky(), "n": 1}
    mgr.save(1, state)
    monkeypatch.setattr(_Flaky, "fail", True)
    with pytest.raises(Exception) as failed:
        mgr.save(2, state)
    chain, error = [], failed.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    assert any("this value cannot be pickled now" in m for m in chain), chain
    assert planned == ["step-00000001"]  # the failed save reused the plan
    assert mgr.latest_valid_step() == 1
    monkeypatch.setattr(_Flaky, "fail", False)
    mgr.save(2, state)  # the step's partial folder is replaced
    assert mgr.latest_valid_step() == 2 and mgr.verify(2)
    assert torch.equal(mgr.load_all(2)["b"], state["b"])


def _lookup(state: dict, fqn: str):
    for part in fqn.split("."):
        state = state[part] if isinstance(state, dict) else state[int(part)]
    return state


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["model"].update({"layer0.weight": torch.zeros(64, 33)}),  # a new shape
        lambda s: s["model"].update({"extra": torch.ones(3)}),  # a new key
        lambda s: s["model"].update({"layer1.weight": s["model"]["layer1.weight"].double()}),  # dtype
        lambda s: s["trainer"].update({"step": torch.tensor(5)}),  # a value becomes a tensor
    ],
)
def test_a_changed_layout_is_planned_again(tmp_path, planned, change):
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    mgr.save(1, _state(1))
    changed = _state(2)
    change(changed)
    mgr.save(2, changed)
    mgr.save(3, changed)
    assert planned == ["step-00000001", "step-00000002"]
    assert diff_states(mgr.load_all(2), changed) == []
    assert diff_states(mgr.load_all(3), changed) == []


class _Rows(list):
    """A list subclass: DCP descends into it, the plan reuse does not vouch for it."""


def test_state_dicts_the_plan_reuse_cannot_vouch_for_are_planned_every_save(tmp_path, planned):
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    for step in (1, 2):
        mgr.save(step, {"rows": _Rows([torch.full((4,), float(step)), torch.ones(2)]), "n": step})
    assert planned == ["step-00000001", "step-00000002"]
    assert torch.equal(mgr.load_all(2)["rows"][0], torch.full((4,), 2.0))


def test_new_data_files_are_allocated_before_they_are_written(tmp_path, monkeypatch):
    allocated: list[int] = []
    real = dcp_mod.preallocate

    def preallocate(f, size):
        allocated.append(size)
        assert f.tell() == 0  # before the first byte
        return real(f, size)

    monkeypatch.setattr(dcp_mod, "preallocate", preallocate)
    mgr = CheckpointManager(f"file://{tmp_path}/ck", recycle=False)
    state = _state(1)
    mgr.save(1, state)
    marker = storage.read_json(storage.join(mgr.step_uri(1), MARKER))
    data = {n: m for n, m in marker["files"].items() if n.endswith(".distcp")}
    tensor_bytes = sum(
        t.numel() * t.element_size()
        for t in [*state["model"].values(), *state["optim"]["state"]["layer0.weight"].values(), state["rng"]]
    )
    assert len(allocated) == len(data) and sum(allocated) == tensor_bytes
    folder = storage.filesystem(mgr.step_uri(1))[1]
    for name, meta in data.items():  # the pickled entries follow the allocated tensors
        assert os.path.getsize(os.path.join(folder, name)) == meta["size"] > 0
    assert mgr.verify(1)
    recycling = CheckpointManager(f"file://{tmp_path}/recycling", keep_latest_k=2)
    for step in (1, 2, 3):
        recycling.save(step, state)
        recycling.wait()  # the third save retires the first: its files are recycled
    allocated.clear()
    assert recycling.save(4, state).recycled_files == len(data)
    assert allocated == []  # recycled files keep their blocks


def test_preallocate_allocates_the_blocks_of_a_local_file_and_nothing_elsewhere(tmp_path):
    import io

    with open(tmp_path / "f", "wb") as f:
        assert dcp_mod.preallocate(f, 1 << 20)
    assert os.path.getsize(tmp_path / "f") == 1 << 20
    assert os.stat(tmp_path / "f").st_blocks * 512 >= 1 << 20
    assert not dcp_mod.preallocate(io.BytesIO(), 1 << 20)


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture
def get_state_dict_calls(monkeypatch) -> list[int]:
    calls: list[int] = []

    def counting(model, optimizer):
        calls.append(1)
        return get_state_dict(model, optimizer)

    monkeypatch.setattr(trainer_mod, "get_state_dict", counting)
    return calls


def test_model_optimizer_state_is_get_state_dicts_without_calling_it_again(get_state_dict_calls):
    model, optimizer = _model_and_optimizer()
    app = _ModelOptimState(model, optimizer)
    app.state_dict()
    for _ in range(3):
        optimizer.param_groups[0]["lr"] *= 0.5  # a scheduler step: the param groups follow
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        renamed = app.state_dict()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        assert _same(renamed, {"model": model_sd, "optim": optim_sd})
    assert len(get_state_dict_calls) == 1


def test_model_optimizer_state_calls_get_state_dict_again_when_parameters_change(get_state_dict_calls):
    model, optimizer = _model_and_optimizer()
    app = _ModelOptimState(model, optimizer)
    app.state_dict()
    model[2].weight = torch.nn.Parameter(torch.zeros(2, 8))  # a new parameter object
    optimizer.param_groups[0]["params"][4] = model[2].weight
    optimizer.state.clear()
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    assert _same(app.state_dict(), {"model": model_sd, "optim": optim_sd})
    assert len(get_state_dict_calls) == 2


def test_model_optimizer_state_keeps_calling_get_state_dict_when_renames_do_not_reproduce_it(
    get_state_dict_calls,
):
    class Holder(torch.nn.Module):  # a submodule named like DDP's wrapper, but no DDP
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Linear(2, 2)

    model = Holder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.module(torch.randn(1, 2)).sum().backward()
    optimizer.step()
    app = _ModelOptimState(model, optimizer)
    for _ in range(2):
        assert list(app.state_dict()["model"]) == ["module.weight", "module.bias"]
    assert len(get_state_dict_calls) == 2


def test_sync_and_async_saves_of_a_model_share_one_plan(tmp_path, planned):
    """A trainer mixing sync saves (the module's OrderedDicts) and async saves (their staging
    copies, plain dicts) plans once."""
    model, optimizer = _model_and_optimizer()
    app = _ModelOptimState(model, optimizer)
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    for step in range(1, 6):
        if step % 2:
            mgr.save_async(step, {"app": app, "step": step})
            mgr.wait()
        else:
            mgr.save(step, {"app": app, "step": step})
    assert planned == ["step-00000001"]
    assert torch.equal(mgr.load_all(4)["app"]["model"]["0.weight"], model.state_dict()["0.weight"])


def _tensors() -> dict:
    """Large entries (each written in chunks), small ones (written together) and a square one."""
    g = torch.Generator().manual_seed(7)
    return {
        "big": torch.randn(700_000, generator=g),
        "square": torch.randn(300, 300, generator=g),
        "small": {f"s{i}": torch.randn(50, generator=g) for i in range(40)},
        "step": 0,
    }


def _snapshot(state: dict) -> dict:
    return {
        k: _snapshot(v) if isinstance(v, dict) else (v.clone() if torch.is_tensor(v) else v)
        for k, v in state.items()
    }


def _assert_saved(mgr: CheckpointManager, saved: dict[int, dict]) -> None:
    """Every step in ``saved`` verifies and loads back as its snapshot."""
    for step, expected in saved.items():
        assert mgr.verify(step)
        assert diff_states(mgr.load_all(step), expected) == [], step


def test_tensors_updated_in_place_are_written_by_the_same_program_with_their_new_bytes(tmp_path):
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    state = _tensors()
    saved = {}
    programs = []
    for step in range(1, 5):
        state["step"] = step
        mgr.save(step, state)
        saved[step] = _snapshot(state)
        programs.append(dict(mgr._plan.programs))
        with torch.no_grad():  # an optimizer step: the same storages, new values
            state["big"].mul_(1.5).add_(step)
            state["square"].sub_(0.25)
            for t in state["small"].values():
                t.add_(step)
    assert programs[0] == {}  # the first save is planned by DCP
    assert programs[1] and all(p.reusable for p in programs[1].values())
    assert programs[2] == programs[1] and programs[3] == programs[1]  # the same program objects
    _assert_saved(mgr, saved)


def test_tensors_moved_or_viewed_anew_are_written_from_where_they_are_now(tmp_path):
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    state = _tensors()
    mgr.save(1, state)
    mgr.save(2, state)  # the write programs worked out
    first = dict(mgr._plan.programs)
    saved = {}
    # Step 3: a large and a small entry replaced by new tensors (new storages, same layout).
    state["big"] = state["big"] * 2
    state["small"]["s3"] = torch.full((50,), 3.0)
    mgr.save(3, state)
    saved[3] = _snapshot(state)
    assert mgr._plan.programs and mgr._plan.programs != first
    # Step 4: the square matrix transposed, a view at the same address and of the same shape:
    # copied to be written in order, so no program is kept for it.
    state["square"] = state["square"].t()
    mgr.save(4, state)
    saved[4] = _snapshot(state)
    assert mgr._plan.programs == {} and mgr._plan.placements is None
    # Step 5: contiguous again.
    state["square"] = state["square"].contiguous()
    mgr.save(5, state)
    saved[5] = _snapshot(state)
    assert mgr._plan.programs and all(p.reusable for p in mgr._plan.programs.values())
    _assert_saved(mgr, saved)


def test_a_kept_write_program_keeps_no_tensor_alive(tmp_path):
    import gc
    import weakref

    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    state = _tensors()
    for step in (1, 2):
        mgr.save(step, state)
    assert mgr._plan.programs
    refs = [weakref.ref(state["big"]), weakref.ref(state["small"]["s0"])]
    del state
    gc.collect()
    assert [r() for r in refs] == [None, None]
