"""The cloud catalog: GPU offers (region, zone, GPU type, VM shape, on-demand and spot prices).

Loaded from the packaged ``data/gcp_gpu_offers.csv`` (derived from real GCP prices, see
``derive.py`` and the provenance line at the top of the file) or from another file with the same
columns. Loading is cheap (stdlib ``csv``, no pandas) so DAG files may ask for the choices.
"""

from __future__ import annotations

import csv
import functools
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from sailor_tasks.catalog.derive import OFFER_COLUMNS
from sailor_tasks.errors import CatalogError
from sailor_tasks.model import Offer

if TYPE_CHECKING:
    from sailor_tasks.catalog.transfer import TransferTable

DEFAULT_OFFERS_FILE = "gcp_gpu_offers.csv"


def _packaged(name: str) -> str:
    return str(resources.files("sailor_tasks.catalog").joinpath("data", name))


def _number(
    row: dict[str, str], column: str, where: str, kind: type[float] | type[int] = float, least: float = 0
) -> float:
    """``row[column]`` as a finite ``kind`` ≥ ``least``; ValueError naming ``where``, the column
    and the value."""
    try:
        value = kind(row[column])
    except ValueError:
        raise ValueError(f"{where}: {column}={row[column]!r} is not a number") from None
    if not (math.isfinite(value) and value >= least):
        raise ValueError(f"{where}: {column}={row[column]!r}: need a finite number ≥ {least:g}")
    return value


def read_offers(path: str | None = None) -> list[Offer]:
    """Read offers from a CSV with the columns of ``derive.OFFER_COLUMNS`` (``#`` lines skipped).

    Raises:
        ValueError: a row lacks a column or has a value of the wrong type or out of range (GPUs
            per node ≥ 1, prices finite and ≥ 0), naming the file, the row (its number among the
            data rows) and the column; a file without any offer; a row CSV cannot read.
    """
    path = path or _packaged(DEFAULT_OFFERS_FILE)
    offers = []
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        n = 0
        try:
            for n, r in enumerate(rows, start=1):
                offers.append(_offer(r, f"{path}: data row {n}"))
        except csv.Error as exc:
            raise ValueError(f"{path}: data row {n + 1}: {exc}") from None
    if not offers:
        raise ValueError(f"{path}: no offer (a header and no data row)")
    return offers


def _offer(r: dict[str, str], where: str) -> Offer:
    missing = [k for k in OFFER_COLUMNS if r.get(k) in (None, "")]
    if missing:
        raise ValueError(f"{where}: no value for {', '.join(missing)}")
    return Offer(
        cloud=r["cloud"],
        region=r["region"],
        zone=r["zone"],
        gpu_type=r["gpu_type"],
        gpus_per_node=_number(r, "gpus_per_node", where, int, least=1),
        instance_type=r["instance_type"],
        ondemand_usd_per_hour=_number(r, "ondemand_usd_per_hour", where),
        spot_usd_per_hour=_number(r, "spot_usd_per_hour", where),
        spot_above_ondemand=r["spot_above_ondemand"] == "1",
    )


@dataclass(frozen=True)
class Catalog:
    """An immutable set of offers with the indexes the planner needs."""

    offers: tuple[Offer, ...]

    @functools.cached_property
    def regions(self) -> tuple[str, ...]:
        return tuple(sorted({o.region for o in self.offers}))

    @functools.cached_property
    def zones(self) -> tuple[str, ...]:
        return tuple(sorted({o.zone for o in self.offers}))

    @functools.cached_property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({o.gpu_type for o in self.offers}))

    @functools.cached_property
    def transfer(self) -> TransferTable:
        """Transfer prices and bandwidths between this catalog's locations (``transfer.py``)."""
        from sailor_tasks.catalog.transfer import load_transfer

        return load_transfer()

    def region_of(self, zone: str) -> str:
        for o in self.offers:
            if o.zone == zone:
                return o.region
        raise KeyError(zone)

    def select(
        self,
        gpu_types: Iterable[str] | None = None,
        regions: Iterable[str] | None = None,
    ) -> list[Offer]:
        gpu_set = set(gpu_types) if gpu_types is not None else None
        region_set = set(regions) if regions is not None else None
        return [
            o
            for o in self.offers
            if (gpu_set is None or o.gpu_type in gpu_set) and (region_set is None or o.region in region_set)
        ]


@functools.lru_cache(maxsize=8)
def load_catalog(path: str | None = None, supply_path: str | None = None) -> Catalog:
    """Load (and cache) the catalog: offers from ``path`` / ``$SAILOR_CATALOG_FILE`` / the packaged
    file, with capacity and preemption rates from the supply file (see ``supply.py``)."""
    from sailor_tasks.catalog.supply import apply_supply, load_supply

    try:
        offers = tuple(read_offers(path or os.environ.get("SAILOR_CATALOG_FILE") or None))
        return Catalog(offers=apply_supply(offers, load_supply(supply_path)))
    except (OSError, ValueError, KeyError) as exc:
        raise CatalogError(str(exc)) from exc


def catalog_choices() -> tuple[Sequence[str], Sequence[str]]:
    """(regions, gpu_types) of the catalog the stages use (``$SAILOR_CATALOG_FILE``, else the
    packaged file), for Param enums at DAG parse time: the form offers, and the schema accepts,
    exactly the catalog's regions and GPU types. An unreadable file falls back to the packaged
    choices so the DAG still parses (``validate`` then reports the catalog error)."""
    return _offer_choices(os.environ.get("SAILOR_CATALOG_FILE") or None)


@functools.lru_cache(maxsize=8)
def _offer_choices(path: str | None) -> tuple[Sequence[str], Sequence[str]]:
    try:
        offers = read_offers(path)
    except (OSError, ValueError, KeyError):
        offers = read_offers(_packaged(DEFAULT_OFFERS_FILE))
    return tuple(sorted({o.region for o in offers})), tuple(sorted({o.gpu_type for o in offers}))
