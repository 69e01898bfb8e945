"""``sailor submit`` against a paused DAG, and the commands it prints to follow, see and cancel a run."""

from __future__ import annotations

import json

import pytest
import requests

from sailor_tasks.cli import submit
from sailor_tasks.cli.airflow_api import AirflowAPIError
from sailor_tasks.cli.main import main as sailor


class FakeAirflow:
    def __init__(self, paused: bool = True, trigger_error: BaseException | None = None):
        self.paused, self.trigger_error = paused, trigger_error
        self.calls: list[tuple] = []

    def get_dag(self, dag_id):
        self.calls.append(("get_dag", dag_id))
        return {"dag_id": dag_id, "is_paused": self.paused}

    def unpause(self, dag_id):
        self.calls.append(("unpause", dag_id))
        self.paused = False

    def trigger(self, dag_id, conf, note=None):
        self.calls.append(("trigger", dag_id, self.paused))
        self.conf = conf
        if self.trigger_error:
            raise self.trigger_error
        return {"dag_run_id": "manual__2026-11-22T10:00:00+00:00"}


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "params.json"
    path.write_text(json.dumps({"job_name": "lm", "team": "qa", "num_workers": 2, "total_steps": 300}))
    return str(path)


@pytest.fixture
def airflow(monkeypatch):
    fake = FakeAirflow()
    monkeypatch.setattr(submit, "client_from_args", lambda args: fake)
    return fake


def test_paused_dag_is_not_triggered_and_the_message_says_how_to_unpause(params, airflow, capsys):
    assert sailor(["submit", params, "--no-wait"]) == 1
    err = capsys.readouterr().err
    assert (
        "DAG sailor_train is paused" in err
        and "--unpause" in err
        and "airflow dags unpause sailor_train" in err
    )
    assert [c[0] for c in airflow.calls] == ["get_dag"]


def test_unpause_flag_triggers_then_unpauses_and_prints_the_next_commands(params, airflow, capsys):
    assert sailor(["submit", params, "--no-wait", "--unpause"]) == 0
    assert airflow.calls == [
        ("get_dag", "sailor_train"),
        ("trigger", "sailor_train", True),  # the run waits while the DAG is paused
        ("unpause", "sailor_train"),
    ]
    out, err = capsys.readouterr()
    run_id = "manual__2026-11-22T10:00:00+00:00"
    assert out.strip() == run_id  # stdout: the run id alone, for scripts
    for command in (f"sailor logs {run_id} --follow", f"sailor show {run_id}", f"sailor cancel {run_id}"):
        assert command in err


def test_the_next_commands_name_the_api_server_and_the_dag_it_was_submitted_to(params, airflow, capsys):
    """Its logs are read where it was submitted (a deployment's log folder may not be on this
    machine), of its own DAG; a rebalance run is not in the ledger, so there is no show line."""
    airflow.paused = False
    url = "http://airflow.corp:8080"
    assert sailor(["submit", params, "--no-wait", "--airflow-url", url, "--dag-id", "sailor_rebalance"]) == 0
    err = capsys.readouterr().err
    run_id = "manual__2026-11-22T10:00:00+00:00"
    assert f"sailor logs {run_id} --follow --dag-id sailor_rebalance --airflow-url {url}" in err
    assert f"sailor cancel {run_id} --dag-id sailor_rebalance --airflow-url {url}" in err
    assert "sailor show" not in err


def test_an_unpaused_dag_is_triggered_without_touching_its_pause_state(params, airflow):
    airflow.paused = False
    assert sailor(["submit", params, "--no-wait"]) == 0
    assert [c[0] for c in airflow.calls] == ["get_dag", "trigger"]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (AirflowAPIError("POST", "/auth/token", 401, "Invalid credentials"), 2),
        (AirflowAPIError("POST", "/api/v2/dags/x/dagRuns", 400, "bad conf"), 2),
        (AirflowAPIError("GET", "/api/v2/dags/x", 404, "DAG not found"), 3),
        (requests.ConnectionError("connection refused"), 3),
    ],
)
def test_airflow_errors_map_to_documented_exit_codes(params, airflow, capsys, error, code):
    airflow.paused, airflow.trigger_error = False, error
    assert sailor(["submit", params, "--no-wait"]) == code
    assert str(error) in capsys.readouterr().err


def test_set_overrides_the_file_and_bad_overrides_trigger_nothing(params, airflow, capsys):
    airflow.paused = False
    assert sailor(["submit", params, "--set", "num_workers=4", "--set", "job_name=lm2", "--no-wait"]) == 0
    assert airflow.conf == {"job_name": "lm2", "team": "qa", "num_workers": 4, "total_steps": 300}
    assert sailor(["submit", "--set", "job_name=only-set", "--no-wait"]) == 0  # no file: --set alone
    assert airflow.conf == {"job_name": "only-set"}
    capsys.readouterr()
    triggers = [c for c in airflow.calls if c[0] == "trigger"]
    for argv, message in (
        ([params, "--set", "num_workers"], "--set 'num_workers' is not KEY=VALUE"),
        ([params, "--set", "num_workers=0"], "num_workers=0: 0 is less than the minimum of 1"),
        ([], "give a params JSON file, --set KEY=VALUE overrides, or both"),
    ):
        assert sailor(["submit", *argv, "--no-wait"]) == 2, argv
        assert message in capsys.readouterr().err, argv
    for flag in ("--poll", "--timeout"):
        with pytest.raises(SystemExit) as done:
            sailor(["submit", params, flag, "0"])
        assert done.value.code == 2
        assert f"argument {flag}: '0': need a number > 0" in capsys.readouterr().err
    assert [c for c in airflow.calls if c[0] == "trigger"] == triggers  # nothing more was triggered


@pytest.mark.parametrize(
    ("stop", "code", "said"),
    [
        (KeyboardInterrupt(), 130, "stopped following run"),
        (requests.ConnectionError("connection reset"), 3, "error: following run"),
        (TimeoutError("run not finished after 5 s"), 1, "error: run not finished after 5 s"),
    ],
    ids=["ctrl-c", "network", "timeout"],
)
def test_following_stops_without_a_traceback_and_says_the_run_goes_on(
    params, airflow, capsys, stop, code, said
):
    def wait(*args, **kwargs):
        raise stop

    airflow.paused, airflow.wait = False, wait
    assert sailor(["submit", params, "--airflow-url", "http://af:8080"]) == code
    err = capsys.readouterr().err
    assert said in err and "the run goes on" in err and "Traceback" not in err
    assert err.rstrip().endswith(
        "sailor cancel manual__2026-11-22T10:00:00+00:00 --airflow-url http://af:8080"
    )


def test_params_airflow_refuses_leave_a_paused_dag_paused(params, airflow, capsys):
    """--unpause with params Airflow refuses (400): exit 2, and the DAG is not left unpaused to
    run its schedule."""
    airflow.trigger_error = AirflowAPIError("POST", "/api/v2/dags/sailor_rebalance/dagRuns", 400, "bad")
    assert sailor(["submit", params, "--no-wait", "--unpause", "--dag-id", "sailor_rebalance"]) == 2
    assert airflow.paused and ("unpause", "sailor_rebalance") not in airflow.calls


def test_a_run_created_before_unpausing_fails_is_named_and_not_lost(params, airflow, capsys):
    """--unpause: the run is triggered, then unpausing the DAG is refused (a user who may trigger
    but not edit it): the run's id is still printed, and the error says it exists and waits."""
    run_id = "manual__2026-11-22T10:00:00+00:00"

    def refuse(dag_id):
        airflow.calls.append(("unpause", dag_id))
        raise AirflowAPIError("PATCH", f"/api/v2/dags/{dag_id}", 403, "Forbidden")

    airflow.unpause = refuse
    assert sailor(["submit", params, "--no-wait", "--unpause"]) == 2
    out, err = capsys.readouterr()
    assert out.strip() == run_id
    assert f"run {run_id} was created but waits: DAG sailor_train is still paused" in err
    assert "HTTP 403" in err and "airflow dags unpause sailor_train" in err
    assert f"sailor cancel {run_id}" in err
    assert [c[0] for c in airflow.calls] == ["get_dag", "trigger", "unpause"]


@pytest.mark.parametrize(
    "dag_id, tasks, printed, code",
    [
        ("sailor_train", {"validate": "success", "finalize": "success", "teardown": "success"}, "success", 0),
        (
            "sailor_train",
            {"validate": "success", "finalize": "skipped", "teardown": "success"},
            "cancelled",
            1,
        ),
        # No teardown: a cancel ends the run failed; tasks its own branches skip (a dry run's) are done.
        (
            "sailor_rebalance",
            {
                "collect": "success",
                "publish_assignment": "skipped",
                "replicate_data": "skipped",
                "report": "success",
            },
            "success",
            0,
        ),
    ],
)
def test_a_run_airflow_calls_success_succeeded_only_if_its_work_completed(
    params, airflow, capsys, dag_id, tasks, printed, code
):
    """A cancelled run ends "success" once its teardown does (the skipped tasks count as done):
    submit reports it cancelled and exits 1."""
    airflow.paused = False
    if dag_id != "sailor_train":
        params_argv = ["--dag-id", dag_id]
    else:
        params_argv = []
    airflow.wait = lambda *a, **k: "success"
    airflow.task_instances = lambda dag_id, run_id: [{"task_id": t, "state": s} for t, s in tasks.items()]
    airflow.xcom = lambda *a: {"summary_md": "## summary"}
    assert sailor(["submit", params, *params_argv]) == code
    assert capsys.readouterr().out.splitlines()[-1] == printed


def test_a_deadline_is_judged_on_the_speeds_the_ledger_readable_here_measured(
    tmp_path, settings, airflow, monkeypatch, capsys
):
    """No ledger here: a deadline too short at the packaged speeds is refused, saying so and that
    --no-check skips the check. With this machine's ledger, on the speeds it measured, as validate
    judges it: a deadline they meet is triggered."""
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.ledger import Ledger

    airflow.paused = False
    params = tmp_path / "p.json"
    params.write_text(json.dumps({"model": "tiny_gpt", "total_steps": 1_000_000, "deadline_hours": 0.5}))
    assert sailor(["submit", str(params), "--no-wait"]) == 2
    err = capsys.readouterr().err
    assert "deadline_hours=0.5" in err and "at the packaged speeds: no ledger is readable here" in err
    assert "--no-check skips this check" in err and "trigger" not in [c[0] for c in airflow.calls]

    Ledger(settings.ledger_url).dispose()
    fast = [("tiny_gpt", g, 1e6) for g in load_catalog().gpu_types]
    monkeypatch.setattr(Ledger, "measured_throughputs", lambda self, exclude_backends=("local",): fast)
    assert sailor(["submit", str(params), "--no-wait"]) == 0
    assert [c[0] for c in airflow.calls][-1] == "trigger"
