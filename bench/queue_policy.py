"""Live admission policies over a seeded mixed queue on simulated capacity.

Drives the live admission code (``sailor_tasks.queue``: ``rank`` with the policy objects, and
``admission_pass``, the loop ``stages.queueing.admit_queued`` runs) in a discrete-event simulation:
runs arrive, wait in the queue, are admitted when the policy's order and the free GPUs allow, hold
their GPUs until they finish (no preemption: the live path does not time-share), and free them.
An admission pass runs at every arrival and completion and at each waiting run's urgent time (its
latest start minus ``URGENT_MARGIN_S``), as the live queue's re-checks do.

Workload (``--seed``): two teams; team ``a`` submits a burst of runs at the start, team ``b`` a
steady stream, so that ``fifo`` serves ``a``'s burst first. Sizes 1/2/4 GPUs, on two GPU types
(V100, and T4 at 0.3-0.5 of its speed per model); a third of the runs have a deadline of 1.3-4x
their fastest run time after arrival. Spot capacity: 8 V100 + 8 T4, offered load about 0.9 of it
over ``--hours``. On-demand is used only by a run at its latest start that spot cannot take
(Cameo). A run past its latest start that cannot be placed fails then (early), which counts as a
miss. Two scenarios: ``open`` (on-demand not capped by the spot supply: the market has it, at a
higher price; its GPU-hours are reported), where every deadline on-demand could meet must be met
(``latest_start_misses``), and ``capped`` (2 V100 + 2 T4 on-demand), where deadlines compete and
the policies' misses differ (``edf_misses``, ``fifo_misses``).

Figures per policy (las, fifo, ftf, edf): avg JCT (h), deadline misses (late or failed early),
team share ratio (max/min GPU-hours per team while both teams had runs waiting, weighted),
latest-start misses (misses among runs whose deadline on-demand alone could meet: their whole
run fits between arrival and deadline). Top-level: ``las_vs_fifo_team_fairness`` (las ratio,
fifo ratio), ``edf_misses`` and ``fifo_misses``, ``latest_start_misses`` (summed over policies).

Run: .venv/bin/python bench/queue_policy.py [--runs 60] [--seed 7] [--hours 16]
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import time
from dataclasses import dataclass

from sailor_tasks.queue import HeldRun, QueuedRun, Ranked, admission_pass, rank
from sailor_tasks.queue.admission import URGENT_MARGIN_S

SPOT = {"V100": 8, "T4": 8}
ON_DEMAND_CAPPED = {"V100": 2, "T4": 2}
"""The on-demand GPUs of the ``capped`` scenario, where deadlines compete for them."""
POLICIES = ("las", "fifo", "ftf", "edf")


@dataclass(frozen=True)
class Job:
    run_id: str
    team: str
    gpus: int
    arrival_s: float
    steps: float
    throughput: dict[str, float]
    deadline_s: float | None

    @property
    def fastest_s(self) -> float:
        return self.steps / max(self.throughput.values())

    @property
    def latest_start_s(self) -> float | None:
        return None if self.deadline_s is None else self.deadline_s - self.fastest_s


def workload(n: int, seed: int, hours: float) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    burst = n // 2
    for i in range(n):
        team = "a" if i < burst else "b"
        arrival = rng.uniform(0, 600) if team == "a" else rng.uniform(0, hours * 3600)
        gpus = rng.choice((1, 2, 2, 4))
        v100 = 2.0 * gpus  # steps/s of the whole run
        thr = {"V100": v100, "T4": v100 * rng.uniform(0.3, 0.5)}
        hours = rng.uniform(0.5, 3.0)  # on V100
        steps = v100 * hours * 3600
        deadline = None
        if rng.random() < 1 / 3:
            deadline = arrival + rng.uniform(1.3, 4.0) * hours * 3600
        jobs.append(Job(f"{team}-{i:03d}", team, gpus, arrival, steps, thr, deadline))
    return sorted(jobs, key=lambda j: j.arrival_s)


def simulate(jobs: list[Job], policy: str, on_demand: dict[str, float]) -> dict:
    by_id = {j.run_id: j for j in jobs}
    free: dict[str, dict[str, float]] = {"spot": dict(SPOT), "on_demand": dict(on_demand)}
    on_demand_gpu_s = 0.0
    queued: dict[str, Job] = {}
    running: dict[str, tuple[str, str, float, float]] = {}  # run → (pool, gpu type, start, end)
    done: dict[str, float] = {}
    failed: set[str] = set()
    held_log: list[tuple[str, int, float, float]] = []  # (team, gpus, start, end) on spot
    events: list[tuple[float, int, str, str]] = []
    for j in jobs:
        heapq.heappush(events, (j.arrival_s, 0, "arrive", j.run_id))
        if j.latest_start_s is not None:
            heapq.heappush(events, (max(j.arrival_s, j.latest_start_s - URGENT_MARGIN_S), 2, "wake", j.run_id))
            heapq.heappush(events, (max(j.arrival_s, j.latest_start_s), 2, "wake", j.run_id))
    contended_gpu_s = {"a": 0.0, "b": 0.0}
    last_t = 0.0
    passes = 0
    while events:
        t = events[0][0]
        # GPU-seconds per team on spot since the last event, counted while both teams had runs waiting.
        if all(any(q.team == team for q in queued.values()) for team in contended_gpu_s):
            for run_id, (pool, _g, _s, _e) in running.items():
                if pool == "spot":
                    contended_gpu_s[by_id[run_id].team] += by_id[run_id].gpus * (t - last_t)
        last_t = t
        while events and events[0][0] == t:
            _, _, kind, run_id = heapq.heappop(events)
            if kind == "arrive":
                queued[run_id] = by_id[run_id]
            elif kind == "end":
                pool, gtype, _s, _e = running.pop(run_id)
                free[pool][gtype] += by_id[run_id].gpus
        if not queued:
            continue
        passes += 1
        views = [
            QueuedRun(
                run_id=j.run_id,
                team=j.team,
                gpus=j.gpus,
                throughput=j.throughput,
                arrival_s=j.arrival_s,
                expected_s=j.fastest_s,
                steps_remaining=j.steps,
                deadline_s=j.deadline_s,
                latest_start_s=j.latest_start_s,
            )
            for j in queued.values()
        ]
        held = [
            HeldRun(
                run_id=r,
                team=by_id[r].team,
                gpus=by_id[r].gpus,
                gpu_type=g,
                throughput=by_id[r].throughput,
                started_s=s,
                expected_end_s=e,
            )
            for r, (pool, g, s, e) in running.items()
            if pool == "spot"
        ]
        attained: dict[str, float] = {}
        for team, gpus, s, e in held_log:
            start, end = max(s, t - 24 * 3600), min(e, t)
            if end > start:
                attained[team] = attained.get(team, 0.0) + gpus * (end - start)
        ranked = rank(views, held, SPOT, t, policy, {}, attained)

        def try_admit(r: Ranked, t: float = t) -> bool | None:
            nonlocal on_demand_gpu_s
            j = by_id[r.run_id]
            pools = ("spot", "on_demand") if r.urgent else ("spot",)
            for pool in pools:
                # As the live placement engine's deadline rule: only GPU types that finish in time.
                fits = [
                    g
                    for g in j.throughput
                    if free[pool][g] >= j.gpus
                    and (j.deadline_s is None or t + j.steps / j.throughput[g] <= j.deadline_s)
                ]
                if fits:
                    g = max(fits, key=lambda g: j.throughput[g])
                    free[pool][g] -= j.gpus
                    end = t + j.steps / j.throughput[g]
                    running[j.run_id] = (pool, g, t, end)
                    if pool == "spot":
                        held_log.append((j.team, j.gpus, t, end))
                    else:
                        on_demand_gpu_s += j.gpus * (end - t)
                    heapq.heappush(events, (end, 1, "end", j.run_id))
                    done[j.run_id] = end
                    del queued[j.run_id]
                    return True
            if j.latest_start_s is not None and t >= j.latest_start_s:
                failed.add(j.run_id)  # fails early: even on-demand cannot take it by its latest start
                del queued[j.run_id]
                return None
            return False

        admission_pass(ranked, try_admit)
    jct = [done[j.run_id] - j.arrival_s for j in jobs if j.run_id in done]
    with_deadline = [j for j in jobs if j.deadline_s is not None]
    missed = [j for j in with_deadline if j.run_id in failed or done[j.run_id] > j.deadline_s + 1e-6]
    meetable = {j.run_id for j in with_deadline if j.deadline_s - j.arrival_s >= j.fastest_s}
    shares = [contended_gpu_s[t] for t in sorted(contended_gpu_s)]
    return {
        "avg_jct_h": round(sum(jct) / len(jct) / 3600.0, 3),
        "finished": len(done),
        "deadline_runs": len(with_deadline),
        "deadline_misses": len(missed),
        "failed_early": len(failed),
        "latest_start_misses": sum(j.run_id in meetable for j in missed),
        "team_gpu_h_while_contended": {t: round(contended_gpu_s[t] / 3600.0, 2) for t in sorted(contended_gpu_s)},
        "team_share_ratio": round(max(shares) / min(shares), 3) if min(shares) > 0 else None,
        "on_demand_gpu_h": round(on_demand_gpu_s / 3600.0, 2),
        "admission_passes": passes,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--hours", type=float, default=16.0, help="team b's runs arrive over this many hours")
    args = parser.parse_args()
    jobs = workload(args.runs, args.seed, args.hours)
    scenarios = {"open": {"V100": float("inf"), "T4": float("inf")}, "capped": ON_DEMAND_CAPPED}
    per: dict[str, dict[str, dict]] = {name: {} for name in scenarios}
    for name, on_demand in scenarios.items():
        for policy in POLICIES:
            started = time.perf_counter()
            per[name][policy] = simulate(jobs, policy, on_demand)
            per[name][policy]["wall_s"] = round(time.perf_counter() - started, 2)
            print(f"{name} {policy}: {json.dumps(per[name][policy])}")
    open_, capped = per["open"], per["capped"]
    out = {
        "runs": len(jobs),
        "seed": args.seed,
        "avg_jct_h": {p: open_[p]["avg_jct_h"] for p in POLICIES},
        "on_demand_gpu_h": {p: open_[p]["on_demand_gpu_h"] for p in POLICIES},
        "las_vs_fifo_team_fairness": {"las": open_["las"]["team_share_ratio"], "fifo": open_["fifo"]["team_share_ratio"]},
        "las_fairer_than_fifo": (open_["las"]["team_share_ratio"] or 0) <= (open_["fifo"]["team_share_ratio"] or 0),
        "latest_start_misses": sum(open_[p]["latest_start_misses"] for p in POLICIES),
        "capped_deadline_misses": {p: capped[p]["deadline_misses"] for p in POLICIES},
        "edf_misses": capped["edf"]["deadline_misses"],
        "fifo_misses": capped["fifo"]["deadline_misses"],
        "per_policy": per,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
