"""Inputs of the spot simulator: the market (catalog zones + availability traces) and generated jobs.

Binding traces to zones: a trace recorded in a known zone for a known GPU type (GCP 2020 logs,
Sailor's per-zone CSV columns, ``<GPU>_<zone>.json``) drives that (zone, GPU type); the longest such
trace wins. ``bind="exact"`` stops there: zones without a trace of their own get no spot offer (the
honest minimum, 3 zones in the shared data), and a trace of a simulated GPU type recorded in a zone
the catalog does not sell that GPU in is refused (it would bind nowhere). ``bind="pool"`` (default) lets every other catalog zone
replay a trace from the pool of all loaded traces, taken in turn, each from a seeded random offset,
so zones do not lose capacity at the same instants. Pooled zones keep their own catalog prices; the
availability pattern is real but recorded elsewhere (documented in README "Spot economics").
Every zone carries its catalog capacity (``capacity_gpus``, the supply file's GPUs of that type in
the zone): the spot capacity a single-node trace stands for while it says available.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sailor_tasks.catalog.offers import Catalog
from sailor_tasks.simulator.spot.engine import SpotJob, SpotMarket, SpotZone
from sailor_tasks.traces.sources import ZoneTrace

BIND_MODES: tuple[str, ...] = ("pool", "exact")

DEFAULT_GPU_TYPES: tuple[str, ...] = ("A100", "H100", "L4", "T4", "V100", "P100")
"""Training GPUs the catalog sells in at least 12 zones (P4, also that widespread, is an inference card)."""
GPU_COUNTS = (1, 2, 4, 8)
GPU_COUNT_WEIGHTS = (0.4, 0.2, 0.2, 0.2)
"""GPUs per job: most training jobs use one GPU, the rest one VM of 2-8 (Philly-like sizes, as
sailor_tasks.simulator.rounds.workload)."""
WORK_HOURS = (1.0, 16.0)
"""Job length on its GPUs, log-uniform: minutes-long jobs do not need a market strategy, week-long
ones are out of the traces' reach (2.8-5.9 days)."""
DATA_GB = (5.0, 200.0)
"""Dataset size, log-uniform."""
CHECKPOINT_GB_PER_GPU = 2.0
"""Checkpoint (model + optimizer state) per GPU of the job."""


def build_market(
    catalog: Catalog,
    traces: Sequence[ZoneTrace],
    gpu_types: Sequence[str] = DEFAULT_GPU_TYPES,
    bind: str = "pool",
    seed: int = 0,
) -> SpotMarket:
    """The simulated market: one ``SpotZone`` per catalog (zone, GPU type) of ``gpu_types``.

    Raises:
        ValueError: unknown ``bind`` or GPU type, no traces, or with ``bind="exact"`` a trace of
            one of ``gpu_types`` recorded in a zone the catalog sells no such GPU in (each names
            the valid choices).
    """
    if bind not in BIND_MODES:
        raise ValueError(f"bind={bind!r} is not a trace binding; valid: {', '.join(BIND_MODES)}")
    unknown = sorted(set(gpu_types) - set(catalog.gpu_types))
    if unknown:
        raise ValueError(
            f"GPU type(s) {', '.join(unknown)} not in the catalog; valid: {', '.join(catalog.gpu_types)}"
        )
    if not traces:
        raise ValueError("no availability traces: pass --availability with trace files or folders")
    exact: dict[tuple[str, str], ZoneTrace] = {}
    for t in traces:
        if t.zone and t.gpu_type:
            key = (t.zone, t.gpu_type)
            old = exact.get(key)
            if old is None or (t.trace.duration_s, t.name) > (old.trace.duration_s, old.name):
                exact[key] = t
    pool = sorted(traces, key=lambda t: t.name)
    rng = np.random.default_rng(seed)
    spot: dict[tuple[str, str], dict[int, float]] = {}
    od: dict[tuple[str, str], dict[int, float]] = {}
    rate: dict[tuple[str, str], float] = {}
    capacity: dict[tuple[str, str], int] = {}
    region: dict[str, str] = {}
    for o in catalog.offers:
        if o.gpu_type not in gpu_types:
            continue
        key = (o.zone, o.gpu_type)
        region[o.zone] = o.region
        rate[key] = o.preemption_rate_per_hour
        if o.capacity_gpus is not None:  # the zone's supply, the same on every VM shape's row
            capacity[key] = max(o.capacity_gpus, capacity.get(key, 0))
        od.setdefault(key, {})
        spot.setdefault(key, {})
        od[key][o.gpus_per_node] = min(o.ondemand_usd_per_hour, od[key].get(o.gpus_per_node, math.inf))
        if not o.spot_above_ondemand and o.spot_usd_per_hour > 0:
            spot[key][o.gpus_per_node] = min(o.spot_usd_per_hour, spot[key].get(o.gpus_per_node, math.inf))
    if bind == "exact":
        for t in traces:
            if t.zone and t.gpu_type in gpu_types and (t.zone, t.gpu_type) not in od:
                valid = sorted(z for z, g in od if g == t.gpu_type)
                raise ValueError(
                    f"availability trace {t.trace.source or t.name}: zone {t.zone!r} sells no "
                    f"{t.gpu_type} in the catalog, so --bind exact binds it nowhere; zones selling "
                    f"{t.gpu_type}: {', '.join(valid)}"
                )
    zones = []
    turn = 0
    for key in sorted(od):
        zone, gpu = key
        bound = exact.get(key)
        offset = 0.0
        if bound is None and bind == "pool":
            bound = pool[turn % len(pool)]
            turn += 1
            offset = float(rng.uniform(0.0, bound.trace.duration_s))
        zones.append(
            SpotZone(
                zone=zone,
                region=region[zone],
                gpu_type=gpu,
                spot_usd=spot[key] if bound is not None else {},
                on_demand_usd=od[key],
                preemption_rate_per_hour=rate[key],
                trace=bound.trace if bound is not None else None,
                trace_offset_s=offset,
                trace_name=bound.name if bound is not None else "",
                capacity_gpus=capacity.get(key),
            )
        )
    return SpotMarket(tuple(zones), catalog.transfer)


def generate_spot_jobs(
    n: int, market: SpotMarket, seed: int = 0, jobs_per_hour: float = 1.0
) -> list[SpotJob]:
    """``n`` jobs with Poisson arrivals over the market's GPU types (see the constants for sizes).

    Raises:
        ValueError: ``n`` < 1 or a rate <= 0.
    """
    if n < 1 or not jobs_per_hour > 0:
        raise ValueError(f"jobs={n}, jobs_per_hour={jobs_per_hour}: need >= 1 and > 0")
    rng = np.random.default_rng(seed)
    gpus = sorted({z.gpu_type for z in market.zones})
    sizes = {g: sorted({k for z in market.zones if z.gpu_type == g for k in z.on_demand_usd}) for g in gpus}
    jobs = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(3600.0 / jobs_per_hour))
        gpu = gpus[int(rng.integers(len(gpus)))]
        allowed = [(k, w) for k, w in zip(GPU_COUNTS, GPU_COUNT_WEIGHTS, strict=True) if k in sizes[gpu]]
        weights = np.array([w for _, w in allowed])
        k = allowed[int(rng.choice(len(allowed), p=weights / weights.sum()))][0]
        work = float(np.exp(rng.uniform(math.log(WORK_HOURS[0]), math.log(WORK_HOURS[1]))))
        data = float(np.exp(rng.uniform(math.log(DATA_GB[0]), math.log(DATA_GB[1]))))
        regions = sorted({z.region for z in market.zones_for(gpu, k)})
        home = regions[int(rng.integers(len(regions)))]
        jobs.append(
            SpotJob(
                job_id=f"job-{i:05d}",
                arrival_s=round(t, 3),
                gpu_type=gpu,
                num_gpus=k,
                work_h=round(work, 4),
                home_region=home,
                data_gb=round(data, 2),
                checkpoint_gb=CHECKPOINT_GB_PER_GPU * k,
            )
        )
    return jobs
