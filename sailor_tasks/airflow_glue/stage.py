"""``run_stage``: every DAG task calls its stage through this, so every task gets the Airflow
connection's Google Cloud credentials and SAILOR's errors map onto Airflow's retry semantics.

Configuration errors (bad params, no feasible offer, an infeasible rebalance) fail the task at once
with ``AirflowFailException``; ``StageSkipped`` skips it; transient errors (capacity taken,
preemption, I/O) propagate so Airflow retries them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from sailor_tasks.errors import PERMANENT_ERRORS, StageSkipped
from sailor_tasks.model import finite

R = TypeVar("R")

USER_END_STATES = frozenset({"failed", "success", "skipped", "upstream_failed", "removed"})
"""Task states a user sets on a running or deferred task (or that marking its run sets): the
train task's ``on_kill`` (and its trigger's) then stops the run for good. A task cleared while it
runs is ``restarting``: Airflow runs it again, the run is not cancelled."""


def run_stage(stage: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run ``stage`` with the Airflow connection's credentials installed (``gcp.install``).

    Returns:
        The stage's result; a dict with NaN and infinities as None (``model.finite``): it becomes
        the task's XCom.

    Raises:
        AirflowFailException: the stage raised a configuration error (no retries).
        AirflowSkipException: the stage had nothing to do for this run (``StageSkipped``).
    """
    from sailor_tasks.airflow_glue import gcp

    gcp.install()
    try:
        result = stage(*args, **kwargs)
    except StageSkipped as exc:
        raise AirflowSkipException(str(exc)) from exc
    except PERMANENT_ERRORS as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
    # A task's return value is its XCom, stored as JSON (JSONB on PostgreSQL, which refuses NaN):
    # a diverged run's NaN loss becomes null there, as in every other JSON SAILOR writes.
    return finite(result) if isinstance(result, dict) else result
