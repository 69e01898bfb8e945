"""A trainer with DataLoader worker processes gets through the notice: the SIGTERM reaches every
process of the worker (as on a VM's shutdown and from torchrun), ``ignore_notice`` keeps the
loader's processes alive, and the trainer loads its next batch, saves and exits 75."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from sailor_tasks.runtime import contract
from sailor_tasks.train.checkpoint.dcp import CheckpointManager

pytestmark = pytest.mark.slow

TRAINER = textwrap.dedent(
    """\
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from sailor_tasks.runtime import Run, ignore_notice

    run = Run.from_env()

    class Batches(Dataset):
        def __len__(self):
            return run.total_steps

        def __getitem__(self, step):
            time.sleep(0.02)  # the loader's processes are busy when the notice comes
            return torch.full((4,), float(step))

    init = ignore_notice if sys.argv[1] == "ignore" else None
    loader = iter(DataLoader(Batches(), batch_size=None, num_workers=2, worker_init_fn=init))
    w, step = torch.zeros(4), 0
    while step < run.total_steps:
        w += next(loader)
        step += 1
        run.report_step(step)
        if run.should_save():
            w += next(loader)  # the step in flight when the notice came: its batch still loads
            step += 1
            run.save(step, {"w": w, "step": step})
            run.exit_preempted()
        time.sleep(0.05)
    run.close()
    """
)


def _notice_everyone(trainer: psutil.Process, notice_file: str) -> int:
    """The notice as the backends give it: the file, then SIGTERM to the trainer and every process
    under it. Returns how many processes were signalled."""
    contract.write_notice(notice_file, 30.0)
    procs = [trainer, *trainer.children(recursive=True)]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    return len(procs)


def _trainer_env(tmp_path, total_steps: int) -> dict[str, str]:
    return {
        **os.environ,
        **contract.contract_env(
            run_id="loader",
            attempt=1,
            data_dir=f"file://{tmp_path}/data",
            checkpoint_dir=f"file://{tmp_path}/ckpt",
            total_steps=total_steps,
            seed=0,
            notice_file=str(tmp_path / "notice.json"),
            progress_file=str(tmp_path / "progress.json"),
        ),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }


def _run_until_noticed(tmp_path, mode: str) -> tuple[subprocess.CompletedProcess, int]:
    (tmp_path / "trainer.py").write_text(TRAINER)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "trainer.py"), mode],
        env=_trainer_env(tmp_path, 10_000),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        progress = tmp_path / "progress.json"
        while not (progress.exists() and json.loads(progress.read_text() or "{}").get("step", 0) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stdout.read() if proc.stdout else ""
            )
            time.sleep(0.05)
        signalled = _notice_everyone(psutil.Process(proc.pid), str(tmp_path / "notice.json"))
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                p.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out), signalled


def test_loader_workers_that_ignore_the_notice_let_the_trainer_save_and_exit_75(tmp_path):
    done, signalled = _run_until_noticed(tmp_path, "ignore")
    assert signalled >= 3  # the trainer and its two loader processes all got SIGTERM
    assert done.returncode == contract.PREEMPTED_EXIT_CODE, done.stdout
    manager = CheckpointManager(f"file://{tmp_path}/ckpt")
    step = manager.latest_valid_step()  # committed, its checksums verified
    assert step is not None and step >= 4
    state = manager.load_all(step)
    # every batch the trainer summed, the one after the notice included: sum of 0..step-1
    assert state["step"] == step and float(state["w"][0]) == step * (step - 1) / 2


def test_without_a_notice_the_trainer_still_stops_its_loader_workers_when_it_ends(tmp_path):
    (tmp_path / "trainer.py").write_text(TRAINER)
    # the loader's iterator is still referenced at exit: multiprocessing stops its processes with
    # SIGTERM from the trainer, which must end them, not be taken for a notice
    done = subprocess.run(
        [sys.executable, str(tmp_path / "trainer.py"), "ignore"],
        env=_trainer_env(tmp_path, 6),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "ckpt").exists()  # no notice, nothing saved


def test_a_process_an_ignoring_loader_worker_forks_can_be_stopped_with_sigterm(tmp_path):
    """SIGTERM stays blocked in the loader process itself; a process it forks (a decoder pool)
    unblocks it, and a program started with ``preexec_fn=unblock_sigterm`` too."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "from sailor_tasks.runtime import ignore_notice, unblock_sigterm\n"
        "ignore_notice()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(30)\n"
        "    os._exit(3)\n"
        "os.kill(pid, signal.SIGTERM)\n"
        "forked = os.waitpid(pid, 0)[1]\n"
        "p = subprocess.Popen(['sleep', '30'], preexec_fn=unblock_sigterm)\n"
        "p.terminate()\n"
        "print(os.WIFSIGNALED(forked) and os.WTERMSIG(forked) == signal.SIGTERM, p.wait() == -signal.SIGTERM)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr
