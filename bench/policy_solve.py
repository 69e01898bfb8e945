"""Policy solve time vs. number of jobs: ``las`` and ``las`` with space sharing.

Jobs are drawn (seeded) from Gavel's measured job types with priority weights 1/2/4; the cluster
has n/4 GPUs of each of K80, P100 and V100 (as in Gavel's policy-runtime sweep). Each point is the
median of ``--repeats`` solves of a fresh policy call. Prints one JSON object (last line).

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

DEFAULT_THROUGHPUTS = os.path.join(
    os.path.dirname(__file__), "..", "..", "shared", "data", "gavel", "simulation_throughputs.json"
)
SIZES = (32, 64, 128, 256, 512, 1024, 2048)
SPACE_SHARING_MAX = 512
"""Largest size timed with space sharing (Gavel's reference point: 41.8 s at 512 jobs)."""


def instance(n: int, table, seed: int) -> PolicyState:
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
                priority_weight=float(rng.choice([1.0, 2.0, 4.0])),
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--throughputs", default=DEFAULT_THROUGHPUTS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    table = load_gavel(args.throughputs)
    timed(instance(32, table, args.seed), 1)  # warm-up: imports, HiGHS load
    out: dict[str, list] = {"jobs": list(SIZES)}
    for key in ("las_s", "las_space_sharing_s", "las_cpu_s", "las_space_sharing_cpu_s"):
        out[key] = []
    for n in SIZES:
        state = instance(n, table, args.seed)
        wall, cpu = timed(state, args.repeats)
        out["las_s"].append(round(wall, 4))
        out["las_cpu_s"].append(round(cpu, 4))
        if n <= SPACE_SHARING_MAX:
            wall, cpu = timed(replace(state, space_sharing=True), args.repeats)
            out["las_space_sharing_s"].append(round(wall, 4))
            out["las_space_sharing_cpu_s"].append(round(cpu, 4))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
