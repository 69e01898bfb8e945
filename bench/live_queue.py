"""SAILOR's queue on real Airflow services: runs wait (deferred) instead of failing for capacity.

Starts the real services (PostgreSQL, api-server, scheduler, dag-processor, triggerer; see
``sailor_tasks.testing.airflow_stack``) with a supply file that gives SAILOR capacity for 2
workers (2 T4 GPUs in one zone, nothing elsewhere) and a short lease (``--lease-s``).

1. A *victim* run (2 workers, longer) is triggered through the REST API and starts training.
2. ``--runs`` runs of 2 workers from teams ``a`` and ``b`` (alternating) are triggered through the
   REST API: nothing fits, so each waits in SAILOR's queue with its ``plan`` task deferred.
3. The victim is killed hard mid-training: SIGKILL to its task's process, the executor worker
   supervising it and its torchrun processes (a lost worker: no teardown runs, nothing renews its
   lease). After its lease expires, ``sailor_reconcile`` is triggered through the REST API: it
   tears down what the victim left on the local backend, reclaims the reservation and admits the
   queue's first run. Each run's teardown then admits the next.

While it runs, every ``--poll-s`` the script reads the ledger (GPUs held by live reservations) and
the REST API (task states). ``queued_worker_slots_max``: the most queued runs whose ``plan`` task
held a worker slot (state running/queued/scheduled, not deferred) on two consecutive polls (a
queued run's ``plan`` runs briefly when it enqueues and at each re-check, then defers).

Prints one JSON object as its last line: ``runs``, ``succeeded``, ``failed_for_capacity``,
``max_reserved_gpus`` (≤ ``capacity_gpus``), ``queued_worker_slots_max``,
``leaked_reservations_after_kill`` (the victim's live reservations after the reconciler ran),
``deferred_max`` (most plan tasks deferred at once), the queue waits and the admission order.

Run: .venv/bin/python bench/live_queue.py [--runs 6] [--steps 30] [--lease-s 30]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from sailor_tasks import storage
from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
from sailor_tasks.ledger import Ledger
from sailor_tasks.model import run_key
from sailor_tasks.testing.airflow_stack import AirflowStack

ROOT = Path(__file__).resolve().parents[1]
ZONE = "us-central1-a"
CAPACITY_GPUS = 2
PARAMS = {
    "model": "tiny_gpt",
    "num_workers": 2,
    "gpu_type": "T4",
    "regions": ["us-central1"],
    "batch_size": 8,
    "max_queue_hours": 2,
}
HOLDING = ("running", "queued", "scheduled", "up_for_retry", "up_for_reschedule")


def kill_run_hard(key: str) -> list[int]:
    """SIGKILL the run's training processes, the task process that started them and the executor
    worker that supervises it (supervisor first, so nothing reports the task's end)."""
    import psutil

    from sailor_tasks.backends.local import run_processes

    procs = run_processes(key)
    tasks = {p.parent() for p in procs if p.parent() is not None and p.parent() not in procs}
    tasks = {t for t in tasks if t.pid != os.getpid()}
    supervisors = {t.parent() for t in tasks if t.parent() is not None}
    killed = []
    for p in [*supervisors, *tasks, *procs]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
            killed.append(p.pid)
    return killed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=30, help="total_steps of each queued run")
    parser.add_argument("--victim-steps", type=int, default=20000, help="total_steps of the run killed hard")
    parser.add_argument("--lease-s", type=float, default=30.0)
    parser.add_argument("--poll-s", type=float, default=5.0)
    parser.add_argument("--timeout-s", type=float, default=2400.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the services on SIGTERM too

    root = Path(tempfile.mkdtemp(prefix="sailor-live-queue-", dir="/tmp"))
    supply = root / "supply.yaml"
    supply.write_text(
        f"version: 1\ndefaults:\n  capacity_gpus: {{}}\n  preemption_rate_per_hour: {{T4: 0.0}}\nzones:\n  {ZONE}:\n    T4: {{capacity_gpus: {CAPACITY_GPUS}}}\n"
    )
    stack = AirflowStack(
        root, ROOT, extra_env={"SAILOR_SUPPLY_FILE": str(supply), "SAILOR_LEASE_S": str(args.lease_s)}
    )
    started = time.monotonic()
    out: dict = {}
    try:
        stack.start()
        settings = stack.settings()
        write_demo_dataset(storage.resolve(DEMO_DATASET, settings))
        client = stack.client()
        client.unpause("sailor_train")
        for _ in range(60):  # parsed with the others, but only sailor_train's parse is awaited
            try:
                client.unpause("sailor_reconcile")
                break
            except Exception:  # noqa: BLE001 - not parsed yet
                time.sleep(2)
        ledger = Ledger(settings.ledger_url)

        victim = client.trigger(
            "sailor_train",
            {**PARAMS, "job_name": "victim", "team": "a", "total_steps": args.victim_steps,
             "checkpoint_every_steps": 50},
        )["dag_run_id"]
        deadline = time.monotonic() + 900
        while {t["task_id"]: t["state"] for t in client.task_instances("sailor_train", victim)}.get("train") != "running":
            if time.monotonic() > deadline:
                raise TimeoutError(f"victim never started training\n{stack.dump_logs()}")
            time.sleep(2)

        runs = []
        for i in range(args.runs):
            team = "ab"[i % 2]
            conf = {**PARAMS, "job_name": f"q{i}", "team": team, "total_steps": args.steps,
                    "checkpoint_every_steps": min(10, args.steps)}
            runs.append(client.trigger("sailor_train", conf)["dag_run_id"])

        max_reserved = 0
        deferred_max = 0
        slots_max = 0
        holding_before: set[str] = set()
        killed: list[int] = []
        reconcile_run = None
        leaked_after_kill = None
        finished: dict[str, str] = {}
        victim_key = run_key(victim)
        t_end = time.monotonic() + args.timeout_s
        while len(finished) < len(runs):
            if time.monotonic() > t_end:
                raise TimeoutError(f"runs still active after {args.timeout_s:.0f} s: "
                                   f"{sorted(set(runs) - set(finished))}\n{stack.dump_logs()}")
            live = ledger.live_reservations()
            max_reserved = max(max_reserved, sum(r.gpus for r in live))
            queued = {e["run_id"] for e in ledger.queue_entries(("queued",))}
            holding, deferred = set(), 0
            for run_id in runs:
                if run_id in finished:
                    continue
                states = {t["task_id"]: t["state"] for t in client.task_instances("sailor_train", run_id)}
                deferred += states.get("plan") == "deferred"
                if run_id in queued and states.get("plan") in HOLDING:
                    holding.add(run_id)
                state = client.dag_run("sailor_train", run_id)["state"]
                if state in ("success", "failed"):
                    finished[run_id] = state
            slots_max = max(slots_max, len(holding & holding_before))
            holding_before = holding
            deferred_max = max(deferred_max, deferred)

            if not killed and deferred_max >= min(2, args.runs):
                time.sleep(5)  # mid-training: it has been training since before the queue formed
                killed = kill_run_hard(victim_key)
                killed_at = time.monotonic()
            if killed and reconcile_run is None and time.monotonic() - killed_at > args.lease_s + 5:
                reconcile_run = client.trigger("sailor_reconcile")["dag_run_id"]
                if client.wait("sailor_reconcile", reconcile_run, timeout_s=600, poll_s=3) != "success":
                    raise RuntimeError(f"sailor_reconcile failed\n{stack.dump_logs()}")
                leaked_after_kill = sum(1 for r in ledger.live_reservations() if r.run_id == victim)
            time.sleep(args.poll_s)

        entries = {e["run_id"]: e for e in ledger.queue_entries(("queued", "admitted", "timed_out", "failed", "left"))}
        failed_for_capacity = 0
        for run_id, state in finished.items():
            if state != "success":
                record = ledger.get_run(run_id) or {}
                text = f"{record.get('error') or ''} {(entries.get(run_id) or {}).get('reason') or ''}"
                if any(w in text for w in ("Capacity", "capacity", "queue", "deadline")):
                    failed_for_capacity += 1
        admitted = sorted(
            (e for e in entries.values() if e["admitted_at"] is not None and e["run_id"] in runs),
            key=lambda e: e["admitted_at"],
        )
        waits = [(e["admitted_at"] - e["enqueued_at"]).total_seconds() for e in admitted]
        teams = {r: (ledger.get_run(r) or {}).get("team") for r in runs}
        out = {
            "runs": len(runs),
            "succeeded": sum(s == "success" for s in finished.values()),
            "failed_for_capacity": failed_for_capacity,
            "capacity_gpus": CAPACITY_GPUS,
            "max_reserved_gpus": max_reserved,
            "queued_worker_slots_max": slots_max,
            "deferred_max": deferred_max,
            "leaked_reservations_after_kill": leaked_after_kill,
            "max_reserved_gpus_exact": peak_reserved_gpus(ledger),
            "victim_killed_pids": len(killed),
            "victim_status_after_reconcile": (ledger.get_run(victim) or {}).get("status"),
            "queued_runs": len(admitted),
            "admission_order_teams": [teams[e["run_id"]] for e in admitted],
            "queue_wait_s_max": round(max(waits), 1) if waits else None,
            "queue_wait_s_mean": round(sum(waits) / len(waits), 1) if waits else None,
            "queue_policy": settings.queue_policy,
            "wall_s": round(time.monotonic() - started, 1),
            "cpu_count": os.cpu_count(),
        }
        ledger.dispose()
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out))
    if not killed or leaked_after_kill is None:
        sys.exit("the victim was not killed hard, or the reconciler never ran: the hard-kill figures are unmeasured")


def peak_reserved_gpus(ledger: Ledger) -> int:
    """The most GPUs reserved at any one moment over the whole run, from the ledger's records of
    every reservation's interval (live and released ones, and the intervals of reservations a
    re-plan replaced): exact, where the polled ``max_reserved_gpus`` can miss a short overlap."""
    from sqlalchemy import select

    from sailor_tasks.ledger import schema as t

    r, i = t.reservations.c, t.reservation_intervals.c
    events: list[tuple[float, int]] = []
    with ledger.engine.connect() as c:
        rows = [*c.execute(select(r.created_at, r.released_at, r.gpus)), *c.execute(select(i.started_at, i.ended_at, i.gpus))]
    for start, end, gpus in rows:
        events.append((start.timestamp(), gpus))
        if end is not None:
            events.append((end.timestamp(), -gpus))
    held = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # a release before a reserve at one instant
        held += delta
        peak = max(peak, held)
    return peak


if __name__ == "__main__":
    main()
