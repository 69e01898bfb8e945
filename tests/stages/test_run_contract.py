"""The run contract through every ``sailor_train`` stage on the local backend, with a probe command:
what each worker is given, the notice (file + SIGTERM), and what each exit status means."""

from __future__ import annotations

import json
import textwrap

import pytest

from sailor_tasks import paths, storage
from sailor_tasks.errors import TrainingFailedError
from sailor_tasks.ledger import Ledger
from sailor_tasks.settings import Settings
from sailor_tasks.stages import StageContext
from sailor_tasks.testing.run_inline import run_inline

pytestmark = pytest.mark.slow

PROBE = textwrap.dedent(
    """\
    import json, os, signal, sys, time
    noticed = {}
    signal.signal(signal.SIGTERM, lambda *_: noticed.update(at=time.time()))
    env = os.environ
    attempt, rank = env["SAILOR_ATTEMPT"], env["RANK"]
    names = [n for n in env if n.startswith("SAILOR_") or n in ("RANK", "WORLD_SIZE", "PROBE_DIR")]
    with open(os.path.join(env["PROBE_DIR"], f"env-{attempt}-{rank}.json"), "w") as f:
        json.dump({n: env[n] for n in names}, f)
    # Training starts once every rank is up (its SIGTERM handler set), as a first collective would
    # make it: a notice at step 2 must not find a rank still starting on a slow machine.
    started = time.time()
    while not all(
        os.path.exists(os.path.join(env["PROBE_DIR"], f"env-{attempt}-{r}.json"))
        for r in range(int(env["WORLD_SIZE"]))
    ) and time.time() - started < 60:
        time.sleep(0.02)
    if env.get("PROBE_EXIT"):
        if env.get("PROBE_NOISE"):  # bytes that are not UTF-8, then more than a pipe holds
            sys.stdout.buffer.write(b"latin-1 label: caf\\xe9\\n")
            sys.stdout.flush()
            for i in range(2000):
                print(f"noise {i} " + "x" * 60)
        print("probe: something broke in the user's code", flush=True)
        sys.exit(int(env["PROBE_EXIT"]))
    for step in range(1, 1000):
        if rank == "0":
            with open(env["SAILOR_PROGRESS_FILE"] + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(env["SAILOR_PROGRESS_FILE"] + ".tmp", env["SAILOR_PROGRESS_FILE"])
        if noticed:
            with open(env["SAILOR_NOTICE_FILE"]) as f:
                notice = json.load(f)
            with open(os.path.join(env["PROBE_DIR"], f"notice-{attempt}-{rank}.json"), "w") as f:
                json.dump({**notice, "sigterm_at": noticed["at"]}, f)
            sys.exit(75)
        if attempt != "1" and step >= 3:
            sys.exit(0)
        time.sleep(0.05)
    """
)


@pytest.fixture
def probe(tmp_path, settings, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text(PROBE)
    out = tmp_path / "probe-out"
    out.mkdir()
    monkeypatch.setenv("SAILOR_COMMAND_ROOTS", str(code))
    return StageContext(Settings.from_env()), out


def base(demo_dataset, out, **extra):
    return {
        "dataset_uri": demo_dataset,
        "num_workers": 2,
        "total_steps": 10,
        "checkpoint_every_steps": 5,
        "command": ["python", "probe.py"],
        "env": {"PROBE_DIR": str(out), **extra.pop("env", {})},
        "preemption_notice_s": 25,
        **extra,
    }


def test_workers_get_the_contract_and_a_notice_before_sigterm(probe, demo_dataset):
    ctx, out = probe
    summary = run_inline(base(demo_dataset, out, inject_preemptions=[2]), "contract", ctx)
    attempts = Ledger(ctx.settings.ledger_url).attempts("contract")
    assert [a["outcome"] for a in attempts] == ["preempted", "completed"]
    for number, att in enumerate(attempts, start=1):
        run_uri = ctx.run_uri(att["region"], "contract")
        for rank in ("0", "1"):
            env = json.loads((out / f"env-{number}-{rank}.json").read_text())
            assert env["SAILOR_RUN_ID"] == "contract" and env["SAILOR_ATTEMPT"] == str(number)
            assert env["SAILOR_DATA_DIR"] == att["data"]["data_uri"]  # the placed replica
            assert env["SAILOR_CHECKPOINT_DIR"] == paths.checkpoint_uri(run_uri)
            assert (env["SAILOR_TOTAL_STEPS"], env["SAILOR_SEED"]) == ("10", "0")
            assert (env["RANK"], env["WORLD_SIZE"]) == (rank, "2")
    for rank in ("0", "1"):
        notice = json.loads((out / f"notice-1-{rank}.json").read_text())
        assert notice["notice_s"] == 25
        assert notice["deadline"] - notice["sigterm_at"] == pytest.approx(25, abs=5)
    assert not (out / "notice-2-0.json").exists()
    assert summary["steps"] >= 3 and summary["checkpoint_uri"] is None  # the probe saves nothing
    result = storage.read_json(paths.result_uri(ctx.run_uri(attempts[1]["region"], "contract")))
    assert result["status"] == "completed" and result["initial_loss"] is None
    assert "command `python probe.py`" in summary["summary_md"]


def test_a_failing_command_fails_the_run_with_the_tail_of_its_log(probe, demo_dataset):
    ctx, out = probe
    with pytest.raises(TrainingFailedError, match="exit code") as info:
        run_inline(base(demo_dataset, out, env={"PROBE_EXIT": "3"}), "broken", ctx)
    message = str(info.value)
    assert "probe: something broke in the user's code" in message  # the workers' own output
    assert "[torchrun] worker exit status: rank " in message and ": 3" in message
    assert "ChildFailedError" not in message  # torchrun's traceback is in the task log, not here
    ledger = Ledger(ctx.settings.ledger_url)
    (attempt,) = ledger.attempts("broken")
    assert attempt["outcome"] == "failed" and ledger.preemptions("broken") == []
    assert ledger.get_run("broken")["status"] == "failed"


def test_output_that_is_not_utf8_is_logged_and_the_failure_still_reported(probe, demo_dataset):
    """One byte that is not UTF-8 used to stop the log reader; nobody drained the pipe any more,
    and the workers hung on their next print."""
    import threading

    ctx, out = probe
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            run_inline(base(demo_dataset, out, env={"PROBE_EXIT": "3", "PROBE_NOISE": "1"}), "noisy", ctx)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the attempt hung"
    (exc,) = outcome
    assert isinstance(exc, TrainingFailedError), exc
    assert "probe: something broke in the user's code" in str(exc) and ": 3" in str(exc)


CHECKPOINTS_EVERY_4 = textwrap.dedent(
    """\
    import json, os, torch
    import torch.distributed.checkpoint as dcp
    root = os.environ["SAILOR_CHECKPOINT_DIR"].removeprefix("file://")
    progress = os.environ["SAILOR_PROGRESS_FILE"]
    for step in range(1, int(os.environ["SAILOR_TOTAL_STEPS"]) + 1):
        with open(progress + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(progress + ".tmp", progress)
        if step % 4 == 0:
            writer = dcp.FileSystemWriter(f"{root}/step-{step:08d}")
            dcp.save({"w": torch.full((2,), float(step)), "step": step}, storage_writer=writer, no_dist=True)
    """
)


def test_a_command_that_ends_past_its_last_save_records_that_save_with_its_own_step(probe, demo_dataset):
    ctx, out = probe
    (out.parent / "code" / "ck.py").write_text(CHECKPOINTS_EVERY_4)
    params = {**base(demo_dataset, out, num_workers=1), "command": ["python", "ck.py"]}
    summary = run_inline(params, "ckpt", ctx, max_tries=0)
    assert summary["steps"] == 10 and summary["checkpoint_uri"].endswith("step-00000008")
    (record,) = Ledger(ctx.settings.ledger_url).checkpoints("ckpt")
    assert (record["step"], record["uri"]) == (8, summary["checkpoint_uri"])
