"""Policy inputs from SAILOR's own state: a region's GPU supply and prices from the catalog, and
its queued/running runs from the ledger, so the nightly DAG allocates GPU types per run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sailor_tasks.catalog import Catalog
from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, ThroughputTable
from sailor_tasks.model import ANY_GPU
from sailor_tasks.policies.base import Allocation, PolicyJob, PolicyState, get_policy

ACTIVE_RUN_STATUSES = ("planned", "provisioned", "running")
"""Runs that hold or wait for capacity: the ones a GPU-type allocation applies to."""


def region_supply(catalog: Catalog, region: str, gpu_types: Iterable[str] | None = None) -> dict[str, int]:
    """GPUs per type the organisation may use in ``region`` (supply file capacity, summed over zones)."""
    allowed = set(gpu_types) if gpu_types is not None else None
    per_zone: dict[tuple[str, str], int] = {}
    for offer in catalog.offers:
        if offer.region != region or (allowed is not None and offer.gpu_type not in allowed):
            continue
        if offer.capacity_gpus is not None:
            per_zone[(offer.zone, offer.gpu_type)] = offer.capacity_gpus
    out: dict[str, int] = {}
    for (_zone, gpu), gpus in per_zone.items():
        out[gpu] = out.get(gpu, 0) + gpus
    return dict(sorted(out.items()))


def gpu_prices(catalog: Catalog, region: str, market: str = "spot") -> dict[str, float]:
    """Cheapest USD per GPU-hour of each GPU type in ``region``."""
    out: dict[str, float] = {}
    for offer in catalog.offers:
        if offer.region == region:
            p = offer.usd_per_gpu_hour(market)
            out[offer.gpu_type] = min(p, out.get(offer.gpu_type, p))
    return out


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
    pinned = request.get("gpu_type", ANY_GPU)
    throughput = {}
    for g in gpu_types:
        if pinned not in (ANY_GPU, g):
            continue
        measured = table.throughput(key, g)
        # Gavel measured scale factors 1/2/4/8; otherwise assume linear scaling from one GPU.
        throughput[g] = measured if measured > 0 else table.throughput(base, g) * num_gpus
    total = run.get("total_steps") or request.get("total_steps") or 0
    return PolicyJob(
        job_id=run["run_id"],
        throughput=throughput,
        scale_factor=max(1, num_gpus),
        steps_remaining=float(max(total - (run.get("steps") or 0), 0)),
        job_type=key,
    )


def allocate_region(
    runs: Iterable[Mapping[str, Any]],
    catalog: Catalog,
    table: ThroughputTable,
    region: str,
    policy: str = "las",
    market: str = "spot",
) -> Allocation:
    """Run ``policy`` over a region's runs against the region's supply of the types ``table`` knows."""
    supply = {g: c for g, c in region_supply(catalog, region, table.gpu_types).items() if c > 0}
    jobs = tuple(job_from_run(run, table, supply) for run in runs)
    state = PolicyState(jobs=jobs, gpus=supply, usd_per_gpu_hour=gpu_prices(catalog, region, market))
    return get_policy(policy).allocate(state)
