"""``sailor trace-gcp``: GCP 2020 preemption logs as per-zone stats or one zone's availability trace."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sailor_tasks.cli.argtypes import positive_float
from sailor_tasks.cli.output import print_table


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "trace-gcp", help="GCP 2020 preemption logs: per-zone rates, or --zone as an availability trace"
    )
    p.add_argument("--logs", default="../shared/data/gcp_preemption_2020/logs", help="folder of *.out logs")
    p.add_argument("--zone", help="write this zone's availability trace (JSON) instead of the stats")
    p.add_argument("--gpu", help="only instances of this GPU type (e.g. nvidia-tesla-v100)")
    p.add_argument(
        "--gap", type=positive_float, default=900.0, help="seconds per trace slot (logs pinged every 900 s)"
    )
    p.add_argument("--out", help="output file (default: stdout)")
    p.set_defaults(func=cmd_trace_gcp)


def cmd_trace_gcp(args: argparse.Namespace) -> int:
    """Per-zone preemption stats of the GCP 2020 logs, or one zone as an availability trace JSON."""
    from sailor_tasks.traces.gcp_2020 import load_gcp_logs, to_availability_trace

    try:
        log = load_gcp_logs(args.logs)
        known = sorted({lf.gpu_type for lf in log.lives} | {e.gpu_type for e in log.events if e.gpu_type})
        if args.gpu is not None and args.gpu not in known:
            print(
                f"error: --gpu {args.gpu!r}: no instance of it in the logs; valid: {', '.join(known)}",
                file=sys.stderr,
            )
            return 2
        if not args.zone:
            rows = [
                {
                    "zone": z,
                    "preemptions": st.preemptions,
                    "instance_hours": st.instance_hours,
                    "preemptions_per_hour": st.preemptions_per_hour,
                    "stockout_fraction": st.stockout_fraction,
                }
                for z, st in log.zone_stats(args.gpu).items()
            ]
            print_table(rows, list(rows[0]) if rows else ["zone"])
            return 0
        trace = to_availability_trace(log, args.zone, args.gpu, args.gap)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(
        {"metadata": {"gap_seconds": trace.gap_seconds, "source": trace.source}, "data": trace.data}
    )
    if args.out:
        try:
            with open(args.out, "w") as f:
                f.write(text)
        except OSError as exc:
            print(f"error: --out {args.out!r}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {len(trace.data)} slots, {len(trace.preemption_times())} preemptions to {args.out}")
    else:
        print(text)
    return 0
