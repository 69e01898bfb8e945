"""A new user's first hour through the ``sailor`` command against the real services: a paused DAG,
show, logs from the folder and the REST API, and a cancel that leaves no process of the run."""

from __future__ import annotations

import pytest

from sailor_tasks.testing import first_hour as fh

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def submitted(stack):
    try:
        return fh.submit_to_paused_dag(stack)
    finally:
        stack.client().unpause("sailor_train")  # the other tests trigger it


def test_submit_to_a_paused_dag_says_so_and_unpause_runs_it(submitted):
    assert submitted["refused_exit"] == 1 and submitted["triggered_while_paused"] == 0, submitted
    assert submitted["ok"], submitted


def test_show_and_logs_of_the_run(stack, submitted):
    assert fh.show(stack, submitted["run_id"])["ok"]
    logs = fh.logs(stack, submitted["run_id"])
    assert logs["ok"], logs


def test_cancel_stops_every_process_of_the_run_and_teardown_releases_it(stack):
    result = fh.cancel(stack)
    assert result["exit"] == 0 and result["state"] == "failed", result
    assert result["processes_before"] >= 3 and result["leftover_processes"] == 0, result
    # Whichever records first, the train task's on_kill, the task itself or teardown (which
    # Airflow starts as soon as the task is marked failed), the run ends cancelled.
    assert result["ledger_status"] == "cancelled" and result["reservation_released"], result
    assert result["follow_ended"] and result["followed_train_log"], result


def test_check_holds_on_the_stack_and_reports_an_unconfigured_gcp_setup(stack):
    local = fh.check_local(stack.env)
    assert local["ok"], local
    gke = fh.check_gke(stack.env)
    assert gke["exit"] == 1 and gke["reports"] >= 5 and gke["all_have_a_fix"], gke
