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
from sailor_tasks.simulator.recovery import StrategyRecovery, make_recovery, recovery_names
from sailor_tasks.simulator.routing import ROUTERS, PlacementRouter, SimPlacement, make_router
from sailor_tasks.simulator.workload import SimJob, generate_jobs, read_gavel_trace

__all__ = [
    "AlwaysAvailable",
    "AvailabilityProvider",
    "AvailabilityTrace",
    "LeastLoadedRouter",
    "PlacementRouter",
    "ROUTERS",
    "RecoveryStrategy",
    "Region",
    "Router",
    "SimConfig",
    "SimJob",
    "SimPlacement",
    "SimResult",
    "StayInRegion",
    "StrategyRecovery",
    "TraceAvailability",
    "generate_jobs",
    "make_recovery",
    "make_router",
    "read_gavel_trace",
    "recovery_names",
    "simulate",
]
