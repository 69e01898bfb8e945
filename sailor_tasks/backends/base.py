"""The backend interface: provision capacity for a placement, run training on it, tear it down."""

from __future__ import annotations

from collections.abc import Mapping
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
    inject: Mapping[str, Any] | None = None
    """Preemptions to inject (``backends.preemption.InjectionSpec`` as a dict); honoured by backends
    that can inject them (local). None: none."""
    attempt: int = 1
    """Attempt number of this launch within the run (1 = first; recovery attempts count up)."""
    image: str = ""
    """The run's container image (container backends); empty: SAILOR's training image."""

    @property
    def run_folder(self) -> str:
        """The run folder the train config lies in (progress, result, cancel marker beside it)."""
        return self.config_uri.rsplit("/", 1)[0]


@runtime_checkable
class ClusterBackend(Protocol):
    name: str
    detached_attempts: bool
    """Whether an attempt runs on without a process of the train task following it (GKE pods while
    the task is deferred): then whoever stops the run ends the attempt in the ledger. False: the
    train task's own process ends the attempt when its workers stop (local)."""

    def provision(self, run_key: str, placement: Placement) -> dict[str, Any]:
        """Create (or find, when it already exists) the capacity for ``placement``; idempotent."""

    def train(self, launch: TrainLaunch) -> int:
        """Run the training process group to its end; return the group's exit status.

        ``PREEMPTED_EXIT_CODE`` (75) when the capacity was preempted. A backend that knows more about
        the preemption (notice or not, step reached) writes it as ``launch.json`` next to the config
        (see ``LocalBackend``); the train stage reads it when present.
        """

    def cancel(self, run_key: str, *, for_good: bool = True) -> int:
        """Stop everything the run's training started (every worker process, or every pod still
        running); the number stopped. Idempotent; the capacity stays until ``teardown``.
        ``for_good`` False: only the task running the training is being stopped, not the run (an
        attempt whose task ends it, as on local, ends as interrupted, not cancelled)."""

    def teardown(self, run_key: str) -> bool:
        """Release the run's capacity; True when something was released. Idempotent."""
