"""Domain errors with structured fields; messages name the bad value, the valid choices and the fix."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PREEMPTED_EXIT_CODE = 75
"""Exit status of a trainer that stopped on a preemption notice after saving (EX_TEMPFAIL)."""


class ExitCode(enum.IntEnum):
    """Exit statuses of the ``sailor`` command (listed in ``sailor --help``)."""

    OK = 0
    FAILED = 1
    """The command ran and what it did or followed failed (a run that failed, a refused action)."""
    BAD_INPUT = 2
    """Bad arguments or params, or credentials refused; the message names the value and the choices."""
    NOT_FOUND = 3
    """No such run, DAG or log, or a service (Airflow) that cannot be reached."""
    INTERRUPTED = 130
    """Stopped with Ctrl-C while following a run (the run goes on), as shells count SIGINT."""


class SailorError(Exception):
    """Base of SAILOR's errors."""

    retryable = False
    """Whether an orchestrator should retry the stage that raised it (transient conditions)."""


def _choices(valid: Iterable[object], limit: int = 60) -> str:
    items = [str(v) for v in valid]
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


class SettingsError(SailorError, ValueError):
    """A ``SAILOR_*`` setting has a bad value; the message names the variable, the value and what
    is valid."""


class InvalidRequestError(SailorError, ValueError):
    """A run's parameters are invalid. Configuration error: retrying does not help."""

    def __init__(self, field: str, value: object, reason: str, valid: Sequence[object] | None = None):
        self.field = field
        self.value = value
        self.reason = reason
        self.valid = list(valid) if valid is not None else None
        msg = f"{field}={value!r}: {reason}"
        if self.valid is not None:
            msg += f"; valid choices: {_choices(self.valid)}"
        super().__init__(msg)


class InvalidRequestErrors(InvalidRequestError):
    """Several invalid parameters, reported together (each is an InvalidRequestError)."""

    def __init__(self, errors: Sequence[InvalidRequestError]):
        self.errors = list(errors)
        first = self.errors[0]
        SailorError.__init__(self, "; ".join(str(e) for e in self.errors))
        self.field, self.value, self.reason, self.valid = first.field, first.value, first.reason, first.valid


class InvalidQuotaError(InvalidRequestError):
    """A rebalance quota is malformed (a misspelt key or region, a bad count): the message names
    the entry and the valid choices. Configuration error: retrying does not help."""

    def __init__(self, message: str):
        self.field, self.value, self.reason, self.valid = "quotas", None, message, None
        SailorError.__init__(self, message)


class NoFeasibleOfferError(SailorError):
    """No catalog offer satisfies the request; ``rejections`` counts offers per validator."""

    def __init__(self, request_summary: str, rejections: dict[str, int], hint: str = ""):
        self.rejections = dict(rejections)
        detail = ", ".join(f"{rule}: {n}" for rule, n in sorted(rejections.items(), key=lambda kv: -kv[1]))
        super().__init__(
            f"no offer satisfies {request_summary} (offers rejected by rule: {detail or 'none'})"
            + (f"; {hint}" if hint else "")
        )


class CapacityUnavailableError(SailorError):
    """Capacity was taken by another planner or the cloud has none now. Transient: retry."""

    retryable = True

    def __init__(self, region: str, gpu_type: str, gpus: int, history: Sequence[str] = ()):
        self.region, self.gpu_type, self.gpus, self.history = region, gpu_type, gpus, list(history)
        super().__init__(
            f"no capacity for {gpus}x {gpu_type} in {region}"
            + (f" after {len(self.history)} attempts: {'; '.join(self.history)}" if self.history else "")
        )


class RunQueuedError(SailorError):
    """Nothing fits now: the run waits in SAILOR's queue. Not a failure: the orchestrator waits
    (``sailor_train``'s ``plan`` defers) until the run is admitted, times out or fails."""

    def __init__(
        self,
        run_id: str,
        position: int | None,
        reason: str,
        estimated_start: str | None,
        wait_until: str,
        recheck_at: str | None = None,
    ):
        self.run_id, self.position, self.reason = run_id, position, reason
        self.estimated_start, self.wait_until, self.recheck_at = estimated_start, wait_until, recheck_at
        super().__init__(
            f"run {run_id} queued at position {position if position is not None else '?'} ({reason}); "
            f"estimated start {estimated_start or 'unknown'}; waits until {wait_until} (max_queue_hours)"
        )


class QueueTimeoutError(SailorError):
    """The run waited ``max_queue_hours`` in the queue without being admitted. Not retried."""

    def __init__(self, run_id: str, hours: float, waited_for: str):
        self.run_id, self.hours, self.waited_for = run_id, hours, waited_for
        super().__init__(
            f"run {run_id} waited {hours:g} h (max_queue_hours) in SAILOR's queue for {waited_for} "
            "and was not admitted; raise max_queue_hours, ask for fewer GPUs or another GPU type, "
            "or widen the regions"
        )


class ReconcileIncompleteError(SailorError):
    """The reconciler could not stop or remove what some runs with expired leases left on their
    backend: their capacity stays held (nothing else is planned onto it) and every later pass
    tries again. Raised after the pass did the rest (reclaims, admission), so the failure shows."""

    retryable = True

    def __init__(self, errors: list[str], result: dict):
        self.errors, self.result = errors, result
        super().__init__(
            f"{len(errors)} run(s) with an expired lease could not be stopped and removed from their "
            "backend (capacity still held; the next pass retries): " + "; ".join(errors)
        )


class LeaseReclaimedError(SailorError):
    """The run's reservation was reclaimed when its lease expired (its task stopped renewing it):
    the run may not train on capacity that is no longer its own. Not retried."""

    def __init__(self, run_id: str, reclaimed_at: str):
        self.run_id, self.reclaimed_at = run_id, reclaimed_at
        super().__init__(
            f"run {run_id}: its reservation was reclaimed at {reclaimed_at} after its lease expired "
            "(the task stopped renewing it); trigger the run again"
        )


class ReservationReleasedError(SailorError):
    """The run's reservation was released (its teardown ran, or the reconciler reclaimed it) while
    one of its stages still needed it: after ``plan`` reserved it and before the placement was
    recorded, or before a stage used the capacity (a stage retried after the run was torn down).
    The run has ended: it is not marked ``planned`` or ``running`` again. Not retried."""

    def __init__(self, run_id: str, when: str = "before its placement was recorded"):
        self.run_id = run_id
        super().__init__(
            f"run {run_id}: its reservation was released (the run was torn down, or its lease "
            f"reclaimed) {when}; trigger the run again"
        )


class QueueRejectedError(SailorError):
    """The queue turned the run away (``state``: failed, left) for ``reason``. Not retried."""

    def __init__(self, run_id: str, state: str, reason: str):
        self.run_id, self.state, self.reason = run_id, state, reason
        super().__init__(f"run {run_id} left SAILOR's queue ({state}): {reason}")


class DeadlineUnmeetableError(SailorError):
    """The run's deadline cannot be met: its latest start passed (or was already past when it
    arrived) and no capacity, spot or on-demand, could take it. Not retried."""

    def __init__(
        self, run_id: str, deadline: str, latest_start: str, expected_hours: float, detail: str = ""
    ):
        self.run_id, self.deadline, self.latest_start = run_id, deadline, latest_start
        self.expected_hours = expected_hours
        super().__init__(
            f"run {run_id} cannot meet its deadline {deadline}: it needs about {expected_hours:.2f} h "
            f"(training, data copy, launch), so it had to start by {latest_start}"
            + (f"; {detail}" if detail else "")
            + "; raise deadline_hours or allow market=on_demand/auto"
        )


class DataIntegrityError(SailorError):
    """A copied file or a checkpoint does not match its recorded checksum."""

    def __init__(self, uri: str, expected: str, actual: str, *, what: str = "checksum mismatch"):
        self.uri, self.expected, self.actual = uri, expected, actual
        super().__init__(f"{what} for {uri}: expected {expected}, got {actual}")


class ReplicationIncompleteError(SailorError):
    """Planned dataset copies failed (each named with its error). Transient: a retry copies what is
    missing (copies already made are kept)."""

    retryable = True

    def __init__(self, failed: Sequence[Mapping[str, Any]], planned: int):
        self.failed = list(failed)
        listed = "; ".join(f"{f['dataset_uri']} → {f['region']}: {f['error']}" for f in self.failed[:5])
        more = f" (and {len(self.failed) - 5} more)" if len(self.failed) > 5 else ""
        super().__init__(f"{len(self.failed)} of {planned} planned copies failed: {listed}{more}")


class ReplicationFailedError(ReplicationIncompleteError):
    """Planned dataset copies still failed after every try: the night is reported, then fails."""

    retryable = False


class LeaseBusyError(SailorError):
    """Another holder kept a ledger lease (e.g. a copy into the same replica) past the wait.
    Transient: the holder finishes or its lease expires, so a retry goes through."""

    retryable = True

    def __init__(self, name: str, holder: str, waited_s: float):
        self.name, self.holder, self.waited_s = name, holder, waited_s
        super().__init__(f"lease {name!r} still held by {holder!r} after waiting {waited_s:.0f} s")


class LeaseLostError(SailorError):
    """A lease expired or was taken over while its work ran: the work must not publish its result."""

    retryable = True

    def __init__(self, name: str, holder: str):
        self.name, self.holder = name, holder
        super().__init__(
            f"lease {name!r} of {holder!r} was lost (expired or taken over) before the work ended"
        )


class StaleAttemptError(SailorError):
    """A training attempt tried to write or commit a checkpoint after a newer attempt claimed the
    checkpoint root (an orphaned worker of an ended attempt): nothing of it is committed."""

    def __init__(self, root: str, attempt: int, newer: int):
        self.root, self.attempt, self.newer = root, attempt, newer
        super().__init__(
            f"attempt {attempt} may no longer write checkpoints under {root}: attempt {newer} claimed it"
        )


class TrainingFailedError(SailorError):
    """The training process group exited with a failure (not a preemption)."""

    def __init__(self, run_id: str, returncode: int, log_tail: str = ""):
        self.run_id, self.returncode, self.log_tail = run_id, returncode, log_tail
        super().__init__(f"training of run {run_id} failed with exit code {returncode}\n{log_tail}")


class PodUnstartableError(SailorError):
    """A training pod cannot start, and waiting will not change it: its image cannot be pulled
    (no such image or tag, an invalid name, no access) or its container cannot be created. Its
    pods are stopped and the attempt failed; not retried (a retry would wait on the same pods)."""

    def __init__(self, run_id: str, pod: str, message: str):
        self.run_id, self.pod = run_id, pod
        super().__init__(f"run {run_id}: pod {pod} cannot start: {message}")


class PreemptedError(SailorError):
    """The run's capacity was preempted; the recovery strategy decides what happens next."""

    retryable = True

    def __init__(self, run_id: str, zone: str, step: int, noticed: bool):
        self.run_id, self.zone, self.step, self.noticed = run_id, zone, step, noticed
        super().__init__(
            f"run {run_id} preempted in {zone} at step {step} ({'with' if noticed else 'without'} notice)"
        )


class TrainingInterruptedError(SailorError):
    """The train task was stopped by Airflow, not by a user (a worker's graceful shutdown, a
    timeout, the task cleared while it ran): its workers saved and stopped. Retried: the next try
    resumes from the last checkpoint."""

    retryable = True

    def __init__(self, run_id: str, step: int | None = None):
        self.run_id, self.step = run_id, step
        at = "" if step is None else f" at step {step}"
        super().__init__(
            f"the train task of run {run_id} was stopped{at} (not the run): the next try resumes it"
        )


class RunCancelledError(SailorError):
    """The run's training was stopped on purpose (``sailor cancel``, the run marked failed) while it
    ran; not retried."""

    def __init__(self, run_id: str, step: int | None = None):
        self.run_id, self.step = run_id, step
        at = "" if step is None else f" at step {step}"
        super().__init__(f"run {run_id} was cancelled while training{at}; its workers were stopped")


class RecoveryExhaustedError(SailorError):
    """Every allowed attempt of a run was preempted (or failed); lists the attempts."""

    def __init__(self, run_id: str, attempts: Sequence[str]):
        self.run_id, self.attempts = run_id, list(attempts)
        lines = "\n".join(f"  {a}" for a in self.attempts)
        super().__init__(
            f"run {run_id} did not finish: recovery exhausted after {len(self.attempts)} attempt(s):\n{lines}\n"
            "raise the train task's retries, pick another recovery_strategy, or use market=on_demand"
        )


class InfeasibleAllocationError(SailorError):
    """A scheduling policy's LP has no optimal solution (e.g. SLO deadlines the cluster cannot meet)."""

    def __init__(self, policy: str, status: str, detail: str = ""):
        self.policy, self.status, self.detail = policy, status, detail
        super().__init__(
            f"policy {policy!r} found no optimal allocation (solver status: {status})"
            + (f": {detail}" if detail else "")
        )


class RebalanceInfeasibleError(SailorError, ValueError):
    """No assignment satisfies the rebalance's hard constraints; the message names the binding one."""

    def __init__(self, constraint: str, detail: str):
        self.constraint = constraint
        super().__init__(f"rebalance infeasible — binding constraint: {constraint}: {detail}")


class CatalogError(SailorError, ValueError):
    """The catalog cannot be loaded (``SAILOR_CATALOG_FILE`` or ``SAILOR_SUPPLY_FILE`` unreadable
    or malformed); the message is the cause, naming the file."""


class StageSkipped(SailorError):
    """The stage has nothing to do for this run (e.g. a dry run publishes nothing): the task is skipped."""


class LedgerSchemaError(SailorError):
    """The ledger's schema revisions cannot be applied as asked: an unknown revision, a ledger
    migrated by a newer SAILOR, or migrations that fork into two heads. The message names the
    revisions and the fix."""


PERMANENT_ERRORS: tuple[type[Exception], ...] = (
    InvalidRequestError,
    NoFeasibleOfferError,
    RebalanceInfeasibleError,
    RunCancelledError,
    QueueTimeoutError,
    DeadlineUnmeetableError,
    QueueRejectedError,
    LeaseReclaimedError,
    ReservationReleasedError,
    LedgerSchemaError,
    PodUnstartableError,
    ReplicationFailedError,
)
"""Errors that retrying cannot fix (or must not undo: a cancel): the task fails at once."""
