"""Utilization collection: ledger rows + catalog supply → the rebalance ``Problem``.

Demand of a team per (region, GPU type) is its mean concurrent GPUs over the window (GPU-hours of
its runs overlapping the window / window hours); its peak concurrent GPUs is kept beside it. The
datasets a team reads come from its runs; their sizes and current replicas from the replicas table.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sailor_tasks.ledger.store import aware
from sailor_tasks.rebalance.problem import ANY_REGION, Dataset, Problem, Team, is_gpu_count

QUOTA_KINDS = ("max", "min")
"""Keys of a team's quotas: at most / at least this many GPUs of the team per region."""


def check_quotas(quotas: Mapping[str, Any], regions: Iterable[str]) -> None:
    """Refuse quotas that are not team → {"max"/"min": {region: GPUs ≥ 0}} over ``regions`` (and
    ``"*"`` in max), naming the bad entry and the valid choices: a misspelt key or region would
    otherwise be ignored and the quota silently not applied.

    Raises:
        ValueError: the first bad entry.
    """
    known = sorted(regions)
    shape = 'team → {"max": {region: GPUs}, "min": {region: GPUs}}'
    if not isinstance(quotas, Mapping):
        raise ValueError(f"quotas={quotas!r:.80}: need {shape}")
    for team, q in quotas.items():
        if not isinstance(q, Mapping):
            raise ValueError(f"quotas[{team!r}]={q!r:.80}: need {shape}")
        unknown = sorted(set(q) - set(QUOTA_KINDS))
        if unknown:
            raise ValueError(f"quotas[{team!r}]: unknown key {', '.join(map(repr, unknown))}; valid: max, min")
        for kind in QUOTA_KINDS:
            per = q.get(kind, {})
            if not isinstance(per, Mapping):
                raise ValueError(f"quotas[{team!r}][{kind!r}]={per!r:.80}: need {{region: GPUs}}")
            for region, n in per.items():
                if region not in known and not (kind == "max" and region == ANY_REGION):
                    star = f" and {ANY_REGION!r} (every other region)" if kind == "max" else ""
                    raise ValueError(
                        f"quotas[{team!r}][{kind!r}]: {region!r} is not a region of the supply; "
                        f"valid: {', '.join(known)}{star}"
                    )
                if not is_gpu_count(n):
                    raise ValueError(f"quotas[{team!r}][{kind!r}][{region!r}]={n!r}: need a number of GPUs ≥ 0")


def _overlap_hours(start: dt.datetime, end: dt.datetime, since: dt.datetime, until: dt.datetime) -> float:
    lo, hi = max(start, since), min(end, until)
    return max(0.0, (hi - lo).total_seconds() / 3600.0)


def peak_concurrency(rows: Iterable[Mapping[str, Any]], since: dt.datetime, until: dt.datetime) -> float:
    """Most GPUs in use at once by ``rows`` within [since, until)."""
    events: list[tuple[dt.datetime, int]] = []
    for row in rows:
        start, end = max(aware(row["started_at"]), since), min(aware(row["ended_at"]), until)
        if end > start:
            events += [(start, int(row["gpus"])), (end, -int(row["gpus"]))]
    peak = now = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at a tie
        now += delta
        peak = max(peak, now)
    return float(peak)


def build_problem(
    rows: Iterable[Mapping[str, Any]],
    replica_rows: Iterable[Mapping[str, Any]],
    supply: Mapping[tuple[str, str], float],
    since: dt.datetime,
    until: dt.datetime,
    budget_bytes: int,
    size_of: Callable[[str], int | None] | None = None,
    quotas: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None,
    priorities: Mapping[str, float] | None = None,
    storage_cap_bytes: Mapping[str, float] | None = None,
    residency: Callable[[str], Iterable[str] | None] | None = None,
) -> tuple[Problem, dict[str, Any]]:
    """The problem and collection stats (GPU-hours, peak GPUs per team, datasets of unknown size).

    Args:
        rows: ledger utilization rows with the run's ``dataset_uri``.
        replica_rows: ledger replica rows (dataset_uri, region, bytes).
        supply: (region, GPU type) → GPUs from the catalog.
        size_of: bytes of a dataset that has no recorded replica (e.g. from its source manifest);
            None: unknown. A dataset of unknown size is left out of the problem (no replica of it
            is planned: its copy could not be charged to the budget) and listed in the stats.
        quotas: team → {"max": {region: GPUs}, "min": {region: GPUs}}; ``"*"`` in max caps every
            region not listed. A bad entry raises ValueError (``check_quotas``).
        residency: the regions a dataset may be stored in (its runs' ``data_residency``), None
            when it may be stored anywhere; without it, every dataset may.
    """
    quotas = quotas or {}
    check_quotas(quotas, {r for r, _g in supply})  # a region whose supply is 0 is no typo
    since, until = aware(since), aware(until)
    hours = max((until - since).total_seconds() / 3600.0, 1e-9)
    gpu_hours: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    reads: dict[str, set[str]] = defaultdict(set)
    by_team: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    total_hours = 0.0
    supplied = {g for (_r, g), n in supply.items() if n > 0}
    unsupplied: dict[str, float] = defaultdict(float)
    for row in rows:
        h = row["gpus"] * _overlap_hours(aware(row["started_at"]), aware(row["ended_at"]), since, until)
        if h <= 0:
            continue
        if row["gpu_type"] not in supplied:  # no region can take it: left out, listed in the stats
            unsupplied[row["gpu_type"]] += h
            continue
        per = gpu_hours[row["team"]][row["region"]]
        per[row["gpu_type"]] = per.get(row["gpu_type"], 0.0) + h
        total_hours += h
        by_team[row["team"]].append(row)
        if row.get("dataset_uri"):
            reads[row["team"]].add(row["dataset_uri"])
    sizes: dict[str, int] = {}
    where: dict[str, set[str]] = defaultdict(set)
    for rep in replica_rows:
        sizes[rep["dataset_uri"]] = max(sizes.get(rep["dataset_uri"], 0), int(rep["bytes"]))
        where[rep["dataset_uri"]].add(rep["region"])
    supply_regions = {r for r, _g in supply}
    unknown = []
    datasets: dict[str, Dataset] = {}
    for uri in sorted({d for ds in reads.values() for d in ds}):
        # a sailor://<region>/... dataset is complete in that region's bucket (as the placement
        # engine's ``dataset_sources`` counts it): no copy needed there
        scheme, _, rest = uri.partition("://")
        if scheme == "sailor" and rest.split("/", 1)[0] in supply_regions:
            where[uri].add(rest.split("/", 1)[0])
        size = sizes.get(uri)
        if size is None:
            size = size_of(uri) if size_of else None
            if size is None:  # a copy that cannot be priced is not planned (never counted free)
                unknown.append(uri)
                continue
        allowed = residency(uri) if residency is not None else None
        datasets[uri] = Dataset(
            uri,
            int(size),
            tuple(sorted(where.get(uri, ()))),
            None if allowed is None else tuple(sorted(set(allowed))),
        )
    priorities = priorities or {}
    teams = []
    for team in sorted(gpu_hours):
        q = quotas.get(team, {})
        teams.append(
            Team(
                name=team,
                current={
                    r: {g: round(h / hours, 9) for g, h in per.items()}
                    for r, per in sorted(gpu_hours[team].items())
                },
                datasets=tuple(sorted(d for d in reads.get(team, ()) if d in datasets)),
                priority=float(priorities.get(team, 1.0)),
                quota_max=dict(q.get("max", {})),
                quota_min=dict(q.get("min", {})),
                peak_gpus=peak_concurrency(by_team[team], since, until),
            )
        )
    nested: dict[str, dict[str, float]] = defaultdict(dict)
    for (r, g), n in supply.items():
        if n > 0:
            nested[r][g] = float(n)
    problem = Problem(
        supply=dict(nested),
        teams=tuple(teams),
        datasets=datasets,
        budget_bytes=int(budget_bytes),
        storage_cap_bytes=dict(storage_cap_bytes or {}),
    )
    stats = {
        "gpu_hours": round(total_hours, 6),
        "window_hours": round(hours, 6),
        "peak_gpus": {t.name: t.peak_gpus for t in teams},
        "unknown_size_datasets": unknown,
        "unsupplied_gpu_hours": {g: round(h, 6) for g, h in sorted(unsupplied.items())},
    }
    return problem, stats
