"""Preemption recovery in the simulator through the product's strategies registry and placement engine.

``StrategyRecovery`` is the simulator's ``RecoveryStrategy`` over ``sailor_tasks.strategies``: a
preempted job's history becomes a ``RecoveryContext`` (the placement it lost, every earlier
preemption), ``get_strategy(name).next_constraint(ctx)`` answers with a ``PlacementConstraint``,
and the job is re-planned by the same placement engine as at arrival (``routing.SimPlacement``)
with the constraint's blocked zones and regions, its market, and the GPUs usable right now.
This is what the ``sailor_train`` DAG does on a real preemption (``sailor_tasks.stages.attempts``).

    preempted in region-0 → next_constraint → blocked zones/regions + market → plan → region-k

The plan looks first at the GPUs free now (as the DAG's plan sees the GPUs other runs hold), then,
when no region has room, at the capacity usable now, where the job queues. The constraint stays
with the job (``SimPlacement.constraints``) for its later placements. When nothing is feasible
(every region blocked or without usable capacity), the job stays where it is and waits for
capacity (counted in ``waits``); the DAG would instead fail the run once its retries are spent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sailor_tasks.simulator.rounds.hooks import RecoveryStrategy, StayInRegion
from sailor_tasks.simulator.rounds.routing import SimPlacement
from sailor_tasks.simulator.rounds.workload import SimJob
from sailor_tasks.strategies import PreemptionRecord, RecoveryContext, get_strategy, strategy_names

BASELINE_RECOVERY = "stay_in_region"


class StrategyRecovery:
    """Adapter: a registry strategy decides the constraint, the placement engine the region."""

    def __init__(self, name: str, sim: SimPlacement):
        self.strategy = get_strategy(name)  # unknown names fail here, listing the valid ones
        self.name = name
        self.sim = sim
        self.history: dict[str, list[PreemptionRecord]] = {}
        self.waits = 0
        """Preemptions after which no region was feasible: the job waited where it was."""

    def on_preemption(
        self,
        job: SimJob,
        region: int,
        now: float,
        available: Sequence[Mapping[str, int]],
        load: Sequence[float],
        free: Sequence[Mapping[str, int]] | None = None,
    ) -> int:
        current = self.sim.current(job, region)
        history = self.history.setdefault(job.job_id, [])
        # A round-boundary capacity loss is a reclaim the simulator sees coming (noticed).
        history.append(
            PreemptionRecord(len(history) + 1, current.region, current.zone, True, market=current.market)
        )
        ctx = RecoveryContext(
            request=self.sim.request(job),
            current=current,
            history=tuple(history),
            zones_by_region=self.sim.zones_by_region,
        )
        constraint = self.strategy.next_constraint(ctx)
        blocked = constraint.all_blocked_zones(self.sim.zones_by_region)
        placement = None
        if constraint.prefer_zone is not None and constraint.prefer_zone not in blocked:
            # The zone the strategy retries first, when it takes the job now (as live recovery).
            others = frozenset(
                z for zs in self.sim.zones_by_region.values() for z in zs if z != constraint.prefer_zone
            )
            self.sim.constraints[job.job_id] = (others, constraint.market)
            placement = self.sim.place_now(job, load, free) if free is not None else None
            if placement is None:
                placement = self.sim.place(job, load, available, others, constraint.market, count_error=False)
        self.sim.constraints[job.job_id] = (blocked, constraint.market)
        if placement is None:
            placement = self.sim.place_now(job, load, free) if free is not None else None
        if placement is None:
            placement = self.sim.place(job, load, available, blocked, constraint.market)
        if placement is None:
            self.waits += 1
            return region
        return self.sim.region_index[placement.region]


def recovery_names() -> tuple[str, ...]:
    """Valid ``--recovery`` names: the strategies registry's, plus the ``stay_in_region`` baseline."""
    return (*strategy_names(), BASELINE_RECOVERY)


def make_recovery(name: str, sim: SimPlacement) -> RecoveryStrategy:
    """The recovery called ``name``.

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    if name == BASELINE_RECOVERY:
        return StayInRegion(pin=sim.pin)
    if name not in strategy_names():
        raise ValueError(
            f"recovery={name!r} is not a recovery strategy; valid: {', '.join(recovery_names())}"
        )
    return StrategyRecovery(name, sim)
