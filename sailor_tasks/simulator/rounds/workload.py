"""Simulated jobs: read from Gavel's trace format or generated (Poisson arrivals, Philly-like sizes)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from sailor_tasks.catalog.throughput import JobKey, ThroughputTable

TRACE_FIELDS = (
    "job_type",
    "command",
    "working_dir",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "priority_weight",
    "SLO",
    "arrival_time_s",
)
"""Gavel's 10 tab-separated trace fields (``../shared/data/README.md``)."""

# Gavel's Philly-derived job generator (scheduler/utils.py, MIT): scale factors 1/2/4/8 with
# probabilities 0.7/0.1/0.15/0.05; durations 10^U(1.5, 3) minutes with probability 0.8, else
# 10^U(3, 4) minutes (measured on a V100, converted to steps with the job's V100 throughput).
SCALE_FACTORS = (1, 2, 4, 8)
SCALE_PROBS = (0.70, 0.10, 0.15, 0.05)
SHORT_JOB_PROB = 0.8
SHORT_LOG10_MIN = (1.5, 3.0)
LONG_LOG10_MIN = (3.0, 4.0)
DURATION_BASELINE_GPU = "V100"


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job of the simulated workload."""

    job_id: str
    job_type: JobKey
    """(model, scale factor): the throughput table's key."""
    total_steps: float
    arrival_s: float
    priority_weight: float = 1.0
    slo_s: float | None = None
    """Deadline after arrival, seconds (None: no SLO)."""

    @property
    def scale_factor(self) -> int:
        return self.job_type[1]


def read_gavel_trace(path: str, table: ThroughputTable | None = None) -> list[SimJob]:
    """Parse a Gavel trace (10 tab-separated fields per line, see ``TRACE_FIELDS``).

    Raises:
        ValueError: a line has the wrong number of fields or a bad value (the message names the
            line, the field and the value), or a job type the throughput table does not know.
    """
    jobs = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != len(TRACE_FIELDS):
                raise ValueError(
                    f"{path}:{lineno}: {len(parts)} fields, expected {len(TRACE_FIELDS)}: {', '.join(TRACE_FIELDS)}"
                )
            row = dict(zip(TRACE_FIELDS, parts, strict=True))
            try:
                scale = int(row["scale_factor"])
                steps = float(row["total_steps"])
                weight = float(row["priority_weight"])
                slo = float(row["SLO"])
                arrival = float(row["arrival_time_s"])
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            for field, value, ok, need in (
                ("total_steps", steps, steps > 0, "> 0"),
                ("scale_factor", scale, scale >= 1, "≥ 1"),
                ("priority_weight", weight, weight > 0, "> 0"),
                ("arrival_time_s", arrival, arrival >= 0, "≥ 0"),
                ("SLO", slo, True, "(≤ 0: no SLO)"),
            ):
                if not (ok and math.isfinite(value)):
                    raise ValueError(f"{path}:{lineno}: {field}={row[field]!r}: need a finite number {need}")
            key = (row["job_type"], scale)
            if table is not None and key not in table.alone:
                scales = sorted(k[1] for k in table.alone if k[0] == row["job_type"])
                if scales:
                    raise ValueError(
                        f"{path}:{lineno}: scale_factor={scale} of {row['job_type']!r}: the throughput "
                        f"table has it at scale factors {', '.join(map(str, scales))}"
                    )
                raise ValueError(
                    f"{path}:{lineno}: job type {key!r} is not in the throughput table; "
                    f"known: {', '.join(sorted({k[0] for k in table.alone}))}"
                )
            jobs.append(
                SimJob(
                    job_id=f"job{len(jobs):06d}",
                    job_type=key,
                    total_steps=steps,
                    arrival_s=arrival,
                    priority_weight=weight,
                    slo_s=slo if slo > 0 else None,
                )
            )
    return jobs


def generate_jobs(
    num_jobs: int,
    jobs_per_hour: float,
    table: ThroughputTable,
    seed: int = 0,
    duration_scale: float = 1.0,
    multi_gpu: bool = True,
) -> list[SimJob]:
    """Poisson arrivals at ``jobs_per_hour``; Gavel's Philly-derived scale factors and durations.

    Args:
        duration_scale: multiplies every duration (1.0 = Gavel's distribution).
        multi_gpu: draw scale factors 1/2/4/8; False: every job has one GPU (Gavel's generator
            without ``generate_multi_gpu_jobs``, as in its space-sharing experiments).
    """
    if num_jobs < 0 or not 0 < jobs_per_hour < math.inf or not 0 < duration_scale < math.inf:
        raise ValueError(
            f"num_jobs={num_jobs}, jobs_per_hour={jobs_per_hour}, duration_scale={duration_scale}: "
            "need ≥ 0, a finite number > 0, a finite number > 0"
        )
    rng = np.random.default_rng(seed)
    by_scale: dict[int, list[JobKey]] = {}
    for key in table.job_types:
        if table.throughput(key, DURATION_BASELINE_GPU) > 0:
            by_scale.setdefault(key[1], []).append(key)
    scales = [s for s in SCALE_FACTORS if s in by_scale and (multi_gpu or s == 1)]
    if not scales:  # durations are drawn on the baseline GPU: the table must measure it
        have = "1-GPU job types" if not multi_gpu else "job types"
        raise ValueError(
            f"the throughput table has no {have} measured on {DURATION_BASELINE_GPU}, the GPU type "
            f"generated job durations are defined on; GPU types it measures: {', '.join(table.gpu_types)}"
        )
    probs = np.array([SCALE_PROBS[SCALE_FACTORS.index(s)] for s in scales])
    probs /= probs.sum()
    arrivals = np.cumsum(rng.exponential(3600.0 / jobs_per_hour, num_jobs))
    scale_draw = rng.choice(len(scales), size=num_jobs, p=probs)
    type_draw = rng.random(num_jobs)
    short = rng.random(num_jobs) < SHORT_JOB_PROB
    lo = np.where(short, SHORT_LOG10_MIN[0], LONG_LOG10_MIN[0])
    hi = np.where(short, SHORT_LOG10_MIN[1], LONG_LOG10_MIN[1])
    minutes = 10 ** rng.uniform(lo, hi) * duration_scale
    jobs = []
    for i in range(num_jobs):
        keys = by_scale[scales[scale_draw[i]]]
        key = keys[min(int(type_draw[i] * len(keys)), len(keys) - 1)]
        steps = math.ceil(minutes[i] * 60 * table.throughput(key, DURATION_BASELINE_GPU))
        jobs.append(SimJob(f"job{i:06d}", key, float(steps), float(arrivals[i])))
    return jobs


def run_throughput(table: ThroughputTable, key: JobKey, gpu: str, gpus_per_server: int) -> float:
    """Steps/s of job type ``key`` alone on ``gpu`` as the simulator can run it: consolidated,
    except for a job with more workers than a server has GPUs, which is never consolidated (0:
    cannot run there)."""
    alone = table.throughput(key, gpu)
    if key[1] > gpus_per_server:
        return table.throughput(key, gpu, consolidated=False) or alone
    return alone


def total_gpu_seconds(
    jobs: Iterable[SimJob],
    table: ThroughputTable,
    gpu: str = DURATION_BASELINE_GPU,
    gpus_per_server: int | None = None,
) -> float:
    """GPU-seconds the jobs need on ``gpu`` (a load estimate); with ``gpus_per_server``, at the
    throughput they run at on servers of that size (``run_throughput``), else consolidated."""
    if gpus_per_server is None:
        return sum(j.total_steps / table.throughput(j.job_type, gpu) * j.scale_factor for j in jobs)
    return sum(
        j.total_steps / run_throughput(table, j.job_type, gpu, gpus_per_server) * j.scale_factor for j in jobs
    )
