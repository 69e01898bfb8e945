"""``sailor submit``: trigger a DAG run through Airflow's REST API and follow it to the end."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "submit",
        help="trigger sailor_train through Airflow's REST API with params from a JSON file; follow the run",
    )
    p.add_argument("params", help="JSON file with sailor_train params (the run's conf)")
    p.add_argument("--airflow-url", default=os.environ.get("SAILOR_AIRFLOW_URL", "http://localhost:8080"))
    p.add_argument("--username", default=os.environ.get("SAILOR_AIRFLOW_USERNAME", "admin"))
    p.add_argument("--password", help="default: $SAILOR_AIRFLOW_PASSWORD")
    p.add_argument("--token", help="an access token instead of username/password ($SAILOR_AIRFLOW_TOKEN)")
    p.add_argument("--dag-id", default="sailor_train")
    p.add_argument("--note", help="a note shown on the dag run in the UI")
    p.add_argument("--no-wait", action="store_true", help="print the run id and return")
    p.add_argument("--no-check", action="store_true", help="skip the local params check")
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds to follow the run")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between state checks")
    p.set_defaults(func=cmd_submit)


def cmd_submit(args: argparse.Namespace) -> int:
    """Trigger ``sailor_train`` through Airflow's REST API with params from a JSON file; follow it."""
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.cli.airflow_api import AirflowAPIError, AirflowClient
    from sailor_tasks.errors import InvalidRequestError
    from sailor_tasks.request import from_params

    try:
        with open(args.params) as f:
            params = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: cannot read params from {args.params}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(params, dict):
        print(f"error: {args.params} must hold a JSON object of sailor_train params", file=sys.stderr)
        return 2
    if args.dag_id == "sailor_train" and not args.no_check:
        try:  # the same checks validate runs, minus the dataset lookup: fail here, before Airflow
            from_params(params, load_catalog())
        except InvalidRequestError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    password = args.password if args.password is not None else os.environ.get("SAILOR_AIRFLOW_PASSWORD")
    client = AirflowClient(
        args.airflow_url, args.username, password, token=args.token or os.environ.get("SAILOR_AIRFLOW_TOKEN")
    )
    try:
        run = client.trigger(args.dag_id, params, note=args.note)
    except (AirflowAPIError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot reach Airflow at {args.airflow_url}: {exc}", file=sys.stderr)
        return 2
    run_id = run["dag_run_id"]
    print(run_id, flush=True)
    print(f"{args.airflow_url.rstrip('/')}/dags/{args.dag_id}/runs/{run_id}", file=sys.stderr, flush=True)
    if args.no_wait:
        return 0

    def report(state: str, tasks: dict[str, str]) -> None:
        shown = "  ".join(f"{t}={s}" for t, s in tasks.items())
        print(f"[{time.strftime('%H:%M:%S')}] run {state}: {shown}", file=sys.stderr, flush=True)

    try:
        state = client.wait(args.dag_id, run_id, timeout_s=args.timeout, poll_s=args.poll, on_change=report)
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(state, flush=True)
    if state == "success" and args.dag_id == "sailor_train":
        try:
            summary = client.xcom(args.dag_id, run_id, "finalize")
            print(summary.get("summary_md", ""), file=sys.stderr)
        except AirflowAPIError:
            pass
    return 0 if state == "success" else 1
