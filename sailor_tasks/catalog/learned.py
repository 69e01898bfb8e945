"""Spot preemption rates learned from SAILOR's own attempts, as an update of the supply file's prior.

The supply file gives each (zone, GPU type) a prior rate r0 (preemptions per spot VM-hour). The
ledger observes n preemptions over H spot VM-hours there (attempts on the cloud backends; the local
backend's preemptions are injected by the run's own params and say nothing about a zone). The
learned rate is the posterior mean of a Gamma-Poisson model whose prior counts as
``PRIOR_VM_HOURS`` VM-hours of observation at r0:

    rate = (r0 · H0 + n) / (H0 + H)

so a zone with no observations keeps its prior, and the observations dominate once H ≫ H0.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace

from sailor_tasks.catalog.offers import Catalog

PRIOR_VM_HOURS = 50.0
"""VM-hours of observation the supply file's prior rate counts as."""

Observations = Mapping[tuple[str, str], tuple[int, float]]
"""(zone, GPU type) → (preemptions, spot VM-hours observed)."""


@dataclass(frozen=True, slots=True)
class LearnedRate:
    zone: str
    gpu_type: str
    prior: float
    rate: float
    preemptions: int
    vm_hours: float


def learned_rate(prior: float, preemptions: int, vm_hours: float, prior_hours: float = PRIOR_VM_HOURS) -> float:
    """Posterior mean preemptions per VM-hour (see the module)."""
    if preemptions < 0 or vm_hours < 0:
        raise ValueError(f"preemptions={preemptions}, vm_hours={vm_hours}: need both >= 0")
    return (prior * prior_hours + preemptions) / (prior_hours + vm_hours)


def learned_rates(catalog: Catalog, observations: Observations) -> dict[tuple[str, str], LearnedRate]:
    """The learned rate of every (zone, GPU type) of the catalog (the prior where unobserved)."""
    out: dict[tuple[str, str], LearnedRate] = {}
    for o in catalog.offers:
        key = (o.zone, o.gpu_type)
        if key in out:
            continue
        n, hours = observations.get(key, (0, 0.0))
        prior = o.preemption_rate_per_hour
        out[key] = LearnedRate(o.zone, o.gpu_type, prior, learned_rate(prior, n, hours), int(n), float(hours))
    return out


@functools.lru_cache(maxsize=8)
def _with_learned(catalog: Catalog, observations: tuple[tuple[tuple[str, str], tuple[int, float]], ...]) -> Catalog:
    rates = learned_rates(catalog, dict(observations))
    return Catalog(
        offers=tuple(replace(o, preemption_rate_per_hour=rates[(o.zone, o.gpu_type)].rate) for o in catalog.offers)
    )


def with_learned_rates(catalog: Catalog, observations: Observations) -> Catalog:
    """``catalog`` with each offer's preemption rate replaced by the learned one. The same object
    for the same observations (cached), so indexes built on it are reused."""
    if not observations:
        return catalog
    return _with_learned(catalog, tuple(sorted(observations.items())))
