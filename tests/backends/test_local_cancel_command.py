"""Cancelling a local run whose training is the run's own ``command`` (not the built-in trainer)."""

from __future__ import annotations

import textwrap
import time

import pytest

from sailor_tasks import paths, stages, storage
from sailor_tasks.backends.local import run_processes
from sailor_tasks.errors import RunCancelledError
from sailor_tasks.model import run_key
from sailor_tasks.settings import Settings
from sailor_tasks.stages import StageContext
from tests.backends.test_local_cancel import prepare, train_in_thread

pytestmark = pytest.mark.slow

LOOP = textwrap.dedent(
    """\
    import os, signal, sys, time
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(os.path.join(os.environ["PROBE_DIR"], "up"), "w"):
        pass
    while not stop:
        time.sleep(0.05)
    sys.exit(75)  # saved on the notice, as the runtime helper does
    """
)


@pytest.fixture
def command_ctx(tmp_path, settings, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "loop.py").write_text(LOOP)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("SAILOR_COMMAND_ROOTS", str(code))
    monkeypatch.chdir(tmp_path)
    return StageContext(Settings.from_env()), out


@pytest.mark.parametrize("args", [[], ["--config", "conf/my.yaml"]])
def test_cancelling_a_command_run_ends_it_cancelled(command_ctx, demo_dataset, tmp_path, args):
    """``sailor cancel`` (on_kill → stop_training) of a run of its own command must end the attempt
    and the run ``cancelled`` (RunCancelledError, not retried), as it does for the built-in trainer;
    the backend must not write its marker where a ``--config`` argument of the user's command points."""
    ctx, out = command_ctx
    run_id = "manual__cancel_cmd"
    params = {
        "job_name": "cancel-cmd",
        "team": "qa",
        "num_workers": 1,
        "total_steps": 100,
        "checkpoint_every_steps": 10,
        "command": ["python", "loop.py", *args],
        "env": {"PROBE_DIR": str(out)},
    }
    thread, outcome = train_in_thread(ctx, run_id, prepare(ctx, run_id, demo_dataset, params))
    try:
        deadline = time.monotonic() + 120
        while not (out / "up").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (out / "up").exists()
        stages.stop_training(run_id, ctx)  # what SailorTrainOperator.on_kill does
    finally:
        thread.join(timeout=60)
        stages.teardown(run_id, ctx)
    assert run_processes(run_key(run_id)) == []
    assert not (tmp_path / "conf").exists()  # nothing written where the user's argument points
    assert isinstance(outcome[0], RunCancelledError), outcome
    (attempt,) = ctx.ledger.attempts(run_id)
    assert attempt["outcome"] == "cancelled"
    assert ctx.ledger.get_run(run_id)["status"] == "cancelled"
    assert storage.exists(paths.cancelled_uri(ctx.run_uri(attempt["region"], run_id)))
