"""The run summary: markdown written next to the checkpoints, and each attempt's story from the ledger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sailor_tasks.stages.context import StageContext

JSON = dict[str, Any]


def describe_attempts(ctx: StageContext, run_id: str) -> list[str]:
    pre = {p["attempt"]: p for p in ctx.ledger.preemptions(run_id, limit=10_000)}
    lines = []
    for a in ctx.ledger.attempts(run_id):
        p = pre.get(a["attempt"])
        what = a["outcome"]
        if p:
            what = (
                f"preempted {'with' if p['noticed'] else 'without'} notice at step {p['step']}"
                f" ({p['steps_lost']} steps lost)"
            )
        lines.append(
            f"attempt {a['attempt']} (try {a['try_number']}): {a['region']}/{a['zone']} "
            f"{a['placement'].get('market', '?')}, resumed from step {a['resumed_from_step']}: {what}"
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


def render_summary(s: Mapping[str, Any]) -> str:
    drop = (1 - s["final_loss"] / s["initial_loss"]) * 100 if s.get("final_loss") else 0.0
    if s.get("final_loss") is not None and s.get("initial_loss") is not None:
        losses = f"eval loss {s['initial_loss']:.3f} → {s['final_loss']:.3f} ({drop:.0f}% lower)"
    else:  # the run's own command: SAILOR knows its steps and checkpoints, not its losses
        losses = f"command `{' '.join(s.get('command') or [])}`"
    rate = f"{s['samples_per_s']:.0f} samples/s" if s.get("samples_per_s") is not None else "own command"
    lines = [
        f"# SAILOR run `{s['run_id']}`",
        "",
        f"- **Job**: {s['job_name']} (team {s['team']}), status **{s['status']}**",
        f"- **Placed in** {s['region']} / {s['zone']}: {s['num_gpus']}x {s['gpu_type']} on {s['market']} "
        f"at ${s['usd_per_hour']:.2f}/h",
        f"- **Why**: {s['why'][0] if s['why'] else '-'}",
        f"- **Data**: {s['data_bytes'] / 1e6:.1f} MB at {s['data_uri']}",
        f"- **Training**: {s['steps']} steps in {s['train_wall_s']:.1f} s ({rate}); {losses}",
        f"- **Checkpoint**: {s['checkpoint_uri']}",
        f"- **Estimated cost**: ${s['usd_estimate']:.4f} (price × training wall time)",
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
        lines.append(f"- **Recovered from preemption**: {len(s['attempts'])} attempts")
        lines += [f"  - {a}" for a in s["attempts"]]
    return "\n".join(lines) + "\n"
