"""The rebalance report: a PNG chart of demand/supply per region before and after, and a markdown
summary (ratios, bound, allocation rate, bytes replicated, top moves)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

MAX_CHART_REGIONS = 40


def top_moves(
    problem: Mapping[str, Any], placement: Mapping[str, Mapping[str, Mapping[str, float]]], limit: int = 10
) -> list[dict[str, Any]]:
    """Teams whose demand moves the most: GPUs moved, from where to where (largest first)."""
    moves = []
    for team in problem["teams"]:
        before = {r: sum(per.values()) for r, per in team["current"].items()}
        after = {r: sum(per.values()) for r, per in placement.get(team["name"], {}).items()}
        moved = sum(max(0.0, n - after.get(r, 0.0)) for r, n in before.items())
        if moved <= 1e-6:
            continue
        total = sum(before.values()) or 1.0
        moves.append(
            {
                "team": team["name"],
                "gpus_moved": round(moved, 3),
                "from": {r: round(n / total, 3) for r, n in sorted(before.items(), key=lambda kv: -kv[1])},
                "to": {
                    r: round(n / total, 3)
                    for r, n in sorted(after.items(), key=lambda kv: -kv[1])
                    if n > 1e-9
                },
            }
        )
    return sorted(moves, key=lambda m: -m["gpus_moved"])[:limit]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000.0
    return f"{n:.1f} PB"


def _shares(d: Mapping[str, float]) -> str:
    return ", ".join(f"{r} {s:.0%}" for r, s in list(d.items())[:3])


def render_markdown(
    title: str,
    solution: Mapping[str, Any],
    moves: Sequence[Mapping[str, Any]],
    *,
    window: str,
    bytes_replicated: int | None,
    copies_done: int | None,
    version: int | None,
    chart_uri: str | None,
    unpublished: str = "dry run",
    copies_failed: int = 0,
    copies_withheld: int = 0,
) -> str:
    """The night's summary; ``unpublished``: why no assignment was published (``version`` None)."""
    s = solution
    before, after = s["region_load_before"], s["region_load_after"]
    lines = [
        f"# {title}",
        "",
        f"- **Assignment**: {'v' + str(version) + ' published' if version is not None else f'not published ({unpublished})'}",
        f"- **Window**: {window}",
        f"- **Solver**: {s['status']} in {s['solve_s']:.2f} s ({s['partitions']} partition(s), "
        f"{s['binaries']} replica binaries); stages: {', '.join(s['stage_status'][:6])}"
        + (" …" if len(s["stage_status"]) > 6 else ""),
        f"- **Busiest region demand/supply**: {s['max_ratio_before']:.2f} → **{s['max_ratio_after']:.2f}** "
        f"(LP lower bound {s['region_lower_bound']:.2f}; worst region×GPU cell "
        f"{s['max_cell_ratio_before']:.2f} → {s['max_cell_ratio_after']:.2f}, bound {s['lower_bound']:.2f})",
        f"- **GPU allocation rate**: {s['allocation_rate_before']:.1%} realised → {s['allocation_rate_after']:.1%} projected",
        f"- **Replication**: {len(s['replicate'])} copies planned, {_fmt_bytes(s['bytes_moved'])} of a "
        f"{_fmt_bytes(s['budget_bytes'])} budget; "
        + (
            f"{copies_done} done, {_fmt_bytes(bytes_replicated or 0)} copied"
            + (f", {copies_withheld} withheld (data residency)" if copies_withheld else "")
            + (f", **{copies_failed} failed**" if copies_failed else "")
            if copies_done is not None
            else f"nothing copied ({unpublished})"
        ),
        f"- **GPUs moved**: {s['gpus_moved']:.2f}; cross-region reads after: {s['cross_region_reads']}",
    ]
    if chart_uri:
        lines.append(f"- **Chart**: {chart_uri}")
    lines += ["", "## Regions (busiest before first)", "", "| region | before | after |", "|---|---|---|"]
    for r in sorted(before, key=lambda r: -before[r])[:12]:
        lines.append(f"| {r} | {before[r]:.2f} | {after.get(r, 0.0):.2f} |")
    lines += ["", "## Top moves", ""]
    if not moves:
        lines.append("No team moves.")
    for m in moves:
        lines.append(
            f"- **{m['team']}**: {m['gpus_moved']:.2f} GPUs moved; {_shares(m['from'])} → {_shares(m['to'])}"
        )
    return "\n".join(lines) + "\n"


def render_chart(solution: Mapping[str, Any], title: str) -> bytes:
    """PNG bytes: demand/supply per region before and after, with 1.0 and the lower bound marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before, after = solution["region_load_before"], solution["region_load_after"]
    regions = sorted(before, key=lambda r: -before[r])[:MAX_CHART_REGIONS]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * len(regions) + 2), 4.2), dpi=100)
    xs = range(len(regions))
    ax.bar([x - 0.2 for x in xs], [before[r] for r in regions], width=0.4, label="before", color="#d62728")
    ax.bar(
        [x + 0.2 for x in xs], [after.get(r, 0.0) for r in regions], width=0.4, label="after", color="#1f77b4"
    )
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="supply")
    ax.axhline(solution["region_lower_bound"], color="green", lw=0.8, ls=":", label="LP lower bound")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(regions, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("demand / supply")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
