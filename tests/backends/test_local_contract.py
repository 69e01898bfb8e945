"""The local backend launches every run under the run contract: torchrun, the SAILOR_* variables,
the run's own env, and the built-in trainer or the run's confined command."""

from __future__ import annotations

import sys

import pytest

from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.backends.local import LocalBackend
from sailor_tasks.errors import InvalidRequestError
from sailor_tasks.model import Placement
from sailor_tasks.runtime import contract
from sailor_tasks.settings import Settings
from sailor_tasks.train.config import TrainConfig

HERE = Placement("r", "local", "us-central1", "us-central1-a", "cpu", 2, 1, 2, "spot", "local", 0.0)


@pytest.fixture
def backend(tmp_path, monkeypatch):
    roots = tmp_path / "code"
    roots.mkdir()
    (roots / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv("SAILOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SAILOR_COMMAND_ROOTS", str(roots))
    return LocalBackend(Settings.from_env())


def config(**kw) -> TrainConfig:
    return TrainConfig(
        run_id="run-1",
        model="tiny_gpt",
        data_uri="file:///buckets/us-central1/datasets/d",
        output_uri="file:///buckets/us-central1/runs/run-1",
        total_steps=40,
        checkpoint_every_steps=10,
        seed=7,
        attempt=3,
        **kw,
    )


def launch() -> TrainLaunch:
    return TrainLaunch("run-1", "run-1", "file:///buckets/us-central1/runs/run-1/train_config.json", 2, HERE)


def test_built_in_trainer_runs_under_torchrun_by_default(backend):
    argv = backend.command(launch(), config())
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"] and "--nproc-per-node=2" in argv
    assert argv[-4:] == ["-m", "sailor_tasks.train", "--config", launch().config_uri]


def test_own_command_runs_confined_under_torchrun(backend, tmp_path):
    argv = backend.command(launch(), config(command=("python", "train.py", "--lr", "0.1")))
    assert argv[-3:] == [str(tmp_path / "code" / "train.py"), "--lr", "0.1"]
    assert "sailor_tasks.train" not in argv
    # Its worker runs in the allowed folder the script lies in: a relative path in its arguments
    # means what it means in the command.
    at = argv.index("--cwd")
    assert argv[at + 1] == str((tmp_path / "code").resolve()) and argv[at + 2] == "--"


def test_a_command_gone_since_validation_is_refused_at_launch(backend, tmp_path):
    (tmp_path / "code" / "train.py").unlink()
    with pytest.raises(InvalidRequestError, match="no such file") as info:
        backend.command(launch(), config(command=("python", "train.py")))
    assert info.value.field == "command"


def test_workers_get_the_contract_and_the_runs_env(backend):
    env = backend.environment(launch(), config(env={"MY_FLAG": "on"}))
    assert env[contract.RUN_ID] == "run-1" and env[contract.ATTEMPT] == "3"
    assert env[contract.DATA_DIR] == "file:///buckets/us-central1/datasets/d"
    assert env[contract.CHECKPOINT_DIR] == "file:///buckets/us-central1/runs/run-1/checkpoints"
    assert (env[contract.TOTAL_STEPS], env[contract.SEED]) == ("40", "7")
    assert env[contract.NOTICE_FILE].endswith("run-1.notice.json")
    assert env[contract.PROGRESS_FILE].endswith("run-1.progress.json")
    assert env["MY_FLAG"] == "on"


def test_torchruns_own_options_are_not_inherited_from_the_task(backend, monkeypatch):
    """torchrun reads ``PET_<OPTION>`` as its options: one in the Airflow worker's environment
    would restart or silence the run's workers behind SAILOR's back."""
    monkeypatch.setenv("PET_MAX_RESTARTS", "3")
    monkeypatch.setenv("MY_SITE_FLAG", "kept")
    env = backend.environment(launch(), config())
    assert "PET_MAX_RESTARTS" not in env and env["MY_SITE_FLAG"] == "kept"


def test_workers_do_not_get_airflows_or_the_ledgers_secrets(backend, monkeypatch):
    """The run's own code gets neither the metadata database's URL (with its password), Airflow's
    connections, nor the ledger's URL; the rest of the environment (credentials it needs, such as
    ``GOOGLE_APPLICATION_CREDENTIALS``) it keeps, and a run may still pass any of them in ``env``."""
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://airflow:s3cret@db/airflow")
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "s3cret")
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", "postgresql://u:s3cret@wh/db")
    monkeypatch.setenv("SAILOR_LEDGER_URL", "postgresql://sailor:s3cret@db/ledger")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/keys/sa.json")
    env = backend.environment(launch(), config(env={"AIRFLOW_CONN_WAREHOUSE": "passed on purpose"}))
    assert not any("s3cret" in v for v in env.values())
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == "/keys/sa.json"
    assert env["AIRFLOW_CONN_WAREHOUSE"] == "passed on purpose"


def test_notice_file_holds_the_deadline(tmp_path):
    path = str(tmp_path / "notice.json")
    assert contract.read_notice(path) is None  # no file: no notice
    written = contract.write_notice(path, 30.0, now=1000.0)
    notice = contract.read_notice(path)
    assert notice == written and notice.deadline == 1030.0 and notice.seconds_left(now=1010.0) == 20.0
