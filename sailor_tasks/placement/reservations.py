"""Plan and reserve with optimistic concurrency (ParSync / Protean): many planners, stale views,
conflicts detected at commit and resolved by re-planning on a fresh view, a bounded number of times.

The reservation is keyed by ``run_id``: an Airflow retry of ``plan`` excludes the run's own live
reservation from its view and replaces it in the same transaction, so it never holds capacity twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sailor_tasks.catalog import Catalog
from sailor_tasks.errors import CapacityUnavailableError
from sailor_tasks.ledger import Ledger
from sailor_tasks.model import ClusterState, JobRequest, Placement, Reservation, to_dict
from sailor_tasks.placement.engine import plan
from sailor_tasks.placement.index import CatalogIndex

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
"""Plan+commit attempts before giving up with CapacityUnavailableError (bounded staleness retries)."""


def ledger_state(
    ledger: Ledger,
    request: JobRequest,
    run_id: str,
    dataset_bytes: int | None = None,
    blocked_zones: frozenset[str] = frozenset(),
    checkpoint: tuple[str, int] | None = None,
) -> ClusterState:
    """A fresh snapshot from the ledger: the GPUs live reservations of other runs hold per zone
    and GPU type (the ledger's sums: ``held_gpus``), the latest assignment, the dataset's
    replicas and its size (``dataset_bytes`` when the caller read the manifest, otherwise the
    largest recorded replica), and the checkpoint a relaunch resumes from
    (``ClusterState.checkpoint``)."""
    sizes = ledger.dataset_bytes([request.dataset_uri])
    if dataset_bytes is not None:
        sizes[request.dataset_uri] = dataset_bytes
    return ClusterState(
        held_gpus=ledger.held_gpus(exclude_run_id=run_id),
        assignment=ledger.latest_assignment(),
        replicas=ledger.replicas([request.dataset_uri]),
        blocked_zones=blocked_zones,
        dataset_bytes=sizes,
        checkpoint=checkpoint,
    )


class NotQueuedError(Exception):
    """Admitting a queued run found it no longer queued (admitted by another pass, or gone)."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        super().__init__(f"run {run_id} is no longer queued")


@dataclass
class ReservedPlacement:
    placement: Placement
    attempts: int
    conflicts: list[str] = field(default_factory=list)


def plan_and_reserve(
    request: JobRequest,
    catalog: Catalog,
    ledger: Ledger,
    run_id: str,
    snapshot: Callable[[], ClusterState] | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    index: CatalogIndex | None = None,
    *,
    lease_s: float | None = None,
    admit: bool = False,
) -> ReservedPlacement:
    """Plan on a fresh snapshot and reserve in one checked transaction; on conflict, re-plan.

    ``index``: the catalog's index with the throughput table to plan with (``engine.plan``).
    ``lease_s``: the reservation's lease (default: the ledger's). ``admit``: the run is queued;
    the reservation's transaction also admits it (``Ledger.reserve_if_free``).

    Raises:
        CapacityUnavailableError: every attempt lost its capacity to another planner, or the
            capacity is held by live reservations (``history`` lists the attempts). Retryable.
        NoFeasibleOfferError, InvalidRequestError: from ``plan`` (not retried).
        NotQueuedError: ``admit`` and the run is no longer queued (nothing reserved).
    """
    take = snapshot or (lambda: ledger_state(ledger, request, run_id))
    capacity = {(o.zone, o.gpu_type): o.capacity_gpus for o in catalog.offers}
    history: list[str] = []
    for attempt in range(1, max_attempts + 1):
        try:
            placement = plan(request, catalog, take(), run_id, index=index)
        except CapacityUnavailableError as exc:
            raise CapacityUnavailableError(
                exc.region, exc.gpu_type, exc.gpus, [*history, *exc.history]
            ) from exc
        res = Reservation(
            run_id, placement.region, placement.zone, placement.gpu_type, placement.num_gpus, placement.market
        )
        extra: dict = {} if lease_s is None else {"lease_s": lease_s}
        if admit:
            extra["admit"] = to_dict(placement)
        if ledger.reserve_if_free(res, capacity.get((placement.zone, placement.gpu_type)), **extra):
            if history:
                placement = replace(
                    placement,
                    explanation=(
                        *placement.explanation,
                        f"reserved on attempt {attempt} after {len(history)} conflict(s): "
                        + "; ".join(history),
                    ),
                )
            return ReservedPlacement(placement, attempt, history)
        if admit and (ledger.queue_entry(run_id) or {}).get("state") != "queued":
            raise NotQueuedError(run_id)
        msg = (
            f"attempt {attempt}: {placement.num_gpus}x {placement.gpu_type} in {placement.zone} "
            "taken by another planner (stale view)"
        )
        logger.info("reservation conflict for %s: %s; re-planning on a fresh view", run_id, msg)
        history.append(msg)
    raise CapacityUnavailableError(request_region(request), request.gpu_type, request.num_gpus, history)


def request_region(request: JobRequest) -> str:
    if not request.regions:
        return "any region"
    return ",".join(request.regions) if len(request.regions) <= 3 else f"{len(request.regions)} regions"
