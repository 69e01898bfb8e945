"""Preemption injection: which spot preemptions a run suffers, and when (pure; no signals here).

A run's ``InjectionSpec`` comes from its params. Sources, combinable:

- ``notice_steps`` / ``kill_steps``: a preemption with notice (SIGTERM, then SIGKILL after
  ``notice_s``) or a kill without notice (SIGKILL) once the trainer reaches that step;
- ``times_s``: noticed preemptions at wall-clock seconds since the run's first launch;
- ``rate_per_hour``: noticed preemptions as a Poisson process per hour of training (seeded by the
  run's seed and the attempt number, so a rerun suffers the same preemptions);
- ``trace_uri``: an availability trace (``traces.availability``) replayed from the run's first
  launch, ``trace_time_scale`` trace seconds per wall second; each loss of capacity is a noticed
  preemption.

Each event has a stable ``key``; the backend remembers fired keys per run so a restarted attempt
that re-runs the same steps (after a kill without notice) is not preempted again by the same event.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_NOTICE_S = 30.0
"""GCE gives spot/preemptible VMs 30 s between the ACPI soft-off (SIGTERM) and the hard stop."""


@dataclass(frozen=True, slots=True)
class PreemptionEvent:
    key: str
    noticed: bool
    step: int | None = None
    """Fire once the trainer has completed this step."""
    at_s: float | None = None
    """Or fire this many wall seconds after the run's first launch."""


@dataclass(frozen=True, slots=True)
class InjectionSpec:
    notice_steps: tuple[int, ...] = ()
    kill_steps: tuple[int, ...] = ()
    times_s: tuple[float, ...] = ()
    rate_per_hour: float = 0.0
    trace_uri: str = ""
    trace_time_scale: float = 1.0
    notice_s: float = DEFAULT_NOTICE_S
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("notice_steps", "kill_steps"):
            bad = [s for s in getattr(self, name) if not isinstance(s, int) or s < 1]
            if bad:
                raise ValueError(f"{name}={list(bad)!r}: steps must be integers >= 1")
        if self.notice_s < 0:
            raise ValueError(f"notice_s={self.notice_s!r} must be >= 0")
        if self.rate_per_hour < 0:
            raise ValueError(f"rate_per_hour={self.rate_per_hour!r} must be >= 0")
        if self.trace_time_scale <= 0:
            raise ValueError(f"trace_time_scale={self.trace_time_scale!r} must be > 0")

    @property
    def empty(self) -> bool:
        return not (
            self.notice_steps or self.kill_steps or self.times_s or self.rate_per_hour or self.trace_uri
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> InjectionSpec:
        data = dict(data or {})
        for name in ("notice_steps", "kill_steps", "times_s"):
            if name in data:
                data[name] = tuple(data[name])
        return cls(**data)


def _exact(seconds: float) -> str:
    """A time in an event's key, exactly: two events never share a key (``:g`` keeps 6 digits,
    so 1000000 and 1000004 would both be 1e+06, and the second would count as fired)."""
    value = float(seconds)
    return str(int(value)) if value.is_integer() else repr(value)


def step_events(spec: InjectionSpec) -> list[PreemptionEvent]:
    events = [PreemptionEvent(f"notice@step{s}", True, step=s) for s in spec.notice_steps]
    events += [PreemptionEvent(f"kill@step{s}", False, step=s) for s in spec.kill_steps]
    return sorted(events, key=lambda e: (e.step, e.key))


def time_events(spec: InjectionSpec, attempt: int, attempt_offset_s: float) -> list[PreemptionEvent]:
    """Wall-clock events that may fire in an attempt launched ``attempt_offset_s`` after the first.

    Events whose time fell while the run was down (between attempts) do not fire: no capacity was
    held then, so there was nothing to preempt.
    """
    events = [PreemptionEvent(f"time@{_exact(t)}s", True, at_s=float(t)) for t in spec.times_s]
    if spec.rate_per_hour > 0:
        rng = random.Random(f"{spec.seed}:{attempt}")  # str seeds are stable across processes
        gap_s = rng.expovariate(spec.rate_per_hour / 3600.0)
        events.append(PreemptionEvent(f"rate@attempt{attempt}", True, at_s=attempt_offset_s + gap_s))
    if spec.trace_uri:
        from sailor_tasks.traces.availability import load_availability_trace

        trace = load_availability_trace(spec.trace_uri)
        events += [
            PreemptionEvent(f"trace@{_exact(t)}s", True, at_s=t / spec.trace_time_scale)
            for t in trace.preemption_times()
        ]
    return sorted(
        (e for e in events if e.at_s is not None and e.at_s >= attempt_offset_s), key=lambda e: e.at_s or 0.0
    )


def due(
    events: list[PreemptionEvent], fired: set[str], step: int | None, elapsed_s: float
) -> PreemptionEvent | None:
    """The first not-yet-fired event due at training ``step`` and ``elapsed_s`` since the first launch."""
    for e in events:
        if e.key in fired:
            continue
        if e.step is not None and step is not None and step >= e.step:
            return e
        if e.at_s is not None and elapsed_s >= e.at_s:
            return e
    return None
