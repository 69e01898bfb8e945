"""``sailor logs``: a run's task logs, from Airflow's REST API or from the local log folder."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sailor_tasks.cli.airflow_api import add_connection_options, client_from_args, exit_code_of
from sailor_tasks.cli.argtypes import positive_float, positive_int
from sailor_tasks.errors import ExitCode

TRAIN_TASKS = ("validate", "plan", "place_data", "provision", "train", "finalize", "teardown")
"""``sailor_train``'s tasks in pipeline order (the order logs are shown in)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "logs",
        help="a run's task logs, through Airflow's REST API (--airflow-url) or from the local log folder",
    )
    p.add_argument("run_id", help="the run's id (the Airflow run id; `sailor runs` lists them)")
    p.add_argument("--task", help="only this task (e.g. train); default: every task, in pipeline order")
    p.add_argument(
        "--try", dest="try_number", type=positive_int, help="only this try of each task (default: every try)"
    )
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the run ends")
    p.add_argument(
        "--poll", type=positive_float, default=2.0, help="seconds between reads when following (default 2)"
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        help="stop following after this many seconds (exit status 1; default: never)",
    )
    p.add_argument(
        "--log-folder",
        help="Airflow's base_log_folder (default: $AIRFLOW__LOGGING__BASE_LOG_FOLDER, else "
        "$AIRFLOW_HOME/logs, else ./.airflow/logs when it exists, else ~/airflow/logs)",
    )
    add_connection_options(p, url_default=None)
    # $SAILOR_AIRFLOW_URL applies only without --log-folder (cmd_logs): an explicit folder wins.
    p.set_defaults(func=cmd_logs, airflow_url=None)


@dataclass(frozen=True, order=True)
class TaskTry:
    """One try of one task instance (``map_index`` -1: not a mapped task)."""

    order: int
    task_id: str
    map_index: int
    try_number: int
    triggerer: str = ""
    """The triggerer job whose log of the deferred try this is (local log files: the triggerer
    writes ``attempt=N.log.trigger.<job>.log`` beside the task's; on GKE, the training pods'
    output); empty for the task's own log."""

    @property
    def label(self) -> str:
        mapped = f"[{self.map_index}]" if self.map_index >= 0 else ""
        where = f", triggerer {self.triggerer}" if self.triggerer else ""
        return f"{self.task_id}{mapped} (try {self.try_number}{where})"


def _task_order(task_id: str) -> int:
    return TRAIN_TASKS.index(task_id) if task_id in TRAIN_TASKS else len(TRAIN_TASKS)


class LogSource(Protocol):
    where: str

    def tries(self) -> list[TaskTry]:
        """Every task try that has a log so far, in the order to show them."""

    def lines(self, t: TaskTry) -> list[str]:
        """The try's log lines so far (only complete lines: later reads extend the list)."""

    def done(self) -> bool:
        """Whether the run has ended (nothing more will be logged)."""

    def known(self) -> bool:
        """Whether the run exists (it may have no log yet)."""

    def task_ids(self) -> tuple[str, ...] | None:
        """Every task of the run's DAG, logged or not yet (None: not known here)."""


def base_log_folder(explicit: str | None = None, environ: Any = None) -> str:
    env = os.environ if environ is None else environ
    if explicit:
        return explicit
    if env.get("AIRFLOW__LOGGING__BASE_LOG_FOLDER"):
        return env["AIRFLOW__LOGGING__BASE_LOG_FOLDER"]
    home = env.get("AIRFLOW_HOME")
    if not home:  # this project's `make airflow` uses ./.airflow; Airflow's own default is ~/airflow
        home = ".airflow" if os.path.isdir(".airflow") else os.path.expanduser("~/airflow")
    return os.path.join(home, "logs")


_ATTEMPT = re.compile(r"^attempt=(\d+)\.log(?:\.trigger\.([^/]+)\.log)?$")
_MAP = re.compile(r"^map_index=(\d+)$")


def render_record(line: str) -> str:
    """One line of an Airflow 3 task log file (a JSON record, or plain text) as text."""
    try:
        rec = json.loads(line)
    except ValueError:
        return line
    if not isinstance(rec, dict) or "event" not in rec:
        return line
    ts = str(rec.get("timestamp") or "").replace("T", " ")[:19]
    level = str(rec.get("level") or "").upper()
    logger = rec.get("logger")
    prefix = [f"[{ts}]" if ts else "", f"{level:<7}" if level else "", f"{logger}:" if logger else ""]
    text = " ".join([*(p for p in prefix if p), str(rec["event"])])
    for err in rec.get("error_detail") or ():
        if isinstance(err, dict):
            text += f"\n{err.get('exc_type')}: {err.get('exc_value')}"
    return text


class LocalLogs:
    """Log files Airflow's task runner writes: ``<base>/dag_id=D/run_id=R/task_id=T/[map_index=M/]attempt=N.log``."""

    def __init__(self, folder: str, dag_id: str, run_id: str):
        self.run_dir = os.path.join(folder, f"dag_id={dag_id}", f"run_id={run_id}")
        self.where = self.run_dir
        self.dag_id, self.run_id = dag_id, run_id
        self._ledger: Any = None

    def tries(self) -> list[TaskTry]:
        found = []
        if not os.path.isdir(self.run_dir):
            return []
        for entry in os.listdir(self.run_dir):
            if not entry.startswith("task_id="):
                continue
            task_id, task_dir = entry.removeprefix("task_id="), os.path.join(self.run_dir, entry)
            folders = [(-1, task_dir)] + [
                (int(m.group(1)), os.path.join(task_dir, name))
                for name in os.listdir(task_dir)
                if (m := _MAP.match(name))
            ]
            for map_index, folder in folders:
                for name in os.listdir(folder):
                    if m := _ATTEMPT.match(name):
                        found.append(
                            TaskTry(
                                _task_order(task_id), task_id, map_index, int(m.group(1)), m.group(2) or ""
                            )
                        )
        return sorted(found)

    def path(self, t: TaskTry) -> str:
        parts = [self.run_dir, f"task_id={t.task_id}"]
        if t.map_index >= 0:
            parts.append(f"map_index={t.map_index}")
        trigger = f".trigger.{t.triggerer}.log" if t.triggerer else ""
        return os.path.join(*parts, f"attempt={t.try_number}.log{trigger}")

    def lines(self, t: TaskTry) -> list[str]:
        with open(self.path(t), errors="replace") as f:
            text = f.read()
        complete = text[: text.rfind("\n") + 1]  # a line still being written waits for the next read
        return [render_record(line) for line in complete.splitlines() if line]

    def _ledger_run(self) -> dict[str, Any] | None:
        from sailor_tasks.ledger import Ledger
        from sailor_tasks.settings import Settings

        if self._ledger is None:
            self._ledger = Ledger.for_reading(Settings.from_env().ledger_url) or False
        return self._ledger.get_run(self.run_id) if self._ledger else None

    def known(self) -> bool:
        """The run has a log folder, or (sailor_train) a row in the ledger."""
        return os.path.isdir(self.run_dir) or (
            self.dag_id == "sailor_train" and self._ledger_run() is not None
        )

    def task_ids(self) -> tuple[str, ...] | None:
        return TRAIN_TASKS if self.dag_id == "sailor_train" else None

    def done(self) -> bool:
        """The ledger's status of a sailor_train run is final and teardown has recorded its end in
        the ledger (its log file appears when it starts, long before it has stopped and released
        anything), or the run was rejected at ``validate``, or every try of ``validate`` failed
        before it recorded the run (an error, not a rejection): teardown, whose setups are
        ``validate`` and ``plan``, never runs for such a run."""
        if self.dag_id != "sailor_train":
            return False
        from sailor_tasks.model import RUN_STATUSES_DONE

        run = self._ledger_run()
        if not self._ledger:  # no ledger yet: nothing recorded the run
            return False
        if run is None:
            from sailor_tasks.settings import STAGE_RETRIES

            failed = [
                s for s in self._ledger.stage_timings(self.run_id) if s["stage"] == "validate" and not s["ok"]
            ]
            return len(failed) > STAGE_RETRIES  # a failed try with a retry to come is not the end
        if run["status"] not in RUN_STATUSES_DONE:
            return False
        return run["status"] == "rejected" or any(
            s["stage"] == "teardown" for s in self._ledger.stage_timings(self.run_id)
        )


class ApiLogs:
    """Task logs through Airflow's REST API (the same text as the UI's Logs tab)."""

    def __init__(self, client: Any, dag_id: str, run_id: str):
        self.client, self.dag_id, self.run_id = client, dag_id, run_id
        self.where = f"{client.base_url} (dag {dag_id})"

    def tries(self) -> list[TaskTry]:
        found = []
        for ti in self.client.task_instances(self.dag_id, self.run_id):
            if not ti.get("start_date") or not ti.get("try_number"):
                continue  # not started: no log yet
            for n in range(1, int(ti["try_number"]) + 1):
                found.append(TaskTry(_task_order(ti["task_id"]), ti["task_id"], ti.get("map_index", -1), n))
        return sorted(found)

    def lines(self, t: TaskTry) -> list[str]:
        text = self.client.task_log(self.dag_id, self.run_id, t.task_id, t.try_number, map_index=t.map_index)
        return text.splitlines()

    def done(self) -> bool:
        from sailor_tasks.cli.airflow_api import TERMINAL_RUN_STATES

        return self.client.dag_run(self.dag_id, self.run_id)["state"] in TERMINAL_RUN_STATES

    def known(self) -> bool:
        """The API has the dag run (an unknown one raises its 404)."""
        self.client.dag_run(self.dag_id, self.run_id)
        return True

    def task_ids(self) -> tuple[str, ...] | None:
        """Every task instance of the run, started or not."""
        return tuple({ti["task_id"]: None for ti in self.client.task_instances(self.dag_id, self.run_id)})


def select(tries: Sequence[TaskTry], task: str | None, try_number: int | None) -> list[TaskTry]:
    return [
        t
        for t in tries
        if (task is None or t.task_id == task) and (try_number is None or t.try_number == try_number)
    ]


def print_logs(
    source: LogSource,
    task: str | None = None,
    try_number: int | None = None,
    follow: bool = False,
    poll_s: float = 2.0,
    timeout_s: float | None = None,
    out: Any = None,
) -> ExitCode:
    """Print the selected logs, a ``==> task (try N) <==`` header before each; with ``follow``, keep
    printing new lines (and new tries) until the run has ended."""
    out = out or sys.stdout
    printed: dict[TaskTry, int] = {}
    shown: TaskTry | None = None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        finished = follow and source.done()  # read after: the last lines land before we stop
        for t in select(source.tries(), task, try_number):
            lines = source.lines(t)
            new = lines[printed.get(t, 0) :]
            if not new and t in printed:
                continue
            if shown != t:
                if shown is not None:
                    print(file=out)
                print(f"==> {t.label} <==", file=out)
                shown = t
            for line in new:
                print(line, file=out)
            printed[t] = len(lines)
            out.flush()
        if not follow or finished:
            return ExitCode.OK
        if deadline is not None and time.monotonic() > deadline:
            print(f"stopped following after {timeout_s:.0f} s; the run goes on", file=sys.stderr)
            return ExitCode.FAILED
        time.sleep(poll_s)


RUN_APPEARS_S = 60.0
"""How long ``--follow`` waits for a run it cannot find yet (just triggered: no task has started
and nothing is recorded) before it says there is no such run."""


def _appears(source: LogSource, wait_s: float, poll_s: float) -> bool:
    """Whether the run is known, or becomes known within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while not source.known():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _bad_selection(
    source: LogSource, args: argparse.Namespace, tries: list[TaskTry]
) -> tuple[int, str] | None:
    """(exit status, message) when ``--task`` or ``--try`` cannot select anything, else None.
    Without ``--follow`` they must name logs that exist; with it, a task of the run's DAG (its
    logs may come later)."""
    tasks = sorted({t.task_id for t in tries}, key=_task_order)
    if args.task and args.follow:
        valid = source.task_ids()
        if valid is not None and args.task not in valid:
            return ExitCode.BAD_INPUT, (
                f"--task {args.task!r} is not a task of DAG {args.dag_id}; "
                f"valid: {', '.join(sorted(valid, key=_task_order))}"
            )
    elif args.task and args.task not in tasks:
        return (
            ExitCode.BAD_INPUT,
            f"--task {args.task!r} has no log in run {args.run_id}; valid: {', '.join(tasks)}",
        )
    if args.try_number is not None and not args.follow and not select(tries, args.task, args.try_number):
        have = sorted({t.try_number for t in select(tries, args.task, None)})
        of = f" of task {args.task}" if args.task else ""
        return ExitCode.BAD_INPUT, (
            f"--try {args.try_number} has no log{of} in run {args.run_id}; tries with logs: "
            f"{', '.join(map(str, have))}"
        )
    return None


def cmd_logs(args: argparse.Namespace) -> int:
    source: LogSource
    if args.airflow_url and args.log_folder:
        print(
            f"error: --airflow-url {args.airflow_url} and --log-folder {args.log_folder}: give one "
            "(the API server's logs, or a local log folder)",
            file=sys.stderr,
        )
        return ExitCode.BAD_INPUT
    if not args.airflow_url and not args.log_folder:
        args.airflow_url = os.environ.get("SAILOR_AIRFLOW_URL") or None
    if args.airflow_url:
        source = ApiLogs(client_from_args(args), args.dag_id, args.run_id)
    else:
        source = LocalLogs(base_log_folder(args.log_folder), args.dag_id, args.run_id)
        if args.follow and args.timeout is None and source.task_ids() is None:
            print(
                f"error: --follow cannot tell from the local log folder when a run of DAG {args.dag_id} "
                "ends; give --airflow-url to follow it through the API, or --timeout",
                file=sys.stderr,
            )
            return ExitCode.BAD_INPUT
    try:
        tries = source.tries()
        wait_s = min(RUN_APPEARS_S, args.timeout or RUN_APPEARS_S)
        if not tries and args.follow and not _appears(source, wait_s, args.poll):
            print(
                f"error: no run {args.run_id!r} of DAG {args.dag_id} at {source.where}: no task log, "
                f"nothing recorded after {wait_s:.0f} s",
                file=sys.stderr,
            )
            return ExitCode.NOT_FOUND
        if not tries and not args.follow:
            hint = (
                f" under {source.where}; runs of `airflow dags test` (make demo) print their logs in "
                "the terminal and write none; give --airflow-url to read them from an API server"
                if isinstance(source, LocalLogs)
                else f" at {source.where}"
            )
            print(f"error: no task log of run {args.run_id!r}{hint}", file=sys.stderr)
            return ExitCode.NOT_FOUND
        bad = _bad_selection(source, args, tries)
        if bad is not None:
            print(f"error: {bad[1]}", file=sys.stderr)
            return bad[0]
        return print_logs(source, args.task, args.try_number, args.follow, args.poll, args.timeout)
    except KeyboardInterrupt:  # Ctrl-C: the run goes on; 130, as `sailor --help` says
        print(f"\nstopped reading the logs of run {args.run_id}; the run goes on", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as exc:
        from sailor_tasks.cli.airflow_api import AirflowAPIError

        if not isinstance(exc, AirflowAPIError | ValueError | OSError):
            raise
        print(f"error: logs of run {args.run_id} from {source.where}: {exc}", file=sys.stderr)
        return exit_code_of(exc)
