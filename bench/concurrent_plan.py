"""50 planners in parallel processes against one ledger, competing for scarce capacity (ParSync).

Every planner plans the same kind of request (8x H100 in three regions) from its own snapshot,
taken at the same moment behind a barrier, so most views are stale by the time they commit (``conflicts_retried`` counts the commits refused and re-planned);
``plan_and_reserve`` detects the conflict in its checked transaction and re-plans on a fresh view,
up to ``MAX_ATTEMPTS`` times, then fails cleanly with ``CapacityUnavailableError``. Capacity is
the packaged catalog's H100 offers with ``--capacity`` GPUs per zone. Afterwards the script
checks, from the ledger itself, that no (zone, GPU type) holds more than its capacity, that every
placed planner holds exactly one reservation and every failed one none.

Runs on SQLite (a file in a temp folder) and, when ``initdb``/``pg_ctl`` are on PATH, on a private
PostgreSQL cluster started in a temp folder on a free port (stopped afterwards).
Prints one JSON object as its last line.

Run: .venv/bin/python bench/concurrent_plan.py [--planners 50] [--capacity 16] [--no-postgres]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter

from sailor_tasks.catalog import Catalog, load_catalog
from sailor_tasks.errors import CapacityUnavailableError
from sailor_tasks.ledger import Ledger
from sailor_tasks.model import JobRequest
from sailor_tasks.placement.index import index_for
from sailor_tasks.placement.reservations import plan_and_reserve

REGIONS = ("us-central1", "us-east4", "europe-west4")


def scarce_catalog(capacity: int) -> Catalog:
    offers = [o for o in load_catalog().offers if o.gpu_type == "H100" and o.region in REGIONS]
    return Catalog(tuple(dataclasses.replace(o, capacity_gpus=capacity) for o in offers))


def request(i: int) -> JobRequest:
    return JobRequest(
        job_name=f"p{i}",
        team="research",
        dataset_uri="sailor://source/datasets/demo-text",
        model="gpt_25m",
        num_workers=8,
        gpu_type="H100",
        regions=REGIONS,
        market="spot",
        total_steps=10_000,
    )


def planner(i: int, url: str, catalog: Catalog, barrier, results) -> None:
    ledger = Ledger(url)
    barrier.wait()
    try:
        reserved = plan_and_reserve(request(i), catalog, ledger, f"planner-{i}")
        results.put((i, "placed", reserved.attempts, len(reserved.conflicts), reserved.placement.zone))
    except CapacityUnavailableError as exc:
        conflicts = sum("taken by another planner" in h for h in exc.history)
        results.put((i, "failed_clean", conflicts, conflicts, None))
    except Exception as exc:  # reported, never hidden
        results.put((i, f"error: {type(exc).__name__}: {exc}", 0, 0, None))
    finally:
        ledger.dispose()


def run_planners(url: str, catalog: Catalog, n: int) -> dict:
    Ledger(url).dispose()  # create the tables once, before the race
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=planner, args=(i, url, catalog, barrier, results)) for i in range(n)]
    t = time.perf_counter()
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    wall = time.perf_counter() - t

    ledger = Ledger(url)
    live = ledger.live_reservations()
    ledger.dispose()
    capacity = {(o.zone, o.gpu_type): o.capacity_gpus for o in catalog.offers}
    held: Counter[tuple[str, str]] = Counter()
    for r in live:
        held[(r.zone, r.gpu_type)] += r.gpus
    per_run = Counter(r.run_id for r in live)
    placed = {f"planner-{i}" for i, status, *_ in outcomes if status == "placed"}
    errors = [status for _, status, *_ in outcomes if status.startswith("error")]
    return {
        "planners": n,
        "placed": len(placed),
        "failed_clean": sum(1 for _, s, *_ in outcomes if s == "failed_clean"),
        "errors": errors[:3],
        "conflicts_retried": sum(c for *_, c, _ in outcomes),
        "conflicts_of_placed": sum(c for _, s, _, c, _ in outcomes if s == "placed"),
        "overcommitted": sum(1 for key, gpus in held.items() if gpus > capacity[key]),
        "reservations_consistent": set(per_run) == placed and all(v == 1 for v in per_run.values()),
        "gpus_reserved": sum(held.values()),
        "capacity_gpus": sum(capacity.values()),
        "wall_s": round(wall, 2),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """A throwaway PostgreSQL cluster in a temp folder (as user ``postgres`` when run as root)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sailor-pg-")
        self.port = _free_port()
        self.data = os.path.join(self.dir, "data")
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            self.prefix = ["runuser", "-u", "postgres", "--"]

    def _run(self, *argv: str) -> None:
        subprocess.run([*self.prefix, *argv], check=True, capture_output=True, text=True)

    def __enter__(self) -> str:
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")
        opts = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
        )
        self._run("pg_ctl", "-D", self.data, "-o", opts, "-l", os.path.join(self.dir, "log"), "-w", "start")
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def __exit__(self, *exc) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--planners", type=int, default=50)
    parser.add_argument("--capacity", type=int, default=16, help="H100 GPUs per zone")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    catalog = scarce_catalog(args.capacity)
    index_for(catalog)  # built before fork, shared copy-on-write
    backends = {}
    with tempfile.TemporaryDirectory() as tmp:
        backends["sqlite"] = run_planners(f"sqlite:///{tmp}/ledger.db", catalog, args.planners)
    if not args.no_postgres and shutil.which("initdb") and shutil.which("pg_ctl"):
        with PrivatePostgres() as url:
            backends["postgresql"] = run_planners(url, catalog, args.planners)
    else:
        backends["postgresql"] = "skipped: initdb/pg_ctl not on PATH" if not args.no_postgres else "skipped"
    runs = [b for b in backends.values() if isinstance(b, dict)]
    sqlite = backends["sqlite"]
    # Top level: the default (SQLite) ledger's race; overcommitted and consistency over every backend.
    result = {
        "planners": args.planners,
        "overcommitted": sum(b["overcommitted"] for b in runs),
        "conflicts_retried": sqlite["conflicts_retried"],
        "failed_clean": sqlite["failed_clean"],
        "placed": sqlite["placed"],
        "consistent": all(b["reservations_consistent"] and not b["errors"] for b in runs),
        # the figures above cover these ledgers only: PostgreSQL skipped is not PostgreSQL passed
        "backends_run": [name for name, b in backends.items() if isinstance(b, dict)],
        "all_requested_backends_ran": len(runs) == (1 if args.no_postgres else 2),
        "backends": backends,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
