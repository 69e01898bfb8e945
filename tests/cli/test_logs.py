"""``sailor logs``: task logs from the local log folder or Airflow's REST API, in pipeline order,
and followed until the run ends."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import UTC, datetime

from sailor_tasks.cli.logs import ApiLogs, LocalLogs, TaskTry, print_logs, render_record
from sailor_tasks.cli.main import main as sailor

RUN_ID = "manual__2026-11-22T10:00:00+00:00"


def record(event: str, level: str = "info", logger: str = "sailor_tasks.stages.train", **extra) -> str:
    return json.dumps(
        {
            "timestamp": "2026-11-22T10:00:01.123456Z",
            "level": level,
            "event": event,
            "logger": logger,
            **extra,
        }
    )


def write_log(folder, task: str, attempt: int, lines: list[str], run_id: str = RUN_ID) -> str:
    path = folder / "dag_id=sailor_train" / f"run_id={run_id}" / f"task_id={task}" / f"attempt={attempt}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(line + "\n" for line in lines)
    return str(path)


def test_local_logs_print_every_try_in_pipeline_order(tmp_path, capsys):
    write_log(tmp_path, "teardown", 1, [record("released")])
    write_log(tmp_path, "train", 2, [record("step 30 loss 3.9")])
    write_log(tmp_path, "train", 1, [record("step 10 loss 5.1"), record("preempted", level="warning")])
    write_log(tmp_path, "validate", 1, [record("params ok")])
    assert sailor(["logs", RUN_ID, "--log-folder", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("==> ")]
    assert headers == [
        "==> validate (try 1) <==",
        "==> train (try 1) <==",
        "==> train (try 2) <==",
        "==> teardown (try 1) <==",
    ]
    assert "[2026-11-22 10:00:01] WARNING sailor_tasks.stages.train: preempted" in out

    assert sailor(["logs", RUN_ID, "--log-folder", str(tmp_path), "--task", "train", "--try", "2"]) == 0
    out = capsys.readouterr().out
    assert "step 30 loss 3.9" in out and "step 10" not in out and "params ok" not in out


def test_an_explicit_log_folder_wins_over_the_airflow_url_variable(tmp_path, monkeypatch, capsys):
    """$SAILOR_AIRFLOW_URL is the default source; --log-folder on the command line reads that folder
    (not the API); both given explicitly are refused, naming both."""
    write_log(tmp_path, "validate", 1, [record("params ok")])
    monkeypatch.setenv("SAILOR_AIRFLOW_URL", "http://127.0.0.1:9")
    assert sailor(["logs", RUN_ID, "--log-folder", str(tmp_path)]) == 0
    assert "params ok" in capsys.readouterr().out
    assert sailor(["logs", RUN_ID, "--log-folder", str(tmp_path), "--airflow-url", "http://af:8080"]) == 2
    err = capsys.readouterr().err
    assert "--airflow-url http://af:8080 and --log-folder" in err and "give one" in err


def test_local_logs_show_what_the_triggerer_logged_for_a_deferred_try(tmp_path, capsys):
    """On GKE the deferred train task's pods' output reaches the log the triggerer writes beside
    the task's (``attempt=N.log.trigger.<job>.log``), as Airflow's own log reader finds it."""
    task_log = write_log(tmp_path, "train", 1, [record("pods started; deferring")])
    with open(f"{task_log}.trigger.7.log", "w") as f:
        f.write(
            record("[sailor-r1-node-0] step 100 loss 2.1", logger="sailor_tasks.airflow_glue.triggers") + "\n"
        )
    assert sailor(["logs", RUN_ID, "--log-folder", str(tmp_path), "--task", "train"]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("==> ")] == [
        "==> train (try 1) <==",
        "==> train (try 1, triggerer 7) <==",
    ]
    assert "pods started; deferring" in out and "[sailor-r1-node-0] step 100 loss 2.1" in out


def test_unknown_task_is_bad_input_naming_the_tasks_and_unknown_run_is_not_found(tmp_path, capsys):
    write_log(tmp_path, "validate", 1, [record("params ok")])
    write_log(tmp_path, "train", 1, [record("step 1")])
    assert sailor(["logs", RUN_ID, "--log-folder", str(tmp_path), "--task", "trian"]) == 2
    assert "--task 'trian'" in (err := capsys.readouterr().err) and "valid: validate, train" in err
    assert sailor(["logs", "manual__nothing", "--log-folder", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "no task log of run 'manual__nothing'" in err and "--airflow-url" in err


def test_local_log_folder_defaults_to_airflow_home(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    write_log(tmp_path / "logs", "plan", 1, [record("chose us-central1-a")])
    assert sailor(["logs", RUN_ID]) == 0
    assert "chose us-central1-a" in capsys.readouterr().out


def test_records_render_as_text_with_their_errors_and_plain_lines_pass_through():
    err = record(
        "task failed", level="error", error_detail=[{"exc_type": "TrainingFailedError", "exc_value": "rc 1"}]
    )
    assert render_record(err).endswith("task failed\nTrainingFailedError: rc 1")
    assert render_record("plain torchrun line") == "plain torchrun line"
    assert render_record('{"not": "a record"}') == '{"not": "a record"}'


def test_follow_prints_lines_as_they_are_written_and_stops_when_the_run_ends(tmp_path, ctx):
    ctx.ledger.upsert_run(
        RUN_ID,
        job_name="j",
        team="t",
        status="running",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/datasets/demo-text",
        request={},
    )
    from sailor_tasks.model import Placement

    ctx.ledger.record_placement(
        Placement(RUN_ID, "gcp", "us-central1", "us-central1-a", "L4", 1, 2, 2, "spot", "g2", 1.0)
    )
    write_log(tmp_path, "train", 1, [record("step 1 loss 5.0")])
    half = write_log(tmp_path, "train", 1, [])
    with open(half, "a") as f:
        f.write(record("step 2 loss")[:20])  # a line still being written is not printed yet

    def training() -> None:
        time.sleep(0.3)
        with open(half, "a") as f:
            f.write(record("step 2 loss 4.0")[20:] + "\n")
        write_log(tmp_path, "train", 1, [record("step 3 loss 3.0")])
        time.sleep(0.3)
        ctx.ledger.upsert_run(RUN_ID, status="success")
        write_log(tmp_path, "teardown", 1, [record("teardown started")])
        time.sleep(0.3)  # teardown runs on: following goes on until it has recorded its end
        write_log(tmp_path, "teardown", 1, [record("released the reservation")])
        now = datetime.now(UTC)
        ctx.ledger.record_stage(RUN_ID, "teardown", now, now, ok=True)

    writer = threading.Thread(target=training)
    writer.start()
    out = io.StringIO()
    rc = print_logs(
        LocalLogs(str(tmp_path), "sailor_train", RUN_ID), follow=True, poll_s=0.05, timeout_s=30, out=out
    )
    writer.join()
    text = out.getvalue()
    assert rc == 0
    assert [line.split(": ", 1)[1] for line in text.splitlines() if "step" in line] == [
        "step 1 loss 5.0",
        "step 2 loss 4.0",
        "step 3 loss 3.0",
    ]
    assert "==> teardown (try 1) <==" in text and text.rstrip().endswith("released the reservation")


def test_follow_of_a_run_rejected_at_validate_ends_with_its_status(tmp_path, ctx):
    # teardown never runs for it (its setup, plan, did not succeed): the final status is the end
    ctx.ledger.upsert_run(
        RUN_ID,
        job_name="j",
        team="t",
        status="rejected",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/datasets/demo-text",
        request={},
    )
    write_log(tmp_path, "validate", 1, [record("num_workers=0: 0 is less than the minimum of 1")])
    out = io.StringIO()
    started = time.monotonic()
    rc = print_logs(
        LocalLogs(str(tmp_path), "sailor_train", RUN_ID), follow=True, poll_s=0.05, timeout_s=10, out=out
    )
    assert rc == 0 and time.monotonic() - started < 5
    assert "less than the minimum of 1" in out.getvalue()


def test_follow_of_a_run_whose_validate_failed_before_recording_it_ends(tmp_path, ctx, monkeypatch):
    """validate failed with an error (not a rejection) before the run had a ledger row, on every
    try: teardown never runs, so its last failed try is the end (not the first: a retry comes)."""
    import pytest

    from sailor_tasks import stages, storage
    from sailor_tasks.settings import STAGE_RETRIES

    def denied(uri, *a, **k):
        raise PermissionError(f"403 Forbidden: {uri}")

    monkeypatch.setattr(storage, "exists", denied)
    logs = LocalLogs(str(tmp_path), "sailor_train", RUN_ID)
    for _ in range(STAGE_RETRIES + 1):
        assert not logs.done()  # a retry is to come
        with pytest.raises(PermissionError):
            stages.validate({"dataset_uri": "sailor://source/datasets/demo-text"}, RUN_ID, ctx)
    assert ctx.ledger.get_run(RUN_ID) is None
    write_log(tmp_path, "validate", 1, [record("PermissionError: 403 Forbidden", level="error")])
    out = io.StringIO()
    started = time.monotonic()
    rc = print_logs(
        LocalLogs(str(tmp_path), "sailor_train", RUN_ID), follow=True, poll_s=0.05, timeout_s=10, out=out
    )
    assert rc == 0 and time.monotonic() - started < 5
    assert "403 Forbidden" in out.getvalue()


class FakeAirflow:
    """The REST calls ``ApiLogs`` makes, over a scripted run."""

    base_url = "http://airflow.test"

    def __init__(self):
        self.state = "running"
        self.tis = [
            {"task_id": "train", "try_number": 1, "map_index": -1, "start_date": "t1"},
            {"task_id": "plan", "try_number": 1, "map_index": -1, "start_date": "t0"},
            {"task_id": "finalize", "try_number": 0, "map_index": -1, "start_date": None},
        ]
        self.logs = {("plan", 1): ["chose us-central1-a"], ("train", 1): ["step 1 loss 5.0"]}
        self.reads = 0

    def task_instances(self, dag_id, run_id):
        return self.tis

    def task_log(self, dag_id, run_id, task_id, try_number, map_index=-1):
        self.reads += 1
        if task_id == "train" and self.reads > 3:  # the run moves on while it is followed
            self.logs[("train", 1)] = ["step 1 loss 5.0", "step 2 loss 4.0"]
            self.state = "success"
        return "\n".join(self.logs[(task_id, try_number)])

    def dag_run(self, dag_id, run_id):
        return {"state": self.state}


def test_api_logs_follow_a_run_through_the_rest_api_until_it_ends():
    api = FakeAirflow()
    source = ApiLogs(api, "sailor_train", RUN_ID)
    assert source.tries() == [TaskTry(1, "plan", -1, 1), TaskTry(4, "train", -1, 1)]
    out = io.StringIO()
    assert print_logs(source, follow=True, poll_s=0.01, timeout_s=10, out=out) == 0
    assert out.getvalue().splitlines() == [
        "==> plan (try 1) <==",
        "chose us-central1-a",
        "",
        "==> train (try 1) <==",
        "step 1 loss 5.0",
        "step 2 loss 4.0",
    ]


def test_without_airflow_home_the_projects_airflow_folder_is_used(tmp_path, monkeypatch):
    from sailor_tasks.cli.logs import base_log_folder

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".airflow").mkdir()
    assert base_log_folder(environ={}) == ".airflow/logs"
    assert base_log_folder(environ={"AIRFLOW_HOME": "/srv/af"}) == "/srv/af/logs"
    assert base_log_folder(environ={"AIRFLOW__LOGGING__BASE_LOG_FOLDER": "/l", "AIRFLOW_HOME": "/a"}) == "/l"
    assert base_log_folder("/explicit", environ={"AIRFLOW_HOME": "/a"}) == "/explicit"


def test_follow_never_hangs_on_what_cannot_be_followed(tmp_path, ctx, capsys, monkeypatch):
    """An unknown run, a task the DAG does not have, or a DAG whose local logs cannot tell when
    its run ends: a clear error, not a wait for ever."""
    from sailor_tasks.cli import logs

    assert logs.RUN_APPEARS_S == 60.0
    monkeypatch.setattr(logs, "RUN_APPEARS_S", 0.5)  # how long a just-triggered run may take to appear
    folder = ["--log-folder", str(tmp_path), "--poll", "0.05"]
    started = time.monotonic()
    assert sailor(["logs", "manual__nothing", "--follow", *folder]) == 3  # no --timeout: never ends
    err = capsys.readouterr().err
    assert "no run 'manual__nothing' of DAG sailor_train" in err
    assert time.monotonic() - started < 5

    write_log(tmp_path, "validate", 1, [record("params ok")])
    assert sailor(["logs", RUN_ID, "--follow", "--task", "trian", *folder]) == 2
    err = capsys.readouterr().err
    assert "--task 'trian' is not a task of DAG sailor_train" in err
    assert "valid: validate, plan, place_data, provision, train, finalize, teardown" in err

    assert sailor(["logs", RUN_ID, "--follow", "--dag-id", "sailor_rebalance", *folder]) == 2
    assert "--follow cannot tell from the local log folder" in capsys.readouterr().err


def test_a_try_without_a_log_is_bad_input_naming_the_tries_that_have_one(tmp_path, capsys):
    write_log(tmp_path, "train", 1, [record("step 1")])
    write_log(tmp_path, "train", 2, [record("step 2")])
    write_log(tmp_path, "plan", 1, [record("chose")])
    assert sailor(["logs", RUN_ID, "--log-folder", str(tmp_path), "--task", "train", "--try", "3"]) == 2
    assert "--try 3 has no log of task train in run" in (err := capsys.readouterr().err)
    assert err.rstrip().endswith("tries with logs: 1, 2")
    assert sailor(["logs", RUN_ID, "--log-folder", str(tmp_path), "--try", "2"]) == 0
    assert "step 2" in capsys.readouterr().out


def test_api_logs_follow_of_a_task_the_run_does_not_have_is_bad_input(monkeypatch, capsys):
    from sailor_tasks.cli import logs

    api = FakeAirflow()
    monkeypatch.setattr(logs, "client_from_args", lambda args: api)
    argv = ["logs", RUN_ID, "--airflow-url", "http://airflow.test", "--follow", "--task", "trian"]
    assert sailor(argv) == 2
    assert "valid: plan, train, finalize" in capsys.readouterr().err


def test_ctrl_c_while_following_exits_130_and_says_the_run_goes_on(tmp_path, monkeypatch, capsys):
    from sailor_tasks.cli import logs

    write_log(tmp_path, "validate", 1, [record("params ok")])

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(logs, "print_logs", interrupted)
    assert sailor(["logs", RUN_ID, "--log-folder", str(tmp_path), "--follow", "--timeout", "5"]) == 130
    assert f"stopped reading the logs of run {RUN_ID}; the run goes on" in capsys.readouterr().err
