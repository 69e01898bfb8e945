"""A queue of 10,000 requests planned with ``plan_many`` against the full packaged GCP catalog.

The queue is the seeded request mix of ``bench/placement.py`` with priorities and arrival times;
the snapshot starts with the live reservations of ``--reservations`` other runs. ``plan_many`` holds
each placement's GPUs before planning the next request, and this script checks the result
independently: GPUs placed per (zone, GPU type) plus the snapshot's reservations never exceed the
catalog's capacity (``overcommitted`` counts (zone, GPU type) pairs over capacity).
``cpu_s`` is the same interval in thread CPU time (robust to a loaded shared machine).
Prints one JSON object as its last line.

Run: .venv/bin/python bench/plan_queue.py [--requests 10000]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from placement import live_reservations, requests, scaled_catalog  # noqa: E402

from sailor_tasks.model import Assignment, ClusterState  # noqa: E402
from sailor_tasks.placement import QueuedRequest, plan_many  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--reservations", type=int, default=2_000)
    parser.add_argument("--capacity-scale", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    catalog = scaled_catalog(args.capacity_scale)
    queue = [
        QueuedRequest(f"q{i}", r, priority=rng.choice((0, 0, 0, 1, 5)), arrival=i * 0.5)
        for i, r in enumerate(requests(catalog, args.requests, rng))
    ]
    state = ClusterState(
        reservations=live_reservations(catalog, args.reservations, rng),
        assignment=Assignment(
            version=1, shares={}, region_load={r: rng.uniform(0.3, 2.6) for r in catalog.regions}
        ),
    )
    plan_many(queue[:20], catalog, state)  # warm the catalog index and per-model arrays
    t, c = time.perf_counter(), time.thread_time()
    outcomes = plan_many(queue, catalog, state)
    total_s, cpu_s = time.perf_counter() - t, time.thread_time() - c

    capacity = {(o.zone, o.gpu_type): o.capacity_gpus for o in catalog.offers}
    held: Counter[tuple[str, str]] = Counter()
    for r in state.reservations:
        held[(r.zone, r.gpu_type)] += r.gpus
    for o in outcomes:
        if o.placement is not None:
            held[(o.placement.zone, o.placement.gpu_type)] += o.placement.num_gpus
    overcommitted = sum(1 for key, gpus in held.items() if gpus > capacity[key])
    placed = sum(o.placement is not None for o in outcomes)
    result = {
        "requests": len(queue),
        "total_s": round(total_s, 3),
        "cpu_s": round(cpu_s, 3),
        "per_request_ms": round(total_s / len(queue) * 1e3, 4),
        "placed": placed,
        "not_placed": len(queue) - placed,
        "overcommitted": overcommitted,
        "gpus_held": sum(held.values()),
        "capacity_gpus": sum(capacity.values()),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
