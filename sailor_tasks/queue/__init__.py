"""SAILOR's queue: which waiting run is admitted when capacity frees, by the same Gavel-style
policy objects the simulator uses (``sailor_tasks.policies``), with Kueue-style priorities and
Cameo-style latest start times for runs with a deadline."""

from sailor_tasks.queue.admission import (
    PRIORITIES,
    QUEUE_POLICIES,
    HeldRun,
    QueuedRun,
    Ranked,
    admission_pass,
    estimate_starts,
    rank,
)

__all__ = [
    "PRIORITIES",
    "QUEUE_POLICIES",
    "HeldRun",
    "QueuedRun",
    "Ranked",
    "admission_pass",
    "estimate_starts",
    "rank",
]
