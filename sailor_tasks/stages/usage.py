"""What an attempt used and cost, recorded for one that no try ended itself (its try died, the run
was stopped from outside, its lease was reclaimed): imported by the attempt stages and the
reconciler alike; and the attempt's launch report (``launch.json`` in its run folder), which says
how far it got and how it ended."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from sailor_tasks import paths, storage
from sailor_tasks.ledger.store import aware, utcnow
from sailor_tasks.stages.context import StageContext

logger = logging.getLogger(__name__)


def attempt_run_uri(ctx: StageContext, run_id: str, row: Mapping[str, Any]) -> str:
    """The run folder of the attempt ``row`` (a ``run_attempts`` row): its placement's region's."""
    return ctx.run_uri((row["placement"] or {}).get("region") or row["region"], run_id)


def launch_report(run_uri: str) -> dict[str, Any]:
    """The launch report in the run folder ``run_uri``; empty when there is none."""
    uri = paths.launch_report_uri(run_uri)
    return storage.read_json(uri) if storage.exists(uri) else {}


def update_launch_report(run_uri: str, changes: Mapping[str, Any]) -> None:
    """Write ``changes`` into the launch report in the run folder ``run_uri``."""
    storage.write_json(paths.launch_report_uri(run_uri), {**launch_report(run_uri), **changes})


def end_unreported_attempt(
    ctx: StageContext, run_id: str, row: Mapping[str, Any], outcome: str, detail: str
) -> bool:
    """End ``row``, an attempt still recorded as running that no try will end any more (its try
    died, the run was stopped from outside, its lease was reclaimed), as ``outcome``, and record
    what it used and cost as ``finish_attempt`` does: from its start to the end its launch report
    gives, else now. False when another process ended it meanwhile (nothing recorded)."""
    if not ctx.ledger.end_attempt(run_id, row["attempt"], outcome, if_running=True, detail=detail):
        return False
    pl: Mapping[str, Any] = row["placement"] or {}
    region = pl.get("region") or row["region"]
    started = aware(row["started_at"])
    ended = utcnow()
    try:
        report = launch_report(attempt_run_uri(ctx, run_id, row))
        if report.get("ended_at"):
            ended = dt.datetime.fromtimestamp(report["ended_at"], dt.UTC)
    except (OSError, ValueError) as exc:  # its folder unreadable: up to now
        logger.warning("run %s: launch report of attempt %d unreadable (%s)", run_id, row["attempt"], exc)
    ended = max(ended, started)
    run = ctx.ledger.get_run(run_id) or {}
    strategy = str((run.get("request") or {}).get("strategy") or "?")
    gpus = int(pl.get("num_gpus") or 0)
    ctx.ledger.record_utilization(
        run_id, run.get("team") or "?", region, pl.get("gpu_type") or "?", gpus, started, ended
    )
    if pl.get("usd_per_hour") is not None:  # a placement recorded whole (always, from a plan)
        hours = (ended - started).total_seconds() / 3600.0
        usd_per_hour, market = float(pl["usd_per_hour"]), str(pl.get("market") or "?")
        ctx.ledger.end_attempt_market(run_id, row["attempt"], hours, usd_per_hour, market, strategy)
    return True
