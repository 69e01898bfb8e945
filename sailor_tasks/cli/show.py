"""``sailor show``: one run from the ledger and its folders: placement and why, attempts, data,
checkpoints, cost and summary."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sailor_tasks.cli.output import format_table, print_json
from sailor_tasks.errors import ExitCode

ATTEMPT_COLUMNS = ("attempt", "try", "zone", "gpu", "market", "$/h", "hours", "usd", "outcome", "why")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "show",
        help="one run: placement and why, attempts (market, zone, cost), data, checkpoints, summary",
    )
    p.add_argument("run_id", help="the run's id (the Airflow run id; `sailor runs` lists them)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_show)


def not_found_message(ctx: Any, run_id: str) -> str:
    """The error for a run the ledger does not have; the ledger's URL without its password."""
    recent = [r["run_id"] for r in ctx.ledger.list_runs(limit=5)]
    hint = f"recent runs: {', '.join(recent)}" if recent else "the ledger has no run yet"
    where = ctx.settings.ledger_url_redacted
    return f"no run {run_id!r} in the ledger {where}; {hint} (`sailor runs` lists them)"


def cmd_show(args: argparse.Namespace) -> int:
    from sailor_tasks.cli.submit import next_steps
    from sailor_tasks.settings import Settings
    from sailor_tasks.stages import StageContext
    from sailor_tasks.stages.summary import run_report

    settings = Settings.from_env()
    ctx = StageContext.for_reading(settings)
    if ctx is None:
        print(
            f"error: no run {args.run_id!r}: there is no ledger at {settings.ledger_url_redacted} yet",
            file=sys.stderr,
        )
        return ExitCode.NOT_FOUND
    report = run_report(ctx, args.run_id)
    if report is None:
        print(f"error: {not_found_message(ctx, args.run_id)}", file=sys.stderr)
        return ExitCode.NOT_FOUND
    if args.json:
        print_json(report)
        return ExitCode.OK
    print(render_report(report))
    print()
    print(next_steps(args.run_id))
    return ExitCode.OK


def _usd(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"${v:.{digits}f}"


def render_report(r: dict[str, Any]) -> str:
    """``run_report`` as text, a section per part."""
    run, req = r["run"], r["request"] or {}
    created = run["created_at"].strftime("%Y-%m-%d %H:%M:%S") if run["created_at"] else "-"
    lines = [
        f"Run          {run['run_id']}",
        f"Job          {run['job_name']} (team {run['team']}), backend {run['backend']}, model {run['model']}",
        f"Status       {run['status']} (created {created})",
    ]
    if run.get("error"):
        lines.append(f"Error        {run['error']}")
    if run["region"]:
        lines.append(
            f"Placed in    {run['region']} / {run['zone']}: {run['num_gpus']}x {run['gpu_type']} "
            f"({run['market']}) at {_usd(run['usd_per_hour'], 2)}/h"
        )
    for p in r["placements"]:
        lines.append(
            f"  plan for attempt {p['attempt']}: {p['zone']} {p['num_gpus']}x {p['gpu_type']} {p['market']}"
            + (f" (assignment v{p['assignment_version']})" if p["assignment_version"] else "")
        )
        lines += [f"    why  {line}" for line in p["explanation"]]
    if r["attempts"]:
        lines.append("Attempts")
    text = _attempt_table(r["attempts"])
    lines += [f"  {line}" for line in text]
    for a in r["attempts"]:
        p = a["preemption"]
        if p:
            lost = "" if p["steps_lost"] is None else f", {p['steps_lost']} steps lost"
            back = "" if p["recovery_s"] is None else f", training again {p['recovery_s']:.1f} s later"
            lines.append(
                f"  attempt {a['attempt']} preempted {'with' if p['noticed'] else 'without'} notice "
                f"at step {p['step']}{lost}{back}"
            )
    for d in r["data"]:
        lines.append(
            f"Data placed  {d.get('data_uri')} ({d.get('bytes', 0) / 1e6:.1f} MB, {d.get('files', '?')} files; "
            f"{d.get('bytes_copied', 0) / 1e6:.1f} MB copied in {d.get('seconds', 0):.2f} s)"
        )
    if r["replicas"]:
        lines.append(f"Replicas     {run['dataset_uri']} in {', '.join(r['replicas'])}")
    if run["steps"] is not None:
        loss = ""
        if run["initial_loss"] is not None and run["final_loss"] is not None:
            loss = f"; eval loss {run['initial_loss']:.3f} -> {run['final_loss']:.3f}"
        lines.append(
            f"Training     {run['steps']}/{run['total_steps'] or req.get('total_steps', '?')} steps{loss}"
        )
    for c in r["checkpoints"]:
        steps = c["steps"]
        shown = ", ".join(map(str, steps[-5:]))
        lines.append(f"Checkpoints  {c['root']}: committed steps {shown}")
    if not r["checkpoints"]:
        lines.append("Checkpoints  none committed")
    lines.append(
        f"Cost         {_usd(run['usd_estimate'])} estimated (price x training wall time, every attempt); "
        f"attempts {_usd(r['usd_attempts'])}"
    )
    if r["summary_md"]:
        lines += [f"Summary      {r['summary_uri']}", ""]
        lines += [f"  {line}" if line else "" for line in r["summary_md"].rstrip().splitlines()]
    return "\n".join(lines)


def _attempt_table(attempts: list[dict[str, Any]]) -> list[str]:
    rows = [
        {
            "attempt": a["attempt"],
            "try": a["try_number"],
            "zone": a["zone"],
            "gpu": a["gpu_type"],
            "market": a["market"],
            "$/h": a["usd_per_hour"],
            "hours": a["hours"],
            "usd": a["usd"],
            "outcome": a["outcome"],
            "why": a["why"],
        }
        for a in attempts
    ]
    return format_table(rows, ATTEMPT_COLUMNS) if rows else []
