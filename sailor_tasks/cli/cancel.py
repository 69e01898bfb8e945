"""``sailor cancel``: stop a run by marking its Airflow dag run failed through the REST API."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sailor_tasks.cli.airflow_api import add_connection_options, client_from_args, exit_code_of
from sailor_tasks.cli.argtypes import positive_float
from sailor_tasks.errors import ExitCode


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cancel",
        help="stop a run: mark its dag run failed (train stops its workers or pods; teardown releases capacity)",
    )
    p.add_argument("run_id", help="the run's id (the Airflow run id; `sailor runs` lists them)")
    add_connection_options(p)
    p.add_argument(
        "--no-wait", action="store_true", help="return once the run is marked, before teardown ends"
    )
    p.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds to wait for teardown to end (default 600)"
    )
    p.add_argument("--poll", type=positive_float, default=2.0, help="seconds between state checks (default 2)")
    p.set_defaults(func=cmd_cancel)


def cmd_cancel(args: argparse.Namespace) -> int:
    from sailor_tasks.cli.airflow_api import TERMINAL_RUN_STATES, AirflowAPIError, run_completed, task_states

    client = client_from_args(args)

    def tasks() -> dict[str, str]:
        return task_states(client, args.dag_id, args.run_id)

    try:
        state = client.dag_run(args.dag_id, args.run_id)["state"]
        if state in TERMINAL_RUN_STATES:
            print(f"run {args.run_id} already ended ({state}); nothing to cancel", file=sys.stderr)
            return ExitCode.OK
        if run_completed(tasks()):  # only its teardown is left: marking it failed would undo a success
            print(f"run {args.run_id} already completed its work; nothing to cancel", file=sys.stderr)
            return ExitCode.OK
        client.set_run_state(args.dag_id, args.run_id, "failed")
        print(
            f"run {args.run_id} marked failed: its running tasks are stopped (train stops every worker "
            "process or pod it started); teardown releases the capacity",
            file=sys.stderr,
            flush=True,
        )
        if args.no_wait:
            return ExitCode.OK
        state = client.wait(args.dag_id, args.run_id, timeout_s=args.timeout, poll_s=args.poll)
        if state != "failed" and run_completed(tasks()):
            # It completed before the mark reached its tasks: a success, left as it is.
            print(f"run {args.run_id} completed before the cancel reached it", file=sys.stderr)
        elif state != "failed":
            # Marking a run failed skips its tasks that had not started; when teardown then ends,
            # Airflow judges the run by those skipped leaves and calls it a success. Now that no
            # teardown is pending, marking it failed sets the run's state itself.
            client.set_run_state(args.dag_id, args.run_id, "failed")
            state = client.dag_run(args.dag_id, args.run_id)["state"]
    except TimeoutError as exc:
        print(f"error: {exc}; teardown has not ended", file=sys.stderr)
        return ExitCode.FAILED
    except (AirflowAPIError, ValueError, OSError) as exc:
        what = (
            f"no run {args.run_id!r} of DAG {args.dag_id} at {args.airflow_url}"
            if isinstance(exc, AirflowAPIError) and exc.status == 404
            else f"Airflow at {args.airflow_url}: {exc}"
        )
        print(f"error: {what}", file=sys.stderr)
        return exit_code_of(exc)
    print(state)
    return ExitCode.OK
