"""SAILOR's simulators: round-based (``rounds/``: Gavel-style time-sharing, policies and mechanism at
scale), the live queue's admission (``queue/``) and the spot market (``spot/``)."""

from sailor_tasks.simulator.queue import QueueJob, QueueSimConfig, QueueSimResult, mixed_queue, simulate_queue
from sailor_tasks.simulator.rounds.config import SimConfig
from sailor_tasks.simulator.rounds.engine import SimResult, simulate
from sailor_tasks.simulator.rounds.hooks import (
    AlwaysAvailable,
    AvailabilityProvider,
    LeastLoadedRouter,
    RecoveryStrategy,
    Region,
    Router,
    StayInRegion,
    TraceAvailability,
)
from sailor_tasks.simulator.rounds.replan import StrategyRecovery, make_recovery, recovery_names
from sailor_tasks.simulator.rounds.routing import ROUTERS, PlacementRouter, SimPlacement, make_router
from sailor_tasks.simulator.rounds.workload import SimJob, generate_jobs, read_gavel_trace
from sailor_tasks.traces.availability import AvailabilityTrace, load_availability_trace

__all__ = [
    "AlwaysAvailable",
    "AvailabilityProvider",
    "AvailabilityTrace",
    "LeastLoadedRouter",
    "PlacementRouter",
    "QueueJob",
    "QueueSimConfig",
    "QueueSimResult",
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
    "load_availability_trace",
    "make_recovery",
    "make_router",
    "mixed_queue",
    "read_gavel_trace",
    "recovery_names",
    "simulate",
    "simulate_queue",
]
