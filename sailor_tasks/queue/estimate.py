"""How long a queued run will hold its GPUs, by the placement engine: what its latest start and
the queue's estimated starts are computed from (live and in the queue simulator).

A run with a deadline is estimated on its *fastest* on-demand offer: its latest start (Cameo) is
the last moment it can still start and finish in time, and at that moment admission sends it
on-demand with the hours left, where the engine's deadline rule takes any offer that fits,
the fastest included. Estimating it on the cheapest offer instead would make its latest start
too early, and a run whose deadline a faster on-demand offer can still meet would be refused or
failed. A run without a deadline is estimated on its best on-demand offer (the engine's choice).
Spot offers count only where no offer sells the run on-demand. Capacity held by other runs is
ignored: this is the run's duration, not its wait.

The engine's deadline rule counts training, expected preemption loss and the data copy, not the
launch before training; the queue's estimates count one launch. ``deadline_after_launch`` gives
the engine the hours left once the run has launched, so an offer it accepts finishes in time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sailor_tasks.catalog import Catalog
from sailor_tasks.errors import InvalidRequestError
from sailor_tasks.model import ClusterState, JobRequest
from sailor_tasks.placement.context import RESTART_HOURS
from sailor_tasks.placement.engine import check_request, evaluate, view_for
from sailor_tasks.placement.index import CatalogIndex


@dataclass(frozen=True, slots=True)
class Estimate:
    """The engine's estimate on one offer: training hours and data-copy hours (launch excluded)."""

    market: str
    gpu_type: str
    hours: float
    data_hours: float


MIN_DEADLINE_HOURS = 1e-6
"""The deadline given to the engine when the launch alone uses up the time left (it then accepts
no offer: ``deadline_hours`` must stay positive)."""


def deadline_after_launch(request: JobRequest, launch_h: float = RESTART_HOURS) -> JobRequest:
    """``request`` with its deadline reduced by one launch (``launch_h``), as the placement engine
    must plan it; unchanged without a deadline."""
    if request.deadline_hours is None:
        return request
    return dataclasses.replace(
        request, deadline_hours=max(request.deadline_hours - launch_h, MIN_DEADLINE_HOURS)
    )


def estimate_hours(
    request: JobRequest, catalog: Catalog, state: ClusterState, index: CatalogIndex
) -> Estimate | None:
    """The run's estimate (see the module); None when no offer can run it.

    ``state``: the snapshot whose replicas and dataset sizes count (its reservations are dropped).
    """
    state = dataclasses.replace(state, reservations=())
    fastest = request.deadline_hours is not None
    for market in ("on_demand", "spot"):
        req = dataclasses.replace(request, market=market, deadline_hours=None)
        try:
            check_request(req, catalog, index.job_types)
        except InvalidRequestError:
            return None
        ev = evaluate(req, index, state, view_for(index, state))
        if ev.order.size == 0:
            continue
        total = ev.ctx.hours + ev.ctx.data_hours
        if fastest:
            feasible = np.flatnonzero(ev.feasible & np.isfinite(total))
            if feasible.size == 0:
                continue
            i = int(feasible[np.argmin(total[feasible])])
        else:
            i = int(ev.order[0])
        return Estimate(
            market=market,
            gpu_type=index.gpu_types[ev.ctx.c.gpu[i]],
            hours=float(ev.ctx.hours[i]),
            data_hours=float(ev.ctx.data_hours[i]),
        )
    return None
