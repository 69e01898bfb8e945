"""Policy inputs from SAILOR's own state: a ledger run as a policy job (its model's throughput on
each GPU type, its GPUs, its steps left), for live admission (``stages.queueing``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, ThroughputTable
from sailor_tasks.model import ANY_GPU
from sailor_tasks.policies.base import PolicyJob


def job_from_run(run: Mapping[str, Any], table: ThroughputTable, gpu_types: Iterable[str]) -> PolicyJob:
    """A ledger run as a policy job: its model's throughput on each GPU type (only the requested
    type when the run pinned one), its GPUs as the scale factor, its steps left."""
    request = run.get("request") or {}
    model = run["model"]
    num_gpus = int(run.get("num_gpus") or request.get("num_workers", 1) * request.get("gpus_per_worker", 1))
    base = MODEL_JOB_TYPES.get(model)
    if base is None:
        raise ValueError(
            f"run {run['run_id']}: model {model!r} has no job type; known: {', '.join(MODEL_JOB_TYPES)}"
        )
    key = (base[0], num_gpus)
    scales = sorted({k for name, k in table.alone if name == base[0]})
    pinned = request.get("gpu_type", ANY_GPU)
    throughput = {}
    for g in gpu_types:
        if pinned not in (ANY_GPU, g):
            continue
        # Gavel measured scale factors 1/2/4/8 (a measurement of the model moves them all:
        # ``ThroughputTable.with_measurement``); other counts scale linearly from the largest of
        # them below (3 GPUs: 1.5x the 2-GPU speed), never past the next one up.
        speeds = {k: table.throughput((base[0], k), g) for k in scales}
        below = max((k for k in scales if k <= num_gpus and speeds[k] > 0), default=0)
        above = [speeds[k] for k in scales if k > num_gpus and speeds[k] > 0]
        linear = speeds[below] * num_gpus / below if below else 0.0
        throughput[g] = min(linear, min(above)) if above and linear > 0 else linear
    total = run.get("total_steps") or request.get("total_steps") or 0
    return PolicyJob(
        job_id=run["run_id"],
        throughput=throughput,
        scale_factor=max(1, num_gpus),
        steps_remaining=float(max(total - (run.get("steps") or 0), 0)),
        job_type=key,
    )
