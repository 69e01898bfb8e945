"""The run contract for training code (no Airflow): ``Run.from_env()``, the notice, checkpoints.

``from sailor_tasks.runtime import Run`` loads torch; ``sailor_tasks.runtime.contract`` (the names
and the notice file) does not, so backends use it without loading torch; neither does
``ignore_notice``, the ``worker_init_fn`` that keeps DataLoader workers alive through the notice.
"""

from __future__ import annotations

from typing import Any

from sailor_tasks.runtime.contract import ignore_notice, unblock_sigterm

__all__ = ["Run", "ignore_notice", "unblock_sigterm"]


def __getattr__(name: str) -> Any:
    if name == "Run":
        from sailor_tasks.runtime.run import Run

        return Run
    raise AttributeError(f"module 'sailor_tasks.runtime' has no attribute {name!r}")
