"""Live admission policies over a seeded mixed queue on simulated capacity.

Drives the queue simulator (``sailor_tasks.simulator.queue``: the live admission pass
``sailor_tasks.queue.admit`` on simulated capacity, runs placed by the placement engine; see
docs/simulator.md) over the mixed queue of ``simulator.queue.mixed_queue``: two teams, team ``a``
submits a burst at the start and team ``b`` a steady stream over ``--hours``; 1/2/4 GPUs, 0.5-3 h
of work, a third of the runs with a deadline. Spot capacity 8 V100 + 8 T4 at the packaged
catalog's prices. Two scenarios: ``open`` (on-demand not capped: the market has it, at its
price), where every deadline on-demand could meet must be met (``latest_start_misses``), and
``capped`` (2 V100 + 2 T4 on-demand), where deadlines compete and the policies' misses differ
(``edf_misses``, ``fifo_misses``).

Figures per policy (las, fifo, ftf, edf) and scenario: the simulator's (avg JCT, waits, deadline
misses, failed early, team share ratio: max/min spot GPU-hours per team while both teams had
runs waiting, on-demand GPU-hours, per-team figures), wall and CPU seconds. Top level:
``las_vs_fifo_team_fairness`` (las ratio ≤ fifo ratio; a ratio of null means one team got no
GPUs while both waited, i.e. unbounded), ``edf_misses`` ≤ ``fifo_misses`` (capped),
``latest_start_misses`` (open, summed over policies: 0).

Run: .venv/bin/python bench/queue_policy.py [--runs 60] [--seed 7] [--hours 16]
     [--seeds 1,2,3,4,5,7: one line per seed, then the summary over all seeds]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from sailor_tasks.catalog.throughput import load_packaged
from sailor_tasks.simulator.queue import QueueSimConfig, mixed_queue, simulate_queue

SPOT = {"V100": 8, "T4": 8}
ON_DEMAND_CAPPED = {"V100": 2, "T4": 2}
"""The on-demand GPUs of the ``capped`` scenario, where deadlines compete for them."""
SCENARIOS = {"open": None, "capped": ON_DEMAND_CAPPED}
POLICIES = ("las", "fifo", "ftf", "edf")


def las_fairer(open_: dict) -> bool | None:
    """Whether las's team share ratio is at most fifo's; None when neither had contention to share
    (no team held GPUs while every team had a run waiting: nothing compared). A ratio of None with
    contention means a team got none of it: unbounded, and never a pass for las."""
    las, fifo = open_["las"]["team_share_ratio"], open_["fifo"]["team_share_ratio"]

    def contended(result: dict) -> bool:
        return any(t["gpu_h_while_contended"] > 0 for t in result["teams"].values())

    if not contended(open_["las"]) and not contended(open_["fifo"]):
        return None
    if las is None:
        return False
    return las <= (math.inf if fifo is None else fifo)


def one_seed(runs: int, seed: int, hours: float) -> dict:
    table = load_packaged()
    jobs = mixed_queue(runs, seed, table, tuple(SPOT), hours=hours)
    per: dict[str, dict[str, dict]] = {name: {} for name in SCENARIOS}
    for name, on_demand in SCENARIOS.items():
        for policy in POLICIES:
            wall, cpu = time.perf_counter(), time.process_time()
            result = simulate_queue(jobs, table, QueueSimConfig(SPOT, on_demand, policy)).to_json()
            result["wall_s"] = round(time.perf_counter() - wall, 2)
            result["cpu_s"] = round(time.process_time() - cpu, 2)
            per[name][policy] = result
    open_, capped = per["open"], per["capped"]
    las, fifo = open_["las"]["team_share_ratio"], open_["fifo"]["team_share_ratio"]
    return {
        "runs": len(jobs),
        "seed": seed,
        "avg_jct_h": {p: open_[p]["avg_jct_h"] for p in POLICIES},
        "on_demand_gpu_h": {p: open_[p]["on_demand_gpu_h"] for p in POLICIES},
        "las_vs_fifo_team_fairness": {"las": las, "fifo": fifo},
        "las_fairer_than_fifo": las_fairer(open_),
        "latest_start_misses": sum(open_[p]["latest_start_misses"] for p in POLICIES),
        "open_deadline_runs": open_["las"]["deadline_runs"],
        "capped_deadline_misses": {p: capped[p]["deadline_misses"] for p in POLICIES},
        "edf_misses": capped["edf"]["deadline_misses"],
        "fifo_misses": capped["fifo"]["deadline_misses"],
        "per_policy": per,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--seeds", help="comma-separated seeds (overrides --seed): every seed reported")
    parser.add_argument("--hours", type=float, default=16.0, help="team b's runs arrive over this many hours")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    wall, cpu = time.perf_counter(), time.process_time()
    out = []
    for seed in seeds:
        res = one_seed(args.runs, seed, args.hours)
        for name, policies in res["per_policy"].items():
            for policy, fig in policies.items():
                brief = {k: v for k, v in fig.items() if k != "teams"}
                print(f"seed {seed} {name} {policy}: {json.dumps(brief)}")
        out.append(res)
        if len(seeds) > 1:
            print(json.dumps({k: v for k, v in res.items() if k != "per_policy"}))
    times = {"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2)}
    times["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if len(seeds) == 1:
        print(json.dumps({**out[0], **times}))
        return
    print(
        json.dumps(
            {
                "seeds": seeds,
                "runs": args.runs,
                "las_fairer_than_fifo": {r["seed"]: r["las_fairer_than_fifo"] for r in out},
                "las_vs_fifo_team_fairness": {r["seed"]: r["las_vs_fifo_team_fairness"] for r in out},
                "edf_misses": {r["seed"]: r["edf_misses"] for r in out},
                "fifo_misses": {r["seed"]: r["fifo_misses"] for r in out},
                "latest_start_misses": {r["seed"]: r["latest_start_misses"] for r in out},
                **times,
            }
        )
    )


if __name__ == "__main__":
    main()
