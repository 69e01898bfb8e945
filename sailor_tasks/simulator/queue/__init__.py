"""The queue simulator: runs admitted by the live admission pass (``sailor_tasks.queue.admit``)
on simulated spot and on-demand capacity, placed by the placement engine, non-preemptive."""

from sailor_tasks.simulator.queue.capacity import SimCapacity, catalog_prices
from sailor_tasks.simulator.queue.engine import QueueSimConfig, QueueSimResult, RunOutcome, simulate_queue
from sailor_tasks.simulator.queue.workload import QueueJob, from_trace, mixed_queue

__all__ = [
    "QueueJob",
    "QueueSimConfig",
    "QueueSimResult",
    "RunOutcome",
    "SimCapacity",
    "catalog_prices",
    "from_trace",
    "mixed_queue",
    "simulate_queue",
]
