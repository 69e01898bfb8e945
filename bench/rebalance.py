"""Nightly rebalance at MAST scale: the seeded scenario solved by the HiGHS-based solver.

Run: .venv/bin/python bench/rebalance.py --regions 40 --gpu-types 8 --teams 2000 --datasets 10000 --seed 0
Prints one JSON object as its last line (ratios are demand/supply of the busiest region).
"""

from __future__ import annotations

import argparse
import json
import time

from sailor_tasks.rebalance.scenario import generate
from sailor_tasks.rebalance.solver import solve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--regions", type=int, default=40)
    p.add_argument("--gpu-types", type=int, default=8)
    p.add_argument("--teams", type=int, default=2000)
    p.add_argument("--datasets", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--budget-fraction", type=float, default=None, help="budget as a share of all dataset bytes"
    )
    p.add_argument("--time-limit", type=float, default=50.0, help="solver time budget (s)")
    args = p.parse_args()
    t0 = time.perf_counter()
    extra = {} if args.budget_fraction is None else {"budget_fraction": args.budget_fraction}
    problem = generate(args.regions, args.gpu_types, args.teams, args.datasets, seed=args.seed, **extra)
    gen_s = time.perf_counter() - t0
    sol = solve(problem, seed=args.seed, time_limit_s=args.time_limit)
    demand = sum(sum(t.demand().values()) for t in problem.teams)
    supply = sum(problem.cell_supply().values())
    print(
        json.dumps(
            {
                "regions": args.regions,
                "teams": args.teams,
                "datasets": args.datasets,
                "solve_s": sol.solve_s,
                "max_ratio_before": sol.max_ratio_before,
                "max_ratio_after": sol.max_ratio_after,
                "lower_bound": sol.region_lower_bound,
                "allocation_rate": sol.allocation_rate_after,
                "bytes_moved": sol.bytes_moved,
                "budget_bytes": sol.budget_bytes,
                "allocation_rate_before": sol.allocation_rate_before,
                "max_cell_ratio_before": sol.max_cell_ratio_before,
                "max_cell_ratio_after": sol.max_cell_ratio_after,
                "cell_lower_bound": sol.lower_bound,
                "partition_bound": sol.partition_bound,
                "total_demand_over_supply": round(demand / supply, 4),
                "replicas": len(sol.replicate),
                "cross_region_reads": sol.cross_region_reads,
                "partitions": sol.partitions,
                "binaries": sol.binaries,
                "status": sol.status,
                "generate_s": round(gen_s, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
