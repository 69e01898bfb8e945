"""The queue simulator's runs: a seeded mixed queue (teams, sizes, deadlines), or a Gavel trace.

The mixed queue is what makes admission policies differ: one team submits a burst at the start
and another a steady stream, so ``fifo`` serves the burst first while ``las`` shares the capacity
between teams; a third of the runs have a deadline, so ``edf`` and the latest starts matter.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sailor_tasks.catalog.throughput import JobKey, ThroughputTable
from sailor_tasks.model import DEFAULT_MAX_QUEUE_HOURS
from sailor_tasks.queue.admission import PRIORITIES
from sailor_tasks.simulator.rounds.workload import SimJob

MARKETS = ("auto", "spot", "on_demand")
"""A run's ``market`` param as the simulator honours it (see ``capacity.SimCapacity``)."""

BURST_S = 600.0
"""The burst team submits all its runs within this many seconds of the start (10 minutes)."""
SIZES = (1, 2, 2, 4)
"""GPUs per run, drawn uniformly (2 GPUs twice as often as 1 or 4)."""
HOURS_RANGE = (0.5, 3.0)
"""Hours of work of a run on its fastest GPU type, uniform."""
DEADLINE_FRACTION = 1 / 3
"""Share of the runs with a deadline."""
DEADLINE_FACTOR_RANGE = (1.3, 4.0)
"""A deadline is this many times the run's hours on its fastest GPU type after its arrival."""


@dataclass(frozen=True, slots=True)
class QueueJob:
    """One run of the simulated queue, with the params the live queue reads."""

    run_id: str
    team: str
    job_type: JobKey
    """(model, scale factor): the throughput table's key; the scale factor is the run's GPUs."""
    total_steps: float
    arrival_s: float
    deadline_hours: float | None = None
    """Hours from arrival by which it should finish (the ``deadline_hours`` param)."""
    priority: str = "normal"
    market: str = "auto"
    max_queue_hours: float = DEFAULT_MAX_QUEUE_HOURS

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(
                f"run {self.run_id}: priority {self.priority!r} is not one of {', '.join(PRIORITIES)}"
            )
        if self.market not in MARKETS:
            raise ValueError(f"run {self.run_id}: market {self.market!r} is not one of {', '.join(MARKETS)}")

    @property
    def gpus(self) -> int:
        return self.job_type[1]

    @property
    def deadline_s(self) -> float | None:
        return None if self.deadline_hours is None else self.arrival_s + self.deadline_hours * 3600.0


def job_types_for(table: ThroughputTable, gpu_types: Iterable[str], gpus: int) -> list[JobKey]:
    """The table's job types of scale factor ``gpus`` that run on every one of ``gpu_types``."""
    types = tuple(gpu_types)
    return [k for k in table.job_types if k[1] == gpus and all(table.throughput(k, g) > 0 for g in types)]


def mixed_queue(
    n: int,
    seed: int,
    table: ThroughputTable,
    gpu_types: Sequence[str],
    hours: float = 16.0,
    teams: tuple[str, str] = ("a", "b"),
) -> list[QueueJob]:
    """``n`` runs from two teams: the first team's ``n // 2`` runs arrive in a burst within
    ``BURST_S``, the second team's are spread uniformly over ``hours``. Each run: ``SIZES`` GPUs,
    a job type of that scale factor drawn from ``table`` (one that runs on every GPU type of
    ``gpu_types``), ``HOURS_RANGE`` hours of work on its fastest type of ``gpu_types``, and with
    probability ``DEADLINE_FRACTION`` a deadline ``DEADLINE_FACTOR_RANGE`` times that after arrival.

    Raises:
        ValueError: ``n`` < 1, ``hours`` ≤ 0, or no job type of some size runs on every GPU type.
    """
    if n < 1:
        raise ValueError(f"runs={n}: need at least 1")
    if not 0 < hours < float("inf"):
        raise ValueError(f"arrival hours {hours}: the second team's runs need a positive, finite span to arrive over")
    choices = {g: job_types_for(table, gpu_types, g) for g in sorted(set(SIZES))}
    missing = [g for g, keys in choices.items() if not keys]
    if missing:
        raise ValueError(
            f"no job type of {', '.join(map(str, missing))} GPUs runs on every one of {', '.join(gpu_types)} "
            "in the throughput table"
        )
    rng = random.Random(seed)
    burst = n // 2
    jobs = []
    for i in range(n):
        team = teams[0] if i < burst else teams[1]
        arrival = rng.uniform(0, BURST_S) if team == teams[0] else rng.uniform(0, hours * 3600.0)
        gpus = rng.choice(SIZES)
        key = rng.choice(choices[gpus])
        work_h = rng.uniform(*HOURS_RANGE)
        fastest = max(table.throughput(key, g) for g in gpu_types)
        deadline = None
        if rng.random() < DEADLINE_FRACTION:
            deadline = rng.uniform(*DEADLINE_FACTOR_RANGE) * work_h
        jobs.append(
            QueueJob(
                run_id=f"{team}-{i:03d}",
                team=team,
                job_type=key,
                total_steps=round(fastest * work_h * 3600.0),
                arrival_s=arrival,
                deadline_hours=deadline,
            )
        )
    return sorted(jobs, key=lambda j: (j.arrival_s, j.run_id))


def from_trace(jobs: Iterable[SimJob], team: str = "default") -> list[QueueJob]:
    """Gavel trace jobs as queue runs of one team; a job's SLO becomes its deadline."""
    out = [
        QueueJob(
            run_id=j.job_id,
            team=team,
            job_type=j.job_type,
            total_steps=float(j.total_steps),
            arrival_s=float(j.arrival_s),
            deadline_hours=None if j.slo_s is None else j.slo_s / 3600.0,
        )
        for j in jobs
    ]
    return sorted(out, key=lambda j: (j.arrival_s, j.run_id))
