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

R = TypeVar("R")


def run_stage(stage: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run ``stage`` with the Airflow connection's credentials installed (``gcp.install``).

    Raises:
        AirflowFailException: the stage raised a configuration error (no retries).
        AirflowSkipException: the stage had nothing to do for this run (``StageSkipped``).
    """
    from sailor_tasks.airflow_glue import gcp

    gcp.install()
    try:
        return stage(*args, **kwargs)
    except StageSkipped as exc:
        raise AirflowSkipException(str(exc)) from exc
    except PERMANENT_ERRORS as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
