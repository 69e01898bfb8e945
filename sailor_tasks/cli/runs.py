"""``sailor runs``: list the runs recorded in the ledger."""

from __future__ import annotations

import argparse
import json
from typing import Any

from sailor_tasks.cli.output import json_default, print_table
from sailor_tasks.settings import Settings


def add_parser(sub: Any) -> None:
    p = sub.add_parser("runs", help="list runs recorded in the ledger")
    p.add_argument("--json", action="store_true")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.ledger.store import RUN_LIST_FIELDS

    ledger = Ledger(Settings.from_env().ledger_url)
    runs = ledger.list_runs(limit=args.limit)
    rows = [{k: r[k] for k in RUN_LIST_FIELDS} for r in runs]
    if args.json:
        print(json.dumps(rows, indent=2, default=json_default))
    else:
        print_table(rows, RUN_LIST_FIELDS)
    return 0
