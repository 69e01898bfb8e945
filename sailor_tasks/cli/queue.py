"""``sailor queue``: the runs waiting in SAILOR's queue, in admission order, with the policy's
reason and the estimated start; ``--all`` adds the ones that left it (admitted, timed out, failed)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sailor_tasks.cli.output import print_json, print_table
from sailor_tasks.errors import ExitCode
from sailor_tasks.settings import Settings

TABLE_COLUMNS = (
    "position",
    "run_id",
    "team",
    "priority",
    "gpus",
    "gpu_type",
    "state",
    "waited_min",
    "estimated_start",
    "latest_start",
    "reason",
)
JSON_FIELDS = (
    "run_id",
    "team",
    "priority",
    "gpus",
    "gpu_type",
    "state",
    "policy",
    "position",
    "reason",
    "enqueued_at",
    "estimated_start_at",
    "deadline_at",
    "latest_start_at",
    "max_wait_until",
    "admitted_at",
    "expected_hours",
    "waited_s",
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("queue", help="runs waiting for capacity: position, policy, reason, estimated start")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--all", action="store_true", help="also the runs that left the queue (admitted, timed out, failed, left)"
    )
    p.set_defaults(func=cmd_queue)


def queue_rows(ledger: Any, include_done: bool = False) -> list[dict[str, Any]]:
    """Queue entries, waiting ones first in admission order, each with ``waited_s``."""
    from sailor_tasks.ledger.store import QUEUE_STATES, utcnow

    now = utcnow()
    states = QUEUE_STATES if include_done else ("queued",)
    rows = []
    for e in ledger.queue_entries(states):
        end = e["admitted_at"] or (now if e["state"] == "queued" else e["updated_at"])
        rows.append(
            {k: e.get(k) for k in JSON_FIELDS if k != "waited_s"}
            | {"waited_s": round((end - e["enqueued_at"]).total_seconds(), 1)}
        )
    rows.sort(key=lambda r: (r["state"] != "queued", r["position"] or 1 << 30, r["enqueued_at"]))
    return rows


def cmd_queue(args: argparse.Namespace) -> int:
    from sailor_tasks.ledger import Ledger

    settings = Settings.from_env()
    ledger = Ledger.for_reading(settings.ledger_url)
    if ledger is None:
        print(f"no ledger at {settings.ledger_url_redacted} yet: no run recorded there", file=sys.stderr)
    rows = queue_rows(ledger, include_done=args.all) if ledger else []
    if args.json:
        print_json({"policy": settings.queue_policy, "entries": rows})
        return ExitCode.OK
    print(f"queue policy: {settings.queue_policy}; {sum(r['state'] == 'queued' for r in rows)} waiting")
    if rows:
        print_table(
            [
                {
                    **r,
                    "waited_min": r["waited_s"] / 60.0,
                    "estimated_start": r["estimated_start_at"],
                    "latest_start": r["latest_start_at"],
                }
                for r in rows
            ],
            TABLE_COLUMNS,
            {"waited_min": ",.1f"},
        )
    return ExitCode.OK
