"""A small client of Airflow's REST API v2: log in, unpause, trigger a DAG with params, follow the run.

Used by ``sailor submit``, the end-to-end tests and the overhead benchmark. It speaks plain HTTP
through ``requests`` (no Airflow import), so it runs on a laptop that has only SAILOR installed.

Flow (Airflow 3 with the simple or FAB auth manager): ``POST /auth/token`` with username and
password → a JWT; every other call sends ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import requests

from sailor_tasks.errors import ExitCode, SailorError

TERMINAL_RUN_STATES = ("success", "failed")
"""Dag-run states after which nothing changes unless a person clears the run."""


class AirflowAPIError(SailorError):
    """Airflow answered with an error status; ``status`` and ``detail`` are what it said."""

    def __init__(self, method: str, path: str, status: int, detail: Any):
        self.method, self.path, self.status, self.detail = method, path, status, detail
        super().__init__(f"{method} {path} -> HTTP {status}: {detail}")


class NotAirflowAPIError(AirflowAPIError):
    """The server answered, but not as Airflow's REST API does (JSON): an HTML page, as Airflow's
    UI answers any path it does not know, for a URL that is not the API server's root."""


def task_states(client: Any, dag_id: str, run_id: str) -> dict[str, str]:
    """task id → state (``none`` before it is scheduled) of every task instance of the run."""
    return {ti["task_id"]: ti["state"] or "none" for ti in client.task_instances(dag_id, run_id)}


def run_completed(tasks: Mapping[str, str]) -> bool:
    """Whether a dag run's work completed, from its task states (task id → state): its
    ``finalize`` succeeded (``sailor_train``), or, in another DAG, every task but a ``teardown``
    did. A run marked failed by a cancel skips the tasks it had not started; once its teardown
    ends, Airflow calls the run ``success`` all the same."""
    if "finalize" in tasks:
        return tasks["finalize"] == "success"
    work = [state for task, state in tasks.items() if task != "teardown"]
    return bool(work) and all(state == "success" for state in work)


def _detail(resp: requests.Response) -> Any:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:2000]
    return body.get("detail", body) if isinstance(body, dict) else body


def _log_line(part: Any) -> str:
    """One structured log record as text: the message, then any exception type and value."""
    if not isinstance(part, dict):
        return str(part)
    line = str(part.get("event", ""))
    for err in part.get("error_detail") or ():
        if isinstance(err, dict):
            line += f"\n{err.get('exc_type')}: {err.get('exc_value')}"
    return line


LOG_SOURCES_GROUP = "::group::Log message source details"
"""The first record of the block Airflow puts before a task log: where each part was read from
(``::endgroup::`` ends it)."""


def _without_sources(records: list[Any]) -> list[Any]:
    """A task log's records without Airflow's block of log sources: its length changes while the
    task runs (a running task's log is also read from its worker), so a reader that counts lines
    to print only new ones would skip real lines once it shrinks; and it is no line of the task."""
    events = [r.get("event") if isinstance(r, dict) else None for r in records]
    if LOG_SOURCES_GROUP not in events:
        return records
    first = events.index(LOG_SOURCES_GROUP)
    if "::endgroup::" not in events[first + 1 :]:
        return records
    end = events.index("::endgroup::", first + 1)
    return records[:first] + records[end + 1 :]


@dataclass
class AirflowClient:
    """REST client bound to one Airflow deployment.

    Args:
        base_url: the API server, e.g. ``http://localhost:8080``.
        username, password: credentials for ``POST /auth/token`` (unused when ``token`` is given).
        token: an access token obtained elsewhere.
    """

    base_url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0
    session: requests.Session = field(default_factory=requests.Session, repr=False)

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")

    # --- plumbing -------------------------------------------------------------------------------
    def login(self) -> str:
        """Exchange username/password for an access token (``POST /auth/token``)."""
        if not self.username or self.password is None:
            raise ValueError("give a token, or a username and password, to log in to Airflow")
        resp = self.session.post(
            f"{self.base_url}/auth/token",
            json={"username": self.username, "password": self.password},
            timeout=self.timeout_s,
        )
        if resp.status_code not in (200, 201):
            raise AirflowAPIError("POST", "/auth/token", resp.status_code, _detail(resp))
        try:
            self.token = resp.json()["access_token"]
        except (ValueError, KeyError, TypeError):
            raise self._not_the_api("POST", "/auth/token", resp) from None
        return self.token

    def _not_the_api(self, method: str, path: str, resp: requests.Response) -> NotAirflowAPIError:
        what = resp.headers.get("content-type") or "no content type"
        return NotAirflowAPIError(
            method,
            path,
            resp.status_code,
            f"not Airflow's REST API at {self.base_url} (the answer is {what}): give the API "
            "server's root URL, without /api/v2",
        )

    def request(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        """Send one authenticated request; return the decoded JSON body (or raise AirflowAPIError)."""
        if self.token is None:
            self.login()
        headers = {"Authorization": f"Bearer {self.token}", **kwargs.pop("headers", {})}
        resp = self.session.request(
            method, f"{self.base_url}{path}", headers=headers, timeout=self.timeout_s, **kwargs
        )
        if resp.status_code == 401 and self.username and self.password is not None:
            self.login()  # token expired: log in once more and retry
            headers["Authorization"] = f"Bearer {self.token}"
            resp = self.session.request(
                method, f"{self.base_url}{path}", headers=headers, timeout=self.timeout_s, **kwargs
            )
        if resp.status_code not in ok:
            raise AirflowAPIError(method, path, resp.status_code, _detail(resp))
        if not resp.content:
            return None
        if "json" not in resp.headers.get("content-type", ""):
            raise self._not_the_api(method, path, resp)
        return resp.json()

    # --- DAGs and runs ----------------------------------------------------------------------------
    def get_dag(self, dag_id: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v2/dags/{quote(dag_id)}")

    def unpause(self, dag_id: str) -> dict[str, Any]:
        return self.request("PATCH", f"/api/v2/dags/{quote(dag_id)}", json={"is_paused": False})

    def pause(self, dag_id: str) -> dict[str, Any]:
        return self.request("PATCH", f"/api/v2/dags/{quote(dag_id)}", json={"is_paused": True})

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None, note: str | None = None) -> dict:
        """Create a dag run now (``logical_date: null``) with ``conf`` as its params.

        Raises:
            AirflowAPIError: e.g. HTTP 400 when the conf does not match the DAG's param schema.
        """
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf or {})}
        if note:
            body["note"] = note
        return self.request("POST", f"/api/v2/dags/{quote(dag_id)}/dagRuns", ok=(200, 201), json=body)

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of the run (mapped ones one per index), read page by page: the API
        returns at most ``limit`` (50 by default) per request."""
        path = f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        found: list[dict[str, Any]] = []
        while True:
            body = self.request("GET", path, params={"limit": TASK_INSTANCES_PAGE, "offset": len(found)})
            page = body["task_instances"]
            found.extend(page)
            if not page or len(found) >= int(body.get("total_entries", len(found))):
                return found

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1
    ) -> str:
        """Text of a task instance's log for one try (``map_index`` for one instance of a mapped task)."""
        body = self.request(
            "GET",
            f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{quote(task_id)}/logs/{try_number}",
            headers={"Accept": "application/json"},
            params={"map_index": map_index} if map_index >= 0 else None,
        )
        content = body.get("content", body) if isinstance(body, dict) else body
        if isinstance(content, list):
            return "\n".join(_log_line(part) for part in _without_sources(content))
        return str(content)

    def set_run_state(self, dag_id: str, run_id: str, state: str) -> dict[str, Any]:
        """Mark a dag run ``failed``, ``success`` or ``queued`` (``PATCH .../dagRuns/{run_id}``).

        Marking a run failed stops its running tasks (each task's ``on_kill``) and skips the ones not
        started; teardown tasks still run.
        """
        return self.request(
            "PATCH",
            f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}",
            json={"state": state},
        )

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        body = self.request(
            "GET",
            f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{quote(task_id)}/xcomEntries/{quote(key)}",
        )
        return body.get("value")

    def wait(
        self,
        dag_id: str,
        run_id: str,
        timeout_s: float = 1800.0,
        poll_s: float = 2.0,
        on_change: Callable[[str, dict[str, str]], None] | None = None,
    ) -> str:
        """Poll until the run ends; call ``on_change(run_state, {task_id: state})`` when anything moved.

        Returns:
            the final run state (``success`` or ``failed``).

        Raises:
            TimeoutError: the run did not end within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        last: tuple[str, dict[str, str]] | None = None
        while True:
            state = self.dag_run(dag_id, run_id)["state"]
            tasks = {}
            if on_change is not None:
                tasks = task_states(self, dag_id, run_id)
                if last != (state, tasks):
                    on_change(state, tasks)
                    last = (state, tasks)
            if state in TERMINAL_RUN_STATES:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"dag run {dag_id}/{run_id} still {state} after {timeout_s:.0f} s")
            time.sleep(poll_s)


# --- command-line options shared by the commands that talk to Airflow ------------------------------


def add_connection_options(p: Any, url_default: str | None = "http://localhost:8080") -> None:
    """``--airflow-url``, ``--username``, ``--password``, ``--token`` (each defaulting to its
    ``SAILOR_AIRFLOW_*`` variable) and ``--dag-id``."""
    url = os.environ.get("SAILOR_AIRFLOW_URL", url_default)
    p.add_argument(
        "--airflow-url",
        default=url,
        help=f"Airflow API server (default: $SAILOR_AIRFLOW_URL, else {url_default or 'none'})",
    )
    p.add_argument(
        "--username",
        default=os.environ.get("SAILOR_AIRFLOW_USERNAME", "admin"),
        help="Airflow user (default: $SAILOR_AIRFLOW_USERNAME, else admin)",
    )
    p.add_argument("--password", help="Airflow password (default: $SAILOR_AIRFLOW_PASSWORD)")
    p.add_argument(
        "--token", help="an access token instead of username/password (default: $SAILOR_AIRFLOW_TOKEN)"
    )
    p.add_argument("--dag-id", default="sailor_train", help="the DAG of the run (default: sailor_train)")


def client_from_args(args: Any) -> AirflowClient:
    """The client the options of ``add_connection_options`` describe."""
    password = args.password if args.password is not None else os.environ.get("SAILOR_AIRFLOW_PASSWORD")
    token = args.token or os.environ.get("SAILOR_AIRFLOW_TOKEN")
    return AirflowClient(args.airflow_url, args.username, password, token=token)


TASK_INSTANCES_PAGE = 100
"""Task instances asked for per request (within the API's ``maximum_page_limit``, 100 by default)."""


def exit_code_of(exc: BaseException) -> ExitCode:
    """The ``sailor`` exit status for an error talking to Airflow: refused credentials or params are
    bad input (2); a missing DAG, run or log, or an unreachable server, is not found (3)."""
    if isinstance(exc, AirflowAPIError):
        if exc.status == 404 or exc.status >= 500 or isinstance(exc, NotAirflowAPIError):
            return ExitCode.NOT_FOUND  # no such thing, or no Airflow API (yet) at that URL
        if exc.status in (400, 401, 403, 409, 422):
            return ExitCode.BAD_INPUT
        return ExitCode.FAILED
    if isinstance(exc, ValueError):  # no credentials given
        return ExitCode.BAD_INPUT
    if isinstance(exc, OSError):  # requests' ConnectionError and Timeout are OSErrors
        return ExitCode.NOT_FOUND
    return ExitCode.FAILED
