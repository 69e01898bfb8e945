"""``sailor plan``: place a request against the catalog and the ledger's cluster state."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sailor_tasks.cli.output import load_params, print_json
from sailor_tasks.errors import ExitCode
from sailor_tasks.settings import Settings


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="place a request (JSON file of sailor_train params and/or --set k=v)")
    p.add_argument("request", nargs="?", help="JSON file with sailor_train params")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one param (JSON value)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON: the winner, runners-up, regions and every rejected candidate",
    )
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.errors import SailorError
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.placement import explain, plan
    from sailor_tasks.placement.reservations import ledger_state
    from sailor_tasks.request import from_params

    try:
        params = load_params(args.request, args.set)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    catalog = load_catalog()
    try:
        request = from_params(params, catalog)
        ledger = Ledger(Settings.from_env().ledger_url)
        state = ledger_state(ledger, request, run_id="cli-plan")
        if args.json:  # the whole decision: winner, runners-up, regions, every rejected candidate
            print_json(explain(request, catalog, state, run_id="cli-plan"))
            return ExitCode.OK
        placement = plan(request, catalog, state, run_id="cli-plan")
    except SailorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    print("\n".join(placement.explanation))
    return ExitCode.OK
