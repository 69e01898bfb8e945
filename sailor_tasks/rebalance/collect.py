"""Utilization collection: ledger rows + catalog supply → the rebalance ``Problem``.

Demand of a team per (region, GPU type) is its mean concurrent GPUs over the window (GPU-hours of
its runs overlapping the window / window hours); its peak concurrent GPUs is kept beside it. The
datasets a team reads come from its runs; their sizes and current replicas from the replicas table.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sailor_tasks.errors import InvalidQuotaError
from sailor_tasks.ledger.store import aware
from sailor_tasks.rebalance.problem import ANY_REGION, Dataset, Problem, Team, is_gpu_count

logger = logging.getLogger(__name__)

QUOTA_KINDS = ("max", "min")
"""Keys of a team's quotas: at most / at least this many GPUs of the team per region."""


def check_quotas(quotas: Mapping[str, Any], regions: Iterable[str]) -> None:
    """Refuse quotas that are not team → {"max"/"min": {region: GPUs ≥ 0}} over ``regions`` (and
    ``"*"`` in max), naming the bad entry and the valid choices: a misspelt key or region would
    otherwise be ignored and the quota silently not applied.

    Raises:
        InvalidQuotaError: the first bad entry (a ``ValueError``; not retried in a task).
    """
    known = sorted(regions)
    shape = 'team → {"max": {region: GPUs}, "min": {region: GPUs}}'
    if not isinstance(quotas, Mapping):
        raise InvalidQuotaError(f"quotas={quotas!r:.80}: need {shape}")
    for team, q in quotas.items():
        if not isinstance(q, Mapping):
            raise InvalidQuotaError(f"quotas[{team!r}]={q!r:.80}: need {shape}")
        unknown = sorted(set(q) - set(QUOTA_KINDS))
        if unknown:
            raise InvalidQuotaError(f"quotas[{team!r}]: unknown key {', '.join(map(repr, unknown))}; valid: max, min")
        for kind in QUOTA_KINDS:
            per = q.get(kind, {})
            if not isinstance(per, Mapping):
                raise InvalidQuotaError(f"quotas[{team!r}][{kind!r}]={per!r:.80}: need {{region: GPUs}}")
            for region, n in per.items():
                if region not in known and not (kind == "max" and region == ANY_REGION):
                    star = f" and {ANY_REGION!r} (every other region)" if kind == "max" else ""
                    raise InvalidQuotaError(
                        f"quotas[{team!r}][{kind!r}]: {region!r} is not a region of the supply; "
                        f"valid: {', '.join(known)}{star}"
                    )
                if not is_gpu_count(n):
                    raise InvalidQuotaError(f"quotas[{team!r}][{kind!r}][{region!r}]={n!r}: need a number of GPUs ≥ 0")


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


def _team_residency(
    current: Mapping[str, Mapping[str, float]],
    restricted: Mapping[str, Iterable[str]],
    supply: Mapping[tuple[str, str], float],
) -> tuple[set[str] | None, str | None]:
    """(the regions every dataset in ``restricted`` (URI → the regions it may be stored in) may
    be stored in, None when none restricts them; why the team cannot be placed anywhere whole,
    when those regions supply none of its GPU types, else None)."""
    if not restricted:
        return None, None
    allowed = set.intersection(*(set(r) for r in restricted.values()))
    gpu_types = {g for per in current.values() for g, n in per.items() if n > 0}
    missing = sorted(g for g in gpu_types if not any(supply.get((r, g), 0) > 0 for r in allowed))
    if not missing:
        return allowed, None
    where = ", ".join(sorted(allowed)) or "no region (their restrictions do not overlap)"
    reads = ", ".join(sorted(restricted))
    why = f"it reads {reads}, which may be stored only in {where}: none supplies {', '.join(missing)}"
    return allowed, why


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
        size_of: bytes of a dataset that is in a region but has no recorded replica (a
            ``sailor://<region>/...`` dataset, from its manifest); None: unknown. A dataset of
            unknown size is left out of the problem (no replica of it is planned: its copy could
            not be charged to the budget) and listed in the stats (``unknown_size_datasets``). A
            dataset in no region yet is left out too (``unplaced_datasets``): its run's
            ``place_data`` copies it wherever the run is placed. A team whose datasets may be
            stored in no common region that supplies its GPU types stays where it ran
            (``kept_in_place``, with the reason), and the others are rebalanced.
        quotas: team → {"max": {region: GPUs}, "min": {region: GPUs}}; ``"*"`` in max caps every
            region not listed. A bad entry raises ``InvalidQuotaError`` (``check_quotas``).
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
    held: dict[tuple[str, str], int] = {}  # (region, dataset) → bytes of its replica there
    for rep in replica_rows:
        sizes[rep["dataset_uri"]] = max(sizes.get(rep["dataset_uri"], 0), int(rep["bytes"]))
        where[rep["dataset_uri"]].add(rep["region"])
        held[(rep["region"], rep["dataset_uri"])] = int(rep["bytes"])
    supply_regions = {r for r, _g in supply}
    unknown, unplaced = [], []
    datasets: dict[str, Dataset] = {}
    stored_in: dict[str, tuple[str, ...] | None] = {}  # every dataset read: where it may be stored
    for uri in sorted({d for ds in reads.values() for d in ds}):
        allowed = residency(uri) if residency is not None else None
        stored_in[uri] = None if allowed is None else tuple(sorted(set(allowed)))
        # a sailor://<region>/... dataset is complete in that region's bucket (as the placement
        # engine's ``dataset_sources`` counts it): no copy needed there
        scheme, _, rest = uri.partition("://")
        if scheme == "sailor" and rest.split("/", 1)[0] in supply_regions:
            where[uri].add(rest.split("/", 1)[0])
        if not where.get(uri):
            # In no region yet (a waiting run's new dataset): its run's place_data copies it from
            # its source wherever the run is placed, whatever the rebalance decides; it neither
            # ties the team to the regions of a planned copy nor spends the budget (its residency
            # still confines the team, below).
            unplaced.append(uri)
            continue
        size = sizes.get(uri)
        if size is None:
            size = size_of(uri) if size_of else None
            if size is None:  # a copy that cannot be priced is not planned (never counted free)
                unknown.append(uri)
                continue
        datasets[uri] = Dataset(uri, int(size), tuple(sorted(where.get(uri, ()))), stored_in[uri])
    priorities = priorities or {}
    teams = []
    kept_in_place: dict[str, str] = {}
    for team in sorted(gpu_hours):
        q = quotas.get(team, {})
        per_region = sorted(gpu_hours[team].items())
        current = {r: {g: round(h / hours, 9) for g, h in per.items()} for r, per in per_region}
        read = tuple(sorted(d for d in reads.get(team, ()) if d in datasets))
        quota_max, quota_min = dict(q.get("max", {})), dict(q.get("min", {}))
        restricted = {d: stored_in[d] for d in reads.get(team, ()) if stored_in[d] is not None}
        allowed, stuck = _team_residency(current, restricted, supply)
        if allowed is not None:  # also what data outside the problem (not placed yet) allows
            quota_max = {**quota_max, **{r: 0.0 for r in sorted(supply_regions - allowed)}}
        if stuck is not None:
            # Each of its runs kept its own data's residency, but no one region can hold all its
            # data: the team stays where it ran (its runs' data is already there), and the other
            # teams are still rebalanced.
            logger.warning("team %s is not rebalanced: %s", team, stuck)
            kept_in_place[team] = stuck
            # Where it ran and the supply still has its GPU types. Its demand elsewhere (a region
            # or GPU type gone from the catalog) cannot stay there and may not move: it is left
            # out tonight, not made a minimum no region can meet.
            kept = {
                r: {g: v for g, v in per.items() if supply.get((r, g), 0) > 0} for r, per in current.items()
            }
            if gone := sorted(f"{g} in {r}" for r, per in current.items() for g in per if g not in kept[r]):
                logger.warning(
                    "team %s: its demand for %s is left out: the supply has none there", team, ", ".join(gone)
                )
            current = {r: per for r, per in kept.items() if per}
            here = {r: round(sum(per.values()), 9) for r, per in current.items()}
            read, quota_max, quota_min = (), {**here, ANY_REGION: 0.0}, dict(here)
        teams.append(
            Team(
                name=team,
                current=current,
                datasets=read,
                priority=float(priorities.get(team, 1.0)),
                quota_max=quota_max,
                quota_min=quota_min,
                peak_gpus=peak_concurrency(by_team[team], since, until),
                pinned=team in kept_in_place,
            )
        )
    # A quota of a team with no demand in the window changes nothing tonight (an idle team, or a
    # misspelt name): said, not silently dropped.
    idle_quotas = sorted(set(quotas) - set(gpu_hours))
    if idle_quotas:
        logger.warning("quotas of teams with no demand in the window, unused: %s", ", ".join(idle_quotas))
    # Replicas of the datasets outside the problem (no team read them in the window, or their size
    # is unknown) still fill their region's bucket: they count against its storage cap.
    held_elsewhere: dict[str, float] = defaultdict(float)
    for (region, uri), n in held.items():
        if uri not in datasets:
            held_elsewhere[region] += n
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
        storage_held_bytes=dict(sorted(held_elsewhere.items())),
    )
    stats = {
        "gpu_hours": round(total_hours, 6),
        "window_hours": round(hours, 6),
        "peak_gpus": {t.name: t.peak_gpus for t in teams},
        "unknown_size_datasets": unknown,
        "unplaced_datasets": unplaced,
        "kept_in_place": kept_in_place,
        "quotas_without_demand": idle_quotas,
        "unsupplied_gpu_hours": {g: round(h, 6) for g, h in sorted(unsupplied.items())},
    }
    return problem, stats
