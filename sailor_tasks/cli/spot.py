"""``sailor simulate --strategy ...``: the spot-economics simulator's arguments and driver."""

from __future__ import annotations

import argparse
import time
from typing import Any

DEFAULT_SLACK = 0.2


def add_spot_arguments(g: Any) -> None:
    """Arguments of the spot simulator (an argument group of ``sailor simulate``)."""
    from sailor_tasks.cli.argtypes import nonnegative_float
    from sailor_tasks.simulator.spot.setup import BIND_MODES
    from sailor_tasks.strategies import MARKET_STRATEGIES

    g.add_argument(
        "--strategy",
        help=f"run the spot simulator with this market strategy: {', '.join(MARKET_STRATEGIES)}",
    )
    g.add_argument(
        "--availability",
        nargs="+",
        metavar="DIR_OR_FILE",
        help="availability traces: trace JSON, Sailor GPU-trace CSV/JSON, GCP 2020 logs (folders searched)",
    )
    g.add_argument(
        "--deadline-slack",
        type=nonnegative_float,
        default=DEFAULT_SLACK,
        help="deadline = arrival + (1 + SLACK) x on-demand time (default 0.2)",
    )
    g.add_argument(
        "--bind",
        choices=BIND_MODES,
        default="pool",
        help="pool: zones without their own trace replay a pooled trace; exact: they get no spot",
    )


def spot_inputs(availability: list[str], jobs: int, seed: int, slack: float, jobs_per_hour: float, bind: str):
    """(market, jobs with deadlines) for the given traces: what the CLI and the benchmark share."""
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.simulator.spot.engine import with_deadlines
    from sailor_tasks.simulator.spot.setup import build_market, generate_spot_jobs
    from sailor_tasks.traces.sources import load_sources

    market = build_market(load_catalog(), load_sources(availability), bind=bind, seed=seed)
    generated = generate_spot_jobs(jobs, market, seed=seed, jobs_per_hour=jobs_per_hour)
    return market, with_deadlines(generated, market, slack)


def run_spot_simulation(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``--jobs`` generated jobs under ``--strategy``; the JSON summary.

    Raises:
        ValueError: a bad argument (names it and the valid choices).
    """
    from sailor_tasks.simulator.spot.engine import simulate_spot
    from sailor_tasks.strategies import MARKET_STRATEGIES

    started = time.perf_counter()
    if args.strategy not in MARKET_STRATEGIES:
        raise ValueError(
            f"--strategy {args.strategy!r} is not a market strategy; valid: {', '.join(MARKET_STRATEGIES)}"
        )
    if args.jobs is None:
        raise ValueError("--strategy needs --jobs N (generated jobs with deadlines), not --trace")
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: need an integer ≥ 1 (generated jobs with deadlines)")
    if not args.availability:
        raise ValueError("--strategy needs --availability DIR_OR_FILE ... (spot availability traces)")
    market, jobs = spot_inputs(
        args.availability, args.jobs, args.seed, args.deadline_slack, args.jobs_per_hour, args.bind
    )
    result = simulate_spot(jobs, market, args.strategy).to_json()
    result["deadline_slack"] = args.deadline_slack
    result["spot_zones"] = sum(1 for z in market.zones if z.trace is not None)
    result["wall_s"] = round(time.perf_counter() - started, 3)
    return result
