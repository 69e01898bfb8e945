"""Per-placement latency of the fast path over the FULL packaged GCP catalog (all regions, zones,
GPU types, VM shapes, both markets) with 10,000 live reservations in the snapshot.

Requests are a seeded mix: any/specific GPU type, 1-16 workers, all/some regions, spot/on-demand/
auto, with and without deadlines, datasets with replicas of 1-500 GB, an assignment with region
loads. Capacities are the packaged supply × ``--capacity-scale`` (a large organisation, so that the
10,000 reservations hold about a third of the GPUs rather than all of them). Each decision is one
``plan()`` call (exhaustive search + explanation); infeasible requests count as decisions too.
The snapshot's reservations are aggregated once (reported as ``snapshot_ms``), as when
``plan_many`` or an admission pass places several runs on one snapshot. ``p99_cpu_ms`` is
the same percentile in thread CPU time, which a loaded shared machine does not inflate.
``ledger_*``: the first ``--fresh`` decisions again as a live ``plan`` makes them, each on a
snapshot of its own read from a SQLite ledger holding the same reservations, assignment and
replicas (``ledger_state``: the ledger's sums of the GPUs held per zone and GPU type), the read
timed with the decision. ``target_met``: both p99s within the 2 ms target.
Prints one JSON object as its last line.

Run: .venv/bin/python bench/placement.py [--decisions 3000] [--reservations 10000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import tempfile
import time

from sailor_tasks.catalog import Catalog, load_catalog
from sailor_tasks.errors import SailorError
from sailor_tasks.ledger import Ledger
from sailor_tasks.model import Assignment, ClusterState, JobRequest, Reservation
from sailor_tasks.placement import plan
from sailor_tasks.placement.engine import view_for
from sailor_tasks.placement.index import index_for
from sailor_tasks.placement.reservations import ledger_state
from sailor_tasks.train.specs import MODEL_NAMES

TARGET_P99_MS = 2.0
"""The target for one decision's p99, on a shared snapshot and on one read from the ledger."""


def scaled_catalog(scale: int) -> Catalog:
    base = load_catalog()
    return Catalog(
        tuple(dataclasses.replace(o, capacity_gpus=(o.capacity_gpus or 0) * scale) for o in base.offers)
    )


def live_reservations(catalog: Catalog, n: int, rng: random.Random) -> tuple[Reservation, ...]:
    offers = catalog.offers
    return tuple(
        Reservation(
            f"live-{i}",
            o.region,
            o.zone,
            o.gpu_type,
            rng.choice((1, 1, 1, 2)),
            rng.choice(("spot", "on_demand")),
        )
        for i, o in enumerate(rng.choice(offers) for _ in range(n))
    )


def requests(catalog: Catalog, n: int, rng: random.Random) -> list[JobRequest]:
    out = []
    for i in range(n):
        regions = () if rng.random() < 0.6 else tuple(rng.sample(catalog.regions, rng.randint(1, 8)))
        out.append(
            JobRequest(
                job_name=f"j{i}",
                team=rng.choice(("research", "vision", "speech", "ads")),
                dataset_uri=f"sailor://source/datasets/d{rng.randrange(50)}",
                model=rng.choice(MODEL_NAMES),
                num_workers=rng.choice((1, 1, 2, 4, 8, 16)),
                gpu_type=rng.choice(("any", "any", *catalog.gpu_types)),
                regions=regions,
                market=rng.choice(("auto", "auto", "spot", "on_demand")),
                max_usd_per_hour=rng.choice((None, 20.0, 100.0, 500.0)),
                total_steps=rng.choice((300, 5_000, 100_000, 1_000_000)),
                checkpoint_every_steps=50,
                deadline_hours=rng.choice((None, None, 2.0, 24.0, 200.0)),
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--reservations", type=int, default=10_000)
    parser.add_argument("--capacity-scale", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fresh", type=int, default=500, help="decisions also timed on a snapshot read from a ledger"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    catalog = scaled_catalog(args.capacity_scale)
    index = index_for(catalog)
    reqs = requests(catalog, args.decisions, rng)
    datasets = sorted({r.dataset_uri for r in reqs})  # sorted: set order varies with the hash seed
    state = ClusterState(
        reservations=live_reservations(catalog, args.reservations, rng),
        assignment=Assignment(
            version=1,
            shares={"research": {"us-central1": 0.6, "europe-west4": 0.4}},
            region_load={r: rng.uniform(0.3, 2.6) for r in catalog.regions},
        ),
        replicas={d: tuple(rng.sample(catalog.regions, rng.randint(1, 3))) for d in datasets},
        dataset_bytes={d: rng.randint(1, 500) * 10**9 for d in datasets},
    )
    t0 = time.perf_counter()
    view_for(index, state)
    snapshot_ms = (time.perf_counter() - t0) * 1e3
    for r in reqs[:50]:  # warm caches (speed arrays per model, region masks)
        try:
            plan(r, catalog, state, "warm")
        except SailorError:
            pass
    samples, cpu, placed = [], [], 0
    for i, r in enumerate(reqs):
        t, c = time.perf_counter(), time.thread_time()
        try:
            plan(r, catalog, state, f"run-{i}")
            placed += 1
        except SailorError:
            pass
        samples.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.thread_time() - c) * 1e3)
    samples.sort()
    cpu.sort()
    fresh, fresh_cpu = [], []
    with tempfile.TemporaryDirectory() as folder:
        ledger = Ledger(f"sqlite:///{folder}/ledger.db")
        for res in state.reservations:
            ledger.reserve(res)
        ledger.publish_assignment(
            state.assignment.shares, source="bench", region_load=state.assignment.region_load
        )
        for d, regions in state.replicas.items():
            for region in regions:
                ledger.record_replica(d, region, f"file:///replicas/{region}", state.dataset_bytes[d], 1)
        for i, r in enumerate(reqs[: args.fresh]):
            t, c = time.perf_counter(), time.thread_time()
            try:
                plan(r, catalog, ledger_state(ledger, r, f"fresh-{i}"), f"fresh-{i}")
            except SailorError:
                pass
            fresh.append((time.perf_counter() - t) * 1e3)
            fresh_cpu.append((time.thread_time() - c) * 1e3)
        ledger.engine.dispose()
    fresh.sort()
    fresh_cpu.sort()
    result = {
        "decisions": len(samples),
        "placed": placed,
        "p50_ms": round(statistics.median(samples), 4),
        "p99_ms": round(samples[int(0.99 * (len(samples) - 1))], 4),
        "max_ms": round(samples[-1], 4),
        "p99_cpu_ms": round(cpu[int(0.99 * (len(cpu) - 1))], 4),
        "snapshot_ms": round(snapshot_ms, 3),
        "ledger_decisions": len(fresh),
        "ledger_p50_ms": round(statistics.median(fresh), 4) if fresh else None,
        "ledger_p99_ms": round(fresh[int(0.99 * (len(fresh) - 1))], 4) if fresh else None,
        "ledger_p99_cpu_ms": round(fresh_cpu[int(0.99 * (len(fresh_cpu) - 1))], 4) if fresh else None,
        "candidates": index.num_candidates,
        "regions": len(index.regions),
        "zones": len(index.zones),
        "gpu_types": len(index.gpu_types),
        "live_reservations": len(state.reservations),
    }
    result["target_met"] = result["p99_ms"] <= TARGET_P99_MS and (
        not fresh or result["ledger_p99_ms"] <= TARGET_P99_MS
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
