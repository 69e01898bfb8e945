"""``AttemptPodsTrigger``: the triggerer follows every pod of a GKE training attempt at once.

The provider's ``GKEStartPodTrigger`` follows one pod; a multi-node attempt whose node 1 dies
would wait on node 0 until its collective timed out. This trigger reads every pod of the attempt
each ``poll_interval`` through the provider's async GKE Kubernetes hook, streams the lines each pod
logged since the last read into the task log (step, loss, samples/s as the trainer prints them),
and fires as soon as any pod has ended in failure or is gone (its node reclaimed), or when all
succeeded. ``SailorTrainOperator.resume_train`` then judges each pod, stops the others and ends
the attempt.

No task runs while the attempt is deferred, so the trigger is the run's heartbeat: each poll it
renews the run's reservation lease (``stages.queueing.hold_lease``, the normal ``lease_s``) from
the triggerer's own settings and ledger, in a thread (the event loop never waits on the
database). A lease the reconciler reclaimed (the trigger could not renew it in time) fires
``lease_reclaimed``: ``resume_train`` stops the attempt's pods and fails. A renewal that fails
(the ledger briefly unreachable) is logged and retried at the next poll: the lease lasts many polls.

``LeasedOperationTrigger``: the Google provider's ``GKEOperationTrigger`` (a cluster or node-pool
operation, minutes for GPU nodes) that renews the run's lease the same way every poll while the
operation runs, and fires ``lease_reclaimed`` when the lease was reclaimed meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from airflow.providers.google.cloud.triggers.kubernetes_engine import GKEOperationTrigger
from airflow.triggers.base import BaseTrigger, TriggerEvent

CLASSPATH = "sailor_tasks.airflow_glue.triggers.AttemptPodsTrigger"
OPERATION_CLASSPATH = "sailor_tasks.airflow_glue.triggers.LeasedOperationTrigger"
PENDING_PHASES = ("Pending", "")
LEASE_RECLAIMED = "lease_reclaimed"
UNSTARTABLE = "unstartable"
"""``AttemptPodsTrigger``'s event when a pod cannot start (its message: ``<pod>: <why>``)."""
UNSCHEDULED = "unscheduled"
"""``AttemptPodsTrigger``'s event when a pod is still pending after ``startup_timeout`` with no
node: none came up for it (the zone has no capacity for the pool now)."""
"""Event status: the run's reservation lease was reclaimed while the attempt was deferred."""
LEASE_HOLDER = "train (deferred)"
OPERATION_LEASE_HOLDER = "gke operation (deferred)"


@functools.lru_cache(maxsize=4)
def _context(settings: Any) -> Any:
    """One ``StageContext`` (and its ledger engine) per settings, shared by every trigger of the
    triggerer process."""
    from sailor_tasks.stages import StageContext

    return StageContext(settings)


def renew_lease(run_id: str, holder: str = LEASE_HOLDER) -> None:
    """Renew the run's reservation lease for ``lease_s`` from the triggerer's settings (the ledger's
    URL never rides in the trigger's kwargs: they are stored and shown by Airflow).

    Raises:
        LeaseReclaimedError: the reconciler reclaimed the reservation (its lease had expired).
        ReservationReleasedError: the run's teardown released it.
    """
    from sailor_tasks.settings import Settings
    from sailor_tasks.stages.queueing import hold_lease

    hold_lease(_context(Settings.from_env()), run_id, holder)


def cancel_attempt(run_id: str, for_good: bool = True) -> int:
    """Stop what the run's training runs and end its running attempt as ``cancelled``, or, not
    ``for_good`` (the task was cleared: its next try begins the next attempt), as ``failed``
    (``stages.stop_training``), from the triggerer's own settings and ledger; how many pods were
    stopped."""
    from sailor_tasks import stages
    from sailor_tasks.airflow_glue import gcp
    from sailor_tasks.settings import Settings

    gcp.install()
    return stages.stop_training(
        run_id,
        _context(Settings.from_env()),
        for_good=for_good,
        failed_because="its deferred train task was cleared: the next try begins the next attempt",
    )


async def stopped_for_good(trigger: BaseTrigger, timeout_s: float = 2.0) -> bool:
    """Whether the user's action on the deferred task ends the run (the task marked failed or
    success, or its run marked) rather than clearing it (Airflow runs it again: ``restarting`` or
    no state). Asked of the triggerer in a thread; no answer counts as ending it (the triggerer
    calls ``on_kill`` only for a user's action)."""
    from sailor_tasks.airflow_glue.stage import USER_END_STATES

    ti = trigger.task_instance
    if ti is None:
        return True

    def ask() -> Any:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        return RuntimeTaskInstance.get_task_states(
            dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id]
        )

    try:
        states = await asyncio.wait_for(asyncio.to_thread(ask), timeout_s)
    except Exception:  # the triggerer cannot say: a user acted, as on_kill means
        return True
    return ((states or {}).get(ti.run_id) or {}).get(ti.task_id) in USER_END_STATES


async def renew_or_reclaimed(run_id: str | None, log: Any, holder: str = LEASE_HOLDER) -> str | None:
    """Renew the run's lease (in a thread: the event loop never waits on the database); the
    reason when the run holds its reservation no more (the reconciler reclaimed it, or the run's
    teardown released it), else None (also when ``run_id`` is None, or when the renewal failed:
    logged, retried at the next poll, the lease lasts many polls)."""
    from sailor_tasks.errors import LeaseReclaimedError, ReservationReleasedError

    if run_id is None:
        return None
    try:
        await asyncio.to_thread(renew_lease, run_id, holder)
    except (LeaseReclaimedError, ReservationReleasedError) as exc:
        return str(exc)
    except Exception as exc:
        log.warning("renewing the lease of run %s failed (%s); retrying at the next poll", run_id, exc)
    return None


class LeasedOperationTrigger(GKEOperationTrigger):
    """``GKEOperationTrigger`` that renews the lease of ``run_id`` every ``poll_interval`` while
    the operation runs (no task renews it while the provisioning task is deferred).

    Events: the provider's (``success``, ``failed``, ``error``), or ``lease_reclaimed`` (with
    ``message``) as soon as a renewal finds the lease reclaimed; the operation is then no longer
    polled.
    """

    def __init__(self, *, run_id: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.run_id = run_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return OPERATION_CLASSPATH, {**kwargs, "run_id": self.run_id}

    async def on_kill(self) -> None:
        """A user acted on the deferred task (``sailor cancel``): a train task waiting for a
        recovery's node pool has begun its next attempt, which ends ``cancelled`` as it would
        while its pods run (``cancel_attempt``); a provision task has no attempt to end."""
        if self.run_id is not None:
            await asyncio.to_thread(cancel_attempt, self.run_id, await stopped_for_good(self))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        events = super().run()
        pending: asyncio.Future | None = None
        try:
            while True:  # renew, then poll the operation until it ends or a poll interval passes
                reclaimed = await renew_or_reclaimed(self.run_id, self.log, OPERATION_LEASE_HOLDER)
                if reclaimed is not None:
                    yield TriggerEvent({"status": LEASE_RECLAIMED, "message": reclaimed})
                    return
                pending = pending or asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait({pending}, timeout=self.poll_interval)
                if done:
                    break
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            yield event
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending
            await events.aclose()


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status behind a Kubernetes API error (the async hook wraps it)."""
    for e in (exc, exc.__cause__, exc.__context__):
        status = getattr(e, "status", None)
        if isinstance(status, int):
            return status
    return None


def _seconds_since(stamp: str | None, margin_s: float) -> int | None:
    """``since_seconds`` that reaches back to ``stamp`` (a log line's RFC 3339 timestamp) with
    ``margin_s`` to spare, however long ago it was (failed polls, a slow loop); None (the whole
    log) without a readable one."""
    if not stamp:
        return None
    try:
        at = dt.datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return max(1, math.ceil(time.time() - at.timestamp() + margin_s))


class AttemptPodsTrigger(BaseTrigger):
    """Follow the pods ``pod_names`` of one attempt until one fails or all succeed.

    Event payload: ``status`` (``success``: every pod succeeded; ``ended``: a pod failed or is
    gone; ``unscheduled``: a pod had no node after ``startup_timeout``; ``unstartable``: a pod
    cannot start (its image); ``error``: the API kept failing, or a pod on a node did not start
    within ``startup_timeout``;
    ``lease_reclaimed``: the run's lease was reclaimed), ``pods`` (name → ``{"phase",
    "exit_code"}``, ``phase`` ``Gone`` for a pod that no longer exists), ``message``, and SAILOR's
    resume ``state`` under ``sailor_train``.

    ``run_id``: the run whose lease each poll renews (None: none renewed; a trigger serialised
    before it existed has none).
    """

    def __init__(
        self,
        *,
        pod_names: Sequence[str],
        namespace: str,
        cluster_url: str,
        ssl_ca_cert: str,
        gcp_conn_id: str = "google_cloud_default",
        container: str = "base",
        poll_interval: float = 15.0,
        startup_timeout: float = 30 * 60,
        started_at: float | None = None,
        state: Mapping[str, Any] | None = None,
        log_marks: Mapping[str, str] | None = None,
        run_id: str | None = None,
    ):
        super().__init__()
        self.run_id = run_id
        self.pod_names = list(pod_names)
        self.namespace = namespace
        self.cluster_url, self.ssl_ca_cert, self.gcp_conn_id = cluster_url, ssl_ca_cert, gcp_conn_id
        self.container = container
        self.poll_interval, self.startup_timeout = poll_interval, startup_timeout
        self.started_at = time.time() if started_at is None else started_at
        self.state = dict(state or {})
        self.log_marks = dict(log_marks or {})
        """Timestamp of the last log line streamed per pod: later reads stream only lines after it.
        Kept in memory only (the triggerer stores a trigger's arguments once, when the task
        defers): a trigger rebuilt after a triggerer restart streams each pod's log from its start
        again."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            CLASSPATH,
            {
                "pod_names": self.pod_names,
                "namespace": self.namespace,
                "cluster_url": self.cluster_url,
                "ssl_ca_cert": self.ssl_ca_cert,
                "gcp_conn_id": self.gcp_conn_id,
                "container": self.container,
                "poll_interval": self.poll_interval,
                "startup_timeout": self.startup_timeout,
                "started_at": self.started_at,
                "state": self.state,
                "log_marks": self.log_marks,
                "run_id": self.run_id,
            },
        )

    def hook(self) -> Any:
        """The provider's async Kubernetes hook for the attempt's GKE cluster."""
        from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook

        return GKEKubernetesAsyncHook(
            cluster_url=self.cluster_url,
            ssl_ca_cert=self.ssl_ca_cert,
            gcp_conn_id=self.gcp_conn_id,
            enable_tcp_keepalive=True,
        )

    async def _read(self, hook: Any, name: str) -> dict[str, Any]:
        """The pod's phase, training container's exit status and, while it waits, why it cannot
        start when waiting will not help (``unstartable``: the provider's own judgement of image
        pulls and container creation); ``Gone`` on a 404."""
        from airflow.providers.cncf.kubernetes.utils.pod_manager import detect_pod_terminate_early_issues

        try:
            pod = await hook.get_pod(name, self.namespace)
        except Exception as exc:
            if _status_of(exc) == 404:
                return {"phase": "Gone", "exit_code": None}
            raise
        code = None
        for status in getattr(pod.status, "container_statuses", None) or ():
            terminated = status.state.terminated if status.state else None
            if status.name == self.container and terminated is not None:
                code = int(terminated.exit_code)
        phase = (pod.status.phase if pod.status else "") or ""
        unstartable = None
        if phase in PENDING_PHASES and pod.status:
            unstartable = detect_pod_terminate_early_issues(pod)
        pending = {}
        if phase in PENDING_PHASES:  # the node that took it, None while none has
            pending["node"] = getattr(getattr(pod, "spec", None), "node_name", None) or None
        return {
            "phase": phase,
            "exit_code": code,
            **pending,
            **({"unstartable": unstartable} if unstartable else {}),
        }

    async def _stream_logs(self, hook: Any, name: str) -> None:
        """Log the lines the pod wrote since the last read (timestamped lines, deduplicated)."""
        try:
            since = _seconds_since(self.log_marks.get(name), margin_s=self.poll_interval + 5)
            lines = await hook.read_logs(name, self.namespace, self.container, since_seconds=since)
        except Exception as exc:  # logs are best effort: the pod's outcome is what matters
            self.log.debug("no logs of %s yet: %s", name, exc)
            return
        mark = self.log_marks.get(name, "")
        for raw in lines:
            line = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            stamp, _, text = line.rstrip("\n").partition(" ")
            if stamp and stamp <= mark:
                continue
            self.log.info("[%s] %s", name, text or stamp)
            mark = stamp or mark
        if mark:
            self.log_marks[name] = mark

    async def on_kill(self) -> None:
        """A user acted on the deferred train task (marked it or its run failed, as ``sailor
        cancel`` does, or cleared it): stop the attempt's pods and end it as ``cancelled``, as the
        operator's ``on_kill`` does while the task runs, or, cleared, as ``failed`` (the run goes
        on in the task's next try). Not called when the trigger times out or
        the triggerer restarts; a still-running attempt is then ended by the next try or, as
        ``failed``, by ``teardown``."""
        if self.run_id is None:
            return
        for_good = await stopped_for_good(self)
        stopped = await asyncio.to_thread(cancel_attempt, self.run_id, for_good)
        self.log.warning(
            "train of run %s killed: stopped %d pod(s); attempt %s",
            self.run_id,
            stopped,
            "cancelled" if for_good else "failed (the task was cleared: its next try goes on)",
        )

    def _event(self, status: str, pods: dict[str, Any], message: str) -> TriggerEvent:
        return TriggerEvent(
            {"status": status, "pods": pods, "message": message, "sailor_train": self.state}
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self.hook()
        errors = 0
        while True:
            reclaimed = await renew_or_reclaimed(self.run_id, self.log)
            if reclaimed is not None:
                yield self._event(LEASE_RECLAIMED, {}, reclaimed)
                return
            try:
                pods = {name: await self._read(hook, name) for name in self.pod_names}
                errors = 0
            except Exception as exc:
                errors += 1
                if errors >= 5:
                    yield self._event("error", {}, f"Kubernetes API kept failing: {exc}")
                    return
                self.log.warning("reading the attempt's pods failed (%s); retrying", exc)
                await asyncio.sleep(self.poll_interval)
                continue
            for name, pod in pods.items():
                if pod["phase"] not in PENDING_PHASES and pod["phase"] != "Gone":
                    await self._stream_logs(hook, name)
            ended = [n for n, p in pods.items() if p["phase"] in ("Failed", "Gone")]
            if ended:
                yield self._event("ended", pods, f"pod {ended[0]} {pods[ended[0]]['phase'].lower()}")
                return
            if all(p["phase"] == "Succeeded" for p in pods.values()):
                yield self._event("success", pods, "every pod succeeded")
                return
            stuck = [n for n, p in pods.items() if p.get("unstartable")]
            if stuck:
                yield self._event(UNSTARTABLE, pods, f"{stuck[0]}: {pods[stuck[0]]['unstartable']}")
                return
            waiting = [n for n, p in pods.items() if p["phase"] in PENDING_PHASES]
            if waiting and time.time() - self.started_at > self.startup_timeout:
                # A pod no node took is the zone's want of capacity; one on a node that does not
                # start (its container) is not, and the API's error path follows it.
                homeless = [n for n in waiting if not pods[n].get("node")]
                status, pod = (UNSCHEDULED, homeless[0]) if homeless else ("error", waiting[0])
                yield self._event(status, pods, f"pod {pod} not started after {self.startup_timeout:.0f} s")
                return
            await asyncio.sleep(self.poll_interval)
