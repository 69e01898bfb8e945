"""Process groups time out after ``SAILOR_COLLECTIVE_TIMEOUT_S`` (set on GKE): the default group
and every group SAILOR makes beside it (torch gives a new group its own 30-minute default)."""

from __future__ import annotations

import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sailor_tasks.train.device import COLLECTIVE_TIMEOUT_ENV, collective_timeout


def test_the_timeout_is_read_from_the_environment_or_left_to_torch():
    assert collective_timeout({COLLECTIVE_TIMEOUT_ENV: "300"}) == datetime.timedelta(seconds=300)
    assert collective_timeout({}) is None and collective_timeout({COLLECTIVE_TIMEOUT_ENV: ""}) is None


@pytest.mark.parametrize("raw", ["0", "-5", "5m", "nan", "inf", "1e400"])  # inf: OverflowError in timedelta
def test_a_bad_timeout_is_named(raw):
    with pytest.raises(
        ValueError, match=f"SAILOR_COLLECTIVE_TIMEOUT_S='{raw}' is not a positive, finite number"
    ):
        collective_timeout({COLLECTIVE_TIMEOUT_ENV: raw})


def test_a_bad_timeout_fails_the_run_helper_naming_it():
    from sailor_tasks.runtime.run import Run

    env = {
        "SAILOR_RUN_ID": "r", "SAILOR_ATTEMPT": "1", "SAILOR_DATA_DIR": "file:///x",
        "SAILOR_CHECKPOINT_DIR": "file:///y", "SAILOR_TOTAL_STEPS": "10", "SAILOR_SEED": "0",
    }  # fmt: skip
    assert Run.from_env({**env, COLLECTIVE_TIMEOUT_ENV: "300"}, handle_sigterm=False).collective_timeout == (
        datetime.timedelta(seconds=300)
    )
    with pytest.raises(ValueError, match="SAILOR_COLLECTIVE_TIMEOUT_S='soon'"):
        Run.from_env({**env, COLLECTIVE_TIMEOUT_ENV: "soon"}, handle_sigterm=False)


def test_gke_pods_set_it():
    from sailor_tasks.backends import gke

    assert gke.COLLECTIVE_TIMEOUT_S > 0 and COLLECTIVE_TIMEOUT_ENV == "SAILOR_COLLECTIVE_TIMEOUT_S"


def _worker(rank: int, port: int, out: str) -> None:
    """Two ranks join through ``Run.init_distributed`` with a 2 s timeout; rank 0 then all-reduces
    on the async saves' group, which rank 1 never joins (a peer that died): rank 0 must fail
    within the timeout, not wait on its peer."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", SAILOR_RUN_ID="r", SAILOR_ATTEMPT="1",
        SAILOR_DATA_DIR="file:///x", SAILOR_CHECKPOINT_DIR=f"file://{out}/ckpt", SAILOR_TOTAL_STEPS="10",
        SAILOR_SEED="0", SAILOR_COLLECTIVE_TIMEOUT_S="2",
    )  # fmt: skip
    from sailor_tasks.runtime.run import Run

    run = Run.from_env(handle_sigterm=False)
    run.init_distributed()
    done = os.path.join(out, "rank-0")
    if rank == 0:
        started = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=run._ckpt_group)
            outcome = "completed"
        except Exception as exc:  # gloo's timeout error
            outcome = f"failed after {time.monotonic() - started:.1f} s: {type(exc).__name__}"
        with open(done + ".tmp", "w") as f:
            f.write(outcome)
        os.replace(done + ".tmp", done)
    else:
        deadline = time.monotonic() + 90  # rank 0's result, or a hang shown as a slow failure
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.1)
    os._exit(0)


@pytest.mark.slow
def test_the_async_saves_group_times_out_after_the_contract_timeout(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=2)
    outcome = (tmp_path / "rank-0").read_text()
    assert outcome.startswith("failed after"), outcome
    assert float(outcome.split()[2]) < 30, outcome  # 2 s, not torch's 30 minutes
