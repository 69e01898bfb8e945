"""Discrete-event, round-based simulator that drives SAILOR's policies and mechanism at scale."""

from sailor_tasks.simulator.engine import SimConfig, SimResult, simulate
from sailor_tasks.simulator.hooks import (
    AlwaysAvailable,
    AvailabilityProvider,
    AvailabilityTrace,
    LeastLoadedRouter,
    RecoveryStrategy,
    Region,
    Router,
    StayInRegion,
    TraceAvailability,
)
from sailor_tasks.simulator.workload import SimJob, generate_jobs, read_gavel_trace

__all__ = [
    "AlwaysAvailable",
    "AvailabilityProvider",
    "AvailabilityTrace",
    "LeastLoadedRouter",
    "RecoveryStrategy",
    "Region",
    "Router",
    "SimConfig",
    "SimJob",
    "SimResult",
    "StayInRegion",
    "TraceAvailability",
    "generate_jobs",
    "read_gavel_trace",
    "simulate",
]
