"""The regions one process simulates: admission, policy re-solves, the round mechanism's grants and
the jobs' progress inside a round.

Regions only meet through routing and recovery, which stay with the round loop (``engine.py``);
everything else a region does each round is its own. A ``RegionShard`` owns some of the regions
and answers the loop's three calls: ``revoke`` (capacity changed, or was lost during the last
round: take the lost GPUs back and say which jobs lost theirs), ``plan`` (apply admissions and
departures, re-solve changed regions, grant GPUs; returns how long the round would need and which
jobs can finish in it) and ``progress`` (run the granted jobs for the round's length, each only
until its GPU type's capacity goes, when it goes inside the round; returns the GPU time and
cost). One
shard with every region is the serial simulator; shards in worker processes (``workers.py``) give
the same results.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from sailor_tasks.catalog.throughput import ThroughputTable
from sailor_tasks.errors import InfeasibleAllocationError
from sailor_tasks.placement.context import RESTART_HOURS, SECONDS_PER_HOUR
from sailor_tasks.policies import PolicyJob, PolicyState, get_policy
from sailor_tasks.policies.mechanism import RoundMechanism
from sailor_tasks.simulator.rounds.hooks import Region
from sailor_tasks.simulator.rounds.workload import SimJob, run_throughput

if TYPE_CHECKING:
    from sailor_tasks.simulator.rounds.config import SimConfig

logger = logging.getLogger(__name__)

LEAVE = -1
"""Region index of an event that takes a job out of its region (``RegionShard.plan``)."""
_NO_JOBS = np.zeros(0, dtype=np.int64)
_NO_STEPS = np.zeros(0)


MOVE_GAIN_S = RESTART_HOURS * SECONDS_PER_HOUR
"""A running job is offered free GPUs elsewhere only when it would finish at least this much
sooner there: the placement engine's planning value for getting a moved run going again."""



def unit_frees(unit_of: np.ndarray, need: np.ndarray, gpus: np.ndarray, units: int) -> np.ndarray:
    """GPUs each granted job frees when it finishes, for units that may share GPUs: a unit's GPUs
    are free once its last job finishes, credited once (to the first of its jobs that finish
    last: two identical jobs of a pair finish together).

    Args:
        unit_of: each job's unit; need: seconds each job needs to finish; gpus: each job's unit's
            GPUs; units: how many units there are.
    """
    last = np.zeros(units)
    np.maximum.at(last, unit_of, need)
    ends_last = need >= last[unit_of]
    first = np.full(units, len(need))
    np.minimum.at(first, unit_of[ends_last], np.nonzero(ends_last)[0])
    return np.where(np.arange(len(need)) == first[unit_of], gpus, 0.0)

class RegionRound(NamedTuple):
    """What a region's grants leave over in a round (``RegionShard.plan``)."""

    region: int
    free: np.ndarray
    """GPUs of each of the region's types (``region_gpu_types`` order) no grant uses."""
    waiting: np.ndarray
    """Jobs admitted here that got no GPUs this round, by job index."""
    remaining: np.ndarray
    """Their steps remaining (they travel with a job that moves)."""
    faster: np.ndarray = _NO_JOBS
    """Running jobs that would finish at least ``MOVE_GAIN_S`` sooner on GPUs free elsewhere
    (``plan``'s ``free``), by job index."""
    faster_remaining: np.ndarray = _NO_STEPS
    """Their steps remaining at the start of the round."""
    faster_rate: np.ndarray = _NO_STEPS
    """Their steps/s in the round."""


def region_gpu_types(region: Region) -> tuple[str, ...]:
    """The GPU types a region has (count > 0), sorted: the column order of its arrays."""
    return tuple(sorted(g for g, c in region.gpus.items() if c > 0))


class _RegionSim:
    """Per-region state: admitted jobs, the cached allocation's unit arrays, the mechanism."""

    def __init__(self, index: int, region: Region, gpus_per_server: int, restart_s: float = 0.0):
        self.index = index
        """The region's position in the simulation's region list."""
        self.region = region
        self.gpu_types = region_gpu_types(region)
        self.capacity = np.array([region.gpus[g] for g in self.gpu_types], dtype=np.int64)
        self.cap = self.capacity.copy()
        """GPUs usable now (below ``capacity`` while spot capacity is lost)."""
        self.price = np.array([region.usd_per_gpu_hour.get(g, 0.0) for g in self.gpu_types])
        self.priced = bool((self.price > 0).any())
        self.n_alive = 0
        """Units whose jobs are all still here."""
        self.active: set[int] = set()
        self.dirty = False
        self.mech = RoundMechanism(list(self.capacity), gpus_per_server, restart_s=restart_s)
        self.unit_jobs: list[tuple[int, ...]] = []
        self.first = np.zeros(0, dtype=np.int64)
        """The (first) job of each unit."""
        self.singles = True
        """Every unit is one job (no space sharing): the round's arrays are built without loops."""
        self.x = np.zeros((0, len(self.gpu_types)))
        self.scale = np.zeros(0)
        self.thr = np.zeros((0, len(self.gpu_types), 2))
        self.thr_unc = self.thr
        self.alive = np.zeros(0, bool)
        self.ok = np.zeros((0, len(self.gpu_types)), bool)
        """Where each unit can run (throughput > 0, enough GPUs of the type), False once one of
        its jobs left: what the mechanism may grant."""
        self.job_units: dict[int, Sequence[int]] = {}
        self.gcols = np.zeros(0, dtype=np.int64)
        self.session = None
        self.frozen: tuple | None = None
        """Last round's grants and work when they are sure to repeat (see ``RegionShard._grant``)."""
        self.ahead: tuple | None = None
        """(round start, ``_grant``'s answer) computed ahead by ``RegionShard.prepare``."""


def _granted_work(
    r: _RegionSim, grants: Sequence, units: np.ndarray, types: np.ndarray, consolidated: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(job, steps/s, unit) of every job the grants run: units on one server (or of one GPU) at
    their consolidated throughput, units spread over servers at the unconsolidated one."""
    whole = consolidated | (r.scale[units] <= 1)
    if r.singles:
        rate = np.where(whole, r.thr[units, types, 0], r.thr_unc[units, types, 0])
        return r.first[units], rate, units
    js, rates, unit_of = [], [], []
    for gr, w in zip(grants, whole.tolist(), strict=True):
        source = r.thr if w else r.thr_unc
        for k, j in enumerate(r.unit_jobs[gr.unit]):
            js.append(j)
            rates.append(source[gr.unit, gr.gpu_type, k])
            unit_of.append(gr.unit)
    return np.array(js), np.array(rates), np.array(unit_of)


class RegionShard:
    """Some of the simulated regions (``own``, indices into ``regions``) and their jobs' progress.

    Jobs are indices into ``jobs``; a job's steps remaining are kept by the shard of the region it
    is in and travel with it when recovery moves it (``plan``'s events).
    """

    def __init__(
        self,
        jobs: Sequence[SimJob],
        regions: Sequence[Region],
        own: Sequence[int],
        table: ThroughputTable,
        config: SimConfig,
    ):
        self.jobs, self.table, self.config = jobs, table, config
        self.policy = get_policy(config.policy)
        self.ids = [j.job_id for j in jobs]
        self.index = {jid: i for i, jid in enumerate(self.ids)}
        n = len(jobs)
        self.remaining = np.zeros(n)
        self.region_of = np.full(n, -1, dtype=np.int64)
        self.finished = np.zeros(n, dtype=bool)
        self.gpu_names = sorted({g for r in regions for g in region_gpu_types(r)})
        self._type_cache: dict = {}
        # Unconsolidated / consolidated throughput per job type and GPU type (1 where not measured).
        keys = sorted({j.job_type for j in jobs})
        key_index = {k: t for t, k in enumerate(keys)}
        self.type_of = np.fromiter((key_index[j.job_type] for j in jobs), dtype=np.int64, count=n)
        self.unc_ratio = np.ones((len(keys), len(self.gpu_names)))
        self.speed = np.zeros((len(keys), len(self.gpu_names)))
        """Steps/s of each job type on each GPU type as it runs there (``run_throughput``)."""
        self.key_scale = np.array([k[1] for k in keys], dtype=float)
        for t, key in enumerate(keys):
            alone, unc = self.type_thr(key)
            for gi, g in enumerate(self.gpu_names):
                self.speed[t, gi] = alone[g]
                if alone.get(g, 0) > 0:
                    self.unc_ratio[t, gi] = unc[g] / alone[g]
        self.region_cols = [
            np.array([self.gpu_names.index(g) for g in region_gpu_types(r)], dtype=np.int64) for r in regions
        ]
        # Time received restarts at every re-solve, from half a round on every type (Gavel's prior).
        self.sims = {
            ri: _RegionSim(ri, regions[ri], config.gpus_per_server, restart_s=config.round_s / 2)
            for ri in sorted(own)
        }
        for r in self.sims.values():
            r.gcols = np.array([self.gpu_names.index(g) for g in r.gpu_types], dtype=np.int64)
            r.session = (
                None
                if config.space_sharing or not hasattr(self.policy, "session")
                else self.policy.session({g: int(c) for g, c in zip(r.gpu_types, r.capacity, strict=True)})
            )
        self._base_jobs: dict[int, PolicyJob] = {}
        self._planned: list = []

    def type_thr(self, key) -> tuple[dict[str, float], dict[str, float]]:
        """Steps/s of a job type alone on each GPU type of the simulation, consolidated and not.

        A job with more workers than a server has GPUs is never consolidated: both are its
        unconsolidated throughput, so the policy allocates with the speed the job runs at (on
        Gavel's measurements an 8-GPU job spread over servers keeps ~100% of its K80 speed but
        ~46% of its V100 speed: the types where it loses least are where it should go)."""
        hit = self._type_cache.get(key)
        if hit is None:
            gps = self.config.gpus_per_server
            alone = {g: run_throughput(self.table, key, g, gps) for g in self.gpu_names}
            unc = {g: self.table.throughput(key, g, consolidated=False) or alone[g] for g in alone}
            hit = self._type_cache[key] = (alone, unc)
        return hit

    def _policy_job(self, i: int, now: float) -> PolicyJob:
        job = self.jobs[i]
        if self.policy.symmetric:
            pj = self._base_jobs.get(i)
            if pj is None:
                pj = self._base_jobs[i] = PolicyJob(
                    self.ids[i],
                    self.type_thr(job.job_type)[0],
                    job.scale_factor,
                    job.priority_weight,
                    job_type=job.job_type,
                )
            return pj
        return PolicyJob(
            self.ids[i],
            self.type_thr(job.job_type)[0],
            job.scale_factor,
            job.priority_weight,
            steps_remaining=float(self.remaining[i]),
            elapsed_s=now - job.arrival_s,
            deadline_s=(job.arrival_s + job.slo_s - now) if job.slo_s else None,
            job_type=job.job_type,
            arrival_s=job.arrival_s,
            steps_total=job.total_steps,
        )

    def _resolve(self, r: _RegionSim, now: float) -> None:
        members = sorted(r.active)
        state = PolicyState(
            jobs=tuple(self._policy_job(i, now) for i in members),
            gpus={g: int(c) for g, c in zip(r.gpu_types, r.cap, strict=True)},
            usd_per_gpu_hour=dict(zip(r.gpu_types, r.price.tolist(), strict=True)),
            space_sharing=self.config.space_sharing,
            table=self.table,
            seed=self.config.seed,
        )
        try:
            alloc = (r.session or self.policy).allocate(state)
        except InfeasibleAllocationError:
            # The jobs' SLOs cannot all hold this round (they contend for the GPUs, or one fell
            # behind its deadline's pace): as Gavel's cost policy does, allocate without them.
            with_slo = [j.job_id for j in state.jobs if j.deadline_s is not None]
            if not with_slo:
                raise
            logger.warning(
                "%s: the SLOs of %s cannot all be met at t=%.0f s; allocating without them this round",
                self.config.policy,
                ", ".join(with_slo),
                now,
            )
            jobs = tuple(dataclasses.replace(j, deadline_s=None) for j in state.jobs)
            alloc = (r.session or self.policy).allocate(dataclasses.replace(state, jobs=jobs))
        n_units, m = len(alloc.units), len(r.gpu_types)
        thr = np.zeros((n_units, m, 2))
        thr[:, :, : alloc.unit_throughput.shape[2]] = alloc.unit_throughput[:, :, :2]
        thr_unc = thr.copy()
        index = self.index
        singles = all(len(unit) == 1 for unit in alloc.units)
        if singles:
            first = np.fromiter((index[unit[0]] for unit in alloc.units), dtype=np.int64, count=n_units)
            first_l = first.tolist()
            unit_jobs = [(j,) for j in first_l]
            thr_unc[:, :, 0] *= self.unc_ratio[self.type_of[first]][:, r.gcols]
            runnable = thr[:, :, 0] > 0
            r.job_units = {j: (u,) for u, j in enumerate(first_l)}
        else:
            unit_jobs = [tuple(index[j] for j in unit) for unit in alloc.units]
            sizes = np.fromiter((len(u) for u in unit_jobs), dtype=np.int64, count=n_units)
            for k in range(2):
                has = sizes > k
                members = np.fromiter(
                    (u[k] if len(u) > k else 0 for u in unit_jobs), dtype=np.int64, count=n_units
                )
                ratio = self.unc_ratio[self.type_of[members]][:, r.gcols]
                thr_unc[:, :, k] = np.where(has[:, None], thr[:, :, k] * ratio, thr[:, :, k])
            runnable = (thr[:, :, 0] > 0) & ((sizes[:, None] < 2) | (thr[:, :, 1] > 0))
            first = np.fromiter((u[0] for u in unit_jobs), dtype=np.int64, count=n_units)
            r.job_units = {}
            for u, unit in enumerate(unit_jobs):
                for j in unit:
                    r.job_units.setdefault(j, []).append(u)
        r.unit_jobs, r.x, r.scale, r.thr, r.thr_unc = unit_jobs, alloc.matrix, alloc.unit_scale, thr, thr_unc
        r.first, r.singles = first, singles
        # The capacity check is the mechanism's own (its GPUs are this round's: a capacity
        # change re-solves the region).
        r.alive = np.ones(n_units, bool)
        r.ok = r.mech.fits(runnable, alloc.unit_scale)
        r.n_alive = n_units
        r.mech.set_units(unit_jobs, now)
        r.frozen = None
        r.dirty = False

    def _admit(self, i: int, ri: int, remaining: float) -> None:
        r = self.sims[ri]
        r.active.add(i)
        r.dirty = True
        self.region_of[i] = ri
        self.remaining[i] = remaining

    def _leave(self, i: int) -> None:
        r = self.sims[int(self.region_of[i])]
        r.active.discard(i)
        r.dirty = True
        self.region_of[i] = -1
        for u in r.job_units.get(i, ()):
            r.n_alive -= int(r.alive[u])
            r.alive[u] = False
            r.ok[u] = False

    def revoke(
        self, caps: Mapping[int, np.ndarray], cut: Mapping[int, np.ndarray] | None = None
    ) -> dict[int, list[tuple[int, float]]]:
        """Adopt new usable capacity (region → GPUs per type) for regions where it changed or was
        lost during the last round (``cut``: region → the types whose capacity fell below the
        round's inside it, which ``progress`` stopped the jobs on).

        Returns:
            region → [(job, steps remaining)] of the jobs whose GPUs were taken: capacity shrank
            (now, or during the last round), so every lease on such a type is revoked (their jobs
            stay admitted here until the loop's recovery moves them).
        """
        lost_jobs: dict[int, list[tuple[int, float]]] = {}
        for ri, cap in sorted(caps.items()):
            r = self.sims[ri]
            shrunk = cap < r.cap
            if cut is not None and ri in cut:
                shrunk = shrunk | cut[ri]
            if shrunk.any() and r.mech.leases:
                lost = [u for u, gr in r.mech.leases.items() if shrunk[gr.gpu_type]]
                r.mech.leases = {u: gr for u, gr in r.mech.leases.items() if not shrunk[gr.gpu_type]}
                # Jobs that finished (or moved) since their last grant have nothing to lose.
                lost_jobs[ri] = [
                    (j, float(self.remaining[j])) for u in lost for j in r.unit_jobs[u] if j in r.active
                ]
            r.mech.gpus = {g: int(c) for g, c in enumerate(cap)}
            r.cap = np.asarray(cap, dtype=np.int64).copy()
            r.dirty = True
            r.frozen = None
        return lost_jobs

    def prepare(self, t: float) -> None:
        """Grant GPUs ahead for the round starting at ``t`` in regions nothing has changed yet.

        Called right after ``progress`` while the loop offers free GPUs and routes the next
        arrivals; ``plan(t, ...)`` uses these grants for every region its events leave unchanged,
        so they are what ``plan`` would compute itself (the grants depend only on the region's
        state and ``t``).
        """
        for r in self.sims.values():
            r.ahead = (t, self._grant(r, t)) if r.active and not r.dirty else None

    def _grant(self, r: _RegionSim, t: float) -> tuple:
        """(grants, work, frozen) of region ``r`` (not dirty) for the round starting at ``t``:
        ``work`` is (job, steps/s, unit, seconds needed, granted units, their types) of every job
        that runs (None when nothing is granted); ``frozen`` is what ``r.frozen`` becomes. Reads
        the region's state and changes nothing."""
        if r.frozen is not None:
            # Nothing changed and every unit ran on the only type X gives it: the greedy would
            # grant the same units the same leased GPUs again, so reuse last round's grants.
            grants, (js_a, rate, unit_a, units, types) = frozen = r.frozen
        else:
            grants = r.mech.schedule(t, r.x, r.unit_jobs, r.scale, r.ok, r.x, r.singles, fits=True)
            if not grants:
                return grants, None, None
            # Grant fields: unit, gpu_type, servers, extended, consolidated.
            cols = list(zip(*grants, strict=True))
            units, types = np.array(cols[0]), np.array(cols[1])
            js_a, rate, unit_a = _granted_work(r, grants, units, types, np.array(cols[4]))
            frozen = None
            if self.config.reuse_stable_rounds and len(grants) == r.n_alive:
                support = r.x[units] > 0
                if support[np.arange(len(units)), types].all() and (support.sum(axis=1) == 1).all():
                    frozen = (grants, (js_a, rate, unit_a, units, types))
        need = self.remaining[js_a] / np.maximum(rate, 1e-12)
        return grants, (js_a, rate, unit_a, need, units, types), frozen

    def plan(
        self,
        t: float,
        events: Sequence[tuple[int, int, float]],
        free: Sequence[np.ndarray] | None = None,
        stops: Mapping[int, np.ndarray] | None = None,
    ) -> tuple[float, int, list[tuple[int, int, float, int, int]], list[RegionRound]]:
        """Apply ``events`` in order ((job, region, steps remaining) admits the job; region
        ``LEAVE`` takes it out of its region), then grant GPUs for the round starting at ``t``.
        ``free``: GPUs of each type free in every region (``region_gpu_types`` order), against
        which running jobs are checked for a faster place (``RegionRound.faster``). ``stops``:
        region → seconds into the round at which each type's capacity falls below the round's
        (inf: it does not); a job granted such a type runs only until then.

        Returns:
            how long the round must last for every granted unit (capped at the round length, and
            for each unit at its type's stop; 0 when nothing was granted); how many policy solves
            it took; the jobs that can finish within a round before their stop, [(region, job,
            seconds it needs, GPU type column, GPUs it frees)] in region order
            (``progress(round_len)`` finishes exactly those that need at most ``round_len``); and
            a ``RegionRound`` per region of this shard, in region order.
        """
        for i, ri, rem in events:
            if ri == LEAVE:
                self._leave(i)
            else:
                self._admit(i, ri, rem)
        round_s = self.config.round_s
        planned = self._planned = []
        round_len = 0.0
        solves = 0
        ending: list[tuple[int, int, float, int, int]] = []
        regions: list[RegionRound] = []
        for r in self.sims.values():
            ahead, r.ahead = r.ahead, None
            if not r.active:
                regions.append(RegionRound(r.index, r.cap.copy(), _NO_JOBS, _NO_STEPS))
                continue
            if r.dirty:
                self._resolve(r, t)
                solves += 1
                grants, work, r.frozen = self._grant(r, t)
            elif ahead is not None and ahead[0] == t:
                grants, work, r.frozen = ahead[1]
            else:
                grants, work, r.frozen = self._grant(r, t)
            regions.append(self._region_round(r, work))
            if work is None:
                planned.append((r, grants, work, None))
                continue
            js_a, need, unit_a = work[0], work[3], work[2]
            stop = stops.get(r.index) if stops else None
            unit_type = None
            if stop is None:
                planned.append((r, grants, work, None))
                round_len = max(round_len, float(min(need.max(), round_s)))
                soon = need <= round_s
            else:
                unit_type = np.zeros(len(r.unit_jobs), dtype=np.int64)
                unit_type[work[4]] = work[5]
                # Each job's stop (its type's), and each grant's (the mechanism's time received).
                job_stop = stop[unit_type[unit_a]]
                planned.append((r, grants, work, (job_stop, stop[work[5]])))
                limit = np.minimum(job_stop, round_s)
                round_len = max(round_len, float(np.minimum(need, limit).max()))
                soon = need <= limit
            if soon.any():
                ri = r.index
                if unit_type is None:
                    unit_type = np.zeros(len(r.unit_jobs), dtype=np.int64)
                    unit_type[work[4]] = work[5]
                if r.singles:
                    frees = r.scale[unit_a]
                else:
                    frees = unit_frees(unit_a, need, r.scale[unit_a], len(r.unit_jobs))
                ending += [
                    (ri, j, d, g, int(f))
                    for j, d, g, f in zip(
                        js_a[soon].tolist(),
                        need[soon].tolist(),
                        unit_type[unit_a[soon]].tolist(),
                        frees[soon].tolist(),
                        strict=True,
                    )
                ]
        if free is not None:
            faster = self._faster(planned, free)
            if faster:
                regions = [
                    rr._replace(faster=f[0], faster_remaining=f[1], faster_rate=f[2])
                    if (f := faster.get(rr.region))
                    else rr
                    for rr in regions
                ]
        return round_len, solves, ending, regions

    def _region_round(self, r: _RegionSim, work: tuple | None) -> RegionRound:
        """Free GPUs and waiting jobs of region ``r`` under this round's grants (``work``)."""
        if work is None:
            free, granted = r.cap.copy(), _NO_JOBS
        else:
            js_a, units, types = work[0], work[4], work[5]
            used = np.bincount(types, weights=r.scale[units], minlength=len(r.cap))
            free = np.maximum(r.cap - used.astype(np.int64), 0)
            granted = js_a
        if len(granted) >= len(r.active):
            return RegionRound(r.index, free, _NO_JOBS, _NO_STEPS)
        waiting = np.fromiter(r.active, dtype=np.int64, count=len(r.active))
        waiting = np.sort(waiting[~np.isin(waiting, granted)])
        return RegionRound(r.index, free, waiting, self.remaining[waiting])

    def _faster(self, planned: Sequence[tuple], offers: Sequence[np.ndarray]) -> dict[int, tuple]:
        """Region → (jobs, steps remaining, steps/s) of the jobs running there that would finish
        at least ``MOVE_GAIN_S`` sooner on a GPU type free (for their whole scale) in another
        region (``offers``: free GPUs per region, ``region_gpu_types`` order)."""
        running = [(r, work, stop) for r, _, work, stop in planned if work is not None]
        if not running:
            return {}
        free = np.zeros((len(offers), len(self.gpu_names)))
        for ri, f in enumerate(offers):
            free[ri, self.region_cols[ri]] = f
        if not free.any():
            return {}
        js = np.concatenate([work[0] for _, work, _ in running])
        rate = np.concatenate([work[1] for _, work, _ in running])
        need = np.concatenate([work[3] for _, work, _ in running])
        # A job whose capacity goes inside the round is preempted then, not moved.
        stop = np.concatenate(
            [np.full(len(work[0]), np.inf) if s is None else s[0] for _, work, s in running]
        )
        where = np.concatenate([np.full(len(work[0]), r.index) for r, work, _ in running])
        keys = self.type_of[js]
        scale = self.key_scale[keys]
        best = np.zeros(len(js))
        for s in np.unique(scale).tolist():
            room = free >= s
            # Types with room in some region other than the job's own.
            elsewhere = (room.sum(axis=0)[None, :] - room) > 0
            of = np.nonzero(scale == s)[0]
            best[of] = (self.speed[keys[of]] * elsewhere[where[of]]).max(axis=1)
        rem = self.remaining[js]
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = rem / rate - rem / best
        round_s = self.config.round_s
        pick = (rate > 0) & (best > rate) & (gain >= MOVE_GAIN_S) & (need > round_s) & (stop >= round_s)
        out: dict[int, tuple] = {}
        for ri in np.unique(where[pick]).tolist():
            sel = pick & (where == ri)
            out[ri] = (js[sel], rem[sel], rate[sel])
        return out

    def progress(self, round_len: float) -> list[tuple[int, float, float]]:
        """Run the planned round for ``round_len`` seconds (the same for every region), each job
        only until its stop (``plan``'s ``stops``) when that comes first; jobs that finish leave
        their region.

        Returns:
            per region that ran anything, in region order: (region, GPU-seconds used, USD spent).
        """
        out = []
        remaining = self.remaining
        for r, grants, work, stop in self._planned:
            if stop is None:
                ran = round_len
                r.mech.record(grants, round_len)
            else:
                ran = np.minimum(stop[0], round_len)
                r.mech.record(grants, np.minimum(stop[1], round_len))
            if work is None:
                continue
            js_a, rate, unit_a, need, units, types = work
            run_s = np.minimum(need, ran)
            finished = need <= ran
            remaining[js_a] = np.maximum(remaining[js_a] - rate * ran, 0.0)
            # A unit occupies its GPUs until its last job finishes (or the round ends).
            if r.singles:  # one job per granted unit: the grants' own order
                used, used_run, used_gpu = units, run_s, types
            else:
                unit_run = np.zeros(len(r.unit_jobs))
                np.maximum.at(unit_run, unit_a, run_s)
                unit_gpu = np.zeros(len(r.unit_jobs), dtype=np.int64)
                unit_gpu[units] = types
                used = np.unique(unit_a)
                used_run, used_gpu = unit_run[used], unit_gpu[used]
            gpu_s = r.scale[used] * used_run
            busy = float(gpu_s.sum())
            cost = float((gpu_s * r.price[used_gpu]).sum()) / 3600.0 if r.priced else 0.0
            for j in js_a[finished].tolist():
                if not self.finished[j]:
                    self.finished[j] = True
                    self._leave(j)
            out.append((r.index, busy, cost))
        self._planned = []
        return out
