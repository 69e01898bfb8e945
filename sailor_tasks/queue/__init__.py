"""SAILOR's queue: which waiting run is admitted when capacity frees, by the same Gavel-style
policy objects the simulator uses (``sailor_tasks.policies``), with Kueue-style priorities and
Cameo-style latest start times for runs with a deadline. ``admit`` is the whole admission pass,
run by the live queue and the queue simulator alike."""

from sailor_tasks.queue.admission import (
    ATTAINED_WINDOW_S,
    PRIORITIES,
    QUEUE_POLICIES,
    URGENT_MARGIN_S,
    HeldRun,
    QueuedRun,
    Ranked,
    admission_pass,
    estimate_starts,
    rank,
)
from sailor_tasks.queue.admit import PassResult, Reserver, admit, refused_on_arrival
from sailor_tasks.queue.estimate import Estimate, estimate_hours

__all__ = [
    "ATTAINED_WINDOW_S",
    "PRIORITIES",
    "QUEUE_POLICIES",
    "URGENT_MARGIN_S",
    "Estimate",
    "HeldRun",
    "PassResult",
    "QueuedRun",
    "Ranked",
    "Reserver",
    "admission_pass",
    "admit",
    "estimate_hours",
    "estimate_starts",
    "rank",
    "refused_on_arrival",
]
