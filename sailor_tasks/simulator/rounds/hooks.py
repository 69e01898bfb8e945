"""The simulator's plug points: spot availability, job routing across regions, preemption recovery.

Each is a small Protocol. The defaults call the product's own code: routing by the placement
engine (``routing.py``) and recovery by the strategies registry (``replan.py``); the simple
implementations here are the explicitly named baselines ``least_loaded`` and ``stay_in_region``.
``TraceAvailability`` replays the product's availability traces (``sailor_tasks.traces.availability``,
loaded with ``load_availability_trace``) as spot capacity, and says when it changes inside a round
(``ReportsChanges``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sailor_tasks.traces.availability import AvailabilityTrace

if TYPE_CHECKING:
    from sailor_tasks.simulator.rounds.workload import SimJob


@dataclass(frozen=True, slots=True)
class Region:
    """One simulated cluster: GPUs per type, their price, and whether they are spot capacity."""

    name: str
    gpus: Mapping[str, int]
    usd_per_gpu_hour: Mapping[str, float] = field(default_factory=dict)
    spot: bool = False


@runtime_checkable
class AvailabilityProvider(Protocol):
    def capacity(self, region: Region, gpu_type: str, t: float) -> int:
        """GPUs of ``gpu_type`` usable in ``region`` at simulated time ``t`` (≤ nominal)."""
        ...


@runtime_checkable
class ReportsChanges(Protocol):
    """An ``AvailabilityProvider`` that also says when capacity changes. The round loop asks it for
    every round, so that capacity lost inside a round stops the jobs on it at that time and
    capacity that comes back ends a round in which nothing runs; a provider without it is read at
    round starts only (capacity is taken to hold for the whole round)."""

    def changes(self, region: Region, gpu_type: str, start: float, end: float) -> Sequence[tuple[float, int]]:
        """(time, GPUs usable from then) at every change of ``capacity(region, gpu_type, ·)`` in
        (``start``, ``end``), in time order; each time is the first at which ``capacity`` reads
        the new value."""
        ...


class AlwaysAvailable:
    """Every GPU is always there (on-demand capacity)."""

    def capacity(self, region: Region, gpu_type: str, t: float) -> int:
        return int(region.gpus.get(gpu_type, 0))


class TraceAvailability:
    """Spot regions follow availability traces (region name → trace); others are always available.

    The trace repeats past its end. ``unavailable_flag`` traces: 1 takes every GPU of the region
    away, 0 leaves them all; ``available_count`` traces cap the region's GPUs at the count. It
    ``ReportsChanges``: the round loop sees a slot that starts inside a round.
    """

    def __init__(self, traces: Mapping[str, AvailabilityTrace]):
        self.traces = dict(traces)

    def capacity(self, region: Region, gpu_type: str, t: float) -> int:
        nominal = int(region.gpus.get(gpu_type, 0))
        trace = self.traces.get(region.name)
        if trace is None or not region.spot:
            return nominal
        return _usable(trace, trace.at(t), nominal)

    def changes(self, region: Region, gpu_type: str, start: float, end: float) -> list[tuple[float, int]]:
        """``ReportsChanges.changes``: the starts of the trace slots in (``start``, ``end``) whose
        value changes the GPUs usable."""
        trace = self.traces.get(region.name)
        if trace is None or not region.spot:
            return []
        nominal = int(region.gpus.get(gpu_type, 0))
        gap = trace.gap_seconds
        k = start // gap  # the slot of ``start``, as ``AvailabilityTrace.slot`` reads it
        last = _usable(trace, trace.at(start), nominal)
        out = []
        while True:
            k += 1
            at = k * gap
            # In floating point ``k * gap`` can still read slot k - 1 (a gap such as 0.1 s): step
            # to the first time that reads slot k.
            while at // gap < k:
                at = math.nextafter(at, math.inf)
            if at >= end:
                return out
            usable = _usable(trace, trace.at(at), nominal)
            if usable != last:
                out.append((at, usable))
                last = usable


def _usable(trace: AvailabilityTrace, value: int, nominal: int) -> int:
    """GPUs usable of ``nominal`` when ``trace`` reads ``value``."""
    if trace.kind == "available_count":
        return min(nominal, value)
    return 0 if value == 1 else nominal


@runtime_checkable
class Router(Protocol):
    def route(self, job: SimJob, runnable: Sequence[bool], load: Sequence[float]) -> int:
        """Region index for a newly arrived job; ``runnable[r]``: region r has a GPU type that can
        run it; ``load[r]`` = GPUs demanded (this job included) / GPUs in region r."""
        ...


@runtime_checkable
class StartsJobs(Protocol):
    """A router that can also send a job where it starts at once (``free`` GPUs). The round loop
    asks it first for every arriving job and, each round, for the jobs that got no GPUs where
    they wait, so that no GPU idles while a job that could use it waits in another region."""

    def start_now(
        self,
        job: SimJob,
        load: Sequence[float],
        free: Sequence[Mapping[str, int]],
        exclude: int | None = None,
    ) -> int | None:
        """A region where ``job`` can start now (``free[r]``: GPUs of each type no job uses in
        region r this round), never ``exclude``; None when no region has room for it."""
        ...


class LeastLoadedRouter:
    """Baseline (``--router least_loaded``): the region with the lowest demand/supply among those
    that can run the job. The default router is the placement engine (``routing.PlacementRouter``)."""

    name = "least_loaded"

    def route(self, job: SimJob, runnable: Sequence[bool], load: Sequence[float]) -> int:
        best, best_load = -1, float("inf")
        for r, (ok, lr) in enumerate(zip(runnable, load, strict=True)):
            if ok and lr < best_load:
                best, best_load = r, lr
        return best


@runtime_checkable
class RecoveryStrategy(Protocol):
    def on_preemption(
        self,
        job: SimJob,
        region: int,
        now: float,
        available: Sequence[Mapping[str, int]],
        load: Sequence[float],
        free: Sequence[Mapping[str, int]] | None = None,
    ) -> int:
        """Region index where ``job``, preempted in ``region`` at ``now``, continues.

        ``available[r]``: GPUs of each type usable in region r now; ``load[r]``: GPUs demanded /
        GPUs in region r if the job continued there; ``free[r]``: GPUs of each type no job uses
        there (a region with room lets the job start at once)."""
        ...


class StayInRegion:
    """Baseline (``--recovery stay_in_region``): the preempted job waits for capacity to come back
    in the same region. The default is the registry's ``same_zone_first``
    (``replan.StrategyRecovery``).

    ``pin`` (``make_recovery`` passes ``SimPlacement.pin``) is called with the job and its region at
    every preemption and keeps the job there for its later placements, so the router does not move
    it to GPUs free elsewhere either; without it only the recovery itself keeps the job in place.
    """

    name = "stay_in_region"

    def __init__(self, pin: Callable[[SimJob, int], None] | None = None):
        self.pin = pin

    def on_preemption(
        self,
        job: SimJob,
        region: int,
        now: float,
        available: Sequence[Mapping[str, int]],
        load: Sequence[float],
        free: Sequence[Mapping[str, int]] | None = None,
    ) -> int:
        if self.pin is not None:
            self.pin(job, region)
        return region
