"""Read-only queries behind the SAILOR page: region supply and load, assignment, placements, preemptions.

The Airflow plugin (``plugins/sailor_ui.py``) only renders what ``snapshot`` returns; everything here
is plain Python over the ledger and the catalog, so it is tested without Airflow and could back any
other front end (the CLI, a JSON endpoint).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sailor_tasks.catalog import Catalog, load_catalog
from sailor_tasks.catalog.supply import region_supply
from sailor_tasks.ledger import Ledger
from sailor_tasks.ledger import schema as t
from sailor_tasks.settings import Settings


@dataclass(frozen=True, slots=True)
class RegionRow:
    region: str
    supply_gpus: int
    """GPUs the organisation may use in the region (all GPU types, from the supply file)."""
    reserved_gpus: int
    """GPUs held by live reservations in the region."""
    gpus_by_type: Mapping[str, int]
    """GPU type → supply in the region."""
    assignment_load: float | None = None
    """Demand/supply ratio recorded by the latest rebalance, when it recorded one."""

    @property
    def ratio(self) -> float:
        """Live demand over supply: reserved GPUs / GPUs the region has; infinite for GPUs held
        where the supply has none (a region gone from it), 0 for none held there."""
        if self.supply_gpus:
            return self.reserved_gpus / self.supply_gpus
        return math.inf if self.reserved_gpus > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the SAILOR page shows, read in one go."""

    regions: tuple[RegionRow, ...]
    reservations: tuple[dict[str, Any], ...]
    assignment: dict[str, Any] | None
    placements: tuple[dict[str, Any], ...]
    preemptions: tuple[dict[str, Any], ...]
    runs: tuple[dict[str, Any], ...]
    report_uri: str | None
    """URI of the last rebalance report chart (PNG), or None when no rebalance recorded one."""
    taken_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S"))
    queue: tuple[dict[str, Any], ...] = ()
    """Runs waiting for capacity, in admission order (position, team, priority, GPUs, reason,
    estimated start, latest start, minutes waited)."""
    queue_policy: str = "las"

    @property
    def total_supply(self) -> int:
        return sum(r.supply_gpus for r in self.regions)

    @property
    def total_reserved(self) -> int:
        return sum(r.reserved_gpus for r in self.regions)


def region_rows(catalog: Catalog, ledger: Ledger) -> tuple[RegionRow, ...]:
    """Supply per region (``region_supply``) beside the live reservations held there."""
    by_type: dict[str, dict[str, int]] = defaultdict(dict)
    for (region, gpu), n in region_supply(catalog.offers).items():
        by_type[region][gpu] = n
    reserved: dict[str, int] = defaultdict(int)
    for r in ledger.live_reservations():
        reserved[r.region] += r.gpus
    load = latest_region_load(ledger)
    regions = sorted(set(by_type) | set(reserved))
    return tuple(
        RegionRow(
            region=region,
            supply_gpus=sum(by_type[region].values()),
            reserved_gpus=reserved[region],
            gpus_by_type=dict(sorted(by_type[region].items())),
            assignment_load=float(load[region]) if region in load else None,
        )
        for region in regions
    )


def latest_region_load(ledger: Ledger) -> dict[str, float]:
    """Region → demand/supply recorded with the newest assignment (empty when it recorded none)."""
    from sqlalchemy import select

    a = t.assignments.c
    with ledger.engine.connect() as c:
        row = c.execute(select(a.region_load).order_by(a.version.desc()).limit(1)).first()
    return {str(k): float(v) for k, v in (row[0] or {}).items()} if row else {}


def last_report_uri(ledger: Ledger) -> str | None:
    """URI of the newest rebalance report chart (PNG), recorded by ``sailor_rebalance``'s report
    task in the ledger's ``rebalance_nights``; None when no rebalance has written one yet."""
    return next((n["report_uri"] for n in ledger.rebalance_nights(limit=20) if n["report_uri"]), None)


def snapshot(
    settings: Settings | None = None,
    catalog: Catalog | None = None,
    ledger: Ledger | None = None,
    limit: int = 20,
) -> Snapshot:
    """Read the page's data: regions, the queue, live reservations (with their leases), assignment,
    recent placements and preemptions."""
    settings = settings or Settings.from_env()
    catalog = catalog or load_catalog()
    own = ledger is None
    ledger = ledger or Ledger(settings.ledger_url)
    try:
        assignment = ledger.latest_assignment()
        leases = ledger.reservation_leases()
        now = dt.datetime.now(dt.UTC)
        queue = tuple(
            {
                "position": e["position"],
                "run_id": e["run_id"],
                "team": e["team"],
                "priority": e["priority"],
                "gpus": e["gpus"],
                "gpu_type": e["gpu_type"],
                "reason": e["reason"],
                "estimated_start_at": e["estimated_start_at"],
                "latest_start_at": e["latest_start_at"],
                "waited_min": round((now - e["enqueued_at"]).total_seconds() / 60.0, 1),
            }
            for e in sorted(ledger.queue_entries(("queued",)), key=lambda e: e["position"] or 1 << 30)
        )
        reservations = tuple(
            {
                "run_id": r.run_id,
                "region": r.region,
                "zone": r.zone,
                "gpu_type": r.gpu_type,
                "gpus": r.gpus,
                "market": r.market,
                "lease_expires_at": (leases.get(r.run_id) or {}).get("expires_at"),
            }
            for r in ledger.live_reservations()
        )
        return Snapshot(
            regions=region_rows(catalog, ledger),
            reservations=reservations,
            assignment=(
                {
                    "version": assignment.version,
                    "created_at": assignment.created_at,
                    "source": assignment.source,
                    "shares": {team: dict(s) for team, s in assignment.shares.items()},
                }
                if assignment
                else None
            ),
            placements=tuple(ledger.placements(limit=limit)),
            preemptions=tuple(ledger.preemptions(limit=limit)),
            runs=tuple(ledger.list_runs(limit=limit)),
            report_uri=last_report_uri(ledger),
            queue=queue,
            queue_policy=settings.queue_policy,
        )
    finally:
        if own:
            ledger.dispose()


def report_uri(settings: Settings | None = None) -> str | None:
    """URI of the last rebalance report chart, read from the ledger of ``settings``."""
    ledger = Ledger((settings or Settings.from_env()).ledger_url)
    try:
        return last_report_uri(ledger)
    finally:
        ledger.dispose()


def read_report(uri: str, settings: Settings | None = None) -> bytes:
    """Bytes of the report chart at ``uri`` (``sailor://``, ``file://`` or ``gs://``)."""
    from sailor_tasks import storage

    settings = settings or Settings.from_env()
    return storage.read_bytes(storage.resolve(uri, settings))
