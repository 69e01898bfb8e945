"""``QueueAdmissionTrigger``: what a queued run's ``plan`` task defers on.

It runs in the triggerer (no worker slot is held while the run waits) and polls the run's queue
entry in the ledger. It fires once: when the entry leaves ``queued`` (admitted, timed out, failed,
left), or at ``recheck_at`` (the task resumes, runs an admission pass for time-outs and latest
starts, and defers again if still waiting). The ledger is read in a thread, so the triggerer's
event loop never blocks on the database. The ledger's URL comes from the triggerer's own settings
(``SAILOR_LEDGER_URL`` / ``SAILOR_STATE_DIR``), never from the trigger's kwargs: those are stored
in Airflow's database and shown in its UI, and the URL may hold a password.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

POLL_S = 5.0
"""Seconds between two reads of the queue entry."""
READ_ERRORS_TOLERATED = 60
"""Consecutive failed reads of the queue entry (the ledger briefly unreachable) retried at the next
poll before the trigger fails (about 5 min at ``POLL_S``)."""


@functools.lru_cache(maxsize=4)
def _ledger(url: str) -> Any:
    from sailor_tasks.ledger import Ledger

    return Ledger(url)


def read_state(run_id: str) -> str | None:
    """The run's queue state (None: no entry), from the ledger of this process's settings."""
    from sailor_tasks.settings import Settings

    entry = _ledger(Settings.from_env().ledger_url).queue_entry(run_id)
    return None if entry is None else str(entry["state"])


class QueueAdmissionTrigger(BaseTrigger):
    """Fire ``{"run_id", "state"}`` when the run's queue entry is no longer ``queued``, or
    ``{"run_id", "state": "recheck"}`` at ``recheck_at`` (ISO 8601, UTC)."""

    def __init__(self, run_id: str, recheck_at: str | None = None, poll_s: float = POLL_S):
        super().__init__()
        self.run_id, self.recheck_at, self.poll_s = run_id, recheck_at, poll_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"run_id": self.run_id, "recheck_at": self.recheck_at, "poll_s": self.poll_s},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        recheck = dt.datetime.fromisoformat(self.recheck_at) if self.recheck_at else None
        errors = 0
        while True:
            try:
                state = await asyncio.to_thread(read_state, self.run_id)
                errors = 0
            except Exception as exc:  # the ledger briefly unreachable: retried at the next poll
                errors += 1
                if errors >= READ_ERRORS_TOLERATED:
                    raise
                self.log.warning("reading the queue entry of %s failed (%s); retrying", self.run_id, exc)
                await asyncio.sleep(self.poll_s)
                continue
            if state != "queued":
                yield TriggerEvent({"run_id": self.run_id, "state": state})
                return
            if recheck is not None and dt.datetime.now(dt.UTC) >= recheck:
                yield TriggerEvent({"run_id": self.run_id, "state": "recheck"})
                return
            await asyncio.sleep(self.poll_s)
