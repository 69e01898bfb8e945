"""Every ``sailor_train`` stage in this process, as the DAG runs them (for tests and benchmarks)."""

from __future__ import annotations

from typing import Any

from sailor_tasks import stages
from sailor_tasks.errors import PreemptedError
from sailor_tasks.stages.context import StageContext

JSON = dict[str, Any]


def run_inline(params: JSON, run_id: str, ctx: StageContext, max_tries: int = 5) -> JSON:
    """Run every ``sailor_train`` stage in this process, retrying ``train`` after preemptions with no
    backoff (what Airflow does with backoff). For tests and benchmarks; returns finalize's summary.

    Raises:
        RecoveryExhaustedError: preempted on each of the ``max_tries + 1`` tries.
    """
    request = stages.validate(params, run_id, ctx)
    try:
        placement = stages.plan(request, run_id, ctx)
        data = stages.place_data(request, placement, run_id, ctx)
        stages.provision(request, placement, run_id, ctx)
        for try_number in range(1, max_tries + 2):
            try:
                result = stages.train(
                    request, placement, data, run_id, ctx, try_number=try_number, max_tries=max_tries
                )
                break
            except PreemptedError:
                continue
        return stages.finalize(request, placement, data, result, run_id, ctx)
    finally:
        stages.teardown(run_id, ctx)
