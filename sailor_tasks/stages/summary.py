"""The run summary: markdown written next to the checkpoints, and each attempt's story from the ledger."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sailor_tasks import paths, storage
from sailor_tasks.stages.context import StageContext
from sailor_tasks.train.checkpoint.store import CheckpointStore

JSON = dict[str, Any]


def describe_attempts(ctx: StageContext, run_id: str) -> list[str]:
    pre = {p["attempt"]: p for p in ctx.ledger.preemptions(run_id, limit=10_000)}
    lines = []
    for a in ctx.ledger.attempts(run_id):
        p = pre.get(a["attempt"])
        what = a["outcome"]
        if p:
            lost = "steps lost unknown" if p["steps_lost"] is None else f"{p['steps_lost']} steps lost"
            what = f"preempted {'with' if p['noticed'] else 'without'} notice at step {p['step']} ({lost})"
        resumed = a["resumed_from_step"]
        if resumed is not None:
            start = f"resumed from step {resumed}"
        else:  # a command that writes no progress file says no step
            start = "from scratch" if a["attempt"] == 1 else "resume step not reported"
        lines.append(
            f"attempt {a['attempt']} (try {a['try_number']}): {a['region']}/{a['zone']} "
            f"{a['placement'].get('market', '?')}, {start}: {what}"
        )
    return lines


def attempt_markets(ctx: StageContext, run_id: str) -> list[JSON]:
    """Per attempt: the market used, why, the slack left at the decision and the attempt's cost."""
    return [
        {
            "attempt": m["attempt"],
            "strategy": m["strategy"],
            "market": m["market"],
            "why": m["reason"],
            "slack_h": None if m["slack_h"] is None else round(m["slack_h"], 4),
            "hours": None if m["hours"] is None else round(m["hours"], 6),
            "usd": m["usd"],
        }
        for m in ctx.ledger.attempt_markets(run_id)
    ]


def queue_wait(ctx: StageContext, run_id: str) -> JSON | None:
    """How long the run waited in SAILOR's queue before admission, its position and the policy's
    reason (None: it fitted at once)."""
    e = ctx.ledger.queue_entry(run_id)
    if e is None:
        return None
    end = e["admitted_at"] or e["updated_at"]
    return {
        "state": e["state"],
        "policy": e["policy"],
        "wait_s": round((end - e["enqueued_at"]).total_seconds(), 1),
        "reason": e["reason"],
    }


def _loss_change(initial: float, final: float) -> str:
    """How the eval loss moved, in words; none where a loss is not a finite number (a diverged
    run) or the first is 0."""
    if not (math.isfinite(initial) and math.isfinite(final)) or initial == 0:
        return "change n/a"
    change = (final / initial - 1) * 100
    return f"{abs(change):.0f}% {'lower' if change <= 0 else 'higher'}"


def render_summary(s: Mapping[str, Any]) -> str:
    if s.get("final_loss") is not None and s.get("initial_loss") is not None:
        change = _loss_change(s["initial_loss"], s["final_loss"])
        losses = f"eval loss {s['initial_loss']:.3f} → {s['final_loss']:.3f} ({change})"
    else:  # the run's own command: SAILOR knows its steps and checkpoints, not its losses
        losses = f"command `{' '.join(s.get('command') or [])}`"
    rate = f"{s['samples_per_s']:.0f} samples/s" if s.get("samples_per_s") is not None else "own command"
    attempts = len(s.get("attempts") or ()) or 1
    trained = (
        f"{s['steps']} steps in {s['train_wall_s']:.1f} s ({rate})"
        if attempts == 1
        else f"{s['steps']} steps over {attempts} attempts, the last {s['train_wall_s']:.1f} s ({rate})"
    )
    lines = [
        f"# SAILOR run `{s['run_id']}`",
        "",
        f"- **Job**: {s['job_name']} (team {s['team']}), status **{s['status']}**",
        "- **Queue**: "
        + (
            "none (it fitted at once)"
            if not s.get("queue")
            else f"waited {s['queue']['wait_s']:.1f} s ({s['queue']['policy']}; {s['queue']['state']})"
        ),
        f"- **Placed in** {s['region']} / {s['zone']}: {s['num_gpus']}x {s['gpu_type']} on {s['market']} "
        f"at ${s['usd_per_hour']:.2f}/h",
        f"- **Why**: {s['why'][0] if s['why'] else '-'}",
        f"- **Data**: {s['data_bytes'] / 1e6:.1f} MB at {s['data_uri']}",
        f"- **Training**: {trained}; {losses}",
        f"- **Checkpoint**: {s['checkpoint_uri'] or 'none (the command saved no checkpoint)'}",
        f"- **Estimated cost**: ${s['usd_estimate']:.4f} (each attempt's price × its training wall time)",
    ]
    if s.get("markets"):
        lines.append(
            f"- **Market per attempt** (strategy {s.get('strategy', '?')}, all attempts ${s['usd_attempts']:.4f}):"
        )
        for m in s["markets"]:
            slack = "no deadline" if m["slack_h"] is None else f"{m['slack_h']:.3g} h slack"
            cost = "?" if m["usd"] is None else f"${m['usd']:.4f}"
            lines.append(f"  - attempt {m['attempt']}: {m['market']}, {cost}, {slack}: {m['why']}")
    if len(s.get("attempts") or ()) > 1:
        preempted = sum(1 for a in s["attempts"] if ": preempted " in a)  # describe_attempts' lines
        recovered = f", recovered from {preempted} preemption{'s' * (preempted != 1)}" if preempted else ""
        lines.append(f"- **Attempts**: {len(s['attempts'])}{recovered}")
        lines += [f"  - {a}" for a in s["attempts"]]
    return "\n".join(lines) + "\n"


def run_report(ctx: StageContext, run_id: str) -> JSON | None:
    """Everything the ledger and the run's folders know about one run (``sailor show``), or None
    when the ledger has no such run.

    Keys: ``run`` (the ledger row without its request), ``request`` (the params as validated),
    ``placements`` (each plan, oldest first, with its rule-by-rule ``explanation``), ``attempts``
    (zone, market, why, price, hours, cost, outcome, preemption), ``data`` (each distinct placed
    copy), ``replicas`` (regions holding the dataset), ``checkpoints`` (committed step folders per
    run folder, and the ones the ledger recorded), ``usd_attempts``, ``summary_uri`` and
    ``summary_md`` (the run summary, when ``finalize`` wrote it).
    """
    ledger = ctx.ledger
    run = ledger.get_run(run_id)
    if run is None:
        return None
    markets = {m["attempt"]: m for m in ledger.attempt_markets(run_id)}
    preempted = {p["attempt"]: p for p in ledger.preemptions(run_id, limit=10_000)}
    attempts = []
    for a in ledger.attempts(run_id):
        m = markets.get(a["attempt"], {})
        p = preempted.get(a["attempt"])
        attempts.append(
            {
                "attempt": a["attempt"],
                "try_number": a["try_number"],
                "region": a["region"],
                "zone": a["zone"],
                "gpu_type": a["placement"].get("gpu_type"),
                "market": m.get("market") or a["placement"].get("market"),
                "strategy": m.get("strategy"),
                "why": m.get("reason"),
                "usd_per_hour": m.get("usd_per_hour") or a["placement"].get("usd_per_hour"),
                "hours": m.get("hours"),
                "usd": m.get("usd"),
                "started_at": a["started_at"],
                "ended_at": a["ended_at"],
                "outcome": a["outcome"],
                "resumed_from_step": a["resumed_from_step"],
                "step": a["step"],
                "preemption": None
                if p is None
                else {k: p[k] for k in ("at", "noticed", "step", "steps_lost", "recovery_s")},
            }
        )
    data = []
    for a in ledger.attempts(run_id):
        if a["data"] and a["data"] not in data:
            data.append(a["data"])
    regions = list(
        dict.fromkeys([a["region"] for a in attempts] + ([run["region"]] if run["region"] else []))
    )
    checkpoints = []
    for region in regions:
        root = paths.checkpoint_uri(ctx.run_uri(region, run_id))
        try:
            steps = CheckpointStore(root, recycle=False).committed_steps()
        except OSError:
            steps = []
        if steps:
            checkpoints.append({"region": region, "root": root, "steps": steps})
    summary_uri = paths.summary_uri(ctx.run_uri(run["region"], run_id)) if run["region"] else None
    summary_md = None
    if summary_uri and storage.exists(summary_uri):
        summary_md = storage.read_bytes(summary_uri).decode()
    return {
        "run": {k: v for k, v in run.items() if k != "request"},
        "request": run["request"],
        "placements": list(reversed(ledger.placements(run_id))),
        "attempts": attempts,
        "data": data,
        "replicas": list(ledger.replicas([run["dataset_uri"]]).get(run["dataset_uri"], ())),
        "checkpoints": checkpoints,
        "recorded_checkpoints": ledger.checkpoints(run_id),
        "usd_attempts": sum(a["usd"] or 0.0 for a in attempts),
        "summary_uri": summary_md and summary_uri,
        "summary_md": summary_md,
    }
