"""Every spot availability source the simulator reads, turned into per-zone availability traces.

Accepted inputs (files, or folders searched recursively):

* ``*.json`` in the common format ``{"metadata": {"gap_seconds": N}, "data": [...]}`` (1 =
  unavailable; multi-node traces hold counts). The file stem may name where it was recorded:
  ``<zone>`` or ``<GPU>_<zone>`` (``V100_us-west1-b``).
* ``*.json`` as in the Sailor planner's data: ``[{"Time": seconds, "GPUs": n}, ...]`` (counts of one
  pool over time).
* ``*.csv`` as in the Sailor planner's data: ``,Timestamp,<GPU>-<mem>_<zone>,...`` (GPUs available
  per zone column over time).
* ``*.out``: the GCP 2020 preemptible-GPU logs (``gcp_2020``), one trace per (zone, GPU type).

Counts given at points in time (both Sailor formats) become a regular trace by ``_on_grid``: sorted
by their time, each holding until the next, on a grid of their smallest spacing.

Each trace keeps the zone and catalog GPU type it was recorded for when the source says so.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
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
    gap, (data,) = _on_grid(
        times,
        [("GPUs", counts)],
        [p["Time"] for p in points],
        [f"{source}: [{i}].Time" for i in range(len(points))],
        [f"[{i}]" for i in range(len(points))],
    )
    return AvailabilityTrace(gap, data, "available_count", source)


def _on_grid(
    times: Sequence[float],
    columns: Sequence[tuple[str, Sequence[int]]],
    raw: Sequence[object],
    fields: Sequence[str],
    rows: Sequence[str],
) -> tuple[float, list[tuple[int, ...]]]:
    """Counts given at points in time, in any order, as regular traces: (gap, each column's count
    in each slot).

    Each count holds until the next time. The gap is the smallest spacing of the times (larger
    where that would exceed ``MAX_TIME_SLOTS`` slots; 3600 s for a single time), so irregular
    points keep their real durations; each time starts on the slot nearest it (at most half a gap
    off: a spacing such as 0.1 s, inexact in floating point, lands on its own slot), and of two
    times on one slot the later one's count holds.

    Args:
        times: each point's time in seconds; columns: (name, each point's count); raw: each time
            as given; fields: each time's name in messages (``file:line: Timestamp``); rows: each
            point's short name (``line 3``).

    Raises:
        ValueError: a time given twice with different counts, naming both points and the counts.
    """
    order = sorted(range(len(times)), key=lambda i: times[i])
    for a, b in zip(order, order[1:], strict=False):
        if times[a] == times[b]:
            for name, col in columns:
                if col[a] != col[b]:
                    raise ValueError(
                        f"{fields[b]}={raw[b]!r} repeats {rows[a]}'s time with another count: "
                        f"{name} {col[a]} there, {col[b]} here"
                    )
    start, span = times[order[0]], times[order[-1]] - times[order[0]]
    gaps = [times[b] - times[a] for a, b in zip(order, order[1:], strict=False) if times[b] > times[a]]
    if not gaps:
        return 3600.0, [(col[order[-1]],) for _, col in columns]
    gap = max(min(gaps), span / MAX_TIME_SLOTS)
    slots = [math.floor((times[i] - start) / gap + 0.5) for i in order]
    out = []
    for _, col in columns:
        data: list[int] = []
        for slot, i in zip(slots, order, strict=True):
            if slot < len(data):
                data[slot] = col[i]
                continue
            if slot > len(data):
                data.extend([data[-1]] * (slot - len(data)))
            data.append(col[i])
        out.append(tuple(data))
    return gap, out


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
    """Sailor GPU availability CSV: one count trace per ``<GPU>_<zone>`` column, its rows in the
    order of their ``Timestamp`` (``_on_grid``).

    Raises:
        ValueError: a row of another width, a value that is not a number (a count: not a whole
            number >= 0), or a timestamp given twice with different counts, naming the file, the
            line and the value.
    """
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
    names = [(col, name) for col, name in enumerate(header) if col != ts_col and "_" in name]
    columns = [
        (
            name,
            [
                int(_number(r[col], f"{path}:{line}: {name}", count=True))
                for line, r in enumerate(rows[1:], start=2)
            ],
        )
        for col, name in names
    ]
    lines = range(2, len(rows) + 1)
    gap, data = _on_grid(
        times,
        columns,
        [r[ts_col] for r in rows[1:]],
        [f"{path}:{line}: Timestamp" for line in lines],
        [f"line {line}" for line in lines],
    )
    out = []
    for (_, name), counts in zip(names, data, strict=True):
        zone, gpu = _from_stem(name)
        trace = AvailabilityTrace(gap, counts, "available_count", f"{path}:{name}")
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
