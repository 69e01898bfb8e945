"""The queue simulator: runs arrive, wait in SAILOR's queue and are admitted by the live
admission pass (``sailor_tasks.queue.admit``) on simulated capacity, then hold their GPUs to the
end (non-preemptive, as live: admission does not time-share).

Event-driven: an admission pass runs whenever the live queue would run one, at an arrival that
finds runs waiting (or does not fit), at every run's end (its teardown), at each waiting run's
urgent time and latest start, and when its ``max_queue_hours`` run out (the waiting ``plan``'s
re-checks). A run that arrives when nobody waits is planned and reserved at once, as ``plan``
does; one that does not fit joins the queue unless ``refused_on_arrival`` turns it away (the
same function the live ``plan`` asks). Placement and reservation are ``capacity.SimCapacity``'s:
the placement engine over the simulated spot and on-demand zones.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sailor_tasks.catalog.throughput import ThroughputTable
from sailor_tasks.errors import CapacityUnavailableError, InvalidRequestError, NoFeasibleOfferError
from sailor_tasks.policies.mechanism import GPUS_PER_SERVER
from sailor_tasks.queue import (
    ATTAINED_WINDOW_S,
    QUEUE_POLICIES,
    URGENT_MARGIN_S,
    QueuedRun,
    admit,
    refused_on_arrival,
)
from sailor_tasks.simulator.queue.capacity import SPOT_REGION, SimCapacity
from sailor_tasks.simulator.queue.workload import QueueJob

logger = logging.getLogger(__name__)

END, ARRIVE, WAKE = 0, 1, 2
"""Event kinds, in the order they are handled at one instant (capacity frees before arrivals)."""


@dataclass(frozen=True)
class QueueSimConfig:
    """The simulated capacity and the queue's settings.

    ``on_demand_gpus`` None: on-demand is not capped (the market has it, at its price).
    """

    spot_gpus: Mapping[str, int]
    on_demand_gpus: Mapping[str, int] | None = None
    policy: str = "las"
    team_weights: Mapping[str, float] = field(default_factory=dict)
    gpus_per_server: int = GPUS_PER_SERVER

    def __post_init__(self) -> None:
        if self.policy not in QUEUE_POLICIES:
            raise ValueError(f"queue policy {self.policy!r} is not one of {', '.join(QUEUE_POLICIES)}")
        bad = {t: w for t, w in self.team_weights.items() if not w > 0}
        if bad:
            raise ValueError(f"team weights must be > 0: {bad}")


@dataclass
class RunOutcome:
    """How one run went: ``state`` finished (admitted, ran to its end), failed or timed_out."""

    run_id: str
    team: str
    gpus: int
    arrival_s: float
    expected_s: float
    deadline_s: float | None
    latest_start_s: float | None
    state: str = "waiting"
    admitted_s: float | None = None
    end_s: float | None = None
    market: str | None = None
    gpu_type: str | None = None
    zone: str | None = None
    num_nodes: int | None = None
    reason: str = ""

    @property
    def wait_s(self) -> float | None:
        return None if self.admitted_s is None else self.admitted_s - self.arrival_s

    @property
    def jct_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.arrival_s

    @property
    def missed(self) -> bool:
        """It had a deadline and did not finish by it (late, failed early or timed out)."""
        if self.deadline_s is None:
            return False
        return self.end_s is None or self.end_s > self.deadline_s + 1e-6

    @property
    def meetable(self) -> bool:
        """Its deadline leaves room for its expected hours after arrival (latest start ≥ arrival):
        on-demand alone could meet it."""
        return self.latest_start_s is not None and self.latest_start_s >= self.arrival_s


@dataclass
class QueueSimResult:
    config: QueueSimConfig
    runs: list[RunOutcome]
    admitted: list[str]
    """Run ids in the order they were admitted (at arrival or by a pass)."""
    passes: int
    contended_gpu_s: dict[str, float]
    """team → spot GPU-seconds it held while every team had a run waiting."""
    on_demand_gpu_s: dict[str, float]
    max_used: dict[tuple[str, str], int]
    """(zone, GPU type) → the most GPUs held at once."""
    capacity: dict[tuple[str, str], int]

    def teams(self) -> list[str]:
        return sorted({r.team for r in self.runs})

    def share_ratio(self) -> float | None:
        """Max/min of the teams' contended GPU-hours per team weight (1: equal); None when a team
        got none or there was no contention."""
        weights = self.config.team_weights
        shares = [self.contended_gpu_s.get(t, 0.0) / weights.get(t, 1.0) for t in self.teams()]
        if len(shares) < 2 or min(shares) <= 0:
            return None
        return max(shares) / min(shares)

    def to_json(self) -> dict[str, Any]:
        """The figures overall and per team (hours, rounded)."""

        def figures(runs: Sequence[RunOutcome]) -> dict[str, Any]:
            done = [r for r in runs if r.state == "finished"]
            waits = [r.wait_s for r in done if r.wait_s is not None]
            with_deadline = [r for r in runs if r.deadline_s is not None]
            return {
                "runs": len(runs),
                "finished": len(done),
                "failed_early": sum(r.state == "failed" for r in runs),
                "timed_out": sum(r.state == "timed_out" for r in runs),
                "avg_jct_h": _h(sum(r.jct_s or 0.0 for r in done) / len(done)) if done else None,
                "avg_wait_h": _h(sum(waits) / len(waits)) if waits else None,
                "max_wait_h": _h(max(waits)) if waits else None,
                "deadline_runs": len(with_deadline),
                "deadline_misses": sum(r.missed for r in with_deadline),
                "latest_start_misses": sum(r.missed and r.meetable for r in with_deadline),
            }

        total_contended = sum(self.contended_gpu_s.values())
        teams = {}
        for t in self.teams():
            teams[t] = {
                **figures([r for r in self.runs if r.team == t]),
                "gpu_h_while_contended": _h(self.contended_gpu_s.get(t, 0.0)),
                "share_while_contended": round(self.contended_gpu_s.get(t, 0.0) / total_contended, 3)
                if total_contended
                else None,
                "on_demand_gpu_h": _h(self.on_demand_gpu_s.get(t, 0.0)),
            }
        ends = [r.end_s for r in self.runs if r.end_s is not None]
        ratio = self.share_ratio()
        return {
            "admission": "queue",
            "policy": self.config.policy,
            **figures(self.runs),
            "team_share_ratio": None if ratio is None else round(ratio, 3),
            "on_demand_gpu_h": _h(sum(self.on_demand_gpu_s.values())),
            "on_demand_capped": self.config.on_demand_gpus is not None,
            "admission_passes": self.passes,
            "makespan_h": _h(max(ends) - min(r.arrival_s for r in self.runs)) if ends else None,
            "overcommitted": sum(self.max_used.get(k, 0) > n for k, n in self.capacity.items()),
            "teams": teams,
        }


def _h(seconds: float) -> float:
    return round(seconds / 3600.0, 3)


def simulate_queue(
    jobs: Sequence[QueueJob],
    table: ThroughputTable,
    config: QueueSimConfig,
    prices: Mapping[str, Mapping[str, float]] | None = None,
) -> QueueSimResult:
    """Run ``jobs`` through the queue on ``config``'s capacity (see the module).

    ``prices``: as ``SimCapacity``'s (default: the packaged catalog's cheapest per GPU type).

    Raises:
        ValueError: duplicate run ids, a job type the throughput table does not know, or bad
            capacity (the message names it).
    """
    cap = SimCapacity(
        table, config.spot_gpus, config.on_demand_gpus, prices, config.gpus_per_server
    )
    for j in jobs:
        if j.run_id in cap.jobs:
            raise ValueError(f"run id {j.run_id!r} appears twice in the workload")
        if j.job_type not in table.alone:
            raise ValueError(f"run {j.run_id}: job type {j.job_type!r} is not in the throughput table")
        cap.jobs[j.run_id] = j
    teams = sorted({j.team for j in jobs})
    weights = dict(config.team_weights)
    outcomes: dict[str, RunOutcome] = {}
    queued: dict[str, QueuedRun] = {}
    events: list[tuple[float, int, int, str]] = []
    seq = 0

    def push(t: float, kind: int, run_id: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, kind, seq, run_id))

    for j in jobs:
        push(j.arrival_s, ARRIVE, j.run_id)
    contended = dict.fromkeys(teams, 0.0)
    on_demand = dict.fromkeys(teams, 0.0)
    capacity = cap.capacity_of()
    max_used: dict[tuple[str, str], int] = {}
    passes = 0
    last_t = min((j.arrival_s for j in jobs), default=0.0)

    def started(run_id: str) -> None:
        hold = cap.holds[run_id]
        out = outcomes[run_id]
        out.state, out.admitted_s, out.end_s = "finished", hold.start_s, hold.end_s
        out.market, out.gpu_type, out.zone = hold.market, hold.placement.gpu_type, hold.placement.zone
        out.num_nodes = hold.placement.num_nodes
        if hold.placement.region != SPOT_REGION:
            on_demand[hold.team] += hold.gpus * (hold.end_s - hold.start_s)
        push(hold.end_s, END, run_id)
        for key, n in cap.used().items():
            max_used[key] = max(max_used.get(key, 0), n)

    def turned_away(run_id: str, state: str, reason: str) -> None:
        cap.ended.setdefault(run_id, (state, reason))
        outcomes[run_id].state, outcomes[run_id].reason = state, reason

    def attained(now: float) -> dict[str, float]:
        """team → spot GPU-seconds held over the attained-service window (as the ledger counts)."""
        out: dict[str, float] = {}
        since = now - ATTAINED_WINDOW_S
        for h in cap.admitted:
            if h.placement.region != SPOT_REGION:
                continue
            lo, hi = max(h.start_s, since), min(h.end_s, now)
            if hi > lo:
                out[h.team] = out.get(h.team, 0.0) + h.gpus * (hi - lo)
        return out

    def arrive(job: QueueJob, now: float) -> None:
        expected = cap.expected_s(job)
        deadline = job.deadline_s
        run = QueuedRun(
            run_id=job.run_id,
            team=job.team,
            gpus=job.gpus,
            throughput=cap.throughput(job),
            arrival_s=now,
            expected_s=expected or 0.0,
            priority=job.priority,
            steps_remaining=job.total_steps,
            deadline_s=deadline,
            latest_start_s=None if deadline is None else deadline - (expected or 0.0),
            market=job.market,
            wait_until_s=now + job.max_queue_hours * 3600.0,
            waiting_for=f"{job.gpus}x GPUs ({job.job_type[0]})",
        )
        outcomes[job.run_id] = RunOutcome(
            job.run_id, job.team, job.gpus, now, run.expected_s, deadline, run.latest_start_s
        )
        tried = not queued
        if tried:  # nobody waits: planned and reserved now, as ``plan`` does
            try:
                cap.reserve(run, None, job.deadline_hours)
            except CapacityUnavailableError:
                pass
            except (NoFeasibleOfferError, InvalidRequestError) as exc:
                turned_away(job.run_id, "failed", f"{type(exc).__name__}: {exc}")
                return
            else:
                started(job.run_id)
                return
        refusal = refused_on_arrival(run, now, tried)
        if refusal is not None:
            state = "timed_out" if run.wait_until_s is not None and run.wait_until_s <= now else "failed"
            turned_away(job.run_id, state, f"{type(refusal).__name__}: {refusal}")
            return
        queued[job.run_id] = run
        wakes = [run.wait_until_s]
        if run.latest_start_s is not None:
            wakes += [run.latest_start_s - URGENT_MARGIN_S, run.latest_start_s]
        for t in wakes:
            if t is not None and t > now:
                push(t, WAKE, job.run_id)

    while events:
        t = events[0][0]
        if queued and all(any(q.team == team for q in queued.values()) for team in teams):
            for h in cap.holds.values():
                if h.placement.region == SPOT_REGION:
                    contended[h.team] += h.gpus * (t - last_t)
        last_t = t
        cap.now_s = t
        arriving = []
        moved = False  # capacity freed, a run arrived, or a waiting run's time came
        while events and events[0][0] == t:
            _, kind, _, run_id = heapq.heappop(events)
            if kind == END:
                cap.release(run_id)
                moved = True
            elif kind == ARRIVE:
                arriving.append(run_id)
                arrive(cap.jobs[run_id], t)
                moved = True
            else:  # WAKE: its urgency, latest start or time-out; none once it has left the queue
                moved = moved or run_id in queued
        if not queued or not moved:
            continue
        passes += 1
        result = admit(
            list(queued.values()),
            cap.held(),
            cap.spot_gpus,
            t,
            cap,
            config.policy,
            weights,
            attained(t),
            arriving,
        )
        for run_id in result.admitted:
            del queued[run_id]
            started(run_id)
        for run_id in (*result.timed_out, *result.failed):
            del queued[run_id]
            turned_away(run_id, *cap.ended[run_id])
    leftover = [r for r in outcomes.values() if r.state == "waiting"]
    if leftover:  # every run ends admitted, failed or timed out; a bug otherwise
        raise RuntimeError(
            f"{len(leftover)} run(s) still waiting when the events ran out: {leftover[0].run_id}"
        )
    return QueueSimResult(
        config=config,
        runs=[outcomes[j.run_id] for j in jobs],
        admitted=[h.run_id for h in cap.admitted],
        passes=passes,
        contended_gpu_s=contended,
        on_demand_gpu_s=on_demand,
        max_used=max_used,
        capacity=capacity,
    )
