"""Supply: GPUs the organisation may use per (zone, GPU type), and spot preemption rates.

Read from a YAML file the organisation edits (packaged default: ``data/supply.yaml``, format
documented at its top; override with ``$SAILOR_SUPPLY_FILE``). ``apply_supply`` fills
``Offer.capacity_gpus`` and ``Offer.preemption_rate_per_hour``; capacity is per (zone, GPU type),
shared by every VM shape of that type in the zone.
"""

from __future__ import annotations

import logging
import math
import os
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import yaml

from sailor_tasks.model import Offer

PACKAGED_SUPPLY = "supply.yaml"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Supply:
    default_capacity: Mapping[str, int]
    default_preemption_rate: Mapping[str, float]
    region_multiplier: Mapping[str, float] = field(default_factory=dict)
    zone_overrides: Mapping[str, Mapping[str, Mapping[str, float]]] = field(default_factory=dict)
    """zone → gpu_type → {"capacity_gpus": n, "preemption_rate_per_hour": r} (either key optional)."""

    def capacity(self, region: str, zone: str, gpu_type: str) -> int:
        override = self.zone_overrides.get(zone, {}).get(gpu_type, {})
        if "capacity_gpus" in override:
            return int(override["capacity_gpus"])
        return int(round(self.default_capacity.get(gpu_type, 0) * self.region_multiplier.get(region, 1.0)))

    def preemption_rate(self, zone: str, gpu_type: str) -> float:
        override = self.zone_overrides.get(zone, {}).get(gpu_type, {})
        return float(
            override.get("preemption_rate_per_hour", self.default_preemption_rate.get(gpu_type, 0.0))
        )


ZONE_KEYS = ("capacity_gpus", "preemption_rate_per_hour")
"""What a zone may override per GPU type."""


def _count(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{where}={value!r}: need an integer >= 0")
    return value


def _rate(value: Any, where: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}={value!r}: need a finite number >= 0")
    return float(value)


def parse_supply(doc: Mapping[str, Any]) -> Supply:
    """Build a ``Supply`` from the YAML document; ValueError names the bad entry (a misspelt key or
    GPU type too: it would be ignored, the default silently kept)."""
    if not isinstance(doc, Mapping):
        raise ValueError(
            f"supply file: expected a mapping with version, defaults, regions, zones; got {doc!r:.80}"
        )
    if doc.get("version") != 1:
        raise ValueError(f"supply file version={doc.get('version')!r}; valid: 1")
    for key in ("defaults", "regions", "zones"):
        if not isinstance(doc.get(key) or {}, Mapping):
            raise ValueError(f"{key}={doc[key]!r:.80}: need a mapping")
    defaults = doc.get("defaults") or {}
    for key in ZONE_KEYS:
        if not isinstance(defaults.get(key) or {}, Mapping):
            raise ValueError(f"defaults.{key}={defaults[key]!r:.80}: need a mapping of GPU type to number")
    caps, rates = defaults.get("capacity_gpus") or {}, defaults.get("preemption_rate_per_hour") or {}
    caps = {gpu: _count(n, f"defaults.capacity_gpus.{gpu}") for gpu, n in caps.items()}
    rates = {gpu: _rate(r, f"defaults.preemption_rate_per_hour.{gpu}") for gpu, r in rates.items()}
    if unrated := sorted(gpu for gpu, n in caps.items() if n > 0 and gpu not in rates):
        # Planning would take their spot VMs as never preempted.
        raise ValueError(
            f"defaults.preemption_rate_per_hour: no rate for {', '.join(unrated)}, which "
            f"capacity_gpus gives GPUs; give each one (0: never preempted)"
        )
    gpu_types = sorted({*caps, *rates})
    multipliers = {}
    for region, spec in (doc.get("regions") or {}).items():
        if not isinstance(spec or {}, Mapping):
            raise ValueError(f"regions.{region}={spec!r:.80}: need a mapping (capacity_multiplier)")
        if unknown := sorted(set(spec or {}) - {"capacity_multiplier"}):
            raise ValueError(
                f"regions.{region}: unknown key {', '.join(map(repr, unknown))}; valid: capacity_multiplier"
            )
        multipliers[region] = _rate(
            (spec or {}).get("capacity_multiplier", 1.0), f"regions.{region}.capacity_multiplier"
        )
    zones: dict[str, dict[str, dict[str, Any]]] = {}
    for zone, spec in (doc.get("zones") or {}).items():
        if not isinstance(spec or {}, Mapping):
            raise ValueError(f"zones.{zone}={spec!r:.80}: need a mapping of GPU type to overrides")
        zones[zone] = {}
        for gpu, v in (spec or {}).items():
            if not isinstance(v or {}, Mapping):
                raise ValueError(
                    f"zones.{zone}.{gpu}={v!r:.80}: need capacity_gpus and/or preemption_rate_per_hour"
                )
            if gpu_types and gpu not in gpu_types:
                raise ValueError(
                    f"zones.{zone}: {gpu!r} is no GPU type of defaults; valid: {', '.join(gpu_types)}"
                )
            entry = dict(v or {})
            if unknown := sorted(set(entry) - set(ZONE_KEYS)):
                raise ValueError(
                    f"zones.{zone}.{gpu}: unknown key {', '.join(map(repr, unknown))}; valid: {', '.join(ZONE_KEYS)}"
                )
            capacity = _count(entry.get("capacity_gpus", 0), f"zones.{zone}.{gpu}.capacity_gpus")
            _rate(entry.get("preemption_rate_per_hour", 0.0), f"zones.{zone}.{gpu}.preemption_rate_per_hour")
            if capacity > 0 and "preemption_rate_per_hour" not in entry and gpu not in rates:
                raise ValueError(
                    f"zones.{zone}.{gpu}: capacity_gpus={capacity} but no preemption_rate_per_hour, here or "
                    f"in defaults; give one (0: never preempted)"
                )
            zones[zone][gpu] = entry
    return Supply(dict(caps), rates, multipliers, zones)


def load_supply(path: str | None = None) -> Supply:
    path = path or os.environ.get("SAILOR_SUPPLY_FILE") or None
    if path is None:
        text = resources.files("sailor_tasks.catalog").joinpath("data", PACKAGED_SUPPLY).read_text()
    else:
        with open(path) as f:
            text = f.read()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"supply file {path or PACKAGED_SUPPLY}: not valid YAML ({exc})") from None
    return parse_supply(doc)


def apply_supply(offers: tuple[Offer, ...], supply: Supply) -> tuple[Offer, ...]:
    """Offers with capacity and preemption rate filled from ``supply``: a GPU type the file gives no
    capacity has none (the organisation may use none of it). A region, zone or GPU type of the file
    that no offer has is logged, with the catalog's own (a misspelt name changes nothing; a catalog
    of fewer regions or types than the file's is not an error)."""
    named_types = {
        *supply.default_capacity,
        *supply.default_preemption_rate,
        *(g for per_gpu in supply.zone_overrides.values() for g in per_gpu),
    }
    for kind, named, known in (
        ("regions", supply.region_multiplier, {o.region for o in offers}),
        ("zones", supply.zone_overrides, {o.zone for o in offers}),
        ("GPU types", named_types, {o.gpu_type for o in offers}),
    ):
        if unknown := sorted(set(named) - known):
            logger.warning(
                "supply file %s %s: no offer of the catalog is there; their entries change nothing%s",
                kind,
                ", ".join(unknown),
                "" if kind == "zones" else f" (the catalog's: {', '.join(sorted(known))})",
            )
    return tuple(
        replace(
            o,
            capacity_gpus=supply.capacity(o.region, o.zone, o.gpu_type),
            preemption_rate_per_hour=supply.preemption_rate(o.zone, o.gpu_type),
        )
        for o in offers
    )


def region_supply(offers: tuple[Offer, ...]) -> dict[tuple[str, str], int]:
    """(region, gpu_type) → GPUs, counting each (zone, GPU type) once whatever its VM shapes."""
    per_zone: dict[tuple[str, str, str], int] = {}
    for o in offers:
        per_zone[(o.region, o.zone, o.gpu_type)] = o.capacity_gpus or 0
    out: dict[tuple[str, str], int] = defaultdict(int)
    for (region, _zone, gpu), n in per_zone.items():
        out[(region, gpu)] += n
    return dict(out)
