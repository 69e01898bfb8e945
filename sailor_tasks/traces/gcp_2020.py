"""GCP preemptible-GPU logs (Feb–Mar 2020): per-zone preemption events and rates.

The logs (``logs/gcp/availability/*.out``) hold lines such as::

    [2020-03-01T10:11:21.000Z] Created instance instance0 with 1 GPU(s) of type nvidia-tesla-v100 in zone us-west1-b
    [2020-03-01T10:11:22.000Z] Instance instance0 running in zone us-west1-b
    [2020-03-01T10:12:22.000Z] Instance instance1 creation failed
    [2020-03-01T10:12:23.000Z] Instance instance1 not running in zone us-west1-b
    [2020-03-01T10:27:04.000Z] Instance instance0 not running in zone us-west1-b
    [2020-03-01T10:27:09.000Z] Successfully deleted instance instance0

Instances were pinged about every 15 minutes. An instance seen ``running`` and later ``not running``
was preempted (detected at the ping, so the event time is late by up to one ping interval); a
``creation failed`` followed by ``not running`` is a stock-out (no capacity), not a preemption.
Lines without a ``[timestamp]`` (price listings) are ignored.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sailor_tasks.traces.availability import AvailabilityTrace

EventKind = Literal["created", "preempted", "creation_failed"]

_LINE = re.compile(r"^\[(?P<ts>[^\]]+)\]\s+(?P<msg>.*)$")
_CREATED = re.compile(
    r"^Created instance (?P<inst>\S+) with (?P<n>\d+) GPU\(s\) of type (?P<gpu>\S+) in zone (?P<zone>\S+)$"
)
_RUNNING = re.compile(r"^Instance (?P<inst>\S+) running in zone (?P<zone>\S+)$")
_NOT_RUNNING = re.compile(r"^Instance (?P<inst>\S+) not running in zone (?P<zone>\S+)$")
_FAILED = re.compile(r"^Instance (?P<inst>\S+) creation failed$")
_DELETED = re.compile(r"^Successfully deleted instance (?P<inst>\S+)$")


@dataclass(frozen=True, slots=True)
class SpotEvent:
    at: dt.datetime
    zone: str
    kind: EventKind
    instance: str
    gpu_type: str | None
    """GPU type of the instance (``None`` for a creation that failed before a type was recorded)."""


@dataclass(frozen=True, slots=True)
class InstanceLife:
    """One instance from its creation to its last ``running`` ping."""

    instance: str
    zone: str
    gpu_type: str
    num_gpus: int
    created_at: dt.datetime
    last_seen_running: dt.datetime
    preempted: bool

    @property
    def hours(self) -> float:
        return (self.last_seen_running - self.created_at).total_seconds() / 3600.0


@dataclass(frozen=True, slots=True)
class ZoneStats:
    zone: str
    preemptions: int
    instance_hours: float
    creations: int
    creation_failures: int

    @property
    def preemptions_per_hour(self) -> float:
        """Preemptions per instance-hour observed running (0 when nothing ran)."""
        return self.preemptions / self.instance_hours if self.instance_hours > 0 else 0.0

    @property
    def stockout_fraction(self) -> float:
        """Share of creation attempts that failed for lack of capacity."""
        tries = self.creations + self.creation_failures
        return self.creation_failures / tries if tries else 0.0


@dataclass(frozen=True, slots=True)
class GcpLog:
    events: tuple[SpotEvent, ...]
    lives: tuple[InstanceLife, ...]

    def zones(self) -> tuple[str, ...]:
        return tuple(sorted({e.zone for e in self.events}))

    def preemption_times(self, zone: str, gpu_type: str | None = None) -> tuple[float, ...]:
        """Seconds from the zone's first creation to each of its preemptions (a replayable schedule)."""
        evs = [e for e in self.events if e.zone == zone and (gpu_type is None or e.gpu_type == gpu_type)]
        starts = [e.at for e in evs if e.kind == "created"]
        if not starts:
            return ()
        t0 = min(starts)
        return tuple((e.at - t0).total_seconds() for e in evs if e.kind == "preempted")

    def zone_stats(self, gpu_type: str | None = None) -> dict[str, ZoneStats]:
        """Per-zone preemption counts and rates (optionally for one GPU type); a zone with neither an
        instance nor a failed creation (of that GPU type) is left out."""
        out = {}
        for zone in self.zones():
            lives = [lf for lf in self.lives if lf.zone == zone and gpu_type in (None, lf.gpu_type)]
            evs = [e for e in self.events if e.zone == zone]
            failures = sum(e.kind == "creation_failed" and gpu_type in (None, e.gpu_type) for e in evs)
            if not lives and not failures:
                continue  # none of that type tried there: no rate (0 would read as the most reliable)
            out[zone] = ZoneStats(
                zone=zone,
                preemptions=sum(lf.preempted for lf in lives),
                instance_hours=sum(lf.hours for lf in lives),
                creations=len(lives),
                creation_failures=failures,
            )
        return out


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def parse_gcp_log(lines: Iterable[str], source: str = "") -> GcpLog:
    """Parse one log file's lines (instance names are local to a file).

    Raises:
        ValueError: a timestamped line that matches no known message (names the source and line).
    """
    events: list[SpotEvent] = []
    lives: list[InstanceLife] = []
    # instance → (zone, gpu, n, created_at, last running ping) while alive
    alive: dict[str, tuple[str, str, int, dt.datetime, dt.datetime]] = {}
    gpu_of: dict[str, str] = {}
    failed: set[str] = set()

    def end(inst: str, preempted: bool) -> None:
        zone, gpu, n, created, seen = alive.pop(inst)
        lives.append(InstanceLife(inst, zone, gpu, n, created, seen, preempted))

    for lineno, raw in enumerate(lines, start=1):
        m = _LINE.match(raw.strip())
        if not m:
            continue
        at, msg = _ts(m["ts"]), m["msg"].strip()
        if c := _CREATED.match(msg):
            inst = c["inst"]
            if inst in alive:
                end(inst, preempted=False)
            alive[inst] = (c["zone"], c["gpu"], int(c["n"]), at, at)
            gpu_of[inst] = c["gpu"]
            failed.discard(inst)
            events.append(SpotEvent(at, c["zone"], "created", inst, c["gpu"]))
        elif r := _RUNNING.match(msg):
            if r["inst"] in alive:
                zone, gpu, n, created, _ = alive[r["inst"]]
                alive[r["inst"]] = (zone, gpu, n, created, at)
        elif nr := _NOT_RUNNING.match(msg):
            inst = nr["inst"]
            if inst in failed:
                failed.discard(inst)
                events.append(SpotEvent(at, nr["zone"], "creation_failed", inst, gpu_of.get(inst)))
            elif inst in alive:
                end(inst, preempted=True)
                events.append(SpotEvent(at, nr["zone"], "preempted", inst, gpu_of.get(inst)))
        elif f := _FAILED.match(msg):
            failed.add(f["inst"])
        elif d := _DELETED.match(msg):
            if d["inst"] in alive:  # deleted while still running: end of the experiment, not a preemption
                end(d["inst"], preempted=False)
        else:
            raise ValueError(f"{source or 'log'}:{lineno}: unrecognised event {msg!r}")
    for inst in list(alive):
        end(inst, preempted=False)
    return GcpLog(events=tuple(sorted(events, key=lambda e: e.at)), lives=tuple(lives))


def load_gcp_logs(folder: str | Path) -> GcpLog:
    """Parse every ``*.out`` file under ``folder`` (recursively) and merge them."""
    folder = Path(folder)
    files = sorted(folder.rglob("*.out"))
    if not files:
        raise FileNotFoundError(f"no *.out GCP log files under {folder}")
    return merge_gcp_logs(files)


def merge_gcp_logs(files: Iterable[str | Path]) -> GcpLog:
    """Parse exactly these log files and merge them (events in time order)."""
    events: list[SpotEvent] = []
    lives: list[InstanceLife] = []
    for path in files:
        with Path(path).open() as f:
            log = parse_gcp_log(f, source=str(path))
        events.extend(log.events)
        lives.extend(log.lives)
    return GcpLog(events=tuple(sorted(events, key=lambda e: e.at)), lives=tuple(lives))


def to_availability_trace(
    log: GcpLog, zone: str, gpu_type: str | None = None, gap_seconds: float = 900.0
) -> AvailabilityTrace:
    """The zone's history as a single-node availability trace (1 = no instance of it running).

    Slot ``i`` covers ``[t0 + i·gap, t0 + (i+1)·gap)`` from the zone's first creation; it is
    available when an instance (of ``gpu_type``, if given) was alive at the slot's start. The
    default gap is the logs' 15-minute ping interval, so an instance lost between two pings shows
    as a 1 in the slot of the ping that found it gone.

    Raises:
        ValueError: no instance (of ``gpu_type``) ran in ``zone`` (names the zones that have some).
    """
    lives = _lives(log, zone, gpu_type)
    if not lives:
        zones = sorted({lf.zone for lf in log.lives if gpu_type in (None, lf.gpu_type)})
        what = f"{gpu_type} instances" if gpu_type else "instances"
        raise ValueError(f"zone={zone!r} has no {what} in the logs; zones with {what}: {', '.join(zones)}")
    t0 = min(lf.created_at for lf in lives)
    end = max(lf.last_seen_running for lf in lives)
    slots = int((end - t0).total_seconds() // gap_seconds) + 1
    data = []
    for i in range(slots):
        t = t0 + dt.timedelta(seconds=i * gap_seconds)
        alive = any(lf.created_at <= t <= lf.last_seen_running for lf in lives)
        data.append(0 if alive else 1)
    return AvailabilityTrace(
        gap_seconds=gap_seconds,
        data=tuple(data),
        source=f"gcp_2020:{zone}" + (f":{gpu_type}" if gpu_type else ""),
    )


def _lives(log: GcpLog, zone: str, gpu_type: str | None) -> list[InstanceLife]:
    return [lf for lf in log.lives if lf.zone == zone and gpu_type in (None, lf.gpu_type)]


def rates_per_zone(log: GcpLog, gpu_type: str | None = None) -> Mapping[str, float]:
    """zone → preemptions per instance-hour."""
    return {z: s.preemptions_per_hour for z, s in log.zone_stats(gpu_type).items()}
