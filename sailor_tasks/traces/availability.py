"""Spot availability traces in the common JSON format.

``{"metadata": {"gap_seconds": N}, "data": [0, 0, 1, ...]}``: entry ``i`` covers the interval
``[i·N, (i+1)·N)`` seconds from the trace start. In single-node traces 1 means spot capacity is
unavailable (the VM is preempted or cannot be obtained) and 0 means available; multi-node traces
hold the number of available instances instead.

Past its end a trace repeats (``slot``/``at``): simulators replay traces shorter than a run.

A *preemption* is the start of an unavailable stretch after an available one (single node), or a
drop in the available count (multi-node: one event per lost instance is not modelled; a drop is
one event affecting the run).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

FORMAT = '{"metadata": {"gap_seconds": N}, "data": [0, 1, ...]}'
"""The expected format, named in every parse error."""

MAX_TRACE_BYTES = 16 * 1024 * 1024
"""Largest trace file read (bytes): a year of one-minute entries is about 1 MiB of JSON, so this
leaves room while a device or a huge file can never exhaust a worker's memory."""

TraceKind = Literal["unavailable_flag", "available_count"]
TRACE_KINDS: tuple[str, ...] = ("unavailable_flag", "available_count")


@dataclass(frozen=True, slots=True)
class AvailabilityTrace:
    gap_seconds: float
    """Seconds covered by each entry of ``data``."""
    data: tuple[int, ...]
    kind: TraceKind = "unavailable_flag"
    """``unavailable_flag``: 1 = unavailable; ``available_count``: instances available."""
    source: str = ""

    @property
    def duration_s(self) -> float:
        return self.gap_seconds * len(self.data)

    def slot(self, t: float) -> int:
        """Index of the entry covering ``t`` seconds from the trace start (the trace repeats)."""
        return int(t // self.gap_seconds) % len(self.data)

    def at(self, t: float) -> int:
        """The value (flag or count) at ``t`` seconds from the trace start (the trace repeats)."""
        return self.data[self.slot(t)]

    def available(self, i: int) -> bool:
        """Whether capacity is available during entry ``i``."""
        v = self.data[i]
        return v == 0 if self.kind == "unavailable_flag" else v > 0

    @property
    def unavailable_fraction(self) -> float:
        if not self.data:
            return 0.0
        return sum(not self.available(i) for i in range(len(self.data))) / len(self.data)

    def preemption_times(self) -> tuple[float, ...]:
        """Seconds from the trace start at which running capacity is lost."""
        times = []
        for i in range(1, len(self.data)):
            if self.kind == "unavailable_flag":
                lost = self.available(i - 1) and not self.available(i)
            else:
                lost = self.data[i] < self.data[i - 1]
            if lost:
                times.append(i * self.gap_seconds)
        return tuple(times)

    def preemptions_per_hour(self) -> float:
        """Preemptions per hour of available time (the rate a running spot VM sees)."""
        available_h = sum(self.available(i) for i in range(len(self.data))) * self.gap_seconds / 3600.0
        return len(self.preemption_times()) / available_h if available_h > 0 else 0.0


def parse_availability_trace(
    obj: Mapping[str, Any], source: str = "", kind: TraceKind | None = None
) -> AvailabilityTrace:
    """Validate a decoded trace JSON object.

    Args:
        obj: the decoded JSON.
        source: where it came from (kept for explanations).
        kind: how to read the values; None infers ``available_count`` when any value exceeds 1.

    Raises:
        ValueError: naming the source, the malformed field and the expected format.
    """

    def bad(what: str) -> ValueError:
        return ValueError(f"availability trace {source!r}: {what}; expected {FORMAT}")

    if not isinstance(obj, Mapping) or "metadata" not in obj or "data" not in obj:
        raise bad("expected an object with 'metadata' and 'data'")
    gap = obj["metadata"].get("gap_seconds") if isinstance(obj["metadata"], Mapping) else None
    if not isinstance(gap, (int, float)) or isinstance(gap, bool) or not 0 < gap < math.inf:
        raise bad(f"metadata.gap_seconds={_shown(gap)} must be a finite number > 0")
    data = obj["data"]
    if not isinstance(data, list) or not data:
        raise bad("'data' must be a non-empty list")
    values = []
    for i, v in enumerate(data):
        # Integral floats (``1.0``, as some writers emit) are read as their integer.
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise bad(f"data[{i}]={_shown(data[i])} must be an integer >= 0")
        values.append(v)
    if kind is None:
        kind = "available_count" if max(values) > 1 else "unavailable_flag"
    elif kind not in TRACE_KINDS:
        raise ValueError(f"kind={kind!r} is not a trace kind; valid: {', '.join(TRACE_KINDS)}")
    return AvailabilityTrace(gap_seconds=float(gap), data=tuple(values), kind=kind, source=source)


def _shown(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a message never echoes a huge value whole)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} chars)"


def load_availability_trace(uri: str, kind: TraceKind | None = None) -> AvailabilityTrace:
    """Read and validate a trace from a ``file://``/``gs://`` URI or a local path.

    Args:
        uri: where the trace is.
        kind: how to read the values; None infers ``available_count`` when any value exceeds 1.

    Raises:
        ValueError: not a regular file, larger than ``MAX_TRACE_BYTES``, not JSON or not a valid
            trace (names the file and the format).
    """
    # Imported here so the trace type itself does not pull in fsspec (simulator worker processes).
    from sailor_tasks import storage

    if "://" not in uri:
        uri = f"file://{uri}"
    try:
        obj = json.loads(storage.read_regular_file(uri, MAX_TRACE_BYTES))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"availability trace {uri!r}: not JSON ({exc}); expected {FORMAT}") from None
    except RecursionError:
        raise ValueError(f"availability trace {uri!r}: JSON nested too deeply; expected {FORMAT}") from None
    return parse_availability_trace(obj, source=uri, kind=kind)
