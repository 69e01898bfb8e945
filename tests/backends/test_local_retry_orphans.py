"""A retried local ``train`` task after a try that was killed hard (SIGKILL: no on_kill): where the
kernel has no parent-death signal, the dead try's torchrun and workers, in sessions of their own,
outlive it. The retry must not train a second
process group of the run next to them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from sailor_tasks import stages
from sailor_tasks.backends.local import run_processes
from sailor_tasks.model import run_key
from sailor_tasks.settings import Settings
from sailor_tasks.stages import StageContext
from sailor_tasks.testing.first_hour import alive

pytestmark = pytest.mark.slow

PROBE = textwrap.dedent(
    """\
    import json, os, sys, time
    env = os.environ
    attempt = env["SAILOR_ATTEMPT"]
    open(os.path.join(env["PROBE_DIR"], f"up-{attempt}"), "w").close()
    if attempt != "1":
        time.sleep(1.0)  # the new attempt trains a little
        sys.exit(0)
    step = 0
    while True:  # attempt 1 (its task is killed) trains on, ahead of the retry
        step += 1
        with open(env["SAILOR_PROGRESS_FILE"] + ".tmp", "w") as f:
            json.dump({"step": 1000 + step}, f)
        os.replace(env["SAILOR_PROGRESS_FILE"] + ".tmp", env["SAILOR_PROGRESS_FILE"])
        time.sleep(0.05)
    """
)


def test_a_retried_train_stops_the_dead_tries_process_group(tmp_path, settings, demo_dataset, monkeypatch):
    code, out = tmp_path / "code", tmp_path / "out"
    code.mkdir()
    out.mkdir()
    (code / "probe.py").write_text(PROBE)
    monkeypatch.setenv("SAILOR_COMMAND_ROOTS", str(code))
    ctx = StageContext(Settings.from_env())
    run_id = "manual__retry_orphans"
    params = {
        "job_name": "retry",
        "team": "qa",
        "dataset_uri": demo_dataset,
        "num_workers": 1,
        "total_steps": 10,
        "checkpoint_every_steps": 5,
        "command": ["python", "probe.py"],
        "env": {"PROBE_DIR": str(out)},
    }
    request = stages.validate(params, run_id, ctx)
    placement = stages.plan(request, run_id, ctx)
    data = stages.place_data(request, placement, run_id, ctx)
    stages.provision(request, placement, run_id, ctx)
    script = (
        "import sailor_tasks.backends.local as local\n"
        "local._die_with_task = lambda task_pid: None  # a system without PR_SET_PDEATHSIG\n"
        "import json, sys\n"
        "from sailor_tasks import stages\n"
        "request, placement, data = json.loads(sys.argv[1])\n"
        "stages.train(request, placement, data, sys.argv[2], try_number=1, max_tries=2)\n"
    )
    task = subprocess.Popen([sys.executable, "-c", script, json.dumps([request, placement, data]), run_id])
    try:
        deadline = time.monotonic() + 120
        while not (out / "up-1").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (out / "up-1").exists()
        old = run_processes(run_key(run_id))
        assert old
        task.kill()  # the try dies hard (its worker lost, OOM-killed): no on_kill
        task.wait()
        time.sleep(0.5)
        assert alive(old), "precondition: the dead try's processes train on"
        # Airflow retries the train task.
        result = stages.train(request, placement, data, run_id, ctx, try_number=2, max_tries=2)
        leaked = alive(old)
    finally:
        stages.teardown(run_id, ctx)
        for p in old if "old" in locals() else []:
            try:
                p.kill()
            except psutil.Error:
                pass
    assert [a["outcome"] for a in ctx.ledger.attempts(run_id)] == ["failed", "completed"]
    assert result["step"] < 1000, result["step"]
    assert leaked == [], f"attempt 1's processes still ran through attempt 2: {[p.pid for p in leaked]}"
