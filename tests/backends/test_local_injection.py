"""The local backend really preempts torchrun: a trace-driven notice reaches the workers, which
checkpoint and exit 75 themselves; a second launch resumes from that checkpoint."""

from __future__ import annotations

import io
import json
import signal

import pytest

from sailor_tasks import storage
from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.backends.local import FailureSummary, LocalBackend, trainer_exit_code
from sailor_tasks.errors import PREEMPTED_EXIT_CODE
from sailor_tasks.model import Placement
from sailor_tasks.train.checkpoint.dcp import CheckpointManager
from sailor_tasks.train.config import TrainConfig

# What torchrun 2.x prints when rank 0 exits 75 first and rank 1 is still exiting when torchrun
# stops it (its own exit status is then 1).
TORCHRUN_FAILURE_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
sailor_tasks.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_15:30:33
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 16117)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 16117
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_15:30:33
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 75 (pid: 16116)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


class _Finished:
    """A finished torchrun as ``LocalBackend._stream`` sees it: its output, line by line."""

    def __init__(self, output: str):
        self.stdout = io.StringIO(output)


def test_trainer_exit_code_is_the_first_failed_workers_from_torchruns_summary():
    failures = FailureSummary()
    worker_log = "2026-11-23 15:30:30,1 [rank 0] sailor_tasks.train.trainer: preemption notice: ...\n"
    LocalBackend._stream(_Finished(worker_log + TORCHRUN_FAILURE_SUMMARY), failures)
    assert failures.exit_codes == {0: 75, 1: -signal.SIGTERM} and failures.root_cause_rank == 0
    assert trainer_exit_code(1, failures) == PREEMPTED_EXIT_CODE
    crashed = FailureSummary()
    LocalBackend._stream(_Finished(TORCHRUN_FAILURE_SUMMARY.replace(": 75 (pid", ": 1 (pid")), crashed)
    assert trainer_exit_code(1, crashed) == 1
    assert trainer_exit_code(-signal.SIGKILL, FailureSummary()) is None  # killed: no summary
    assert trainer_exit_code(0, FailureSummary()) == 0


@pytest.mark.slow
def test_trace_notice_checkpoints_then_the_next_launch_resumes(settings, tmp_path, demo_dataset):
    from sailor_tasks.data.copier import copy_dataset

    data_uri = f"file://{tmp_path}/data"
    copy_dataset(storage.resolve(demo_dataset, settings), data_uri)
    out = f"file://{tmp_path}/run"
    config = TrainConfig(
        run_id="r",
        model="tiny_gpt",
        data_uri=data_uri,
        output_uri=out,
        total_steps=100_000,  # far more than fits before the trace's first loss of capacity
        checkpoint_every_steps=100_000,
        batch_size=2,
    )
    config_uri = storage.join(out, "train_config.json")
    storage.write_bytes(config_uri, config.to_json().encode())
    trace = tmp_path / "trace.json"
    # 20 s available (torchrun starts well within it), then one preemption 20 s after the first launch.
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 20}, "data": [0, 1]}))
    placement = Placement("r", "gcp", "us-x1", "us-x1-a", "L4", 1, 1, 1, "spot", "g2", 0.3)
    backend = LocalBackend(settings)
    inject = {"trace_uri": str(trace), "notice_s": 20.0}

    rc = backend.train(TrainLaunch("r", "r", config_uri, 2, placement, inject, attempt=1))
    assert rc == PREEMPTED_EXIT_CODE  # what train() returns for any injected preemption
    report = storage.read_json(storage.join(out, "launch.json"))
    assert report["preemption"]["noticed"] and report["preemption"]["key"] == "trace@20s"
    # The trainer itself acted on the notice: a worker saved and exited 75 within the notice window
    # (torchrun's own status is then 1, and it stops the other worker, which may still be exiting:
    # 75 or -15). A trainer that ignored the notice is killed at the window's end: no summary.
    assert report["exit_code"] == PREEMPTED_EXIT_CODE and report["rc"] == 1
    assert PREEMPTED_EXIT_CODE in report["worker_exit_codes"].values()
    assert set(report["worker_exit_codes"].values()) <= {PREEMPTED_EXIT_CODE, -signal.SIGTERM}
    result = storage.read_json(config.result_uri)
    assert result["status"] == "preempted" and result["step"] > 0
    saved = CheckpointManager(config.checkpoint_uri).latest_valid_step()
    assert saved == result["step"]  # the notice was used: nothing lost

    # The trace event fired once; a second launch (after it) is not preempted again by it, and
    # resumes from the saved step. Stop it quickly with a step-based kill.
    inject2 = {**inject, "kill_steps": [saved + 5]}
    rc2 = backend.train(TrainLaunch("r", "r", config_uri, 2, placement, inject2, attempt=2))
    report2 = storage.read_json(storage.join(out, "launch.json"))
    assert rc2 == PREEMPTED_EXIT_CODE and report2["preemption"]["key"] == f"kill@step{saved + 5}"
    # killed without notice: torchrun died of SIGKILL, the trainer never exited on its own
    assert report2["rc"] == -signal.SIGKILL and report2["exit_code"] is None
    assert report2["resumed_from"] == saved and report2["first_step_at"] is not None
    assert backend.teardown("r") is False  # no cluster record; progress/injection files removed


def test_a_noticed_preemption_waits_for_the_trainer_a_wrapper_script_started(tmp_path):
    """The run's command is a shell script that starts the trainer without ``exec``: on the
    notice the script dies at once and torchrun ends, while the trainer still saves. The
    preemption waits for the trainer (within the notice window) rather than ending the attempt
    under it, and leaves no process behind."""
    import contextlib
    import subprocess
    import sys
    import time

    import psutil

    from sailor_tasks.backends.preemption import PreemptionEvent

    started, saved = tmp_path / "started", tmp_path / "saved"
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        "import signal, sys, time\n"
        "stop = []\n"
        "signal.signal(signal.SIGTERM, lambda *a: stop.append(1))\n"
        f"open({str(started)!r}, 'w').close()\n"
        "while not stop:\n"
        "    time.sleep(0.05)\n"
        "time.sleep(2)  # saving its checkpoint\n"
        f"open({str(saved)!r}, 'w').close()\n"
        "sys.exit(75)\n"
    )
    wrapper = tmp_path / "train.sh"
    wrapper.write_text(f"#!/bin/sh\n{sys.executable} {trainer}\n")  # no exec: the trainer is its child
    wrapper.chmod(0o755)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "--no-python"]
    cmd += [sys.executable, "-m", "sailor_tasks.runtime.die_with_agent", str(wrapper)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    training: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), "the trainer did not start"
        training = [
            p for p in psutil.Process(proc.pid).children(recursive=True) if str(trainer) in p.cmdline()
        ]
        event = PreemptionEvent("notice@test", True, step=1)
        LocalBackend._deliver(proc, event, 30.0, str(tmp_path / "notice.json"))
        assert saved.exists()  # the trainer finished saving before the capacity was gone
        assert not [p for p in training if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        for p in training:
            with contextlib.suppress(psutil.Error):
                p.kill()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("launcher", ["module", "module_with_options", "console_script"])
def test_a_worker_started_through_die_with_agent_runs_under_either_torchrun(tmp_path, launcher):
    """``python -m torch.distributed.run`` (SAILOR's backends) and the ``torchrun`` console script
    are both the agent a worker may run under: the worker runs, rather than killing itself."""
    import os
    import subprocess
    import sys

    out = tmp_path / "ran"
    agent = {
        "module": [sys.executable, "-m", "torch.distributed.run"],
        "module_with_options": [sys.executable, "-u", "-X", "faulthandler", "-m", "torch.distributed.run"],
        "console_script": [os.path.join(os.path.dirname(sys.executable), "torchrun")],
    }[launcher]
    cmd = [*agent, "--standalone", "--nproc-per-node=1", "--no-python", sys.executable]
    cmd += ["-m", "sailor_tasks.runtime.die_with_agent", sys.executable, "-c", f"open({str(out)!r}, 'w')"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.exists()


def test_a_worker_given_a_working_directory_runs_there_and_torchrun_does_not(tmp_path):
    """``die_with_agent --cwd DIR`` runs the worker in DIR; torchrun itself starts in the task's
    folder, so a module of DIR named like one of torch's cannot shadow it."""
    import subprocess
    import sys

    workdir = tmp_path / "project"
    (workdir / "torch").mkdir(parents=True)
    (workdir / "torch" / "__init__.py").write_text("raise ImportError('the project folder shadowed torch')\n")
    out = tmp_path / "cwd.txt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "--no-python"]
    cmd += [sys.executable, "-m", "sailor_tasks.runtime.die_with_agent", "--cwd", str(workdir), "--"]
    cmd += [sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(os.getcwd())"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_text() == str(workdir)
