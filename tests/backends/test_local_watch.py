"""The local backend injects no preemption once training is ending: a worker that exited (the
run completed, or one worker crashed and torchrun is stopping the others) means an event due now
would turn a completion or a crash into a preemption."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from sailor_tasks.backends.local import LocalBackend
from sailor_tasks.backends.preemption import PreemptionEvent

AGENT = """\
import subprocess, sys, time
workers = [subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({sys.argv[1]}); raise SystemExit({code})"])
           for code in (0, int(sys.argv[2]))]
time.sleep(6)  # torchrun's shutdown: it outlives its workers a while
"""


@pytest.mark.parametrize(("worker_s", "code", "fires"), [(0.5, 0, False), (0.5, 1, False), (8.0, 0, True)])
def test_an_event_due_after_a_worker_exited_is_not_injected(tmp_path, worker_s, code, fires):
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(worker_s), str(code)])
    event = PreemptionEvent("time@1.5s", True, at_s=1.5)
    try:
        started = time.time()
        injection = {"run_started": started, "fired": []}
        got = LocalBackend._watch(agent, [event], injection, str(tmp_path / "p.json"))
        assert (got == event) is fires  # the workers still ran at 1.5 s only in the last case
    finally:
        for p in [agent_process := psutil.Process(agent.pid), *agent_process.children()]:
            p.kill()
        agent.wait()
