"""The rebalance problem and its solution as plain data (JSON in/out): what the solver reads and writes.

Units: demand and supply are GPUs (mean concurrent GPUs over the window: GPU-hours / window hours);
sizes and budgets are bytes. A *cell* is one (region, GPU type).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ANY_REGION = "*"
"""Key of ``Team.quota_max`` that caps every region not listed explicitly."""


@dataclass(frozen=True, slots=True)
class Team:
    """A team (workload class): where its demand runs now, what it reads, and its hard quotas."""

    name: str
    current: Mapping[str, Mapping[str, float]]
    """region → GPU type → GPUs in use there now (the demand to place, by GPU type)."""
    datasets: tuple[str, ...] = ()
    priority: float = 1.0
    """Weight of moving this team's demand (higher: the solver prefers to leave it where it is)."""
    quota_max: Mapping[str, float] = field(default_factory=dict)
    """region → at most this many GPUs of the team there (``"*"``: every region not listed)."""
    quota_min: Mapping[str, float] = field(default_factory=dict)
    """region → at least this many GPUs of the team there."""
    peak_gpus: float = 0.0
    pinned: bool = False
    """Kept where it runs: its GPUs stay in every (region, GPU type) of ``current`` (a team whose
    datasets no one region may hold all of)."""

    def demand(self) -> dict[str, float]:
        """GPU type → GPUs (summed over regions)."""
        out: dict[str, float] = defaultdict(float)
        for per_gpu in self.current.values():
            for gpu, n in per_gpu.items():
                out[gpu] += n
        return {g: n for g, n in out.items() if n > 0}

    def cap(self, region: str) -> float | None:
        if region in self.quota_max:
            return float(self.quota_max[region])
        if ANY_REGION in self.quota_max:
            return float(self.quota_max[ANY_REGION])
        return None


@dataclass(frozen=True, slots=True)
class Dataset:
    uri: str
    bytes: int
    replicas: tuple[str, ...] = ()
    """Regions that hold a complete replica now."""
    regions: tuple[str, ...] | None = None
    """Regions it may be stored in (its runs' ``data_residency``); None: any. A team that reads it
    runs only there, and no replica of it is planned elsewhere."""


@dataclass(frozen=True)
class Problem:
    supply: Mapping[str, Mapping[str, float]]
    """region → GPU type → GPUs available (catalog supply)."""
    teams: tuple[Team, ...]
    datasets: Mapping[str, Dataset]
    budget_bytes: int
    """Bytes the nightly replication may copy."""
    storage_cap_bytes: Mapping[str, float] = field(default_factory=dict)
    """region → bytes its bucket may hold (replicas included); absent: unlimited."""
    storage_held_bytes: Mapping[str, float] = field(default_factory=dict)
    """region → bytes its bucket holds besides the replicas of ``datasets`` (replicas of datasets
    no team read in the window): they count against ``storage_cap_bytes`` too."""

    @property
    def regions(self) -> list[str]:
        return sorted(self.supply)

    @property
    def gpu_types(self) -> list[str]:
        return sorted({g for per in self.supply.values() for g in per})

    def cell_supply(self) -> dict[tuple[str, str], float]:
        return {(r, g): float(n) for r, per in self.supply.items() for g, n in per.items() if n > 0}

    def to_json(self) -> dict[str, Any]:
        return {
            "supply": {r: dict(v) for r, v in self.supply.items()},
            "teams": [
                {
                    "name": t.name,
                    "current": {r: dict(v) for r, v in t.current.items()},
                    "datasets": list(t.datasets),
                    "priority": t.priority,
                    "quota_max": dict(t.quota_max),
                    "quota_min": dict(t.quota_min),
                    "peak_gpus": t.peak_gpus,
                    **({"pinned": True} if t.pinned else {}),
                }
                for t in self.teams
            ],
            "datasets": [
                {
                    "uri": d.uri,
                    "bytes": d.bytes,
                    "replicas": list(d.replicas),
                    **({} if d.regions is None else {"regions": list(d.regions)}),
                }
                for d in self.datasets.values()
            ],
            "budget_bytes": self.budget_bytes,
            "storage_cap_bytes": dict(self.storage_cap_bytes),
            "storage_held_bytes": dict(self.storage_held_bytes),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Problem:
        """The problem from its JSON form (``to_json``'s).

        Raises:
            ValueError: a required key is missing or a value has the wrong type, naming which.
        """
        if not isinstance(doc, Mapping):
            raise ValueError(f"problem JSON: expected an object with {PROBLEM_KEYS}, got {type(doc).__name__}")
        missing = [k for k in ("supply", "teams", "datasets", "budget_bytes") if k not in doc]
        if missing:
            raise ValueError(f"problem JSON: missing {', '.join(missing)}; expected {PROBLEM_KEYS}")
        supply = _gpu_table(doc["supply"], "supply")
        regions = sorted(supply)

        def in_supply(row: dict[str, float], what: str, any_region: bool = False) -> dict[str, float]:
            """``row`` when every key is a region of the supply (or ``ANY_REGION`` where allowed):
            a misspelt region would otherwise be silently not applied."""
            for r in row:
                if r not in supply and not (any_region and r == ANY_REGION):
                    star = f" or {ANY_REGION!r} (every other region)" if any_region else ""
                    raise ValueError(
                        f"{what}: {r!r} is not a region of the supply; valid: {', '.join(regions)}{star}"
                    )
            return row

        where = "teams"
        try:
            teams = []
            names: set[str] = set()
            for i, t in enumerate(doc["teams"]):
                where = f"teams[{i}]"
                if t["name"] in names:
                    raise ValueError(f"team name {t['name']!r} appears twice")
                names.add(t["name"])
                teams.append(
                    Team(
                        name=t["name"],
                        current=_gpu_table(t["current"], f"{where}.current"),
                        datasets=_names(t.get("datasets", ()), "datasets"),
                        priority=_number(t.get("priority", 1.0), "priority"),
                        quota_max=in_supply(
                            _gpu_row(t.get("quota_max") or {}, "quota_max"), "quota_max", True
                        ),
                        quota_min=in_supply(_gpu_row(t.get("quota_min") or {}, "quota_min"), "quota_min"),
                        peak_gpus=_number(t.get("peak_gpus", 0.0), "peak_gpus"),
                        pinned=_flag(t.get("pinned", False), "pinned"),
                    )
                )
            datasets = {}
            for i, d in enumerate(doc["datasets"]):
                where = f"datasets[{i}]"
                if d["uri"] in datasets:
                    raise ValueError(f"dataset uri {d['uri']!r} appears twice")
                datasets[d["uri"]] = Dataset(
                    d["uri"],
                    _whole(d["bytes"], "bytes"),
                    _names(d.get("replicas", ()), "replicas"),
                    None if d.get("regions") is None else _names(d["regions"], "regions"),
                )
            for i, team in enumerate(teams):
                where = f"teams[{i}].datasets"
                if unknown := sorted(set(team.datasets) - set(datasets)):
                    raise ValueError(f"{', '.join(map(repr, unknown))} not among the problem's datasets")
            where = "storage_cap_bytes"
            caps = in_supply(
                _gpu_row(doc.get("storage_cap_bytes") or {}, "storage_cap_bytes"), "storage_cap_bytes"
            )
            where = "storage_held_bytes"
            held = in_supply(
                _gpu_row(doc.get("storage_held_bytes") or {}, "storage_held_bytes"), "storage_held_bytes"
            )
            where = "budget_bytes"
            budget = _whole(doc["budget_bytes"], "budget_bytes")
        except KeyError as exc:
            raise ValueError(
                f"problem JSON: {where} has no {exc.args[0]!r}; expected {PROBLEM_KEYS}"
            ) from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"problem JSON: {where}: {exc}; expected {PROBLEM_KEYS}") from None
        return cls(
            supply=supply,
            teams=tuple(teams),
            datasets=datasets,
            budget_bytes=budget,
            storage_cap_bytes=caps,
            storage_held_bytes=held,
        )


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not true or false")
    return value


def is_gpu_count(n: Any) -> bool:
    """Whether ``n`` (from JSON) is a number of GPUs: a finite int or float ≥ 0, not a bool."""
    return not isinstance(n, bool) and isinstance(n, (int, float)) and 0 <= n < math.inf


def _number(n: Any, what: str) -> float:
    """A finite number ≥ 0 from JSON (not a bool), or a ValueError naming ``what``."""
    if not is_gpu_count(n):
        raise ValueError(f"{what}={n!r}: need a finite number ≥ 0")
    return float(n)


def _whole(n: Any, what: str) -> int:
    """Bytes from JSON: a finite number ≥ 0 (an int keeps its precision)."""
    _number(n, what)
    return int(n)


def _gpu_row(value: Any, what: str) -> dict[str, float]:
    """name → finite number ≥ 0 from JSON (quotas, storage caps), or a ValueError naming the entry."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must map region → number, got {value!r:.80}")
    return {k: _number(n, f"{what}[{k!r}]") for k, n in value.items()}


def _names(value: Any, what: str) -> tuple[str, ...]:
    """A list of strings from JSON (a bare string is refused, not split into characters)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings, got {value!r:.80}")
    return tuple(value)


def _gpu_table(value: Any, where: str) -> dict[str, dict[str, float]]:
    """region → GPU type → GPUs from JSON, or a ValueError naming ``where`` and the bad entry."""
    if not isinstance(value, Mapping):
        raise ValueError(f"problem JSON: {where} must map region → GPU type → GPUs, got {value!r:.80}")
    out: dict[str, dict[str, float]] = {}
    for region, per_gpu in value.items():
        if not isinstance(per_gpu, Mapping):
            raise ValueError(
                f"problem JSON: {where}[{region!r}] must map GPU type → GPUs, got {per_gpu!r:.80}"
            )
        row = {}
        for gpu, n in per_gpu.items():
            if not is_gpu_count(n):
                raise ValueError(
                    f"problem JSON: {where}[{region!r}][{gpu!r}]={n!r}: need a finite number of GPUs ≥ 0"
                )
            row[gpu] = n
        out[region] = row
    return out


PROBLEM_KEYS = (
    "supply (region → GPU type → GPUs), teams (each with name and current: region → GPU type → "
    "GPUs), datasets (each with uri and bytes) and budget_bytes"
)
"""What ``Problem.from_json`` needs, for its error messages."""


def cell_load(
    shares: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> dict[tuple[str, str], float]:
    """(region, GPU type) → GPUs from team → region → GPU type → GPUs."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for per_region in shares.values():
        for region, per_gpu in per_region.items():
            for gpu, n in per_gpu.items():
                out[(region, gpu)] += n
    return dict(out)


def region_ratios(
    load: Mapping[tuple[str, str], float], supply: Mapping[tuple[str, str], float]
) -> dict[str, float]:
    """region → demand / supply summed over GPU types (regions with supply only)."""
    d: dict[str, float] = defaultdict(float)
    s: dict[str, float] = defaultdict(float)
    for (r, _g), n in supply.items():
        s[r] += n
    for (r, _g), n in load.items():
        d[r] += n
    return {r: d[r] / s[r] for r in sorted(s) if s[r] > 0}


def cell_ratios(
    load: Mapping[tuple[str, str], float], supply: Mapping[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    return {c: load.get(c, 0.0) / n for c, n in supply.items() if n > 0}


def allocation_rate(load: Mapping[tuple[str, str], float], supply: Mapping[tuple[str, str], float]) -> float:
    """Share of the supply's GPUs that demand can use: Σ min(load, supply) / Σ supply over cells."""
    total = sum(supply.values())
    if total <= 0:
        return 0.0
    return sum(min(load.get(c, 0.0), n) for c, n in supply.items()) / total
