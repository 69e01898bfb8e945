"""How long a queued run will hold its GPUs, by the placement engine: what its latest start and
the queue's estimated starts are computed from (live and in the queue simulator).

A run with a deadline is estimated on its *fastest* on-demand offer: its latest start (Cameo) is
the last moment it can still start and finish in time, and at that moment admission sends it
on-demand with the hours left, where the engine's deadline rule takes any offer that fits,
the fastest included. Estimating it on the cheapest offer instead would make its latest start
too early, and a run whose deadline a faster on-demand offer can still meet would be refused or
failed. A run without a deadline is estimated on its best on-demand offer (the engine's choice).
Spot offers count only where no offer sells the run on-demand. A run bound to one market
(``market`` spot or on_demand) is estimated on that market alone: a spot-only run's latest start
comes from the spot offers it will run on. Capacity held by other runs is ignored: this is the
run's duration, not its wait.

The estimate leaves the launch out (the callers add one); the engine's deadline rule counts it, so
an offer the engine accepts for the hours left finishes in time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sailor_tasks.catalog import Catalog
from sailor_tasks.errors import InvalidRequestError
from sailor_tasks.model import ClusterState, JobRequest
from sailor_tasks.placement.engine import check_request, evaluate, view_for
from sailor_tasks.placement.index import CatalogIndex


@dataclass(frozen=True, slots=True)
class Estimate:
    """The engine's estimate on one offer: training hours and data-copy hours (launch excluded)."""

    market: str
    gpu_type: str
    hours: float
    data_hours: float


def estimate_hours(
    request: JobRequest, catalog: Catalog, state: ClusterState, index: CatalogIndex
) -> Estimate | None:
    """The run's estimate (see the module); None when no offer can run it.

    ``state``: the snapshot whose replicas and dataset sizes count (what it holds is dropped: its
    reservations and ``held_gpus``).
    """
    state = dataclasses.replace(state, reservations=(), held_gpus={})
    fastest = request.deadline_hours is not None
    # A run bound to one market is estimated on it; another on on-demand first, then spot.
    markets = (request.market,) if request.market in ("on_demand", "spot") else ("on_demand", "spot")
    for market in markets:
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
