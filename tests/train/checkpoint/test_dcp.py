"""DCP checkpoints through CheckpointManager: checksums from the writer, async saves, recycling,
crash-consistency under kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from sailor_tasks import storage
from sailor_tasks.train.checkpoint.dcp import (
    RAW_TENSOR_FORMAT,
    CheckpointManager,
    RawTensorFsspecReader,
    diff_states,
)
from sailor_tasks.train.checkpoint.store import MARKER, RECYCLE_DIR, crc32c_of
from sailor_tasks.train.config import TrainConfig
from sailor_tasks.train.trainer import Trainer


def _state(n: int, fill: float) -> dict:
    return {"w": torch.full((n,), fill), "meta": {"step": int(fill)}}


def test_marker_checksums_computed_while_writing_match_the_files(tmp_path):
    mgr = CheckpointManager(f"file://{tmp_path}/ck")
    mgr.save(1, _state(10_000, 1.0))
    marker = storage.read_json(storage.join(mgr.step_uri(1), MARKER))
    assert ".metadata" in marker["files"] and any(n.endswith(".distcp") for n in marker["files"])
    for name, meta in marker["files"].items():
        assert crc32c_of(storage.join(mgr.step_uri(1), name)) == (meta["crc32c"], meta["size"]), name


def test_retention_reads_back_nothing_a_local_process_wrote_itself(tmp_path, monkeypatch):
    """The marker's checksums were computed from the bytes written; a new process still verifies."""
    import sailor_tasks.train.checkpoint.store as store_mod

    read_back: list[str] = []
    real = store_mod.crc32c_of
    monkeypatch.setattr(store_mod, "crc32c_of", lambda uri: read_back.append(uri) or real(uri))
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=2)
    for step in (1, 2, 3):
        mgr.save(step, _state(10_000, float(step)))
    mgr.save_async(4, _state(10_000, 4.0))
    mgr.wait()
    assert mgr.step_dirs() == [3, 4] and read_back == []
    folder = storage.filesystem(mgr.step_uri(4))[1]
    with open(os.path.join(folder, "__0_0.distcp"), "r+b") as f:  # corrupted behind its back
        f.write(b"\xff")
    restarted = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=2)
    assert restarted.latest_valid_step() == 3 and read_back


@pytest.mark.parametrize("recycle", [False, True])
def test_sync_files_fsyncs_every_data_file_and_the_metadata_before_the_marker(tmp_path, monkeypatch, recycle):
    import sailor_tasks.train.checkpoint.dcp as dcp_mod

    synced: list[str] = []
    real_fsync = os.fsync
    saving = {"step": 0}

    def fsync(fd: int) -> None:
        # the save's own fsyncs (retention, in the "sailor-ckpt" thread, fsyncs what it keeps)
        if not threading.current_thread().name.startswith("sailor-ckpt_"):
            synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
            assert not (tmp_path / "ck" / f"step-{saving['step']:08d}" / MARKER).exists()  # not committed
        real_fsync(fd)

    monkeypatch.setattr(dcp_mod.os, "fsync", fsync)
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=1, recycle=recycle, sync_files=True)
    for step in (1, 2, 3):  # from the third save on, a recycling manager reuses retired files
        synced.clear()
        saving["step"] = step
        mgr.save(step, _several_tensors(step))
        mgr.wait()
    marker = storage.read_json(storage.join(mgr.step_uri(3), MARKER))
    assert sorted(synced) == sorted(marker["files"])  # the .distcp files and .metadata
    assert diff_states(mgr.load_all(3), _several_tensors(3)) == []
    synced.clear()
    CheckpointManager(f"file://{tmp_path}/plain").save(1, _several_tensors(1))
    assert synced == []  # the default writes without fsync


def test_async_save_commits_when_written_and_loads_back(tmp_path):
    mgr = CheckpointManager(f"file://{tmp_path}/ck")
    state = _state(200_000, 2.0)
    mgr.save_async(2, state)
    state["w"].fill_(9.0)  # training goes on: the staged copy must not change
    assert mgr.pending_step == 2
    info = mgr.wait()
    assert info is not None and info.step == 2 and mgr.pending_step is None
    assert mgr.latest_valid_step() == 2
    out = _state(200_000, 0.0)
    mgr.load(2, out)
    assert torch.equal(out["w"], torch.full((200_000,), 2.0))


def _odd_tensors() -> dict:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "f32": torch.randn(3, 5),
        "bf16": torch.randn(7).to(torch.bfloat16),
        "i64": torch.arange(-3, 9),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "transposed": base.t(),  # not contiguous
        "slice": base[1:3],  # a view into a larger storage
        "nested": {"x": torch.ones(2, 2, dtype=torch.float16), "n": 7, "s": "text"},
    }


def test_raw_tensor_entries_round_trip_every_dtype_and_layout(tmp_path):
    mgr = CheckpointManager(f"file://{tmp_path}/ck")
    saved = _odd_tensors()
    mgr.save(1, saved)
    reader = RawTensorFsspecReader(mgr.step_uri(1))
    infos = reader.read_metadata().storage_data
    tagged = {idx.fqn for idx, info in infos.items() if info.transform_descriptors == [RAW_TENSOR_FORMAT]}
    assert {"f32", "bf16", "transposed", "slice", "nested.x"} <= tagged

    into = {k: v for k, v in _odd_tensors().items()}
    for key in ("f32", "bf16", "i64", "bool", "scalar", "transposed", "slice"):
        into[key] = torch.zeros_like(saved[key])
    into["nested"] = {"x": torch.zeros(2, 2, dtype=torch.float16), "n": 0, "s": ""}
    mgr.load(1, into)
    assert diff_states(into, saved) == []
    assert diff_states(mgr.load_all(1), saved) == []  # no template: shapes from the metadata


def test_small_entries_written_together_land_at_their_own_offsets(tmp_path):
    # Hundreds of small entries (more than the 2 MiB after which they are flushed), entries at the
    # size limit, large ones; in the planned save and in the one reusing its plan.
    g = torch.Generator().manual_seed(0)
    state = {
        "tiny": {f"t{i}": torch.randn(3, generator=g) for i in range(300)},
        "small": {f"s{i}": torch.randn(2500, generator=g) for i in range(400)},  # 10 KB each: 4 MB
        "big": torch.randn(700_000, generator=g),
        "edge": {
            "below": torch.randn(16 * 1024 - 1, generator=g),
            "at": torch.randn(16 * 1024, generator=g),  # 64 KiB: written on its own
            "bf16": torch.randn(33, generator=g).to(torch.bfloat16),
        },
        "big2": torch.randn(300_000, generator=g),
        "meta": {"step": 1, "note": "x" * 100},
    }
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    mgr.save(1, state)
    mgr.save(2, state)  # the first save's plan reused
    flat = {}

    def collect(obj, prefix):
        for k, v in obj.items():
            if isinstance(v, dict):
                collect(v, f"{prefix}{k}.")
            elif isinstance(v, torch.Tensor):
                flat[f"{prefix}{k}"] = v

    collect(state, "")
    for step in (1, 2):
        assert mgr.verify(step)
        assert diff_states(mgr.load_all(step), state) == []
        folder = storage.filesystem(mgr.step_uri(step))[1]
        infos = RawTensorFsspecReader(mgr.step_uri(step)).read_metadata().storage_data
        for index, info in infos.items():
            if index.fqn in flat:
                with open(os.path.join(folder, info.relative_path), "rb") as f:
                    f.seek(info.offset)
                    data = f.read(info.length)
                expected = flat[index.fqn].contiguous().view(torch.uint8).numpy().tobytes()
                assert data == expected, (step, index.fqn)


def test_non_tensor_entries_are_pickled_alike_in_every_writer_thread(tmp_path):
    import io

    import torch.utils.serialization.config as serialization_config

    values = {f"v{i}": {"lr": 0.1 * i, "name": f"group {i}", "betas": (0.9, 0.99)} for i in range(8)}
    state = {"a": torch.randn(1000), "b": torch.randn(1000), **values}
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10, thread_count=2)
    for step in (1, 2):  # planned, then the plan reused
        mgr.save(step, state)
        folder = storage.filesystem(mgr.step_uri(step))[1]
        infos = RawTensorFsspecReader(mgr.step_uri(step)).read_metadata().storage_data
        files = set()
        for index, info in infos.items():
            if info.transform_descriptors is not None:
                continue
            files.add(info.relative_path)
            group, key = index.fqn.split(".")
            with open(os.path.join(folder, info.relative_path), "rb") as f:
                f.seek(info.offset)
                data = f.read(info.length)
            expected = io.BytesIO()
            with serialization_config.patch({"save.compute_crc32": False}):  # the crc32c covers them
                torch.save(values[group][key], expected)
            assert data == expected.getvalue(), (step, index.fqn, info.relative_path)
        assert len(files) == 2, files  # in the files of both writer threads


def test_checkpoint_in_dcp_torch_save_format_still_loads(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    mgr = CheckpointManager(f"file://{tmp_path}/ck")
    saved = _odd_tensors()
    dcp.save(saved, storage_writer=FsspecWriter(mgr.step_uri(3), sync_files=False), no_dist=True)
    assert diff_states(mgr.load_all(3), saved) == []


def _metadata_as_dcp_reads_it(uri: str):
    import pickle

    with open(storage.join(uri, ".metadata").removeprefix("file://"), "rb") as f:
        return pickle.load(f)  # what FileSystemReader.read_metadata does


def test_every_save_loads_its_own_values_and_metadata_reads_as_dcps(tmp_path):
    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=10)
    saves = {
        1: {"w": torch.full((50_000,), 1.0), "v": torch.arange(7), "meta": {"step": 1}},
        # Same structure, other values; the pickled entry grows (tensor offsets must not move).
        2: {"w": torch.full((50_000,), 2.0), "v": torch.arange(7) * 2, "meta": {"step": 10**30}},
        # New shape and a new key.
        3: {"w": torch.full((60_000,), 3.0), "v": torch.arange(7), "meta": {"step": 3}, "x": torch.ones(2)},
    }
    for step, state in saves.items():
        mgr.save(step, state)
    for step, state in saves.items():
        assert diff_states(mgr.load_all(step), state) == [], step
        metadata = _metadata_as_dcp_reads_it(mgr.step_uri(step))
        assert type(metadata.state_dict_metadata) is dict and type(metadata.storage_data) is dict
        assert (
            set(metadata.state_dict_metadata)
            == set(metadata.planner_data)
            == {k if not isinstance(v, dict) else f"{k}.step" for k, v in state.items()}
        )
        # No folder name in it: a checkpoint copied to another bucket would name its source.
        assert metadata.storage_meta is None
        assert RawTensorFsspecReader(mgr.step_uri(step)).read_metadata().storage_meta is not None


def test_pipelined_async_save_snapshots_the_state_once_staged(tmp_path):
    mgr = CheckpointManager(f"file://{tmp_path}/ck")
    state = _state(2_000_000, 2.0)
    mgr.save_async(2, state, pipelined=True)  # returns before the staging copy is done
    mgr.wait_staged()  # what the trainer does before the optimizer step
    state["w"].fill_(9.0)
    info = mgr.wait()
    assert info is not None and info.step == 2
    out = _state(2_000_000, 0.0)
    mgr.load(mgr.latest_valid_step(), out)
    assert torch.equal(out["w"], torch.full((2_000_000,), 2.0))


def test_failed_async_save_raises_from_wait_and_commits_nothing(tmp_path):
    (tmp_path / "ck").write_text("a file where the checkpoint folder should be")
    mgr = CheckpointManager(f"file://{tmp_path}/ck")
    mgr.save_async(1, _state(1000, 1.0), pipelined=True)
    mgr.wait_staged()  # never hangs on a failed save
    with pytest.raises(CheckpointException, match="Not a directory"):
        mgr.wait()
    assert mgr.pending_step is None


_WRITER = """
import sys, torch
from sailor_tasks.train.checkpoint.dcp import CheckpointManager
mgr = CheckpointManager(sys.argv[1])
mgr.save(1, {"w": torch.full((1000,), 1.0)})
print("saved-1", flush=True)
mgr.save(2, {"w": torch.full((60_000_000,), 2.0)})  # 240 MB: long enough to be killed mid-write
print("saved-2", flush=True)
"""


def test_kill_9_during_a_checkpoint_write_leaves_the_previous_one_loadable(tmp_path):
    root = f"file://{tmp_path}/ck"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, root], stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    assert proc.stdout.readline().strip() == "saved-1"
    step2 = tmp_path / "ck" / "step-00000002"
    deadline = time.monotonic() + 60
    while not (step2.exists() and any(step2.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)  # mid-write: the data file exists, the marker does not
    proc.wait()
    assert step2.exists() and not (step2 / MARKER).exists()
    mgr = CheckpointManager(root)
    assert mgr.latest_valid_step() == 1
    out = {"w": torch.zeros(1000)}
    mgr.load(1, out)
    assert torch.equal(out["w"], torch.full((1000,), 1.0))


_FAILING_WRITER = """
import resource, sys, torch
from sailor_tasks.train.checkpoint.dcp import CheckpointManager
mgr = CheckpointManager(sys.argv[1], recycle=False)
mgr._abandon = lambda step: None  # as if killed before it cleaned up: the failed save's folder stays
state = lambda v: {"small": torch.full((1 << 16,), v), "big": torch.full((2 << 20,), v)}  # 256 KB + 8 MB
mgr.save(1, state(1.0))
mgr.wait()
resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    mgr.save(2, state(2.0))  # the plan of save 1, reused: the big file fails past 4 MiB
except OSError as exc:
    print("save-2-failed", exc.errno, flush=True)
"""


def test_a_save_that_failed_mid_write_is_never_sealed_and_the_run_resumes_from_the_previous(tmp_path):
    """The writer's ``.metadata`` may be on storage before its last data file is: a failed save
    leaves a folder that looks DCP-complete. The end of the attempt (``seal``) must not commit it."""
    import errno

    root = f"file://{tmp_path}/ck"
    out = subprocess.run(
        [sys.executable, "-c", _FAILING_WRITER, root], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert f"save-2-failed {errno.EFBIG}" in out, out
    step2 = tmp_path / "ck" / "step-00000002"
    assert (step2 / ".metadata").exists() and not (step2 / MARKER).exists()
    mgr = CheckpointManager(root, attempt=1)
    assert mgr.dcp_complete(2)  # it looks finished to DCP...
    assert mgr.seal() == []  # ...but SAILOR's writer commits its own saves: it is left alone
    assert mgr.committed_steps() == [1] and mgr.latest_valid_step() == 1
    loaded = {"small": torch.zeros(1 << 16), "big": torch.zeros(2 << 20)}
    mgr.load(1, loaded)
    assert torch.equal(loaded["big"], torch.full((2 << 20,), 1.0))


def _data_files(folder) -> dict[str, int]:
    """Data files of a checkpoint folder (or of the recycle folder): name -> inode."""
    return {p.name: p.stat().st_ino for p in folder.iterdir() if p.suffix == ".distcp"}


def _recycled(root) -> list[str]:
    folder = root / RECYCLE_DIR
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _assert_marker_matches_files(mgr: CheckpointManager, step: int) -> None:
    marker = storage.read_json(storage.join(mgr.step_uri(step), MARKER))
    for name, meta in marker["files"].items():
        assert crc32c_of(storage.join(mgr.step_uri(step), name)) == (meta["crc32c"], meta["size"]), name
    assert mgr.verify(step)


def _several_tensors(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "w": torch.randn(300_000, generator=g),
        "b": torch.arange(20_000) * step,
        "h": torch.randn(50, 70, generator=g).to(torch.bfloat16),
        "meta": {"step": step},
    }


def test_local_root_recycles_retired_data_files_into_later_saves(tmp_path):
    root = tmp_path / "ck"
    mgr = CheckpointManager(f"file://{root}", keep_latest_k=2)
    states = {step: _several_tensors(step) for step in range(1, 6)}
    infos, inodes = {}, {}
    for step in (1, 2, 3):
        infos[step] = mgr.save(step, states[step])
        inodes[step] = _data_files(root / f"step-{step:08d}")
    assert len(inodes[1]) == 2  # two writer threads, two data files
    mgr.wait()
    assert [i.recycled_files for i in infos.values()] == [0, 0, 0]  # nothing retired before step 3
    assert mgr.committed_steps() == [2, 3]
    # Step 1 retired: its folder is gone, its data files (same inodes) wait in the recycle folder.
    assert not (root / "step-00000001").exists()
    assert _recycled(root) == sorted(f"step-00000001.{n}" for n in inodes[1])
    assert set(_data_files(root / RECYCLE_DIR).values()) == set(inodes[1].values())

    info = mgr.save(4, states[4])  # written into step 1's files
    assert info.recycled_files == 2
    assert _data_files(root / "step-00000004") == inodes[1]  # same names, same inodes
    mgr.wait()
    assert _recycled(root) == sorted(f"step-00000002.{n}" for n in inodes[2])

    mgr.save_async(5, states[5])  # the async path recycles too
    assert mgr.wait().recycled_files == 2
    assert set(_data_files(root / "step-00000005").values()) == set(inodes[2].values())
    assert _recycled(root) == sorted(f"step-00000003.{n}" for n in inodes[3])

    assert mgr.committed_steps() == [4, 5] and mgr.latest_valid_step() == 5
    for step in (4, 5):
        _assert_marker_matches_files(mgr, step)
        assert diff_states(mgr.load_all(step), states[step]) == [], step
        out = _several_tensors(0)
        mgr.load(step, out)
        assert diff_states(out, states[step]) == [], step
    # A fresh manager (a restarted trainer) uses what the previous one recycled.
    again = CheckpointManager(f"file://{root}", keep_latest_k=2)
    assert again.save(6, states[1]).recycled_files == 2
    _assert_marker_matches_files(again, 6)
    assert diff_states(again.load_all(6), states[1]) == []


def test_recycle_false_writes_new_files_and_deletes_retired_ones(tmp_path):
    root = tmp_path / "ck"
    mgr = CheckpointManager(f"file://{root}", keep_latest_k=2, recycle=False)
    states = {step: _several_tensors(step) for step in range(1, 5)}
    for step in range(1, 5):
        assert mgr.save(step, states[step]).recycled_files == 0
    mgr.wait()
    assert not (root / RECYCLE_DIR).exists()
    assert mgr.committed_steps() == [3, 4] and sorted(p.name for p in root.iterdir()) == [
        "step-00000003",
        "step-00000004",
    ]
    assert diff_states(mgr.load_all(4), states[4]) == []


def test_recycled_files_are_truncated_or_extended_to_what_was_written(tmp_path):
    root = tmp_path / "ck"
    mgr = CheckpointManager(f"file://{root}", keep_latest_k=1)
    big = {s: {"w": torch.randn(500_000, generator=torch.Generator().manual_seed(s))} for s in (1, 2, 4)}
    small = {"w": torch.arange(1_000, dtype=torch.float32)}
    mgr.save(1, big[1])
    mgr.save(2, big[2])
    mgr.wait()
    (recycled,) = (root / RECYCLE_DIR).iterdir()
    big_size = recycled.stat().st_size

    assert mgr.save(3, small).recycled_files == 1  # 4 KB into step 1's 2 MB file
    (data,) = (root / "step-00000003").glob("*.distcp")
    assert data.stat().st_size == 4_000 < big_size
    _assert_marker_matches_files(mgr, 3)
    assert diff_states(mgr.load_all(3), small) == []

    assert mgr.save(4, big[4]).recycled_files == 1  # 2 MB into step 2's 2 MB file
    _assert_marker_matches_files(mgr, 4)
    assert diff_states(mgr.load_all(4), big[4]) == []
    assert mgr.save(5, big[1]).recycled_files == 1  # 2 MB into step 3's 4 KB file: extended
    (data,) = (root / "step-00000005").glob("*.distcp")
    assert data.stat().st_size == big_size
    _assert_marker_matches_files(mgr, 5)
    assert diff_states(mgr.load_all(5), big[1]) == []


def test_recycle_folder_keeps_at_most_one_checkpoints_data_files(tmp_path):
    root = tmp_path / "ck"
    mgr = CheckpointManager(f"file://{root}", keep_latest_k=2, thread_count=4)
    mgr.save(1, _several_tensors(1))
    n = len(_data_files(root / "step-00000001"))
    assert n >= 3  # one data file per writer thread with something to write
    for step in range(2, 8):
        info = mgr.save(step, _several_tensors(step))
        mgr.wait()
        assert len(_data_files(root / f"step-{step:08d}")) == n
        assert info.recycled_files == (n if step >= 4 else 0)
        assert len(_recycled(root)) == (n if step >= 3 else 0)
    assert _recycled(root) == [f"step-00000005.__0_{i}.distcp" for i in range(n)]

    # Several checkpoints retired at once (K lowered on a restart), and the newest checkpoint has
    # a single data file: the recycle folder keeps one file, the most recently recycled.
    root = tmp_path / "ck2"
    many = CheckpointManager(f"file://{root}", keep_latest_k=10, thread_count=4)
    for step in range(1, 6):
        many.save(step, _several_tensors(step))
    many.wait()
    assert _recycled(root) == []
    one = CheckpointManager(f"file://{root}", keep_latest_k=2, thread_count=1)
    assert one.save(6, {"w": torch.ones(10)}).recycled_files == 0
    one.wait()
    assert one.committed_steps() == [5, 6]
    assert _recycled(root) == [f"step-00000004.__0_{n - 1}.distcp"]
    assert one.save(7, {"w": torch.ones(10)}).recycled_files == 1
    one.wait()
    assert _recycled(root) == [f"step-00000005.__0_{n - 1}.distcp"]


def test_retention_interrupted_mid_recycle_leaves_no_loadable_partial_checkpoint(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    mgr = CheckpointManager(f"file://{root}", keep_latest_k=10)
    for step in (1, 2, 3):
        mgr.save(step, _several_tensors(step))
    mgr.wait()
    mgr.keep_latest_k = 2

    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(os, "rename", killed)  # dies at the first move into the recycle folder
    with pytest.raises(RuntimeError, match="killed"):
        mgr.retain()
    monkeypatch.undo()
    # The marker went first: step 1 can no longer be loaded, though its data files are still there.
    assert (root / "step-00000001").exists() and not (root / "step-00000001" / MARKER).exists()
    assert mgr.committed_steps() == [2, 3] and mgr.latest_valid_step() == 3

    mgr.save(4, _several_tensors(4))
    mgr.wait()
    assert not (root / "step-00000001").exists()  # an uncommitted leftover: deleted
    assert _recycled(root) == sorted(f"step-00000002.{n}" for n in _data_files(root / "step-00000003"))
    assert mgr.committed_steps() == [3, 4]


@pytest.mark.gcs
def test_object_store_roots_delete_retired_checkpoints_without_recycling(gcs):
    root = f"{gcs()}/ckpt"
    mgr = CheckpointManager(root, keep_latest_k=2)
    assert mgr.recycle_dir is None and mgr._writer(1)._recycle_dir is None
    infos = [mgr.save(step, _several_tensors(step)) for step in (1, 2, 3, 4)]
    mgr.wait()
    assert [i.recycled_files for i in infos] == [0, 0, 0, 0]
    assert storage.listdir(root) == ["step-00000003", "step-00000004"]
    assert mgr.latest_valid_step() == 4
    assert diff_states(mgr.load_all(4), _several_tensors(4)) == []


_RECYCLING_WRITER = """
import os, sys, torch
from sailor_tasks.train.checkpoint.dcp import CheckpointManager
mgr = CheckpointManager(sys.argv[1], keep_latest_k=2)
for step in (1, 2, 3):
    mgr.save(step, {"w": torch.full((10_000_000,), float(step))})  # 40 MB each
mgr.wait()  # step 1 is retired: its data file is in the recycle folder
print("saved-3", flush=True)
sys.stdin.readline()
mgr.save(4, {"w": torch.full((60_000_000,), 4.0)})  # 240 MB into step 1's file: long enough to be killed
print("saved-4", flush=True)
"""


def test_kill_9_while_writing_into_a_recycled_file_leaves_the_previous_ones_loadable(tmp_path):
    root = tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, "-c", _RECYCLING_WRITER, f"file://{root}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    assert proc.stdout.readline().strip() == "saved-3"
    (recycled,) = (root / RECYCLE_DIR).iterdir()
    inode = recycled.stat().st_ino
    proc.stdin.write("go\n")
    proc.stdin.flush()
    step4 = root / "step-00000004"
    deadline = time.monotonic() + 60
    while not (step4.exists() and any(p.suffix == ".distcp" for p in step4.iterdir())):
        assert time.monotonic() < deadline
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)  # mid-write into the recycled file: no marker yet
    proc.wait()
    assert not (step4 / MARKER).exists()
    assert set(_data_files(step4).values()) == {inode} and _recycled(root) == []

    mgr = CheckpointManager(f"file://{root}", keep_latest_k=2)
    assert mgr.committed_steps() == [2, 3] and mgr.latest_valid_step() == 3
    for step in (2, 3):
        _assert_marker_matches_files(mgr, step)
        out = {"w": torch.zeros(10_000_000)}
        mgr.load(step, out)
        assert torch.equal(out["w"], torch.full((10_000_000,), float(step)))
    # Training goes on: the killed save's leftover is deleted, step 2 is recycled.
    mgr.save(5, {"w": torch.full((1000,), 5.0)})
    mgr.wait()
    assert not step4.exists() and mgr.committed_steps() == [3, 5]
    assert _recycled(root) == ["step-00000002.__0_0.distcp"]


@pytest.fixture
def data_uri(tmp_path):
    from sailor_tasks.data.demo import write_demo_dataset

    uri = f"file://{tmp_path}/data"
    write_demo_dataset(uri, num_shards=1, shard_bytes=40_000)
    return uri


def test_async_checkpointing_trains_bit_identically_to_sync(data_uri, tmp_path):
    def run(name: str, async_checkpoint: bool) -> dict:
        cfg = TrainConfig(
            run_id="r",
            model="tiny_gpt",
            data_uri=data_uri,
            output_uri=f"file://{tmp_path}/{name}",
            total_steps=9,
            checkpoint_every_steps=2,
            batch_size=4,
            async_checkpoint=async_checkpoint,
        )
        trainer = Trainer(cfg)
        trainer.train()
        mgr = CheckpointManager(cfg.checkpoint_uri)
        assert mgr.committed_steps() == [8, 9]
        return trainer.model.state_dict(), mgr.load_all(8)

    (sync, sync_ckpt), (asyn, async_ckpt) = run("sync", False), run("async", True)
    for name, tensor in sync.items():
        assert torch.equal(tensor, asyn[name]), name
    # The pipelined snapshot of step 8 (copied while step 9's forward/backward ran) is step 8's
    # state bit for bit: model, optimizer, LR schedule, RNG, step.
    assert diff_states(async_ckpt, sync_ckpt) == []


def test_copied_checkpoint_loads_back_in_the_new_region(tmp_path):
    src = CheckpointManager(f"file://{tmp_path}/r1")
    src.save(3, _state(1000, 3.0))
    src.save(5, _odd_tensors())
    assert src.copy_latest_to(f"file://{tmp_path}/r2") == 5
    dst = CheckpointManager(f"file://{tmp_path}/r2")
    assert dst.latest_valid_step() == 5
    assert diff_states(dst.load_all(5), src.load_all(5)) == []
    assert src.copy_latest_to(f"file://{tmp_path}/r2") == 5  # idempotent on retry


def test_a_save_that_failed_in_one_writer_thread_returns_only_when_the_others_stopped(tmp_path, monkeypatch):
    """With 3 writer threads, one pool thread's file fails while another still writes: the save
    raises only once no thread writes into the step folder any more (a later save of the step
    could otherwise be overwritten by it)."""
    from sailor_tasks.train.checkpoint import dcp

    mgr = CheckpointManager(f"file://{tmp_path}/ck", thread_count=3)
    state = {k: torch.ones(300_000) for k in "abc"}
    mgr.save(1, state)
    real, finished = dcp.ChecksummingFsspecWriter._write_file, threading.Event()

    def write_file(self, name, *args, **kwargs):
        if name.endswith("_1.distcp"):
            raise OSError(28, "No space left on device")
        if name.endswith("_2.distcp"):
            time.sleep(0.5)
            out = real(self, name, *args, **kwargs)
            finished.set()
            return out
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(dcp.ChecksummingFsspecWriter, "_write_file", write_file)
    with pytest.raises(OSError, match="No space left"):
        mgr.save(2, state)
    assert finished.is_set()


def test_a_failed_save_gives_back_the_recycled_files_and_the_space_it_took(tmp_path, monkeypatch):
    """A save that fails mid-write (the disk full) is no checkpoint, but took the recycled files
    and holds a checkpoint's worth of space: its data files go back to the recycle folder and its
    folder goes, so the next save (often the notice's) reuses them instead of needing new space."""
    from sailor_tasks.train.checkpoint import dcp

    mgr = CheckpointManager(f"file://{tmp_path}/ck", keep_latest_k=1)
    for step in (1, 2):
        mgr.save(step, _state(200_000, float(step)))
        mgr.wait()
    recycle = tmp_path / "ck" / RECYCLE_DIR
    before = sorted(os.listdir(recycle))
    assert before  # step 1's data files, retired
    real = dcp.ChecksummingFsspecWriter._write_file

    def full_disk(self, name, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dcp.ChecksummingFsspecWriter, "_write_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        mgr.save(3, _state(200_000, 3.0))
    assert not (tmp_path / "ck" / "step-00000003").exists()
    assert len(os.listdir(recycle)) == len(before)  # the files it took are back
    monkeypatch.setattr(dcp.ChecksummingFsspecWriter, "_write_file", real)
    info = mgr.save(4, _state(200_000, 4.0))
    assert info.recycled_files == len(before) and mgr.latest_valid_step() == 4
    assert torch.equal(mgr.load_all(4)["w"], torch.full((200_000,), 4.0))


def test_an_empty_state_saved_twice_is_a_checkpoint_that_loads(tmp_path):
    """The second save reuses the first's plan, which has no data file: its .metadata was never
    written, and a checkpoint that verified could not load."""
    mgr = CheckpointManager(f"file://{tmp_path}/ck")
    for step in (1, 2):
        mgr.save(step, {})
    for step in (1, 2):  # as DCP's own save writes it for the first
        assert (tmp_path / "ck" / f"step-0000000{step}" / ".metadata").exists()
    assert mgr.latest_valid_step() == 2
    mgr.load(2, {})  # reads its metadata (it had none: DCP's "metadata is None")


def test_a_save_that_fails_before_its_writer_exists_leaves_the_last_checkpoint_alone(tmp_path, monkeypatch):
    """Its failure is abandoned with the files of its own writer only: never those of the save
    before it (a committed checkpoint, whose files would have gone to the recycle folder)."""
    from sailor_tasks.train.checkpoint import dcp

    mgr = CheckpointManager(f"file://{tmp_path}/ck")
    mgr.save(1, _state(1000, 1.0))
    real_remove = dcp.storage.remove

    def remove(uri, *args, **kwargs):
        if uri.endswith("step-00000002"):
            raise OSError("permission denied")
        return real_remove(uri, *args, **kwargs)

    monkeypatch.setattr(dcp.storage, "remove", remove)
    with pytest.raises(OSError, match="permission denied"):
        mgr.save(2, _state(1000, 2.0))
    monkeypatch.setattr(dcp.storage, "remove", real_remove)
    assert CheckpointManager(f"file://{tmp_path}/ck").latest_valid_step() == 1
    assert torch.equal(mgr.load_all(1)["w"], torch.full((1000,), 1.0))


def test_an_async_save_across_ranks_without_a_group_of_its_own_is_refused(tmp_path):
    """Its collectives would run on the default group beside the training's and pair up with
    them (a hang): the save is refused, saying how to make the group, and nothing is written."""
    mgr = CheckpointManager(f"file://{tmp_path}/ckpt", distributed=True, process_group=None)
    with pytest.raises(RuntimeError, match=r"call run.init_distributed\(\) on every rank"):
        mgr.save_async(1, {"w": torch.zeros(4)})
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())


def test_a_save_across_ranks_that_failed_on_one_rank_is_a_checkpoint_failure_like_any_other():
    """DCP raises ``CheckpointException`` (a ``BaseException``) on every rank when one rank's part
    failed: checkpoint work that may fail (a background save) reports it as failed, as on one
    rank, rather than letting it end the training."""
    from sailor_tasks.errors import StaleAttemptError
    from sailor_tasks.train.checkpoint.dcp import unless_fenced

    def failed_on_rank_1():
        raise CheckpointException("save", {1: OSError(28, "No space left on device")})

    assert unless_fenced(failed_on_rank_1, "async checkpoint failed") == (None, False)

    def fenced():
        raise StaleAttemptError("file:///ckpt", 1, 2)

    with pytest.raises(StaleAttemptError):
        unless_fenced(fenced, "async checkpoint failed")
