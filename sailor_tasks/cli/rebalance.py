"""``sailor rebalance``: solve a rebalance scenario (region shares + replicas) without Airflow."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from sailor_tasks.cli.argtypes import nonnegative_float, positive_float, seed
from sailor_tasks.cli.output import print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "rebalance", help="solve a rebalance scenario (region shares + replicas) without Airflow"
    )
    p.add_argument(
        "--scenario",
        default="generated",
        help="'generated' (seeded scenario from the options below) or a problem JSON file",
    )
    p.add_argument("--regions", type=int, default=40, help="regions of a generated scenario (default 40)")
    p.add_argument("--gpu-types", type=int, default=8, help="GPU types of a generated scenario (default 8)")
    p.add_argument("--teams", type=int, default=2000, help="teams of a generated scenario (default 2000)")
    p.add_argument(
        "--datasets", type=int, default=10000, help="datasets of a generated scenario (default 10000)"
    )
    p.add_argument(
        "--seed", type=seed, default=0, help="seed of the generated scenario and the solver (default 0)"
    )
    p.add_argument(
        "--budget-fraction",
        type=nonnegative_float,
        default=0.1,
        help="byte budget / all dataset bytes of a generated scenario (default 0.1)",
    )
    p.add_argument(
        "--time-limit", type=positive_float, default=50.0, help="solver time budget in seconds (default 50)"
    )
    p.add_argument(
        "--comfort-ratio",
        type=nonnegative_float,
        default=0.0,
        help="demand/supply ratios below it count as balanced (default 0: pure min-max)",
    )
    p.add_argument("--write-scenario", metavar="PATH", help="also write the problem as JSON")
    p.add_argument("--full", action="store_true", help="print the whole solution (shares, replicas)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_rebalance)


def cmd_rebalance(args: argparse.Namespace) -> int:
    """Solve a rebalance scenario without Airflow (a generated one, or a problem JSON file)."""
    from sailor_tasks.errors import RebalanceInfeasibleError
    from sailor_tasks.rebalance.problem import Problem
    from sailor_tasks.rebalance.scenario import generate
    from sailor_tasks.rebalance.solver import solve

    if args.scenario == "generated":
        try:
            problem = generate(
                args.regions,
                args.gpu_types,
                args.teams,
                args.datasets,
                seed=args.seed,
                budget_fraction=args.budget_fraction,
            )
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    elif os.path.isfile(args.scenario):
        try:
            with open(args.scenario) as f:
                problem = Problem.from_json(json.load(f))
        except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            print(f"error: --scenario {args.scenario!r}: {exc}", file=sys.stderr)
            return 2
    else:
        print(
            f"error: --scenario {args.scenario!r} is neither 'generated' nor a problem JSON file",
            file=sys.stderr,
        )
        return 2
    if args.write_scenario:
        try:
            with open(args.write_scenario, "w") as f:
                json.dump(problem.to_json(), f)
        except OSError as exc:
            print(f"error: --write-scenario {args.write_scenario!r}: {exc}", file=sys.stderr)
            return 2
    try:
        solution = solve(
            problem, seed=args.seed, time_limit_s=args.time_limit, comfort_ratio=args.comfort_ratio
        )
    except RebalanceInfeasibleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary = solution.summary()
    if args.json:
        print_json(solution.to_json() if args.full else summary)
        return 0
    for key, value in summary.items():
        print(f"{key:24s} {value}")
    if args.full:  # the rest of the solution (placement, shares, replicas), each as JSON
        for key, value in solution.to_json().items():
            if key not in summary:
                print(f"\n{key}:")
                print_json(value)
    return 0
