"""Data transfer prices (USD/GB) and planning bandwidths (Gbit/s) between GCP zones and regions.

Loaded from the packaged ``data/transfer.yaml`` (format and provenance at its top; override with
``$SAILOR_TRANSFER_FILE``). Two views: ``zone_usd_per_gb`` for VM-to-VM traffic (0 same zone,
0.01 same region, continent-dependent across regions), and ``bucket_usd_per_gb`` /
``bucket_gbps`` for copying a dataset from a regional bucket to a region (free inside the region).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from sailor_tasks.errors import CatalogError

PACKAGED_TRANSFER = "transfer.yaml"
UNKNOWN_CONTINENT = "?"


@dataclass(frozen=True, slots=True)
class Link:
    usd_per_gb: float
    gbps: float


def _link(where: str, spec: Any) -> Link:
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}={spec!r}: need a mapping with usd_per_gb and gbps")
    usd, gbps = spec.get("usd_per_gb"), spec.get("gbps")

    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

    if not number(usd) or usd < 0:
        raise ValueError(f"{where}.usd_per_gb={usd!r}: need a finite number >= 0")
    if not number(gbps) or gbps <= 0:
        raise ValueError(f"{where}.gbps={gbps!r}: need a finite number > 0")
    return Link(float(usd), float(gbps))


@dataclass(frozen=True)
class TransferTable:
    """Prices and bandwidths between locations, resolved from the most specific rule."""

    same_zone: Link
    same_region: Link
    bucket_same_region: Link
    continent_of_prefix: Mapping[str, str]
    within: Mapping[str, Link]
    between: Mapping[frozenset[str], Link]
    default_between: Link

    def continent(self, region: str) -> str:
        """Continent code of a region from its name prefix (``europe-west4`` → ``EU``)."""
        return self.continent_of_prefix.get(region.split("-", 1)[0], UNKNOWN_CONTINENT)

    def region_link(self, src_region: str, dst_region: str) -> Link:
        """VM-to-VM link between two different regions (or the same-region link)."""
        if src_region == dst_region:
            return self.same_region
        a, b = self.continent(src_region), self.continent(dst_region)
        if a == b and a in self.within:
            return self.within[a]
        return self.between.get(frozenset((a, b)), self.default_between)

    def zone_link(self, src_zone: str, dst_zone: str) -> Link:
        if src_zone == dst_zone:
            return self.same_zone
        return self.region_link(_region_of_zone(src_zone), _region_of_zone(dst_zone))

    def zone_usd_per_gb(self, src_zone: str, dst_zone: str) -> float:
        return self.zone_link(src_zone, dst_zone).usd_per_gb

    def bucket_link(self, src_region: str, dst_region: str) -> Link:
        """Copying from a regional bucket in ``src_region`` to VMs in ``dst_region``."""
        return (
            self.bucket_same_region if src_region == dst_region else self.region_link(src_region, dst_region)
        )

    def bucket_usd_per_gb(self, src_region: str, dst_region: str) -> float:
        return self.bucket_link(src_region, dst_region).usd_per_gb

    def bucket_gbps(self, src_region: str, dst_region: str) -> float:
        return self.bucket_link(src_region, dst_region).gbps


def _region_of_zone(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def parse_transfer(doc: Mapping[str, Any]) -> TransferTable:
    """Build a ``TransferTable`` from the YAML document; ValueError names the bad entry."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"the document is {type(doc).__name__} {doc!r:.80}: need a mapping with version: 1")
    if doc.get("version") != 1:
        raise ValueError(f"transfer file version={doc.get('version')!r}; valid: 1")
    for key in ("continent_of_prefix", "within", "between"):
        if not isinstance(doc.get(key) or {}, Mapping):
            raise ValueError(f"{key}={doc[key]!r:.80}: need a mapping")
    prefixes = {str(k): str(v) for k, v in (doc.get("continent_of_prefix") or {}).items()}
    continents = set(prefixes.values())
    within = {str(c): _link(f"within.{c}", v) for c, v in (doc.get("within") or {}).items()}
    if unknown := sorted(set(within) - continents):
        raise ValueError(
            f"within.{unknown[0]}: not a continent of continent_of_prefix; valid: {', '.join(sorted(continents))}"
        )
    between: dict[frozenset[str], Link] = {}
    default = Link(0.0, 1.0)
    for key, spec in (doc.get("between") or {}).items():
        pair = str(key)
        link = _link(f"between.{pair}", spec)
        if pair == "default":
            default = link
            continue
        ends = pair.split("-")
        bad = [e for e in ends if e not in continents]
        if len(ends) != 2 or bad:
            raise ValueError(
                f"between.{pair}: need '<A>-<B>' with continents from continent_of_prefix "
                f"({', '.join(sorted(continents))})"
            )
        between[frozenset(ends)] = link
    return TransferTable(
        same_zone=_link("same_zone", doc.get("same_zone")),
        same_region=_link("same_region", doc.get("same_region")),
        bucket_same_region=_link("bucket_same_region", doc.get("bucket_same_region")),
        continent_of_prefix=prefixes,
        within=within,
        between=between,
        default_between=default,
    )


@functools.lru_cache(maxsize=4)
def load_transfer(path: str | None = None) -> TransferTable:
    """The transfer table from ``path`` / ``$SAILOR_TRANSFER_FILE`` / the packaged file (cached).

    Raises:
        CatalogError: the file cannot be read, is not YAML, or has a bad entry (named, with the
            file).
    """
    path = path or os.environ.get("SAILOR_TRANSFER_FILE") or None
    try:
        if path is None:
            text = resources.files("sailor_tasks.catalog").joinpath("data", PACKAGED_TRANSFER).read_text()
        else:
            with open(path) as f:
                text = f.read()
        return parse_transfer(yaml.safe_load(text))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        where = path or PACKAGED_TRANSFER
        raise CatalogError(f"transfer file {where}: {exc}") from None
