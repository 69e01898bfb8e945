"""The Airflow REST client: requests the API answers in pages are read to the end."""

from __future__ import annotations

from types import SimpleNamespace

from sailor_tasks.cli.airflow_api import AirflowClient


class _PagedSession:
    """Airflow's taskInstances endpoint over 130 task instances, at most 50 per page whatever the
    client asks (the server's maximum_page_limit)."""

    def __init__(self):
        self.tis = [{"task_id": f"t{i}", "map_index": -1} for i in range(130)]
        self.calls = []

    def request(self, method, url, headers=None, timeout=None, params=None, **kwargs):
        self.calls.append(params)
        limit = min(int((params or {}).get("limit", 50)), 50)
        offset = int((params or {}).get("offset", 0))
        body = {"task_instances": self.tis[offset : offset + limit], "total_entries": len(self.tis)}
        return SimpleNamespace(
            status_code=200, content=b"x", headers={"content-type": "application/json"}, json=lambda: body
        )


def test_task_instances_are_read_page_by_page():
    client = AirflowClient("http://localhost:8080", token="a-token")
    client.session = _PagedSession()
    tis = client.task_instances("sailor_train", "manual__1")
    assert [ti["task_id"] for ti in tis] == [f"t{i}" for i in range(130)]
    assert [c["offset"] for c in client.session.calls] == [0, 50, 100]


class _LogSession:
    """Airflow's logs endpoint for a task that ends between two reads: while it runs, the block of
    log sources before its lines names the worker's log server too; once it ended, it does not."""

    def __init__(self):
        self.lines = ["line 1", "line 2"]
        self.sources = ["/logs/attempt=1.log", "http://worker:8793/log/attempt=1.log"]

    def request(self, method, url, headers=None, timeout=None, params=None, **kwargs):
        header = ["::group::Log message source details", *self.sources, "::endgroup::"]
        body = {"content": [{"event": e} for e in header + self.lines], "continuation_token": "t"}
        return SimpleNamespace(
            status_code=200, content=b"x", headers={"content-type": "application/json"}, json=lambda: body
        )


def test_a_task_log_is_its_lines_without_airflows_block_of_log_sources():
    """``sailor logs --follow`` prints the lines after those it printed: a block that shrank when
    the task ended would have hidden its next line (often the error)."""
    from sailor_tasks.cli.logs import ApiLogs, TaskTry

    client = AirflowClient("http://localhost:8080", token="a-token")
    client.session = session = _LogSession()
    logs, task = ApiLogs(client, "sailor_train", "manual__1"), TaskTry(4, "train", -1, 1)
    assert logs.lines(task) == ["line 1", "line 2"]
    session.sources = session.sources[:1]  # the task ended
    session.lines = ["line 1", "line 2", "line 3", "Task failed with exception"]
    assert logs.lines(task)[2:] == ["line 3", "Task failed with exception"]


class _HtmlSession:
    """Airflow 3's API server answers a path it does not know with the UI's HTML page and 200."""

    def request(self, method, url, headers=None, timeout=None, **kwargs):
        return SimpleNamespace(
            status_code=200, content=b"<!doctype html>", headers={"content-type": "text/html"}
        )


def test_a_url_that_is_not_the_api_servers_root_is_named_not_a_traceback():
    import pytest

    from sailor_tasks.cli.airflow_api import NotAirflowAPIError, exit_code_of
    from sailor_tasks.errors import ExitCode

    client = AirflowClient("http://localhost:8080/api/v2", token="a-token")
    client.session = _HtmlSession()
    with pytest.raises(
        NotAirflowAPIError, match=r"not Airflow's REST API at http://localhost:8080/api/v2 .*text/html"
    ):
        client.dag_run("sailor_train", "manual__1")
    try:
        client.get_dag("sailor_train")
    except NotAirflowAPIError as exc:
        assert exit_code_of(exc) == ExitCode.NOT_FOUND


def test_a_server_error_is_unreachable_not_a_failed_run():
    from sailor_tasks.cli.airflow_api import AirflowAPIError, exit_code_of
    from sailor_tasks.errors import ExitCode

    for status in (502, 503, 504):
        assert (
            exit_code_of(AirflowAPIError("GET", "/api/v2/dags/x", status, "starting")) == ExitCode.NOT_FOUND
        )
    assert (
        exit_code_of(AirflowAPIError("POST", "/api/v2/dags/x/dagRuns", 409, "exists")) == ExitCode.BAD_INPUT
    )
