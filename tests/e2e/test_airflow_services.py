"""SAILOR through real Airflow services: REST trigger with params → success → ledger; rebalance;
the SAILOR page behind the login; the same DAG with the SAILOR ledger on PostgreSQL."""

from __future__ import annotations

import os

import pytest
import requests

from sailor_tasks.ledger import Ledger
from tests.e2e.conftest import RUN_TIMEOUT_S, TINY

pytestmark = pytest.mark.e2e

TRAIN_TASKS = ("validate", "plan", "place_data", "provision", "train", "finalize", "teardown")


@pytest.fixture(scope="module")
def train_run(stack, client):
    """One sailor_train run triggered through the REST API with params, followed to its end."""
    run = client.trigger("sailor_train", TINY, note="e2e: REST trigger with params")
    state = client.wait("sailor_train", run["dag_run_id"], timeout_s=RUN_TIMEOUT_S)
    return run["dag_run_id"], state


def test_train_dag_triggered_with_params_succeeds(client, train_run):
    run_id, state = train_run
    tasks = {ti["task_id"]: ti["state"] for ti in client.task_instances("sailor_train", run_id)}
    assert state == "success", tasks
    assert all(tasks[t] == "success" for t in TRAIN_TASKS), tasks
    assert client.dag_run("sailor_train", run_id)["conf"]["job_name"] == TINY["job_name"]


def test_train_run_is_recorded_in_the_ledger(stack, train_run):
    run_id, _ = train_run
    ledger = Ledger(stack.settings().ledger_url)
    run = ledger.get_run(run_id)
    assert run["status"] == "success" and run["steps"] == TINY["total_steps"]
    assert run["team"] == TINY["team"] and run["final_loss"] < run["initial_loss"]
    assert run["region"] and run["gpu_type"] and run["usd_estimate"] > 0
    (placement,) = ledger.placements(run_id)
    assert placement["explanation"], "a placement explains itself"
    assert ledger.live_reservations() == []  # teardown released the capacity
    assert {t["stage"] for t in ledger.stage_timings(run_id)} >= set(TRAIN_TASKS)


def test_task_logs_and_xcom_show_progress_and_summary(client, train_run):
    run_id, _ = train_run
    copy_log = client.task_log("sailor_train", run_id, "place_data")
    assert "MB/s" in copy_log and "copied" in copy_log
    train_log = client.task_log("sailor_train", run_id, "train")
    assert "loss" in train_log and "samples/s" in train_log and "eta" in train_log.lower()
    assert "checkpoint" in train_log
    summary = client.xcom("sailor_train", run_id, "finalize")
    assert summary["status"] == "success" and summary["summary_md"].startswith("# SAILOR run")
    assert "Placed in" in summary["summary_md"]


def test_sailor_page_requires_login_and_shows_regions_and_runs(stack, client, train_run):
    run_id, _ = train_run
    anonymous = requests.get(f"{stack.url}/sailor/", timeout=30)
    assert anonymous.status_code == 401
    forged = requests.get(f"{stack.url}/sailor/", headers={"Authorization": "Bearer forged"}, timeout=30)
    assert forged.status_code in (401, 403)

    headers = {"Authorization": f"Bearer {client.token}"}
    page = requests.get(f"{stack.url}/sailor/", headers=headers, timeout=60)
    assert page.status_code == 200, page.text[:500]
    assert 'id="regions"' in page.text and "us-central1" in page.text and "europe-west4" in page.text
    assert run_id in page.text  # in recent placements and runs

    snap = requests.get(f"{stack.url}/sailor/api/snapshot", headers=headers, timeout=60).json()
    regions = {r["region"]: r for r in snap["regions"]}
    assert regions["us-central1"]["supply_gpus"] > 0
    assert any(p["run_id"] == run_id for p in snap["placements"])

    # The UI lists the page in its navigation.
    views = client.request("GET", "/api/v2/plugins")["plugins"]
    sailor = next(p for p in views if p["name"] == "sailor")
    assert sailor["external_views"][0]["href"] == "/sailor/"


def test_rebalance_publishes_an_assignment_the_page_shows(stack, client, train_run):
    client.unpause("sailor_rebalance")
    try:
        run = client.trigger("sailor_rebalance", {})
        state = client.wait("sailor_rebalance", run["dag_run_id"], timeout_s=RUN_TIMEOUT_S)
    finally:  # no scheduled rebalance (replication) while later tests count bucket files
        client.pause("sailor_rebalance")
    assert state == "success"
    assignment = Ledger(stack.settings().ledger_url).latest_assignment()
    assert assignment is not None and TINY["team"] in assignment.shares
    page = requests.get(
        f"{stack.url}/sailor/", headers={"Authorization": f"Bearer {client.token}"}, timeout=60
    ).text
    assert f"v{assignment.version}" in page
    report = requests.get(
        f"{stack.url}/sailor/report.png", headers={"Authorization": f"Bearer {client.token}"}, timeout=60
    )
    if "no report yet" in page.lower():  # until sailor_rebalance records a chart
        assert report.status_code == 404
    else:
        assert report.status_code == 200 and report.content[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_dag_with_the_sailor_ledger_on_postgresql(stack, client, train_run):
    """Restart the scheduler (which runs the tasks) with SAILOR_LEDGER_URL on PostgreSQL, run again."""
    url = stack.postgres.create_database("sailor_ledger")
    try:
        stack.restart_component("scheduler", env={"SAILOR_LEDGER_URL": url})
        run = client.trigger("sailor_train", {**TINY, "job_name": "e2e-pg"})
        state = client.wait("sailor_train", run["dag_run_id"], timeout_s=RUN_TIMEOUT_S)
        assert state == "success"
    finally:
        stack.restart_component("scheduler")
    ledger = Ledger(url)
    assert ledger.engine.dialect.name == "postgresql"
    (row,) = ledger.list_runs()
    assert row["run_id"] == run["dag_run_id"] and row["status"] == "success"
    assert row["steps"] == TINY["total_steps"] and ledger.live_reservations() == []
    assert ledger.placements(row["run_id"]) and ledger.stage_timings(row["run_id"])
    # The default (SQLite) ledger did not see this run.
    assert Ledger(stack.settings().ledger_url).get_run(run["dag_run_id"]) is None
    assert os.path.exists(os.path.join(stack.state_dir, "ledger.db"))


def test_sailor_submit_triggers_and_follows_a_run(stack, tmp_path):
    import json
    import subprocess
    import sys

    params = tmp_path / "params.json"
    params.write_text(json.dumps({**TINY, "job_name": "e2e-cli"}))
    sailor = os.path.join(os.path.dirname(sys.executable), "sailor")
    cmd = [sailor, "submit", str(params), "--airflow-url", stack.url, "--username", "admin", "--poll", "2"]
    done = subprocess.run(
        [*cmd, "--password", "admin"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_id, state = done.stdout.split()
    assert state == "success" and run_id.startswith("manual__")
    assert "train=running" in done.stderr and "# SAILOR run" in done.stderr  # followed, then summarised
    assert Ledger(stack.settings().ledger_url).get_run(run_id)["status"] == "success"

    params.write_text(json.dumps({**TINY, "num_workers": 0}))
    bad = subprocess.run([*cmd, "--password", "admin"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "num_workers" in bad.stderr and bad.stdout == ""

    params.write_text(json.dumps(TINY))
    denied = subprocess.run([*cmd, "--password", "wrong"], capture_output=True, text=True, timeout=120)
    assert denied.returncode == 2 and "401" in denied.stderr
