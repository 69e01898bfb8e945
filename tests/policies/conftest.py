"""Small inline throughput tables and random policy instances shared by the policy tests."""

from __future__ import annotations

import numpy as np
import pytest

from sailor_tasks.catalog.throughput import ThroughputTable
from sailor_tasks.policies import PolicyJob, PolicyState

GPUS = ("K80", "P100", "V100")


def make_table(seed: int = 0, models: int = 6, scales=(1, 2, 4)) -> ThroughputTable:
    """Random but plausible steps/s (V100 ≥ P100 ≥ K80 mostly) with pair throughputs per scale."""
    rng = np.random.default_rng(seed)
    alone, pairs = {}, {}
    keys = [(f"model-{i}", s) for i in range(models) for s in scales]
    for key in keys:
        v100 = rng.uniform(1, 10)
        alone[key] = {
            "V100": v100,
            "P100": v100 * rng.uniform(0.3, 0.9),
            "K80": v100 * rng.uniform(0.05, 0.4),
        }
    for a in keys:
        for b in keys:
            if a[1] == b[1] and a <= b:
                pairs[(a, b)] = {
                    g: (alone[a][g] * rng.uniform(0.5, 0.9), alone[b][g] * rng.uniform(0.5, 0.9))
                    for g in GPUS
                }
    return ThroughputTable(alone=alone, pairs=pairs)


def random_state(
    table: ThroughputTable, n: int, gpus: dict, seed: int, scales=(1, 2, 4), **kw
) -> PolicyState:
    rng = np.random.default_rng(seed)
    keys = [k for k in table.job_types if k[1] in scales]
    jobs = []
    for i in range(n):
        key = keys[int(rng.integers(len(keys)))]
        jobs.append(
            PolicyJob(
                f"job{i:04d}",
                table.alone[key],
                key[1],
                priority_weight=float(rng.choice([1.0, 2.0])),
                steps_remaining=float(rng.uniform(100, 10_000)),
                elapsed_s=float(rng.uniform(0, 3600)),
                deadline_s=None,
                job_type=key,
                arrival_s=float(i),
            )
        )
    prices = {"K80": 0.45, "P100": 1.46, "V100": 2.48}
    return PolicyState(jobs=tuple(jobs), gpus=gpus, usd_per_gpu_hour=prices, table=table, seed=seed, **kw)


@pytest.fixture(scope="session")
def table() -> ThroughputTable:
    return make_table()
