"""Simulator at scale: 100,000 generated jobs on 1,000 GPUs of 4 types in 10 regions of different
sizes and GPU mixes, at load 0.8, with spot preemptions.

Jobs follow Gavel's Philly-derived generator (scale factors 1/2/4/8, durations 10^U(1.5,3) or
10^U(3,4) minutes) with Poisson arrivals at ``--load`` (default 0.8) of the cluster's nominal
capacity (its GPUs weighted by their mean speed over the job types, relative to V100); the policy
is ``las`` with 6-minute rounds. The regions (``REGIONS``) range from 20 to 250 GPUs, each with its
own subset of K80/P100/V100/A100; every third one (``SPOT_REGIONS``) is spot capacity that follows
a GCP 2020 preemptible-GPU availability trace (``--traces``, default the shared data's logs; the
15-minute slots where no instance of it was alive take the region's GPUs away, preempting the jobs
on them, which the recovery strategy moves or keeps waiting). Jobs are routed across regions by
the placement engine (``--router placement``; ``least_loaded`` is the baseline heuristic);
``routing_s`` / ``routing_cpu_s`` are the wall / CPU time spent inside the router (part of
``wall_s`` / ``cpu_s``). The regions are simulated by ``--workers`` processes (default: 2, or 1 on
a 1-core machine; ``simulator/workers.py``): routing stays in this process, results are identical
for any count; ``cpu_s`` adds the workers' CPU time to ``caller_cpu_s`` (this process's), and
``load_average`` is the machine's 1/5/15-minute load at the end. Prints one JSON object (last line).

    .venv/bin/python bench/simulate_scale.py [--jobs N] [--load 0.8] [--traces DIR] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from sailor_tasks.catalog.throughput import load_packaged
from sailor_tasks.simulator import Region, SimConfig, TraceAvailability, generate_jobs, simulate
from sailor_tasks.simulator.rounds.hooks import StartsJobs
from sailor_tasks.simulator.rounds.replan import make_recovery
from sailor_tasks.simulator.rounds.routing import ROUTERS, PlacementRouter, SimPlacement, make_router
from sailor_tasks.simulator.rounds.workload import total_gpu_seconds
from sailor_tasks.traces.sources import load_sources

GPU_TYPES = ("K80", "P100", "V100", "A100")
REGIONS: dict[str, dict[str, int]] = {
    "region-0": {"K80": 40, "P100": 40, "V100": 80, "A100": 90},
    "region-1": {"K80": 60, "P100": 40, "V100": 80},
    "region-2": {"P100": 40, "V100": 40, "A100": 60},
    "region-3": {"K80": 50, "V100": 60},
    "region-4": {"K80": 40, "P100": 30, "A100": 20},
    "region-5": {"V100": 40, "A100": 30},
    "region-6": {"K80": 30, "P100": 30},
    "region-7": {"V100": 45},
    "region-8": {"K80": 20, "A100": 15},
    "region-9": {"P100": 20},
}
"""1,000 GPUs: 240 K80, 200 P100, 345 V100, 215 A100, in regions of 250 down to 20 GPUs."""
SPOT_REGIONS = ("region-1", "region-4", "region-7")
"""Spot capacity (315 GPUs), each following one GCP 2020 trace (taken in name order)."""
TARGET_LOAD = 0.8
TARGET_JOBS = 100_000
TARGET_WALL_S = 300.0
"""``TARGET_JOBS`` jobs within this wall time."""
ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "gcp_preemption_2020"


class TimedRouter:
    """Wraps a router and adds up the wall and CPU time of its decisions."""

    def __init__(self, inner):
        self.inner, self.name, self.seconds, self.cpu_seconds = inner, inner.name, 0.0, 0.0
        if isinstance(inner, StartsJobs):
            self.start_now = self._start_now

    def _timed(self, call, *args, **kwargs):
        started, cpu = time.perf_counter(), time.process_time()
        try:
            return call(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started
            self.cpu_seconds += time.process_time() - cpu

    def route(self, job, runnable, load):
        return self._timed(self.inner.route, job, runnable, load)

    def _start_now(self, job, load, free, exclude=None):
        return self._timed(self.inner.start_now, job, load, free, exclude)


def cpu_seconds() -> float:
    """CPU time of this process and of its finished worker processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--policy", default="las")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--router", default="placement", choices=ROUTERS)
    parser.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes simulating regions in parallel (1: everything in this process)",
    )
    parser.add_argument("--load", type=float, default=TARGET_LOAD, help="offered load / nominal capacity")
    parser.add_argument("--traces", default=str(TRACES), help="GCP 2020 preemption logs (folder)")
    parser.add_argument("--no-spot", action="store_true", help="every region on-demand (no traces)")
    args = parser.parse_args()
    if not args.load > 0:
        parser.error(f"--load {args.load}: need a number > 0")
    table = load_packaged()
    spot_traces = {}
    if not args.no_spot:
        if not Path(args.traces).exists():
            sys.exit(f"--traces {args.traces}: no such folder (the GCP 2020 preemption logs)")
        found = sorted(
            (t for t in load_sources([args.traces]) if t.trace.kind == "unavailable_flag"),
            key=lambda t: t.name,
        )
        if not found:
            sys.exit(f"--traces {args.traces}: no GCP 2020 *.out logs found")
        spot_traces = {r: found[i % len(found)] for i, r in enumerate(SPOT_REGIONS)}
    # Arrival rate: the cluster serves ~sum(GPUs x speed) / (mean V100 GPU-hours per job) jobs/hour,
    # each job's GPU-hours at the speed it can run at on these servers (an 8-GPU job never fits
    # on one 4-GPU server: it always runs at its unconsolidated throughput).
    probe = generate_jobs(2000, 1.0, table, seed=args.seed + 1)
    gpus_per_server = SimConfig().gpus_per_server
    mean_gpu_h = total_gpu_seconds(probe, table, gpus_per_server=gpus_per_server) / len(probe) / 3600.0
    gpus = sum(sum(per.values()) for per in REGIONS.values())
    capacity = sum(
        n * sum(table.speedup(k, g) for k in table.job_types) / len(table.job_types)
        for per in REGIONS.values()
        for g, n in per.items()
    )
    rate = args.load * capacity / mean_gpu_h
    jobs = generate_jobs(args.jobs, rate, table, seed=args.seed)
    regions = [Region(name, per, spot=name in spot_traces) for name, per in REGIONS.items()]
    availability = TraceAvailability({r: t.trace for r, t in spot_traces.items()}) if spot_traces else None
    config = SimConfig(policy=args.policy, seed=args.seed, router=args.router, workers=args.workers)
    started, cpu, caller_cpu = time.perf_counter(), cpu_seconds(), time.process_time()
    placement = SimPlacement(regions, table, config.gpus_per_server)
    router = TimedRouter(make_router(config.router, placement))
    strategy = make_recovery(config.recovery, placement)
    result = simulate(
        jobs, regions, table, config, availability=availability, router=router, strategy=strategy
    )
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    caller_cpu = time.process_time() - caller_cpu
    out = {
        "jobs": result.jobs,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "caller_cpu_s": round(caller_cpu, 2),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "workers": config.workers,
        "gpus": gpus,
        "region_gpus": {name: dict(per) for name, per in REGIONS.items()},
        "spot_regions": {r: t.name for r, t in spot_traces.items()},
        "load": args.load,
        "jobs_per_hour": round(rate, 2),
        "routing_s": round(router.seconds, 2),
        "routing_cpu_s": round(router.cpu_seconds, 2),
        **({"routed_gpu_types": router.inner.summary()} if isinstance(router.inner, PlacementRouter) else {}),
        **{k: v for k, v in result.to_json().items() if k not in ("jobs", "wall_s")},
        # The target: at least its jobs, every one completed (none left past the horizon), at
        # least its load, spot preemptions on, within its wall time.
        "all_completed": result.completed == result.jobs,
        "target_met": result.jobs >= TARGET_JOBS
        and result.completed == result.jobs
        and args.load >= TARGET_LOAD
        and bool(spot_traces)
        and wall <= TARGET_WALL_S,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
