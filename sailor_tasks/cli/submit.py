"""``sailor submit``: trigger a DAG run through Airflow's REST API and follow it to the end."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

from sailor_tasks.cli.airflow_api import add_connection_options, client_from_args, exit_code_of
from sailor_tasks.cli.argtypes import positive_float
from sailor_tasks.cli.output import load_params
from sailor_tasks.errors import ExitCode


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "submit",
        help="trigger sailor_train through Airflow's REST API with params from a JSON file and/or --set; "
        "follow the run",
    )
    p.add_argument("params", nargs="?", help="JSON file with sailor_train params (the run's conf)")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override one param (JSON value), after the file"
    )
    add_connection_options(p)
    p.add_argument("--note", help="a note shown on the dag run in the UI")
    p.add_argument(
        "--unpause", action="store_true", help="unpause the DAG when it is paused (else: stop and say so)"
    )
    p.add_argument("--no-wait", action="store_true", help="print the run id and return")
    p.add_argument("--no-check", action="store_true", help="skip the local params check")
    p.add_argument(
        "--timeout", type=positive_float, default=24 * 3600.0, help="seconds to follow the run (default 86400)"
    )
    p.add_argument("--poll", type=positive_float, default=5.0, help="seconds between state checks (default 5)")
    p.set_defaults(func=cmd_submit)


def next_steps(run_id: str, dag_id: str = "sailor_train", airflow_url: str | None = None) -> str:
    """The commands to follow, see and cancel a run (printed after it is started), with the DAG
    and, when given, the Airflow API server the run was started through (its logs are read there:
    a deployment's log folder may not be on this machine)."""
    dag = "" if dag_id == "sailor_train" else f" --dag-id {dag_id}"
    api = f" --airflow-url {shlex.quote(airflow_url)}" if airflow_url else ""
    lines = [f"Follow its logs:  sailor logs {shlex.quote(run_id)} --follow{dag}{api}"]
    if dag_id == "sailor_train":  # the ledger records sailor_train runs only
        lines.append(f"See the run:      sailor show {shlex.quote(run_id)}")
    lines.append(f"Cancel it:        sailor cancel {shlex.quote(run_id)}{dag}{api}")
    return "\n".join(lines)


def paused_message(dag_id: str, url: str) -> str:
    return (
        f"DAG {dag_id} is paused at {url}: a run triggered now would wait until it is unpaused. "
        f"Unpause it with `sailor submit ... --unpause`, the toggle on the DAG's page in the UI, "
        f"or `airflow dags unpause {dag_id}`."
    )


def _planning_table() -> tuple[Any, str]:
    """The speeds ``validate`` judges a deadline on, as far as this machine can tell: the packaged
    table with the speeds the ledger of this machine's settings measured (read, never made or
    upgraded), else the packaged table alone; and which it is, in words."""
    from sqlalchemy.exc import SQLAlchemyError

    from sailor_tasks.catalog.throughput import load_packaged, packaged_with_measured
    from sailor_tasks.errors import SailorError
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.settings import Settings

    try:
        ledger = Ledger.for_reading(Settings.from_env().ledger_url)
    except (SailorError, SQLAlchemyError, OSError):  # not readable from here: validate judges alone
        ledger = None
    if ledger is None:
        return load_packaged(), "at the packaged speeds: no ledger is readable here"
    try:
        return packaged_with_measured(tuple(ledger.measured_throughputs())), "at the speeds the ledger measured"
    finally:
        ledger.dispose()


def cmd_submit(args: argparse.Namespace) -> int:
    """Trigger ``sailor_train`` through Airflow's REST API with params from a JSON file and ``--set``
    overrides; follow it."""
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.cli.airflow_api import AirflowAPIError, run_completed, task_states
    from sailor_tasks.errors import CatalogError, InvalidRequestError, InvalidRequestErrors
    from sailor_tasks.placement import catalog_errors
    from sailor_tasks.request import from_params
    from sailor_tasks.strategies.live import as_planned

    if not args.params and not args.set:
        print("error: give a params JSON file, --set KEY=VALUE overrides, or both", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        params = load_params(args.params, args.set)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if args.dag_id == "sailor_train" and not args.no_check:
        try:  # the same checks validate runs, minus the dataset lookup: fail here, before Airflow
            catalog = load_catalog()
            req = from_params(params, catalog)
            table, speeds = _planning_table()
            errors = catalog_errors(as_planned(req), catalog, table)
            if errors:
                raise InvalidRequestErrors(
                    [
                        InvalidRequestError(
                            e.field, e.value, f"{e.reason} ({speeds}; --no-check skips this check)", e.valid
                        )
                        if e.field == "deadline_hours"
                        else e
                        for e in errors
                    ]
                )
        except InvalidRequestError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return ExitCode.BAD_INPUT
        except CatalogError as exc:
            print(f"error: the catalog cannot be loaded: {exc} (--no-check skips this check)", file=sys.stderr)
            return ExitCode.BAD_INPUT
    client = client_from_args(args)
    try:
        paused = bool(client.get_dag(args.dag_id).get("is_paused"))
        if paused and not args.unpause:
            print(f"error: {paused_message(args.dag_id, args.airflow_url)}", file=sys.stderr)
            return ExitCode.FAILED
        # Triggered first (the run waits while the DAG is paused), unpaused after: params Airflow
        # refuses leave the DAG paused, not running its schedule.
        run = client.trigger(args.dag_id, params, note=args.note)
    except (AirflowAPIError, ValueError, OSError) as exc:
        where = f"Airflow at {args.airflow_url}"
        print(f"error: {where}: {exc}", file=sys.stderr)
        return exit_code_of(exc)
    run_id = run["dag_run_id"]
    print(run_id, flush=True)  # the run exists: its id is shown whatever comes next
    print(f"{args.airflow_url.rstrip('/')}/dags/{args.dag_id}/runs/{run_id}", file=sys.stderr)
    print(next_steps(run_id, args.dag_id, args.airflow_url), file=sys.stderr, flush=True)
    if paused:
        try:
            client.unpause(args.dag_id)
        except (AirflowAPIError, ValueError, OSError) as exc:
            print(
                f"error: run {run_id} was created but waits: DAG {args.dag_id} is still paused "
                f"(unpausing it failed: Airflow at {args.airflow_url}: {exc}). Unpause the DAG with "
                f"the toggle on its page in the UI or `airflow dags unpause {args.dag_id}` (a new "
                f"submit would start a second run), or cancel the run: "
                f"`sailor cancel {run_id}{'' if args.dag_id == 'sailor_train' else ' --dag-id ' + args.dag_id}`",
                file=sys.stderr,
            )
            return exit_code_of(exc)
        print(f"unpaused DAG {args.dag_id}", file=sys.stderr)
    if args.no_wait:
        return ExitCode.OK

    last_tasks: dict[str, str] = {}

    def report(state: str, tasks: dict[str, str]) -> None:
        last_tasks.clear()
        last_tasks.update(tasks)
        shown = "  ".join(f"{t}={s}" for t, s in tasks.items())
        print(f"[{time.strftime('%H:%M:%S')}] run {state}: {shown}", file=sys.stderr, flush=True)

    goes_on = f"the run goes on:\n{next_steps(run_id, args.dag_id, args.airflow_url)}"
    try:
        state = client.wait(args.dag_id, run_id, timeout_s=args.timeout, poll_s=args.poll, on_change=report)
    except TimeoutError as exc:
        print(f"error: {exc}; {goes_on}", file=sys.stderr)
        return ExitCode.FAILED
    except (AirflowAPIError, OSError) as exc:
        print(f"error: following run {run_id}: {exc}; {goes_on}", file=sys.stderr)
        return exit_code_of(exc)
    except KeyboardInterrupt:
        print(f"\nstopped following run {run_id}; {goes_on}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    if state == "success":
        # A cancelled run ends "success" once its teardown does (the tasks the cancel skipped
        # count as done): it succeeded only if its work completed.
        try:  # the states the last poll reported, else read now
            tasks = last_tasks or task_states(client, args.dag_id, run_id)
        except (AirflowAPIError, OSError) as exc:
            print(f"error: reading the tasks of run {run_id}: {exc}", file=sys.stderr)
            return exit_code_of(exc)
        # Only a teardown (or finalize) makes a cancelled run end "success": in a DAG without
        # one, a cancel ends it failed, and tasks its own branches skip (a dry run's) are done.
        if ("finalize" in tasks or "teardown" in tasks) and not run_completed(tasks):
            print(f"run {run_id} was cancelled (its work did not complete)", file=sys.stderr)
            state = "cancelled"
    print(state, flush=True)
    if state == "success" and args.dag_id == "sailor_train":
        try:
            summary = client.xcom(args.dag_id, run_id, "finalize")
            print(summary.get("summary_md", ""), file=sys.stderr)
        except (AirflowAPIError, OSError):
            pass
    return ExitCode.OK if state == "success" else ExitCode.FAILED
