"""Cancelling a local run stops every process it started: torchrun and its workers, which run in
sessions of their own and would outlive a killed task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from sailor_tasks import paths, stages, storage
from sailor_tasks.backends.local import run_processes
from sailor_tasks.errors import RunCancelledError, TrainingInterruptedError
from sailor_tasks.model import run_key
from sailor_tasks.testing.first_hour import alive

pytestmark = pytest.mark.slow

LONG = {
    "job_name": "cancel-me",
    "team": "qa",
    "model": "tiny_gpt",
    "num_workers": 2,
    "total_steps": 1_000_000,
    "checkpoint_every_steps": 50,
    "batch_size": 4,
}


def prepare(ctx, run_id: str, dataset: str, params: dict = LONG):
    request = stages.validate({**params, "dataset_uri": dataset}, run_id, ctx)
    placement = stages.plan(request, run_id, ctx)
    data = stages.place_data(request, placement, run_id, ctx)
    stages.provision(request, placement, run_id, ctx)
    return request, placement, data


def train_in_thread(ctx, run_id: str, prepared) -> tuple[threading.Thread, list]:
    """``stages.train`` of the prepared run, started in a thread; the list gets its result or error."""
    outcome: list = []

    def train() -> None:
        try:
            outcome.append(stages.train(*prepared, run_id, ctx))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=train)
    thread.start()
    return thread, outcome


def wait_for_workers(run_id: str, n: int, timeout_s: float = 120.0) -> list[psutil.Process]:
    """torchrun and its ``n`` workers, once they are all up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs = run_processes(run_key(run_id))
        agents = [p for p in procs if "torch.distributed.run" in " ".join(p.cmdline())]
        if agents and len(agents[0].children(recursive=True)) >= n:
            return [agents[0], *agents[0].children(recursive=True)]
        time.sleep(0.2)
    raise TimeoutError(f"run {run_id}: {n} workers not up after {timeout_s} s")


def test_killing_the_train_task_leaves_no_process_of_the_run(ctx, demo_dataset, airflow_task_state):
    """What Airflow does when a run is marked failed: the task's on_kill, while train runs."""
    from sailor_tasks import gcp_auth
    from sailor_tasks.airflow_glue.operators import SailorTrainOperator

    airflow_task_state("failed")  # marking the run failed marks its running tasks
    run_id = "manual__cancel"
    request, placement, data = prepare(ctx, run_id, demo_dataset)
    thread, outcome = train_in_thread(ctx, run_id, (request, placement, data))
    try:
        tree = wait_for_workers(run_id, 2)
        op = SailorTrainOperator(task_id="train", request=request, placement=placement, data=data)
        op._run_id = run_id  # what execute records
        op.on_kill()
    finally:
        gcp_auth.set_provider(None)
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert alive(tree) == [] and run_processes(run_key(run_id)) == []
    # A cancel, neither a preemption to recover from nor a failure to retry.
    assert isinstance(outcome[0], RunCancelledError), outcome
    (attempt,) = ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "cancelled" and ctx.ledger.preemptions(run_id) == []
    assert ctx.ledger.get_run(run_id)["status"] == "cancelled"
    (folder,) = {a["region"] for a in ctx.ledger.attempts(run_id)}
    assert storage.exists(paths.cancelled_uri(ctx.run_uri(folder, run_id)))  # the run's own record
    stages.teardown(run_id, ctx)
    assert ctx.ledger.get_run(run_id)["status"] == "cancelled" and ctx.ledger.live_reservations() == []
    assert os.listdir(ctx.settings.clusters_dir) == []  # nothing of the cluster left behind


def test_a_train_task_airflow_stops_stops_its_processes_but_not_the_run(
    ctx, demo_dataset, monkeypatch, airflow_task_state
):
    """A worker's graceful shutdown forwards SIGTERM to the task: its on_kill stops the training
    (the workers save), but the task is still running in Airflow: the run is not cancelled, the
    attempt fails as interrupted (retried), and the next try resumes from the saved step."""
    from sailor_tasks import gcp_auth
    from sailor_tasks.airflow_glue.operators import SailorTrainOperator
    from sailor_tasks.backends import local
    from sailor_tasks.train.progress import read_progress

    def wait_for_progress(key: str, timeout_s: float = 120.0) -> dict:
        """The launch's progress once ``key`` is set and it trained 20 steps past where it began."""
        path = local.LocalBackend(ctx.settings)._progress_path(run_key(run_id))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            progress = read_progress(path)
            if (progress.get("step") or 0) > 20 + (progress.get("resumed_from") or 0) and progress.get(key):
                return progress
            time.sleep(0.1)
        raise TimeoutError(f"no progress with {key} after {timeout_s} s")

    airflow_task_state("running")
    run_id = "manual__worker-restart"
    request, placement, data = prepare(ctx, run_id, demo_dataset)
    thread, outcome = train_in_thread(ctx, run_id, (request, placement, data))
    try:
        tree = wait_for_workers(run_id, 2)
        wait_for_progress("step")
        op = SailorTrainOperator(task_id="train", request=request, placement=placement, data=data)
        op._run_id = run_id
        op.on_kill()
    finally:
        gcp_auth.set_provider(None)
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert alive(tree) == [] and run_processes(run_key(run_id)) == []
    assert isinstance(outcome[0], TrainingInterruptedError), outcome
    (first,) = ctx.ledger.attempts(run_id)
    assert first["outcome"] == "failed" and "not by a user" in first["detail"]
    assert ctx.ledger.get_run(run_id)["status"] not in ("cancelled", "failed")
    saved = ctx.ledger.attempts(run_id)[0]["step"]
    # The next try (a new task process) trains again, from what the stopped workers saved; a
    # user's cancel then ends it.
    airflow_task_state("failed")
    monkeypatch.setattr(local, "_STOPPED", {})  # the next try is another process
    thread, outcome = train_in_thread(ctx, run_id, (request, placement, data))
    try:
        resumed = wait_for_progress("resumed_from")["resumed_from"]
        op.on_kill()
    finally:
        gcp_auth.set_provider(None)
        thread.join(timeout=60)
    assert isinstance(outcome[0], RunCancelledError), outcome
    second = ctx.ledger.attempts(run_id)[1]
    assert second["outcome"] == "cancelled" and resumed == saved > 20
    assert ctx.ledger.get_run(run_id)["status"] == "cancelled"


def test_a_train_task_killed_before_its_launch_starts_no_training(ctx, demo_dataset, airflow_task_state):
    """on_kill ran while the task still prepared the attempt (nothing to stop yet); the task goes
    on until the supervisor's SIGKILL: the launch it then reaches stops at once, as cancelled,
    instead of leaving torchrun training in a session of its own."""
    from sailor_tasks import gcp_auth
    from sailor_tasks.airflow_glue.operators import SailorTrainOperator

    airflow_task_state("failed")
    run_id = "manual__killed-early"
    request, placement, data = prepare(ctx, run_id, demo_dataset)
    op = SailorTrainOperator(task_id="train", request=request, placement=placement, data=data)
    op._run_id = run_id
    try:
        op.on_kill()
    finally:
        gcp_auth.set_provider(None)
    started = time.monotonic()
    with pytest.raises(RunCancelledError):
        stages.train(request, placement, data, run_id, ctx)
    assert time.monotonic() - started < 60  # LONG trains for minutes
    assert run_processes(run_key(run_id)) == []
    assert ctx.ledger.attempts(run_id)[-1]["outcome"] == "cancelled"


NO_DEATH_SIGNAL = (
    "import sailor_tasks.backends.local as local\n"
    "local._die_with_task = lambda task_pid: None  # a system without PR_SET_PDEATHSIG\n"
)
"""Makes a task script's torchrun outlive the task, as where the kernel has no parent-death signal."""


def start_task(run_id: str, prepared, prelude: str = "") -> subprocess.Popen:
    """A train task process running ``stages.train`` of the prepared run, ``prelude`` first."""
    script = prelude + (
        "import json, sys\n"
        "from sailor_tasks import stages\n"
        "request, placement, data = json.loads(sys.argv[1])\n"
        "stages.train(request, placement, data, sys.argv[2])\n"
    )
    return subprocess.Popen([sys.executable, "-c", script, json.dumps(prepared), run_id])


def test_a_hard_killed_task_takes_its_runs_processes_with_it(ctx, demo_dataset):
    """A task process killed with SIGKILL cannot run on_kill; torchrun, in a session of its own,
    gets SIGTERM as its task dies (its workers save on it, then exit): nothing trains on beside a
    retry, which may run on another worker's host."""
    run_id = "manual__taken"
    task = start_task(run_id, prepare(ctx, run_id, demo_dataset))
    try:
        tree = wait_for_workers(run_id, 2)
        task.kill()
        task.wait()
        deadline = time.monotonic() + 60
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(tree) == [] and run_processes(run_key(run_id)) == []
    finally:
        stages.teardown(run_id, ctx)


def test_teardown_stops_workers_that_outlived_a_hard_killed_task(ctx, demo_dataset):
    """A task process killed with SIGKILL cannot run on_kill; where torchrun outlives it (no
    parent-death signal), it and its workers, in their own sessions, go on. teardown, which
    Airflow still runs, stops them before releasing."""
    run_id = "manual__orphans"
    task = start_task(run_id, prepare(ctx, run_id, demo_dataset), NO_DEATH_SIGNAL)
    try:
        tree = wait_for_workers(run_id, 2)
        task.kill()
        task.wait()
        time.sleep(0.5)
        assert len(alive(tree)) == 3  # orphaned: still training
    finally:
        result = stages.teardown(run_id, ctx)
    assert result["training_stopped"] >= 3 and result["cluster_removed"]
    assert alive(tree) == [] and run_processes(run_key(run_id)) == []
    assert ctx.ledger.live_reservations() == [] and ctx.ledger.get_run(run_id)["status"] == "failed"
    assert [a["outcome"] for a in ctx.ledger.attempts(run_id)] == ["failed"]  # not running for ever
    assert os.listdir(ctx.settings.clusters_dir) == []


def test_cancel_stops_only_the_processes_of_its_own_deployment(tmp_path):
    """Two deployments (state folders) on one machine may hold runs with the same run key: a cancel in
    one leaves the other's processes running."""
    from sailor_tasks.backends.local import RUN_KEY_ENV, STATE_DIR_ENV, LocalBackend
    from sailor_tasks.settings import Settings

    mine, theirs = (Settings.from_env({}).with_state_dir(str(tmp_path / n)) for n in ("mine", "theirs"))
    env = {**os.environ, RUN_KEY_ENV: "same-key", STATE_DIR_ENV: os.path.realpath(theirs.state_dir)}
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.time() + 10
        while not run_processes("same-key") and time.time() < deadline:
            time.sleep(0.05)
        assert [p.pid for p in run_processes("same-key", theirs.state_dir)] == [other.pid]
        assert LocalBackend(mine).cancel("same-key", grace_s=0.0) == 0
        assert other.poll() is None
        assert LocalBackend(theirs).cancel("same-key", grace_s=0.0) == 1
        assert other.wait(timeout=10) == -9
    finally:
        other.kill()
        other.wait()


def test_cancel_stops_helpers_the_run_started_with_an_environment_of_their_own(tmp_path):
    """Training code may start a helper with an environment of its own, without the run's key: it
    is still the run's, as a descendant of one of its processes, and outlives its parent's exit."""
    from sailor_tasks.backends.local import RUN_KEY_ENV, STATE_DIR_ENV, LocalBackend
    from sailor_tasks.settings import Settings

    settings = Settings.from_env({}).with_state_dir(str(tmp_path / "state"))
    env = {**os.environ, RUN_KEY_ENV: "helper-key", STATE_DIR_ENV: os.path.realpath(settings.state_dir)}
    pid_file = tmp_path / "helper.pid"
    script = (
        "import subprocess, sys, time\n"
        "h = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], env={'PATH': ''})\n"
        f"open({str(pid_file)!r}, 'w').write(str(h.pid))\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    helper = None
    try:
        deadline = time.time() + 20
        while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
            time.sleep(0.05)
        helper = psutil.Process(int(pid_file.read_text()))
        assert [p.pid for p in run_processes("helper-key", settings.state_dir)] == [parent.pid]
        assert LocalBackend(settings).cancel("helper-key", grace_s=0.0) == 2
        assert parent.wait(timeout=10) == -9
        assert alive([helper]) == []
    finally:
        parent.kill()
        parent.wait()
        if helper is not None and alive([helper]):
            helper.kill()
