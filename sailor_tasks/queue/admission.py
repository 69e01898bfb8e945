"""Live admission: the order in which queued runs get capacity, decided by a policy object.

Capacity is not time-shared on the live path: a run holds its GPUs from admission to teardown.
So admission asks the policy (``sailor_tasks.policies.get_policy``, the objects the simulator
allocates with) for its allocation X over every active run (the ones holding capacity and the
queued ones) and admits the queued run whose *deficit* is largest: the GPUs X gives it (for
``las``, gives its team) minus the GPUs it (its team) holds now, per GPU it needs for ``ftf``.
This is the round mechanism's "least attained service" rule (priority = X / received) without
preemption. ``fifo`` and ``edf`` are orders, not allocations: their policy objects' ``order_key``
ranks the queue directly. Ties go by the policy's own order (arrival; deadline then arrival for ``edf``); for ``las`` the team that attained less
service recently (GPU-seconds held, ``attained``) goes first, which is what makes it *least
attained service* over time and not only over the runs active now.

Before the policy come two classes, in order:

1. **urgent**: runs at or past their latest start (Cameo: deadline − expected hours − data copy −
   launch), earliest latest start first; a run that waits longer misses its deadline.
2. **priority** (``high`` > ``normal`` > ``low``), as Kueue's workload priorities: a lower class is
   admitted only when no higher-class run is waiting for the same GPUs.

``las`` weights each run by its team's weight (configuration) divided by the team's active runs,
so max-min fairness over runs becomes weighted max-min fairness over teams.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sailor_tasks.policies import PolicyJob, PolicyState, get_policy
from sailor_tasks.settings import QUEUE_POLICIES

PRIORITIES = {"low": 0, "normal": 1, "high": 2}
"""The ``priority`` param's values and their order (higher first)."""

URGENT_MARGIN_S = 300.0
"""A run is urgent this many seconds before its latest start (one admission poll to spare)."""

ATTAINED_WINDOW_S = 24 * 3600.0
"""The window of a team's attained service (GPU-seconds held) that ``las`` admission weighs: a day,
so a team that held the capacity overnight yields to the others the next morning."""

ANY = "any"


@dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run waiting for capacity, as admission sees it. Times are seconds (one clock for all)."""

    run_id: str
    team: str
    gpus: int
    throughput: Mapping[str, float]
    """Steps/s of the whole run on each GPU type it may use (0 or absent: cannot run there)."""
    arrival_s: float
    expected_s: float
    """Seconds it is expected to hold its GPUs (training, data copy and launch)."""
    priority: str = "normal"
    steps_remaining: float = 0.0
    deadline_s: float | None = None
    latest_start_s: float | None = None
    market: str = "auto"
    """The market the run asked for (``spot``: never moved to on-demand at its latest start)."""
    wait_until_s: float | None = None
    """When it stops waiting (arrival + ``max_queue_hours``); None: it waits as long as it takes."""
    waiting_for: str = ""
    """What it waits for, as its time-out message says it (e.g. ``2x T4 GPUs in us-central1``)."""
    regions: frozenset[str] = frozenset()
    """The regions it may be placed in (empty: any); its estimated start counts only their GPUs."""

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(
                f"run {self.run_id}: priority {self.priority!r} is not one of {', '.join(PRIORITIES)}"
            )

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted(g for g, v in self.throughput.items() if v > 0))


@dataclass(frozen=True, slots=True)
class HeldRun:
    """A run holding capacity (a live reservation)."""

    run_id: str
    team: str
    gpus: int
    gpu_type: str
    throughput: Mapping[str, float]
    started_s: float
    expected_end_s: float
    steps_remaining: float = 0.0
    region: str = ""
    """Where it holds its GPUs (empty: not known)."""


@dataclass(frozen=True, slots=True)
class Ranked:
    """A queued run's place: ``position`` 1 is admitted next; ``urgent`` runs are past (or near)
    their latest start; ``estimated_start_s`` None when the capacity can never hold it."""

    run_id: str
    position: int
    reason: str
    estimated_start_s: float | None
    urgent: bool = False
    blocks: tuple[tuple[str, str], ...] = field(default=())
    """The (region, GPU type) pools this run waits for (``usable_pools``; region "" when the
    ranking knew no regions: the type's GPUs everywhere): a run behind it that may take its GPUs
    from one of them waits too."""


def _weights(
    policy: str, queued: Sequence[QueuedRun], held: Sequence[HeldRun], team_weights: Mapping[str, float]
) -> dict[str, float]:
    if policy != "las":
        return {r.run_id: 1.0 for r in (*queued, *held)}
    active: dict[str, int] = {}
    for r in (*queued, *held):
        active[r.team] = active.get(r.team, 0) + 1
    return {r.run_id: float(team_weights.get(r.team, 1.0)) / active[r.team] for r in (*queued, *held)}


def policy_targets(
    policy: str,
    queued: Sequence[QueuedRun],
    held: Sequence[HeldRun],
    capacity: Mapping[str, int],
    now_s: float,
    team_weights: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """run_id → GPUs the policy's allocation X gives the run (Σ over types of X · scale factor)."""
    gpus = {g: float(c) for g, c in capacity.items() if c > 0}
    if not gpus:
        return {r.run_id: 0.0 for r in (*queued, *held)}
    weights = _weights(policy, queued, held, team_weights or {})

    def job(r: QueuedRun | HeldRun, since_s: float, deadline_s: float | None = None) -> PolicyJob:
        return PolicyJob(
            job_id=r.run_id,
            throughput={g: float(r.throughput.get(g, 0.0)) for g in gpus},
            scale_factor=max(1, r.gpus),
            priority_weight=weights[r.run_id],
            steps_remaining=max(r.steps_remaining, 1.0),
            elapsed_s=max(0.0, now_s - since_s),
            deadline_s=deadline_s,
            arrival_s=since_s,
        )

    jobs = [job(r, r.arrival_s, None if r.deadline_s is None else r.deadline_s - now_s) for r in queued]
    jobs += [job(r, r.started_s) for r in held]
    allocation = get_policy(policy).allocate(PolicyState(jobs=tuple(jobs), gpus=gpus))
    scale = {j.job_id: j.scale_factor for j in jobs}
    return {job: sum(shares.values()) * scale[job] for job, shares in allocation.shares().items()}


def _order_key(policy: str, run: QueuedRun, attained: Mapping[str, float]) -> tuple:
    """The policy's own order among runs of equal deficit: the order of ``fifo`` / ``edf`` (their
    ``order_key``), least attained team service then arrival for ``las``, arrival otherwise."""
    order_key = getattr(get_policy(policy), "order_key", None)
    if order_key is not None:
        return order_key(
            PolicyJob(
                job_id=run.run_id,
                throughput={},
                scale_factor=max(1, run.gpus),
                deadline_s=run.deadline_s,
                arrival_s=run.arrival_s,
            )
        )
    if policy == "las":
        return (attained.get(run.team, 0.0), run.arrival_s, run.run_id)
    return (run.arrival_s, run.run_id)


def rank(
    queued: Sequence[QueuedRun],
    held: Sequence[HeldRun],
    capacity: Mapping[str, int],
    now_s: float,
    policy: str = "las",
    team_weights: Mapping[str, float] | None = None,
    attained: Mapping[str, float] | None = None,
    region_capacity: Mapping[tuple[str, str], int] | None = None,
) -> list[Ranked]:
    """The admission order of ``queued``, with each run's reason and estimated start.

    ``capacity``: GPUs per type SAILOR may use; ``held``: the runs holding some of them now;
    ``attained``: team → GPU-seconds it held recently (``las`` breaks ties towards less), divided
    by the team's weight; ``region_capacity``: GPUs per (region, type), for the estimated start
    of a run limited to some regions (``estimate_starts``).

    Raises:
        ValueError: ``policy`` is not one of ``QUEUE_POLICIES`` (the message lists them).
    """
    if policy not in QUEUE_POLICIES:
        raise ValueError(f"queue policy {policy!r} is not one of {', '.join(QUEUE_POLICIES)}")
    weights = dict(team_weights or {})
    service = {team: s / weights.get(team, 1.0) for team, s in (attained or {}).items()}
    ordered = hasattr(get_policy(policy), "order_key")  # fifo, edf: an order, not an allocation LP
    targets = {} if ordered else policy_targets(policy, queued, held, capacity, now_s, weights)
    held_by_team: dict[str, float] = {}
    target_by_team: dict[str, float] = {}
    for r in held:
        held_by_team[r.team] = held_by_team.get(r.team, 0.0) + r.gpus
    for r in (*queued, *held):
        target_by_team[r.team] = target_by_team.get(r.team, 0.0) + targets.get(r.run_id, 0.0)
    held_run = {r.run_id: float(r.gpus) for r in held}

    def urgent(r: QueuedRun) -> bool:
        return r.latest_start_s is not None and now_s >= r.latest_start_s - URGENT_MARGIN_S

    def deficit(r: QueuedRun) -> float:
        if ordered:
            return 0.0
        if policy == "las":
            return target_by_team.get(r.team, 0.0) - held_by_team.get(r.team, 0.0)
        # Per run: the fraction of its GPUs the allocation gives it beyond what it holds.
        return (targets.get(r.run_id, 0.0) - held_run.get(r.run_id, 0.0)) / max(1, r.gpus)

    def key(r: QueuedRun) -> tuple:
        if urgent(r):
            return (0, r.latest_start_s, r.arrival_s, r.run_id)
        return (1, -PRIORITIES[r.priority], -round(deficit(r), 9), *_order_key(policy, r, service))

    # Each pick is the least key over the runs left (the first in ``queued`` on a tie). A pick
    # changes only the keys of its team's runs under las (what the team holds), and only ever
    # raises them: a heap whose entries are re-keyed when their team moved on gives the same order
    # in O(n log n) (other policies' keys never change: one sort).
    version: dict[str, int] = {}
    heap = [(key(r), i, 0, r) for i, r in enumerate(queued)]
    heapq.heapify(heap)
    order: list[tuple[QueuedRun, str]] = []
    while heap:
        _, i, seen, best = heapq.heappop(heap)
        if policy == "las" and seen != version.get(best.team, 0):
            heapq.heappush(heap, (key(best), i, version.get(best.team, 0), best))
            continue
        version[best.team] = version.get(best.team, 0) + 1
        order.append(
            (
                best,
                _reason(
                    policy,
                    best,
                    urgent(best),
                    deficit(best),
                    target_by_team,
                    held_by_team,
                    weights,
                    bool(order),
                ),
            )
        )
        held_by_team[best.team] = held_by_team.get(best.team, 0.0) + best.gpus
        held_run[best.run_id] = float(best.gpus)
    starts = estimate_starts([r for r, _ in order], held, capacity, now_s, region_capacity)
    return [
        Ranked(
            run_id=r.run_id,
            position=i + 1,
            reason=reason,
            estimated_start_s=starts[r.run_id],
            urgent=urgent(r),
            blocks=usable_pools(r, capacity, region_capacity),
        )
        for i, (r, reason) in enumerate(order)
    ]


def admission_pass(ranked: Sequence[Ranked], try_admit: Callable[[Ranked], bool | None]) -> list[str]:
    """Admit in ``ranked`` order: ``try_admit`` reserves the run's capacity and answers True
    (admitted), False (it does not fit now) or None (it left the queue, or could not be tried in
    this pass: no effect on others).
    A run that does not fit holds back every non-urgent run behind it that may take its GPUs from
    one of the same (region, GPU type) pools (``Ranked.blocks``; no backfill past it, so it is not
    starved by smaller runs), and so does a run held back itself, on all its pools (a later run
    must not take the GPUs an earlier one waits for, as ``estimate_starts`` counts); a run whose
    pools are all elsewhere (other regions, other types) is tried. Urgent runs are always tried.
    Returns the admitted run ids, in order."""
    blocked: set[str] = set()
    admitted = []
    for r in ranked:
        if blocked & set(r.blocks) and not r.urgent:
            blocked |= set(r.blocks)
            continue
        outcome = try_admit(r)
        if outcome:
            admitted.append(r.run_id)
        elif outcome is False:
            blocked |= set(r.blocks)
    return admitted


def _reason(
    policy: str,
    run: QueuedRun,
    is_urgent: bool,
    deficit: float,
    target_by_team: Mapping[str, float],
    held_by_team: Mapping[str, float],
    weights: Mapping[str, float],
    behind: bool = False,
) -> str:
    """Why the run has its place; ``behind``: runs are ahead of it (what its team holds then
    counts them as admitted)."""
    if is_urgent:
        return "urgent: at its latest start for the deadline (Cameo), admitted before the policy's order"
    head = f"priority {run.priority}; " if run.priority != "normal" else ""
    if policy == "las":
        holds = "would hold" if behind else "holds"
        then = " once the runs ahead are admitted" if behind else ""
        return (
            f"{head}las: team {run.team} (weight {weights.get(run.team, 1.0):g}) {holds} "
            f"{held_by_team.get(run.team, 0.0):g} GPUs{then}, against its max-min fair share "
            f"{target_by_team.get(run.team, 0.0):.2f}"
        )
    if policy == "edf":
        if run.deadline_s is None:
            return f"{head}edf: no deadline, after every run with one, then by arrival"
        return f"{head}edf: by deadline"
    if policy == "ftf":
        return f"{head}ftf: finish-time fairness gives it {deficit:.0%} of its GPUs beyond what it holds"
    return f"{head}fifo: by arrival"


def usable_types(
    run: QueuedRun, capacity: Mapping[str, int], region_capacity: Mapping[tuple[str, str], int] | None = None
) -> tuple[str, ...]:
    """The GPU types ``run`` can take its GPUs from: those it runs on (every type of ``capacity``
    when its throughput names none) that hold its GPUs, with ``region_capacity`` in one region it
    may use (``QueuedRun.regions``). A type only other regions hold is not one it waits for."""
    types = sorted(frozenset(run.gpu_types) or frozenset(capacity))
    if region_capacity is None:
        return tuple(g for g in types if int(capacity.get(g, 0)) >= run.gpus)
    return tuple(
        g
        for g in types
        if any(
            t == g and n >= run.gpus and (not run.regions or r in run.regions)
            for (r, t), n in region_capacity.items()
        )
    )


def usable_pools(
    run: QueuedRun, capacity: Mapping[str, int], region_capacity: Mapping[tuple[str, str], int] | None = None
) -> tuple[tuple[str, str], ...]:
    """The (region, GPU type) pools ``run`` can take all its GPUs from: those of ``region_capacity``
    in a region it may use (``QueuedRun.regions``) of a type it runs on, big enough for it; without
    ``region_capacity``, ("", type) for each of ``usable_types`` (a type's GPUs, every region's)."""
    types = usable_types(run, capacity, region_capacity)
    if region_capacity is None:
        return tuple(("", g) for g in types)
    return tuple(
        (r, g)
        for (r, g), n in sorted(region_capacity.items())
        if g in types and n >= run.gpus and (not run.regions or r in run.regions)
    )


def estimate_starts(
    order: Sequence[QueuedRun],
    held: Sequence[HeldRun],
    capacity: Mapping[str, int],
    now_s: float,
    region_capacity: Mapping[tuple[str, str], int] | None = None,
) -> dict[str, float | None]:
    """Start time of each run in ``order`` if they were admitted in that order as the held runs
    end at their expected ends (list scheduling), as ``admission_pass`` admits: no run starts
    before an earlier run that may take its GPUs from one of its pools (no backfill past it).

    The GPUs are simulated per type, or per (region, type) with ``region_capacity`` (GPUs per
    (region, type)); a run takes all its GPUs from one of the pools it may use (its types, and
    its regions, ``QueuedRun.regions``), the first to have them free. None: no pool it may use
    ever holds that many GPUs.
    """
    # pool (region or None, type) → [free GPUs, heap of (end, gpus) of the runs holding it]
    pools: dict[tuple[str | None, str], list] = {}

    def cap_of(cell: tuple[str | None, str]) -> int:
        region, g = cell
        if region is None:
            return int(capacity.get(g, 0))
        assert region_capacity is not None
        return int(region_capacity.get((region, g), 0))

    def pool(cell: tuple[str | None, str]) -> list:
        if cell not in pools:
            pools[cell] = [float(cap_of(cell)), []]
        return pools[cell]

    for h in held:
        cell = (h.region if region_capacity is not None else None, h.gpu_type)
        state = pool(cell)
        state[0] -= h.gpus
        heapq.heappush(state[1], (max(h.expected_end_s, now_s), h.gpus))

    def first_free(cell: tuple[str | None, str], gpus: int, after: float) -> float:
        """When ``gpus`` GPUs of the pool are free, at ``after`` or later."""
        free, ends = pool(cell)
        for end, n in sorted(ends):
            if free >= gpus:
                break
            free += n
            after = max(after, end)
        return after if free >= gpus else math.inf

    starts: dict[str, float | None] = {}
    pool_clock: dict[tuple[str | None, str], float] = {}
    for run in order:
        cells: list[tuple[str | None, str]] = [
            (r if region_capacity is not None else None, g)
            for r, g in usable_pools(run, capacity, region_capacity)
        ]
        if not cells:
            starts[run.run_id] = None
            continue
        earliest = max([now_s, *(pool_clock.get(c, now_s) for c in cells)])
        start, cell = min((first_free(c, run.gpus, earliest), c) for c in cells)
        for c in cells:  # no run behind it that may use these pools starts before it
            pool_clock[c] = start
        if not math.isfinite(start):
            starts[run.run_id] = None
            continue
        state = pool(cell)
        while state[1] and state[1][0][0] <= start:  # what ended by its start is free again
            state[0] += heapq.heappop(state[1])[1]
        state[0] -= run.gpus
        heapq.heappush(state[1], (start + max(run.expected_s, 0.0), run.gpus))
        starts[run.run_id] = start
    return starts
