"""The backend interface: provision capacity for a placement, run training on it, tear it down."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sailor_tasks.model import Placement


@dataclass(frozen=True, slots=True)
class TrainLaunch:
    """Everything a backend needs to start the training process group of a run."""

    run_id: str
    run_key: str
    """Filesystem/label-safe form of run_id."""
    config_uri: str
    """URI of the TrainConfig JSON every worker reads."""
    num_workers: int
    placement: Placement


@runtime_checkable
class ClusterBackend(Protocol):
    name: str

    def provision(self, run_key: str, placement: Placement) -> dict[str, Any]:
        """Create (or find, when it already exists) the capacity for ``placement``; idempotent."""

    def train(self, launch: TrainLaunch) -> int:
        """Run the training process group to its end; return the group's exit status."""

    def teardown(self, run_key: str) -> bool:
        """Release the run's capacity; True when something was released. Idempotent."""
