"""``sailor runs``: list the runs recorded in the ledger, newest first."""

from __future__ import annotations

import argparse
import json
from typing import Any

from sailor_tasks.cli.output import json_default, print_table
from sailor_tasks.errors import ExitCode
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
    p.set_defaults(func=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.ledger.store import RUN_LIST_FIELDS

    ledger = Ledger(Settings.from_env().ledger_url)
    rows = [{k: r[k] for k in RUN_LIST_FIELDS} for r in ledger.list_runs(limit=args.limit)]
    if args.json:
        print(json.dumps(rows, indent=2, default=json_default))
    else:
        print_table(
            [{**r, "created": r["created_at"], "usd": r["usd_estimate"]} for r in rows], TABLE_COLUMNS
        )
    return ExitCode.OK
