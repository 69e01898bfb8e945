"""Gavel's round-based mechanism: turn the time fractions X into GPU assignments, round by round.

Each round, every (unit, GPU type) gets priority X[u, m] / f[u, m], where f[u, m] is the fraction
of its time so far that the unit spent on type m (never scheduled there: infinite priority); the
simulator counts that time from the last re-solve (``RoundMechanism.restart_s``). Units are
granted in priority order (equal priorities by a tie-break, then by type in an order that starts
one type further every round) while their job(s) are not yet placed this round and ``scale``
GPUs of the type are free; leftover GPUs go to runnable units with zero priority (work
conservation), and a unit left out only because each type's free GPUs were too few for it gets a
type once a granted unit can move to another type of its allocation (``_fill_fragments``). A unit
that keeps its GPU type keeps its GPUs (lease extension). Placement on servers is consolidated
(all GPUs on one server, best fit) when possible, spread otherwise. Over rounds the realised time
fractions converge to X (Gavel, OSDI'20, §5).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

GPUS_PER_SERVER = 4
"""GPUs per server of each type (Gavel's simulated cluster uses 4-GPU servers)."""


class Grant(NamedTuple):
    """One unit's GPUs for a round (a named tuple: the simulator makes millions of them)."""

    unit: int
    gpu_type: int
    servers: tuple[tuple[int, int], ...]
    """(server index, GPUs on it)."""
    extended: bool
    """The unit ran on the same GPUs last round (lease extension: no restart)."""
    consolidated: bool
    """All its GPUs are on one server."""


def priorities(x: np.ndarray, received_s: np.ndarray, age_s: np.ndarray) -> np.ndarray:
    """X / (fraction of time received on each type); inf where X > 0 and nothing received yet."""
    frac = received_s / np.maximum(age_s, 1e-9)[:, None]
    return np.divide(x, frac, out=np.where(x > 0, np.inf, 0.0), where=frac > 0)


def pick_units(
    prio: np.ndarray,
    runnable: np.ndarray,
    unit_jobs: Sequence[tuple[int, ...]],
    scale: np.ndarray,
    free: np.ndarray,
    tiebreak: np.ndarray | None = None,
    singles: bool | None = None,
    first_type: int = 0,
) -> list[tuple[int, int]]:
    """Greedy grant in priority order: [(unit, GPU type)], each job at most once, capacity respected.

    Args:
        prio: (units × types) priorities; entries where ``runnable`` is False are never granted.
        unit_jobs: job indices of each unit (one, or two when space-sharing).
        scale: GPUs each unit needs; ``free``: free GPUs per type (not modified).
        tiebreak: (units × types) secondary key, larger first (e.g. throughput) for equal priority.
        singles: every unit is one job (None: look).
        first_type: where entries equal on both keys start among the types (modulo their number,
            then in index order, wrapping around); within a type, lower unit indices first.
    """
    n_units, m = prio.shape
    if n_units == 0:
        return []
    masked = np.where(runnable, prio, -1.0)
    # Equal keys sort in column order: the columns start at ``first_type``.
    cols = np.roll(np.arange(m), -first_type) if m and first_type % m else None
    if cols is not None:
        masked = masked[:, cols]
        tiebreak = None if tiebreak is None else tiebreak[:, cols]
    flat = masked.ravel()
    keys = (-flat,) if tiebreak is None else (-tiebreak.ravel(), -flat)
    # Priorities are >= 0, so the entries that are not runnable (-1) sort last.
    order = np.lexsort(keys)[: np.count_nonzero(runnable)]
    # Plain Python lists: this loop runs every round for every cluster, on small arrays.
    units_o, types_o = np.divmod(order, m)
    if cols is not None:
        types_o = cols[types_o]
    free_l = np.asarray(free, dtype=float).tolist()
    scale_l = scale.tolist()
    min_scale = min(scale_l)
    open_types = sum(1 for f in free_l if f >= min_scale)
    granted: list[tuple[int, int]] = []
    if singles if singles is not None else all(len(jobs) == 1 for jobs in unit_jobs):
        # One job per unit (no space sharing): "job placed" is "unit placed".
        done = bytearray(n_units)
        left = int(np.count_nonzero(runnable.any(axis=1)))  # units that could still be placed
        for u, g, s in zip(units_o.tolist(), types_o.tolist(), scale[units_o].tolist(), strict=True):
            if done[u] or free_l[g] < s:
                continue
            done[u] = 1
            before = free_l[g]
            free_l[g] = before - s
            granted.append((u, g))
            left -= 1
            if left == 0:
                break
            if before >= min_scale > free_l[g]:
                open_types -= 1
                if open_types == 0:
                    break
        if left and any(f > 0 for f in free_l):
            _fill_fragments(prio, runnable, scale_l, free_l, done, granted)
        return granted
    placed: set[int] = set()
    for u, g in zip(units_o.tolist(), types_o.tolist(), strict=True):
        s = scale_l[u]
        if free_l[g] < s:
            continue
        jobs = unit_jobs[u]
        if jobs[0] in placed or (len(jobs) > 1 and any(j in placed for j in jobs)):
            continue
        placed.update(jobs)
        before = free_l[g]
        free_l[g] = before - s
        granted.append((u, g))
        if before >= min_scale > free_l[g]:
            open_types -= 1
            if open_types == 0:
                break
    return granted


def _fill_fragments(
    prio: np.ndarray,
    runnable: np.ndarray,
    scale_l: list[float],
    free_l: list[float],
    done: bytearray,
    granted: list[tuple[int, int]],
) -> None:
    """Place units the greedy left out because the free GPUs of each type were too few for them
    (fragments), by moving a granted unit to another type its allocation gives it time on.

    For each unplaced unit u (highest priority first) and each type g it can run on: when a
    granted unit v on g with at least the missing GPUs can move to a type h with X[v, h] > 0
    (priority > 0) and room for it, v moves to h and u takes g. Nobody granted loses its round
    and GPUs in use grow by u's scale; with one job per unit only (``granted`` updated in place).
    """
    n_units, m = prio.shape
    on_type: list[list[int]] = [[] for _ in range(m)]
    for k, (_, g) in enumerate(granted):
        on_type[g].append(k)
    waiting = [u for u in range(n_units) if not done[u] and runnable[u].any()]
    waiting.sort(key=lambda u: -float(np.max(np.where(runnable[u], prio[u], -1.0))))
    for u in waiting:
        su = scale_l[u]
        for g in sorted(np.nonzero(runnable[u])[0].tolist(), key=lambda g: -prio[u, g]):
            missing = su - free_l[g]
            if missing <= 0:  # room after an earlier move
                best = None
            else:
                best = None
                for k in on_type[g]:
                    v = granted[k][0]
                    sv = scale_l[v]
                    if sv < missing or (best is not None and sv >= best[0]):
                        continue
                    for h in range(m):
                        if h != g and runnable[v, h] and prio[v, h] > 0 and free_l[h] >= sv:
                            best = (sv, k, h)
                            break
                if best is None:
                    continue
                sv, k, h = best
                v = granted[k][0]
                granted[k] = (v, h)
                on_type[g].remove(k)
                on_type[h].append(k)
                free_l[h] -= sv
                free_l[g] += sv
            done[u] = 1
            free_l[g] -= su
            on_type[g].append(len(granted))
            granted.append((u, g))
            break


class ServerPool:
    """Free GPUs per server of each type; consolidated best-fit placement, spread otherwise."""

    def __init__(
        self,
        gpus: Mapping[int, int],
        gpus_per_server: int = GPUS_PER_SERVER,
        template: Mapping[int, list[int]] | None = None,
    ):
        """``template``: the free lists of these ``gpus`` (``ServerPool.empty``), copied."""
        self.per_server = gpus_per_server
        if template is None:
            template = self.empty(gpus, gpus_per_server)
        self.free: dict[int, list[int]] = {g: free.copy() for g, free in template.items()}

    @staticmethod
    def empty(gpus: Mapping[int, int], gpus_per_server: int = GPUS_PER_SERVER) -> dict[int, list[int]]:
        """Free GPUs per server of each type when nothing is placed."""
        out = {}
        for g, count in gpus.items():
            full, rest = divmod(int(count), gpus_per_server)
            out[g] = [gpus_per_server] * full + ([rest] if rest else [])
        return out

    def place(self, g: int, need: int) -> tuple[tuple[int, int], ...] | None:
        """Reserve ``need`` GPUs of type ``g``: one server when any fits (best fit), else spread."""
        free = self.free[g]
        best, best_free = -1, 1 << 62
        for srv, f in enumerate(free):
            if need <= f < best_free:
                best, best_free = srv, f
                if f == need:  # an exact fit: no later server fits better
                    break
        if best >= 0:
            free[best] -= need
            return ((best, need),)
        if sum(free) < need:
            return None
        out = []
        for srv in sorted(range(len(free)), key=lambda i: -free[i]):
            n = min(free[srv], need)
            if n <= 0:
                break
            free[srv] -= n
            out.append((srv, n))
            need -= n
            if need == 0:
                break
        return tuple(out)


def assign_round(
    picked: Sequence[tuple[int, int]],
    scale: np.ndarray,
    gpus: Mapping[int, int],
    previous: Mapping[int, Grant],
    gpus_per_server: int = GPUS_PER_SERVER,
    template: Mapping[int, list[int]] | None = None,
) -> list[Grant]:
    """Place the picked (unit, type) pairs on servers; units keeping their type keep their GPUs.

    A lease spread over servers is placed afresh (consolidated when a server has room now), and
    when the units new this round leave a multi-GPU unit spread that fits on a server, the type is
    repacked larger units first (``_repack``): a spread unit runs at its unconsolidated
    throughput (up to 9x slower in Gavel's measurements), so keeping small leases where they are
    costs more than moving them.

    Args:
        previous: unit → its grant of last round, extended (units indexed as in ``picked``; the
            grant's own ``unit`` may be the unit's index before a re-solve).
        template: ``ServerPool.empty(gpus, gpus_per_server)``, when the caller keeps it.
    """
    pool = ServerPool(gpus, gpus_per_server, template)
    grants: list[Grant] = []
    fresh = []
    for u, g in picked:
        prev = previous.get(u)
        if prev is not None and prev.gpu_type == g and (prev.consolidated or scale[u] > gpus_per_server):
            free = pool.free[g]
            for srv, n in prev.servers:
                free[srv] -= n
            grants.append(prev if prev.unit == u else Grant(u, g, prev.servers, True, prev.consolidated))
        else:
            fresh.append((u, g))
    if not fresh:
        return grants
    # Larger units first: they are the hardest to consolidate.
    scale_l = scale.tolist()
    if len(fresh) > 1:
        fresh.sort(key=lambda ug: -scale_l[ug[0]])
    spread: set[int] = set()
    for u, g in fresh:
        servers = pool.place(g, int(scale_l[u]))
        if servers is not None:
            grants.append(Grant(u, g, servers, False, len(servers) == 1))
            if len(servers) > 1 and scale_l[u] <= gpus_per_server:
                spread.add(g)
    for g in sorted(spread):
        grants = _repack(grants, g, scale_l, previous, gpus, gpus_per_server, template)
    return grants


def _repack(
    grants: list[Grant],
    g: int,
    scale_l: list[float],
    previous: Mapping[int, Grant],
    gpus: Mapping[int, int],
    gpus_per_server: int,
    template: Mapping[int, list[int]] | None,
) -> list[Grant]:
    """Place type ``g``'s units again, larger first (best fit; a lease keeps its servers when they
    are still free at its turn); keep the new placement when it consolidates more GPUs."""
    mine = [gr for gr in grants if gr.gpu_type == g]
    pool = ServerPool({g: gpus[g]}, gpus_per_server, None if template is None else {g: template[g]})
    free = pool.free[g]
    # Larger first; among equals, leases first (they may keep their servers), then by unit.
    order = sorted(mine, key=lambda gr: (-scale_l[gr.unit], previous.get(gr.unit) is None, gr.unit))
    placed = []
    for gr in order:
        need = int(scale_l[gr.unit])
        prev = previous.get(gr.unit)
        if prev is not None and prev.gpu_type == g and all(free[srv] >= n for srv, n in prev.servers):
            for srv, n in prev.servers:
                free[srv] -= n
            placed.append(Grant(gr.unit, g, prev.servers, True, prev.consolidated))
            continue
        servers = pool.place(g, need)
        if servers is None:  # cannot happen: the same GPUs hold the same units
            return grants
        placed.append(Grant(gr.unit, g, servers, False, len(servers) == 1))

    def consolidated_gpus(gs: Sequence[Grant]) -> float:
        return sum(scale_l[gr.unit] for gr in gs if gr.consolidated and scale_l[gr.unit] > 1)

    if consolidated_gpus(placed) <= consolidated_gpus(mine):
        return grants
    return [gr for gr in grants if gr.gpu_type != g] + placed


class RoundMechanism:
    """Stateful driver for one cluster: time received per unit and type, leases, grants per round.

    Arrays are aligned with the current units; ``set_units`` re-aligns them after a new allocation,
    keyed by a hashable unit key (e.g. the tuple of job ids), so leases survive re-solves, and so
    does the time received unless ``restart_s`` > 0.

    ``restart_s`` > 0: a new allocation restarts every unit's time received, as if it had received
    ``restart_s`` seconds on every type over the last ``restart_s`` seconds (so the first priorities
    are X itself). Priorities then measure how far each unit is behind the allocation in force,
    not behind a mix of the allocations since it arrived (time received under an earlier X says
    nothing about the share the current X gives it).
    """

    def __init__(self, gpus: Sequence[int], gpus_per_server: int = GPUS_PER_SERVER, restart_s: float = 0.0):
        self.gpus_per_server = gpus_per_server
        self.restart_s = float(restart_s)
        self.gpus = {g: int(c) for g, c in enumerate(gpus)}
        self.keys: list[object] = []
        self.rows = np.zeros(0, dtype=np.int64)
        self.rounds = 0
        """Rounds recorded. Units equal in priority and tie-break take types in an order that
        starts one type further each round: a fixed order (type 0 first) fills the same type first
        and leaves the idle GPUs of every round that cannot fill the cluster on the same other
        type; when X spreads jobs evenly over types (``las_agnostic``), that is always the same
        type, and the jobs that must run every round land on type 0 for most of their time."""
        self.leases: dict[int, Grant] = {}
        """Unit → its last grant as an extension (``extended`` True) the next round may repeat."""
        # History of every unit ever seen, one row per key (rows are never reused).
        self._row_of: dict[object, int] = {}
        self._received = np.zeros((64, len(self.gpus)))
        self._since = np.zeros(64)
        # The current units' rows of the history, updated in place every round and written back
        # when the units change.
        self._recv_now = np.zeros((0, len(self.gpus)))
        self._since_now = np.zeros(0)

    @property
    def gpus(self) -> dict[int, int]:
        """GPUs of each type (type index → count); assign a new dict when capacity changes."""
        return self._gpus

    @gpus.setter
    def gpus(self, gpus: Mapping[int, int]) -> None:
        self._gpus = dict(gpus)
        self._cap = np.array([float(self._gpus[g]) for g in range(len(self._gpus))])
        self._empty_pool = ServerPool.empty(self._gpus, self.gpus_per_server)

    @property
    def received(self) -> np.ndarray:
        """Seconds each current unit spent on each type (units × types)."""
        return self._recv_now.copy()

    @property
    def since(self) -> np.ndarray:
        return self._since_now.copy()

    def set_units(self, keys: Sequence[object], now: float) -> None:
        """Adopt a new unit list; units seen before keep their lease, and their history unless
        ``restart_s`` > 0."""
        lease_by_key = {self.keys[u]: lease for u, lease in self.leases.items()}
        self._received[self.rows] = self._recv_now
        rows = np.empty(len(keys), dtype=np.int64)
        for u, k in enumerate(keys):
            row = self._row_of.get(k)
            if row is None:
                row = self._row_of[k] = len(self._row_of)
                if row >= len(self._since):
                    self._received = np.concatenate([self._received, np.zeros_like(self._received)])
                    self._since = np.concatenate([self._since, np.zeros_like(self._since)])
                self._since[row] = now
            rows[u] = row
        if self.restart_s > 0:
            self._received[rows] = self.restart_s
            self._since[rows] = now - self.restart_s
        self.keys, self.rows = list(keys), rows
        self._recv_now, self._since_now = self._received[rows], self._since[rows]
        self.leases = {u: lease_by_key[k] for u, k in enumerate(keys) if k in lease_by_key}

    def schedule(
        self,
        now: float,
        x: np.ndarray,
        unit_jobs: Sequence[tuple[int, ...]],
        scale: np.ndarray,
        runnable: np.ndarray,
        tiebreak: np.ndarray | None = None,
        singles: bool | None = None,
        fits: bool = False,
    ) -> list[Grant]:
        """Grants for the round starting at ``now`` (unit indices as in ``set_units``;
        ``singles``: every unit is one job; ``fits``: ``runnable`` is already False wherever a
        unit needs more GPUs than the type has, see ``fits``)."""
        prio = priorities(x, self._recv_now, now - self._since_now)
        cap = self._cap
        ok = runnable if fits else self.fits(runnable, scale)
        # Ties start one type further every round: a fixed order would always fill the same
        # type first and leave the same one with the idle GPUs (``rounds``).
        picked = pick_units(prio, ok, unit_jobs, scale, cap, tiebreak, singles, self.rounds)
        return assign_round(picked, scale, self._gpus, self.leases, self.gpus_per_server, self._empty_pool)

    def fits(self, runnable: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """``runnable`` where the type has at least the unit's ``scale`` GPUs (False elsewhere)."""
        return runnable & (self._cap[None, :] >= scale[:, None])

    def record(self, grants: Sequence[Grant], seconds: float | np.ndarray) -> None:
        """Account a finished round: time received (``seconds``: the same for every grant, or one
        per grant), and the leases the next round may extend."""
        self.rounds += 1
        self.leases = {
            gr.unit: gr if gr.extended else Grant(gr.unit, gr.gpu_type, gr.servers, True, gr.consolidated)
            for gr in grants
        }
        if grants:
            m = self._recv_now.shape[1]
            flat = self._recv_now.reshape(-1)  # a view: the array is C-contiguous
            flat[[gr.unit * m + gr.gpu_type for gr in grants]] += seconds  # a unit is granted once a round

    def drop_leases(self) -> int:
        """Forget every lease (the GPUs were taken away, e.g. a spot preemption); returns how many."""
        n = len(self.leases)
        self.leases = {}
        return n

    def realised_fractions(self, now: float) -> np.ndarray:
        """Fraction of its time so far each unit spent on each type (compare with X)."""
        return self.received / np.maximum(now - self.since, 1e-9)[:, None]
