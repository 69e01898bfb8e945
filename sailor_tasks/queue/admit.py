"""One admission pass: time-outs, the policy's order, and the rules that admit, hold back or fail
each waiting run. The live queue (``stages.queueing.admit_queued``) and the queue simulator
(``simulator.queue``) both run this function; they differ only in their ``Reserver``: how a run
is planned and its capacity reserved (the ledger and the placement engine live, simulated
capacity and the same engine in the simulator).

The rules, in the order a pass applies them:

1. A run past ``wait_until_s`` (``max_queue_hours``) times out. A run arriving in this pass
   (``arriving``: one that may not wait, ``max_queue_hours`` 0, and found others waiting) is
   tried in the policy's order like the others, and times out at the end of the pass if it was
   not admitted.
2. The others are ranked (``admission.rank``) and tried in that order (``admission_pass``): a run
   that does not fit holds back the runs behind it that wait for the same GPU types.
3. An urgent run (near its latest start) that its own market cannot take is tried on-demand,
   unless it asked for spot.
4. A run past its latest start that nothing can take fails then (Cameo: early, not after its
   deadline: ``DeadlineUnmeetableError``); a run no offer can take (``NoFeasibleOfferError``,
   ``InvalidRequestError``) fails at once.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sailor_tasks.errors import (
    CapacityUnavailableError,
    DeadlineUnmeetableError,
    InvalidRequestError,
    NoFeasibleOfferError,
    QueueTimeoutError,
    SailorError,
)
from sailor_tasks.queue.admission import HeldRun, QueuedRun, Ranked, admission_pass, rank

logger = logging.getLogger(__name__)


class Reserver(Protocol):
    """How a pass places a run and holds its capacity, and takes a run out of the queue."""

    def reserve(self, run: QueuedRun, market: str | None, deadline_hours: float | None) -> bool | None:
        """Plan ``run`` and reserve its capacity, admitting it in the same step.

        Args:
            market: None: the run's own choice; ``on_demand``: forced at its latest start.
            deadline_hours: hours left to its deadline (it counts from arrival), or None.

        Returns:
            True once admitted; None when the run is no longer queued (nothing reserved).

        Raises:
            CapacityUnavailableError: it does not fit now.
            NoFeasibleOfferError, InvalidRequestError: no offer can ever take it.
        """
        ...

    def end(self, run: QueuedRun, state: str, reason: str) -> bool:
        """Take ``run`` out of the queue as ``timed_out`` or ``failed`` with ``reason``; False when
        it was no longer queued (another pass settled it)."""
        ...


@dataclass
class PassResult:
    """What one pass did: run ids admitted (in order), timed out and failed, and the runs it left
    waiting (each ``ranked`` as the pass found them)."""

    admitted: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    waiting: list[QueuedRun] = field(default_factory=list)
    ranked: list[Ranked] = field(default_factory=list)


def iso(t_s: float | None) -> str:
    """A time of the admission clock (seconds since the epoch) as ISO 8601, UTC."""
    if t_s is None:
        return ""
    return dt.datetime.fromtimestamp(t_s, dt.UTC).isoformat(timespec="seconds")


def refused_on_arrival(run: QueuedRun, now_s: float, tried: bool = True) -> SailorError | None:
    """Why a run arriving now may not join the queue, or None: its latest start has already passed
    (``DeadlineUnmeetableError``), or it was just tried (``tried``: nobody waited) and did not fit
    and it may not wait at all (``max_queue_hours`` 0: ``QueueTimeoutError``). Untried, because
    others wait, such a run joins the queue for its arrival pass alone (``admit``'s ``arriving``)."""
    if run.latest_start_s is not None and run.latest_start_s < now_s:
        return DeadlineUnmeetableError(
            run.run_id,
            iso(run.deadline_s),
            iso(run.latest_start_s),
            run.expected_s / 3600.0,
            "nothing fits now either",
        )
    if tried and run.wait_until_s is not None and run.wait_until_s <= now_s:
        return QueueTimeoutError(run.run_id, 0.0, run.waiting_for)
    return None


def admit(
    queued: Sequence[QueuedRun],
    held: Sequence[HeldRun],
    capacity: Mapping[str, int],
    now_s: float,
    reserver: Reserver,
    policy: str = "las",
    team_weights: Mapping[str, float] | None = None,
    attained: Mapping[str, float] | None = None,
    arriving: Collection[str] = (),
    region_capacity: Mapping[tuple[str, str], int] | None = None,
) -> PassResult:
    """One admission pass over ``queued`` at ``now_s`` (see the module for the rules).

    ``held``, ``capacity``, ``policy``, ``team_weights``, ``attained`` and ``region_capacity``
    (GPUs per (region, type): the types a run holds back are those its regions hold) are
    ``rank``'s; ``arriving``: ids of the runs whose arrival this pass is (tried before their
    time-out).

    Raises:
        ValueError: ``policy`` is not one of ``QUEUE_POLICIES``.
    """
    out = PassResult()
    live = []

    def past_limit(run: QueuedRun) -> bool:
        return run.wait_until_s is not None and now_s >= run.wait_until_s

    def time_out(run: QueuedRun) -> None:
        hours = round(max(run.wait_until_s - run.arrival_s, 0.0) / 3600.0, 3)
        if reserver.end(run, "timed_out", str(QueueTimeoutError(run.run_id, hours, run.waiting_for))):
            out.timed_out.append(run.run_id)

    def has_a_pass(run: QueuedRun) -> bool:
        """Its arrival pass, or it may not wait at all (``max_queue_hours`` 0): whichever pass
        reads it first (another run's arrival, a teardown, a re-check, a retried ``plan``) tries
        it once before its time-out."""
        return run.run_id in arriving or (run.wait_until_s is not None and run.wait_until_s <= run.arrival_s)

    for run in queued:
        if past_limit(run) and not has_a_pass(run):
            time_out(run)
        else:
            live.append(run)
    if not live:
        return out
    by_id = {r.run_id: r for r in live}
    out.ranked = rank(live, held, capacity, now_s, policy, team_weights, attained, region_capacity)
    settled: set[str] = set()

    def fail(run: QueuedRun, reason: str) -> None:
        settled.add(run.run_id)
        if reserver.end(run, "failed", reason):
            out.failed.append(run.run_id)

    def try_admit(r: Ranked) -> bool | None:
        run = by_id[r.run_id]
        left_h = None
        if run.deadline_s is not None:  # the deadline counts from arrival, not from admission
            left_h = max((run.deadline_s - now_s) / 3600.0, 1e-6)
        try:
            try:
                admitted = reserver.reserve(run, None, left_h)
            except (CapacityUnavailableError, NoFeasibleOfferError) as own:
                if not r.urgent or run.market == "spot":
                    raise
                # At its latest start: on-demand if its own market cannot take it.
                try:
                    admitted = reserver.reserve(run, "on_demand", left_h)
                except NoFeasibleOfferError:
                    if isinstance(own, CapacityUnavailableError):
                        raise own from None  # no on-demand offer at all: its own market may free
                    raise
        except (CapacityUnavailableError, NoFeasibleOfferError) as exc:
            late = run.latest_start_s is not None and now_s >= run.latest_start_s
            if isinstance(exc, CapacityUnavailableError) and not late:
                return False
            if late:
                why = "no capacity" if isinstance(exc, CapacityUnavailableError) else "no offer meets it"
                err: Exception = DeadlineUnmeetableError(
                    run.run_id,
                    iso(run.deadline_s),
                    iso(run.latest_start_s),
                    run.expected_s / 3600.0,
                    f"{why} at its latest start ({exc})",
                )
                fail(run, str(err))
            else:
                fail(run, f"{type(exc).__name__}: {exc}")
            return None
        except InvalidRequestError as exc:
            fail(run, f"{type(exc).__name__}: {exc}")
            return None
        except Exception:
            # Anything else (its dataset's manifest unreadable, a storage error) is this run's:
            # it stays queued for the next pass, and the pass goes on with the others; one bad
            # entry must not stop every admission (nor fail the run whose plan ran the pass).
            logger.warning("queued run %s could not be tried in this pass; it waits", run.run_id, exc_info=True)
            return None
        settled.add(run.run_id)
        return True if admitted else None

    out.admitted = admission_pass(out.ranked, try_admit)
    for run in live:  # an arriving run that may not wait: it had its pass
        if run.run_id not in settled and past_limit(run):
            settled.add(run.run_id)
            time_out(run)
    out.waiting = [r for r in live if r.run_id not in settled]
    return out
