"""Airflow glue: the one place in ``sailor_tasks`` that imports Airflow.

``run_stage`` calls a stage and maps SAILOR's errors onto Airflow's retry semantics: configuration
errors (bad params, no feasible offer) fail the task at once with ``AirflowFailException``;
transient errors (capacity taken, preemption, I/O) propagate so Airflow retries them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from airflow.sdk.exceptions import AirflowFailException

from sailor_tasks.errors import InvalidRequestError, NoFeasibleOfferError

R = TypeVar("R")

CONFIG_ERRORS: tuple[type[Exception], ...] = (InvalidRequestError, NoFeasibleOfferError)


def run_stage(stage: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run ``stage``; a configuration error becomes ``AirflowFailException`` (no retries).

    Google Cloud credentials come from the Airflow connection (``gcp_glue.install``)."""
    from sailor_tasks import gcp_glue

    gcp_glue.install()
    try:
        return stage(*args, **kwargs)
    except CONFIG_ERRORS as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
