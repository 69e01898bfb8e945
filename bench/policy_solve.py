"""Policy solve time vs. number of jobs: ``las`` and ``las`` with space sharing.

Jobs are drawn (seeded) from Gavel's measured job types with priority weights 1/2/4; the cluster
has n/4 GPUs of each of K80, P100 and V100 (as in Gavel's policy-runtime sweep). ``las`` merges
identical jobs (an exact reduction), so these instances have at most 249 distinct rows;
``las_distinct`` gives every job its own weight, one LP row per job (``*_rows``: the rows solved).
Each point is the median of ``--repeats`` solves of a fresh policy call. Prints one JSON object
(last line).

    .venv/bin/python bench/policy_solve.py [--throughputs ../shared/data/gavel/simulation_throughputs.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace

import numpy as np

from sailor_tasks.catalog.throughput import load_gavel
from sailor_tasks.policies import PolicyJob, PolicyState, get_policy
from sailor_tasks.policies.base import merge_identical, singles

DEFAULT_THROUGHPUTS = os.path.join(
    os.path.dirname(__file__), "..", "..", "shared", "data", "gavel", "simulation_throughputs.json"
)
SIZES = (32, 64, 128, 256, 512, 1024, 2048)
SPACE_SHARING_MAX = 512
"""Largest size timed with space sharing (Gavel's reference point: 41.8 s at 512 jobs)."""


def instance(n: int, table, seed: int, distinct: bool = False) -> PolicyState:
    """``n`` jobs of Gavel's types with weights 1/2/4; ``distinct``: each job its own weight
    (uniform in [0.5, 4]), so that no two jobs are alike and ``las`` solves one LP row per job (it
    merges identical jobs: with 83 job types and 3 weights, at most 249 rows)."""
    rng = np.random.default_rng(seed)
    keys = table.job_types
    jobs = []
    for i in range(n):
        key = keys[int(rng.integers(len(keys)))]
        jobs.append(
            PolicyJob(
                f"job{i:05d}",
                table.alone[key],
                key[1],
                priority_weight=float(rng.uniform(0.5, 4.0) if distinct else rng.choice([1.0, 2.0, 4.0])),
                job_type=key,
            )
        )
    gpus = {g: n // 4 for g in ("K80", "P100", "V100")}
    return PolicyState(jobs=tuple(jobs), gpus=gpus, table=table, seed=seed)


def timed(state: PolicyState, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of one ``las`` allocation (CPU time is robust to a busy machine)."""
    policy = get_policy("las")
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        policy.allocate(state)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def lp_rows(state: PolicyState) -> int:
    """Job rows ``las`` solves for ``state`` (identical jobs merged into one)."""
    policy = get_policy("las")
    units = singles(state.jobs, state.gpus)
    return len(merge_identical(units, policy.merge_columns(units))[1].jobs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--throughputs", default=DEFAULT_THROUGHPUTS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    table = load_gavel(args.throughputs)
    timed(instance(32, table, args.seed), 1)  # warm-up: imports, HiGHS load
    out: dict[str, list] = {"jobs": list(SIZES)}
    keys = ("las_s", "las_cpu_s", "las_rows", "las_distinct_s", "las_distinct_cpu_s", "las_distinct_rows")
    for key in (*keys, "las_space_sharing_s", "las_space_sharing_cpu_s"):
        out[key] = []
    for n in SIZES:
        state = instance(n, table, args.seed)
        for name, s in (("las", state), ("las_distinct", instance(n, table, args.seed, distinct=True))):
            wall, cpu = timed(s, args.repeats)
            out[f"{name}_s"].append(round(wall, 4))
            out[f"{name}_cpu_s"].append(round(cpu, 4))
            out[f"{name}_rows"].append(lp_rows(s))
        if n <= SPACE_SHARING_MAX:
            wall, cpu = timed(replace(state, space_sharing=True), args.repeats)
            out["las_space_sharing_s"].append(round(wall, 4))
            out["las_space_sharing_cpu_s"].append(round(cpu, 4))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
