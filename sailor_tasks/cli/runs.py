"""``sailor runs``: list the runs recorded in the ledger, newest first."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sailor_tasks.cli.output import print_json, print_table
from sailor_tasks.errors import ExitCode
from sailor_tasks.model import RUN_STATUSES
from sailor_tasks.settings import Settings

TABLE_COLUMNS = (
    "run_id",
    "job_name",
    "team",
    "created",
    "status",
    "region",
    "gpu_type",
    "market",
    "steps",
    "usd",
)
"""The table's columns; ``--json`` prints every field of ``RUN_LIST_FIELDS``."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("runs", help="list runs recorded in the ledger, newest first")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--limit", type=int, default=50, help="at most this many runs (default 50)")
    p.add_argument("--team", help="only the runs of this team")
    p.add_argument(
        "--status",
        action="append",
        metavar="STATUS",
        help=f"only runs in this status (repeatable, or comma-separated); one of: {', '.join(RUN_STATUSES)}",
    )
    p.set_defaults(func=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.ledger.store import RUN_LIST_FIELDS

    statuses = None
    if args.status:
        statuses = [s.strip() for item in args.status for s in item.split(",") if s.strip()]
        bad = [s for s in statuses if s not in RUN_STATUSES]
        if bad or not statuses:
            print(
                f"error: --status {', '.join(bad) or repr('')} is not a run status; valid: {', '.join(RUN_STATUSES)}",
                file=sys.stderr,
            )
            return ExitCode.BAD_INPUT
    if args.limit < 1:
        print(f"error: --limit {args.limit} must be at least 1", file=sys.stderr)
        return ExitCode.BAD_INPUT
    settings = Settings.from_env()
    ledger = Ledger.for_reading(settings.ledger_url)
    if ledger is None:
        print(f"no ledger at {settings.ledger_url_redacted} yet: no run recorded there", file=sys.stderr)
    found = ledger.list_runs(limit=args.limit, team=args.team, status=statuses) if ledger else []
    rows = [{k: r[k] for k in RUN_LIST_FIELDS} for r in found]
    if args.json:
        print_json(rows)
    else:
        print_table(
            [{**r, "created": r["created_at"], "usd": r["usd_estimate"]} for r in rows],
            TABLE_COLUMNS,
            {"usd": ",.2f"},
        )
    return ExitCode.OK
