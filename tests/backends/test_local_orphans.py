"""Workers die with their torchrun agent: a SIGKILL of the agent (which cannot stop its workers,
in sessions of their own) leaves no worker running."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.backends.local import LocalBackend, run_processes
from sailor_tasks.model import Placement
from sailor_tasks.settings import Settings
from sailor_tasks.train.config import TrainConfig

HERE = Placement("r", "local", "us-central1", "us-central1-a", "cpu", 2, 1, 2, "spot", "local", 0.0)

WORKER = """\
import os, sys, time
path = os.path.join(sys.argv[1], f"worker-{os.environ['RANK']}.pid")
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(path + ".tmp", path)  # the test reads whole pids only
while True:
    time.sleep(0.1)  # training, as far as anyone can tell
"""


@pytest.fixture
def backend(tmp_path, monkeypatch):
    roots = tmp_path / "code"
    roots.mkdir()
    (roots / "worker.py").write_text(WORKER)
    monkeypatch.setenv("SAILOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SAILOR_COMMAND_ROOTS", str(roots))
    return LocalBackend(Settings.from_env())


def test_sigkill_of_the_agent_leaves_no_worker(backend, tmp_path):
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    config = TrainConfig(
        run_id="orphans",
        model="tiny_gpt",
        data_uri=f"file://{tmp_path}/data",
        output_uri=f"file://{tmp_path}/runs/orphans",
        total_steps=10,
        checkpoint_every_steps=5,
        seed=1,
        attempt=1,
        command=("python", "worker.py", str(pids_dir)),
    )
    launch = TrainLaunch("orphans", "orphans-key", f"file://{tmp_path}/train_config.json", 2, HERE)
    agent = subprocess.Popen(
        backend.command(launch, config),
        env=backend.environment(launch, config),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(pids_dir.glob("worker-*.pid"))) < 2:
            assert agent.poll() is None and time.monotonic() < deadline, "workers did not start"
            time.sleep(0.05)
        workers = [psutil.Process(int(p.read_text())) for p in sorted(pids_dir.glob("worker-*.pid"))]
        assert all(w.ppid() == agent.pid for w in workers)  # the worker's own process, after exec
        assert all(w.pid != os.getpid() and w.is_running() for w in workers)
        assert all(
            w.cmdline()[-2:] == ["worker.py", str(pids_dir)] or w.cmdline()[-1] == str(pids_dir)
            for w in workers
        )
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == [], f"workers outlived their agent: {alive}"
        assert run_processes("orphans-key") == []
    finally:
        for p in run_processes("orphans-key"):
            p.kill()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
