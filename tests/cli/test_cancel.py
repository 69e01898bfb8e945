"""``sailor cancel``: marks the dag run failed through the REST API and waits for teardown."""

from __future__ import annotations

import pytest

from sailor_tasks.cli import cancel
from sailor_tasks.cli.airflow_api import AirflowAPIError
from sailor_tasks.cli.main import main as sailor

RUN_ID = "manual__2026-11-22T10:00:00+00:00"


class FakeAirflow:
    def __init__(self, state: str = "running", after_teardown: str = "failed"):
        self.state, self.after_teardown = state, after_teardown
        self.calls: list[tuple] = []
        self.tasks = {"plan": "success", "train": "running", "finalize": "none", "teardown": "none"}
        self.after_tasks = {
            "plan": "success",
            "train": "failed",
            "finalize": "skipped",
            "teardown": "success",
        }

    def task_instances(self, dag_id, run_id):
        return [{"task_id": t, "state": s} for t, s in self.tasks.items()]

    def dag_run(self, dag_id, run_id):
        self.calls.append(("dag_run", dag_id, run_id))
        if run_id != RUN_ID:
            raise AirflowAPIError("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", 404, "not found")
        return {"state": self.state}

    def set_run_state(self, dag_id, run_id, state):
        self.calls.append(("set_run_state", dag_id, run_id, state))
        if self.state != "running":  # no teardown pending: the run's own state is set
            self.state = state

    def wait(self, dag_id, run_id, timeout_s, poll_s):
        self.calls.append(("wait", dag_id, run_id))
        self.state, self.tasks = self.after_teardown, self.after_tasks
        return self.state


@pytest.fixture
def airflow(monkeypatch):
    fake = FakeAirflow()
    monkeypatch.setattr(cancel, "client_from_args", lambda args: fake)
    return fake


def test_cancel_marks_the_run_failed_and_waits_for_teardown(airflow, capsys):
    assert sailor(["cancel", RUN_ID]) == 0
    assert ("set_run_state", "sailor_train", RUN_ID, "failed") in airflow.calls
    assert airflow.calls[-1][0] == "wait"
    out, err = capsys.readouterr()
    assert out.strip() == "failed" and "teardown releases the capacity" in err


def test_a_run_airflow_ended_as_success_after_teardown_is_marked_failed_again(airflow, capsys):
    """Airflow judges a run marked failed by its skipped leaves once teardown ends: success."""
    airflow.after_teardown = "success"
    assert sailor(["cancel", RUN_ID]) == 0
    marks = [c for c in airflow.calls if c[0] == "set_run_state"]
    assert len(marks) == 2 and airflow.state == "failed"
    assert capsys.readouterr().out.strip() == "failed"


def test_a_run_whose_work_completed_is_not_cancelled(airflow, capsys):
    """Only its teardown is left (finalize succeeded): marking it failed would turn a success
    into a failure."""
    airflow.tasks = {"train": "success", "finalize": "success", "teardown": "running"}
    assert sailor(["cancel", RUN_ID]) == 0
    assert not [c for c in airflow.calls if c[0] == "set_run_state"]
    assert "already completed its work" in capsys.readouterr().err


def test_a_run_that_completed_before_the_cancel_reached_it_stays_a_success(airflow, capsys):
    airflow.after_teardown = "success"
    airflow.after_tasks = {"train": "success", "finalize": "success", "teardown": "success"}
    assert sailor(["cancel", RUN_ID]) == 0
    assert len([c for c in airflow.calls if c[0] == "set_run_state"]) == 1 and airflow.state == "success"
    assert capsys.readouterr().out.strip() == "success"


def test_cancel_of_an_ended_run_changes_nothing(airflow, capsys):
    airflow.state = "success"
    assert sailor(["cancel", RUN_ID]) == 0
    assert [c[0] for c in airflow.calls] == ["dag_run"]
    assert "already ended (success)" in capsys.readouterr().err


def test_cancel_of_an_unknown_run_exits_3(airflow, capsys):
    assert sailor(["cancel", "manual__typo", "--dag-id", "sailor_train"]) == 3
    assert "no run 'manual__typo' of DAG sailor_train" in capsys.readouterr().err


def test_a_running_run_of_a_dag_without_teardown_is_cancelled(airflow, capsys):
    """A rebalance still collecting: no teardown to wait for, nothing completed: it is marked failed
    (not taken for a completed run because its DAG has no finalize or teardown)."""
    airflow.tasks = {"collect_utilization": "running", "solve_assignment": "none"}
    airflow.after_tasks = {"collect_utilization": "failed", "solve_assignment": "skipped"}
    assert sailor(["cancel", RUN_ID, "--dag-id", "sailor_rebalance", "--no-wait"]) == 0
    assert ("set_run_state", "sailor_rebalance", RUN_ID, "failed") in airflow.calls
