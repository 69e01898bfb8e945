"""Every spot availability source the simulator reads, turned into per-zone availability traces.

Accepted inputs (files, or folders searched recursively):

* ``*.json`` in the common format ``{"metadata": {"gap_seconds": N}, "data": [...]}`` (1 =
  unavailable; multi-node traces hold counts). The file stem may name where it was recorded:
  ``<zone>`` or ``<GPU>_<zone>`` (``V100_us-west1-b``).
* ``*.json`` as in the Sailor planner's data: ``[{"Time": seconds, "GPUs": n}, ...]`` (counts of one
  pool; the gap is the median spacing of ``Time``).
* ``*.csv`` as in the Sailor planner's data: ``,Timestamp,<GPU>-<mem>_<zone>,...`` (GPUs available
  per zone column over time).
* ``*.out``: the GCP 2020 preemptible-GPU logs (``gcp_2020``), one trace per (zone, GPU type).

Each trace keeps the zone and catalog GPU type it was recorded for when the source says so.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sailor_tasks.traces.availability import AvailabilityTrace, parse_availability_trace
from sailor_tasks.traces.gcp_2020 import merge_gcp_logs, to_availability_trace

SUFFIXES = (".json", ".csv", ".out")


@dataclass(frozen=True, slots=True)
class ZoneTrace:
    name: str
    trace: AvailabilityTrace
    zone: str | None = None
    """Zone the trace was recorded in (None: not said by the source)."""
    gpu_type: str | None = None
    """Catalog GPU type it was recorded for (None: not said)."""


def catalog_gpu(name: str) -> str:
    """``nvidia-tesla-v100`` / ``A100-40`` / ``v100`` → ``V100`` / ``A100`` / ``V100``."""
    n = name.lower().removeprefix("nvidia-").removeprefix("tesla-")
    n = n.split("-")[0] if n.split("-")[-1].isdigit() else n
    return n.upper()


def _is_zone(text: str) -> bool:
    """``us-west1-b``-like: region-part, a digit-ending middle, a zone letter."""
    parts = text.split("-")
    return len(parts) >= 3 and parts[-2][-1:].isdigit() and len(parts[-1]) == 1


def _from_stem(stem: str) -> tuple[str | None, str | None]:
    """(zone, GPU type) a file stem or CSV column names, where it names them."""
    gpu, sep, zone = stem.partition("_")
    if sep and _is_zone(zone):
        return zone, catalog_gpu(gpu)
    return (stem, None) if _is_zone(stem) else (None, None)


def _number(value: object, where: str, *, count: bool = False) -> float:
    """``value`` as a number (a GPU count: an integral one >= 0); ValueError naming ``where``."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{where}={value!r} is not a number") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"{where}={value!r} is not a finite number")
    if count and (x < 0 or not x.is_integer()):
        raise ValueError(f"{where}={value!r} must be a whole number of GPUs >= 0")
    return x


def _from_times(points: list[dict], source: str) -> AvailabilityTrace:
    for i, p in enumerate(points):
        if not isinstance(p, dict) or not {"Time", "GPUs"} <= p.keys():
            raise ValueError(f"{source}: entry [{i}]={p!r:.80} needs 'Time' and 'GPUs'")
    times = [_number(p["Time"], f"{source}: [{i}].Time") for i, p in enumerate(points)]
    counts = [int(_number(p["GPUs"], f"{source}: [{i}].GPUs", count=True)) for i, p in enumerate(points)]
    changes = sorted(zip(times, counts, strict=True), key=lambda tc: tc[0])
    gaps = [b[0] - a[0] for a, b in zip(changes, changes[1:], strict=False) if b[0] > a[0]]
    if not gaps:
        return AvailabilityTrace(3600.0, tuple(c for _, c in changes[-1:]), "available_count", source)
    # Each count holds until the next Time: sampled every smallest spacing (at most
    # ``MAX_TIME_SLOTS`` slots), so irregular points keep their real durations.
    start, span = changes[0][0], changes[-1][0] - changes[0][0]
    gap = max(min(gaps), span / MAX_TIME_SLOTS)
    slots, k = [], 0
    for i in range(int(span // gap) + 1):
        t = start + i * gap
        while k + 1 < len(changes) and changes[k + 1][0] <= t + 1e-9:
            k += 1
        slots.append(changes[k][1])
    return AvailabilityTrace(gap, tuple(slots), "available_count", source)


MAX_TIME_SLOTS = 1_000_000
"""Most slots a ``[{"Time", "GPUs"}]`` trace is sampled into (its spacing grows beyond)."""


def load_json(path: Path) -> list[ZoneTrace]:
    """The traces of one JSON file (none when it is another JSON file).

    Raises:
        ValueError: the file is not JSON, naming it.
    """
    try:
        with path.open() as f:
            doc = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    zone, gpu = _from_stem(path.stem)
    if isinstance(doc, list) and doc and isinstance(doc[0], dict) and {"Time", "GPUs"} <= doc[0].keys():
        return [ZoneTrace(path.stem, _from_times(doc, str(path)), zone, gpu)]
    if isinstance(doc, dict) and "metadata" in doc:
        return [ZoneTrace(path.stem, parse_availability_trace(doc, source=str(path)), zone, gpu)]
    return []  # another JSON file (prices, quotas, ...): not a trace


def load_csv(path: Path) -> list[ZoneTrace]:
    """Sailor GPU availability CSV: one count trace per ``<GPU>_<zone>`` column."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or "Timestamp" not in rows[0]:
        return []
    header = rows[0]
    for line, r in enumerate(rows[1:], start=2):
        if len(r) != len(header):
            raise ValueError(f"{path}:{line}: {len(r)} fields, the header has {len(header)}")
    ts_col = header.index("Timestamp")
    times = [_number(r[ts_col], f"{path}:{line}: Timestamp") for line, r in enumerate(rows[1:], start=2)]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    gap = statistics.median(gaps) if gaps else 3600.0
    out = []
    for col, name in enumerate(header):
        if col == ts_col or "_" not in name:
            continue
        zone, gpu = _from_stem(name)
        data = tuple(
            int(_number(r[col], f"{path}:{line}: {name}", count=True))
            for line, r in enumerate(rows[1:], start=2)
        )
        trace = AvailabilityTrace(gap, data, "available_count", f"{path}:{name}")
        out.append(ZoneTrace(f"{path.stem}:{name}", trace, zone, gpu))
    return out


def load_gcp(files: Iterable[Path]) -> list[ZoneTrace]:
    """GCP 2020 logs: one single-node trace per (zone, GPU type) over exactly the given files."""
    files = sorted(set(files))
    if not files:
        return []
    log = merge_gcp_logs(files)
    pairs = sorted({(lf.zone, lf.gpu_type) for lf in log.lives})
    return [
        ZoneTrace(f"gcp_2020:{zone}:{gpu}", to_availability_trace(log, zone, gpu), zone, catalog_gpu(gpu))
        for zone, gpu in pairs
    ]


def load_sources(paths: Iterable[str]) -> list[ZoneTrace]:
    """Every availability trace under ``paths`` (files or folders), in a stable order.

    Raises:
        ValueError: a path that does not exist, or no trace found at all (names the paths).
    """
    files: list[Path] = []
    paths = list(paths)
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files.extend(sorted(f for f in path.rglob("*") if f.suffix in SUFFIXES and f.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"--availability {p!r}: no such file or folder")
    out: list[ZoneTrace] = []
    for f in files:
        if f.suffix == ".json":
            out.extend(load_json(f))
        elif f.suffix == ".csv":
            out.extend(load_csv(f))
    out.extend(load_gcp([f for f in files if f.suffix == ".out"]))
    if not out:
        raise ValueError(
            f"--availability {', '.join(paths)}: no availability trace found (expected trace JSON, "
            "Sailor GPU-trace CSV/JSON or GCP 2020 *.out logs)"
        )
    return out
