"""``sailor_train``'s deferrable tasks: ``SailorPlanOperator`` (``plan``: waits in SAILOR's queue
without a worker slot), ``SailorProvisionOperator`` (``provision``: inline on the local backend; on
GKE it waits for cluster and node-pool operations in the triggerer) and ``SailorTrainOperator``
(``train``: inline on the local backend, deferrable on GKE for the training pods)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from sailor_tasks.airflow_glue.stage import USER_END_STATES, run_stage
from sailor_tasks.errors import PREEMPTED_EXIT_CODE
from sailor_tasks.model import to_dict

STATE_QUERY_S = 1.0
"""Seconds ``on_kill`` waits to learn who stopped the task (it has 5 in all before SIGKILL)."""


class SailorProvisionOperator(BaseOperator):
    """Create (or reuse) the run's capacity: ``stages.provision`` inline on the local backend; on
    GKE one ``stages.provision_step`` at a time, deferring on the Google provider's
    ``GKEOperationTrigger`` (``triggers.LeasedOperationTrigger``, which renews the run's lease
    every poll) while a cluster or node-pool operation runs (minutes for a cluster), so no worker
    slot is held. ``resume_provision`` checks the finished operation (the trigger reports an
    operation that ended in error as done too) and takes the next step; a lease reclaimed while it
    waited fails the task (``LeaseReclaimedError``, no retry)."""

    template_fields: Sequence[str] = ("request", "placement")
    ui_color = "#fce5cd"

    def __init__(self, *, request: Any, placement: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.request, self.placement = request, placement

    def execute(self, context: Any) -> Any:
        from sailor_tasks import stages

        if self.request.get("backend") != "gke":
            return run_stage(stages.provision, self.request, self.placement, context["run_id"])
        return self._step(context, None)

    def resume_provision(
        self, context: Any, event: Mapping[str, Any] | None = None, pending: Mapping[str, Any] | None = None
    ) -> Any:
        """Re-entry from ``GKEOperationTrigger``: go on when the operation is done, else fail with
        what the trigger said (Airflow's retry provisions again: what exists is reused)."""
        _check_operation_event(self, context, event, pending)
        return self._step(context, pending)

    def _step(self, context: Any, finished: Mapping[str, Any] | None) -> Any:
        return _capacity_or_defer(self, context, self.request, self.placement, "resume_provision", finished)


def _capacity_or_defer(
    task: BaseOperator,
    context: Any,
    request: Any,
    placement: Any,
    method: str,
    finished: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """One ``stages.provision_step``: its result once the capacity is there, else defer ``task``
    on ``LeasedOperationTrigger`` (the Google provider's ``GKEOperationTrigger``, renewing the
    run's lease every poll) for the running operation, resuming in ``method`` with ``pending``
    (and ``kwargs``)."""
    from sailor_tasks import stages
    from sailor_tasks.airflow_glue.triggers import LeasedOperationTrigger

    out = run_stage(
        stages.provision_step,
        request,
        placement,
        context["run_id"],
        finished=None if finished is None else dict(finished),
    )
    pending = out.get("pending")
    if pending is None:
        return out
    task.log.info("waiting in the triggerer for GKE operation %s (%s)", pending["name"], pending["what"])
    task.defer(
        trigger=LeasedOperationTrigger(
            operation_name=pending["name"],
            project_id=pending["project"],
            location=pending["location"],
            gcp_conn_id=pending["gcp_conn_id"],
            poll_interval=int(pending["poll_s"]),
            run_id=context["run_id"],
        ),
        method_name=method,
        kwargs={"pending": pending, **kwargs},
    )


def _fail_if_reclaimed(task: BaseOperator, context: Any, event: Mapping[str, Any]) -> None:
    """A trigger found the run's lease reclaimed while the task was deferred: stop what the run
    still runs and fail without a retry (``stages.stop_reclaimed``)."""
    from sailor_tasks import stages
    from sailor_tasks.airflow_glue.triggers import LEASE_RECLAIMED

    if event.get("status") == LEASE_RECLAIMED:
        task.log.error("run %s: %s", context["run_id"], event.get("message"))
        run_stage(stages.stop_reclaimed, context["run_id"])


def _check_operation_event(
    task: BaseOperator, context: Any, event: Mapping[str, Any] | None, pending: Mapping[str, Any] | None
) -> None:
    """Raise unless the operation trigger reported the operation done (Airflow's retry then
    provisions again: what exists is reused, a running operation is waited for). A lease reclaimed
    while the task waited fails it for good: the reconciler released the capacity and removed
    what the run had created."""
    event = event or {}
    _fail_if_reclaimed(task, context, event)
    if pending is not None and pending.get("phase") == "busy" and event.get("status") != "success":
        # Not the run's operation (another run's, a GKE upgrade): provisioning looks again.
        task.log.warning(
            "GKE operation %s (%s), not this run's: %s: %s; provisioning goes on",
            pending.get("name"),
            pending.get("what"),
            event.get("status"),
            event.get("message"),
        )
        return
    if pending is None or event.get("status") != "success":
        raise RuntimeError(
            f"GKE operation {(pending or {}).get('name')} ({(pending or {}).get('what')}) did not "
            f"finish: {event.get('status')}: {event.get('message')}"
        )


class SailorPlanOperator(BaseOperator):
    """Place the run and reserve its capacity; when nothing fits now, wait in SAILOR's queue.

    ``execute`` runs ``stages.plan``. If the run is queued (``RunQueuedError``), the task defers on
    ``QueueAdmissionTrigger``, which polls the run's queue entry in the triggerer: no worker slot
    is held while the run waits. ``resume_plan`` runs ``stages.plan`` again: it returns the
    placement the admission reserved, runs an admission pass and defers again (a periodic
    re-check), or fails the task (time-out after ``max_queue_hours``, an unmeetable deadline)
    naming what the run waited for.
    """

    template_fields: Sequence[str] = ("request",)
    ui_color = "#fff2cc"

    def __init__(self, *, request: Any, poll_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.request, self.poll_s = request, poll_s

    def execute(self, context: Any) -> Any:
        return self._plan(context)

    def resume_plan(self, context: Any, event: Mapping[str, Any] | None = None, **_: Any) -> Any:
        """Re-entry from the trigger: the run left the queue, or it is time to re-check."""
        self.log.info("queue event for run %s: %s", context["run_id"], dict(event or {}))
        return self._plan(context)

    def _plan(self, context: Any) -> Any:
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue.queue_trigger import POLL_S, QueueAdmissionTrigger
        from sailor_tasks.errors import RunQueuedError

        try:
            return run_stage(stages.plan, self.request, context["run_id"])
        except RunQueuedError as exc:
            self.log.info("%s; deferring until admitted (no worker slot held)", exc)
            trigger = QueueAdmissionTrigger(
                run_id=context["run_id"],
                recheck_at=exc.recheck_at,
                poll_s=self.poll_s or POLL_S,
            )
            self.defer(trigger=trigger, method_name="resume_plan")


class SailorTrainOperator(BaseOperator):
    """Train the run on its placement, resuming from the newest checkpoint; recover on preemption.

    **backend=local**: ``stages.train`` runs in the task (torchrun on this machine). A preemption
    fails the try with ``PreemptedError``; Airflow's retry recovers before relaunching (one
    attempt per try).

    **backend=gke** (deferrable; needs a running triggerer):

    1. ``execute``: ``stages.launch_train`` begins the attempt with the same code as local
       (recovery, placement, checkpoint and bucket URIs, train config, ledger), or takes over the
       attempt a dead try left running. ``gcp.TrainingPods`` creates the attempt's pods
       (``gke.GkeBackend.launch_manifests``: one per node, the run's image and command under
       torchrun ``--nnodes`` with a per-attempt rendezvous service) through
       ``GKEStartPodOperator``, or reattaches to them by label; the task defers on
       ``triggers.AttemptPodsTrigger``, which follows every pod of the attempt at once and streams
       their logs into the task log, and frees its worker slot.
    2. ``resume_train(event)``: the trigger fired because a pod failed or is gone, or all
       succeeded (or because the run's lease, which the trigger renews at every poll, was
       reclaimed: the attempt's pods are stopped and the task fails with ``LeaseReclaimedError``). Each pod is judged from the pod and its node (``gcp.judge_pod``: Spot node
       reclaimed, pod gone with its node, node shutdown → preempted); the attempt's other pods are
       deleted at once (a dead node does not leave its peers waiting on a collective), succeeded
       ones cleaned up, failed ones kept for inspection; a pod judged preempted goes into the
       attempt's launch report.
    3. ``stages.finish_train`` with the highest exit status, read with the launch report and what
       the trainer wrote (as on local): 0 and a completed result → the result (XCom); a
       preemption (judged from the pods, or a ``preempted`` result: the trainer saved on SIGTERM)
       → ``PreemptedError``: the recovery strategy re-plans with the zone blocked, places data,
       moves the checkpoint and provisions (``stages.launch_train``), and the task defers on the
       new attempt's pods, within the same try, at most ``max_tries + 1`` attempts
       (``RecoveryExhaustedError`` then fails the task without retry); anything else
       ``TrainingFailedError`` (retried by Airflow; the retry relaunches on the same placement).

    **on_kill** (the run marked failed, e.g. by ``sailor cancel``, while the task runs): stops
    everything it started, every local worker process or every pod still running and the
    rendezvous services (``stages.stop_training``, which ends a GKE attempt as ``cancelled``).
    Stopped by Airflow instead (a worker's graceful shutdown, a timeout, a clear: the task is
    still ``running`` or ``restarting``), it stops them too, but not the run: the attempt ends
    ``failed`` (``TrainingInterruptedError``, retried) and the next try resumes it. A
    task that was deferred is not running, so it has nothing to kill: its trigger's ``on_kill``
    does the same in the triggerer. ``teardown``, which still runs, stops whatever is left (an
    attempt nothing ended is then ``failed``) and releases the capacity.

    The resume state (the attempt) rides in the trigger's event (``sailor_train``), so it reaches
    ``resume_train`` both from the triggerer and from ``airflow dags test`` (which hands the
    method the event alone); everything else is in the ledger and the run's bucket.
    """

    template_fields: Sequence[str] = ("request", "placement", "data")
    ui_color = "#d9ead3"

    def __init__(self, *, request: Any, placement: Any, data: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.request, self.placement, self.data = request, placement, data

    def execute(self, context: Any) -> Any:
        from sailor_tasks import stages

        self._run_id = context["run_id"]  # for on_kill, which gets no context
        ti = context["ti"]
        if self.request.get("backend") != "gke":
            return run_stage(
                stages.train,
                self.request,
                self.placement,
                self.data,
                context["run_id"],
                try_number=ti.try_number,
                max_tries=ti.max_tries,
            )
        done = run_stage(stages.completed_train, context["run_id"])
        if done is not None:  # a retried try: its predecessor died after the attempt completed
            return done
        return self._launch(context, self._begin(context))

    def resume_capacity(
        self,
        context: Any,
        event: Mapping[str, Any] | None = None,
        pending: Mapping[str, Any] | None = None,
        attempt: int | None = None,
    ) -> Any:
        """Re-entry from ``GKEOperationTrigger`` while a recovery's node pool (or cluster) is
        created: the next step, then the attempt's pods once the capacity is there."""
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue import gcp
        from sailor_tasks.stages import attempts

        self._run_id = context["run_id"]
        _check_operation_event(self, context, event, pending)
        gcp.install()
        ctx = stages.StageContext.from_env()
        att = attempts.resume_attempt(ctx, self.request, context["run_id"], int(attempt or 0))
        placement = to_dict(att.placement)
        _capacity_or_defer(
            self, context, self.request, placement, "resume_capacity", pending, attempt=att.number
        )
        return self._launch(context, att)

    def on_kill(self) -> None:
        """Stop every worker process or pod this task started (the task is being killed)."""
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue import gcp
        from sailor_tasks.backends.local import stop_launching
        from sailor_tasks.model import run_key

        run_id = getattr(self, "_run_id", None)
        if run_id is None:  # killed before execute began: nothing started
            return
        gcp.install()
        by_user = self._stopped_by_user(run_id)
        self.log.warning(
            "train of run %s killed (%s): stopping its training processes or pods",
            run_id,
            "by a user: the run is cancelled" if by_user else "by Airflow, not a user: a next try resumes it",
        )
        stop_launching(run_key(run_id), for_good=by_user)  # a launch not reached yet never starts
        stopped = stages.stop_training(
            run_id,
            for_good=by_user,
            failed_because="its train task was stopped by Airflow, not by a user: a next try resumes it",
        )
        self.log.warning("stopped %d training process(es) or pod(s) of run %s", stopped, run_id)

    def _stopped_by_user(self, run_id: str) -> bool:
        """Whether a user stopped this task: Airflow has it in a state a user sets (the task or its
        run marked failed, as ``sailor cancel`` does, or success). Else Airflow itself stops it: a
        worker's graceful shutdown forwards SIGTERM, a timeout, the task cleared while it runs
        (it is retried), the API server unreachable; the run then goes on in the next try. Asked
        of the task's supervisor in a thread, for at most ``STATE_QUERY_S`` (``on_kill`` may run
        in a signal handler while the task talks to it); no answer counts as not a user's."""
        import threading

        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        answer: list[Any] = []

        def ask() -> None:
            try:
                answer.append(
                    RuntimeTaskInstance.get_task_states(
                        dag_id=self.dag_id, task_ids=[self.task_id], run_ids=[run_id]
                    )
                )
            except Exception as exc:  # the supervisor or the API server cannot say
                answer.append(exc)

        thread = threading.Thread(target=ask, name="sailor-on-kill-state", daemon=True)
        thread.start()
        thread.join(STATE_QUERY_S)
        if not answer or isinstance(answer[0], Exception):
            self.log.warning(
                "run %s: could not read the train task's state (%s); stopping it as Airflow's stop, "
                "not a user's",
                run_id,
                answer[0] if answer else f"no answer in {STATE_QUERY_S:.0f} s",
            )
            return False
        state = ((answer[0] or {}).get(run_id) or {}).get(self.task_id)
        return state in USER_END_STATES

    def resume_train(self, context: Any, event: Mapping[str, Any] | None = None, **_: Any) -> Any:
        """Re-entry from ``AttemptPodsTrigger``: judge the pods, stop the rest, end the attempt."""
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue import gcp
        from sailor_tasks.airflow_glue.triggers import UNSCHEDULED, UNSTARTABLE
        from sailor_tasks.stages import attempts

        self._run_id = context["run_id"]
        event = event or {}
        # The reconciler took the run's GPUs: its pods may not go on (it stopped them too).
        _fail_if_reclaimed(self, context, event)
        state = event.get(gcp.TRIGGER_STATE_KEY)
        if not isinstance(state, Mapping) or "attempt" not in state:
            raise AirflowFailException(
                f"train resumed by an event without SAILOR's state ({gcp.TRIGGER_STATE_KEY!r}): {event!r}"
            )
        if event.get("status") == UNSTARTABLE:
            # An image that cannot be pulled: a retry would wait on the same pods, GPUs idle.
            pod, _, why = str(event.get("message") or "").partition(": ")
            run_stage(stages.stop_unstartable, context["run_id"], pod, why)
        if event.get("status") not in ("success", "ended", UNSCHEDULED):
            # The API kept failing, or a pod on a node did not start: Airflow's retry reattaches.
            raise RuntimeError(f"following attempt {state['attempt']}'s pods failed: {event.get('message')}")
        gcp.install()
        ctx = stages.StageContext.from_env()
        attempt = attempts.resume_attempt(ctx, self.request, context["run_id"], int(state["attempt"]))
        pods = self._pods(context, ctx, attempt)
        if event.get("status") == UNSCHEDULED:
            # No node came up for a pod (a Spot stockout, say): the zone cannot hold the run now.
            # The attempt ends as preempted, and recovery plans the next one as after a
            # preemption (another zone, or another market, as the strategy says).
            why = f"no node for the pool in time ({event.get('message')})"
            pods.give_up(why, record=lambda e: gcp.report_pod_ends(attempt.config.output_uri, e))
            self.log.warning("attempt %s: %s; re-planning", state["attempt"], why)
            return self._finish(context, attempt.number, 1)
        return self._conclude(context, pods, attempt, event.get("pods") or {})

    # --- gke helpers -------------------------------------------------------------------------

    def _begin(self, context: Any) -> Any:
        """The run's next attempt (recovering first after a preemption), or the one a dead try left.
        A recovery's GKE operations are started, not waited for: ``_launch`` waits in the triggerer."""
        from sailor_tasks import stages
        from sailor_tasks.backends import gke

        with gke.operation_waits_deferred():
            return run_stage(
                stages.launch_train,
                self.request,
                self.placement,
                self.data,
                context["run_id"],
                try_number=context["ti"].try_number,
            )

    def _pods(self, context: Any, ctx: Any, attempt: Any) -> Any:
        from sailor_tasks.airflow_glue import gcp
        from sailor_tasks.backends import get_backend

        backend = get_backend("gke", ctx.settings)
        pods, service = backend.launch_manifests(attempt.launch, attempt.config)
        return gcp.TrainingPods(backend.cfg, attempt.launch, context, pods, service)

    def _launch(self, context: Any, attempt: Any) -> Any:
        from sailor_tasks import stages, storage
        from sailor_tasks.airflow_glue import gcp
        from sailor_tasks.stages.usage import launch_report

        ctx = stages.StageContext.from_env()
        # Read for every launch: a new attempt's was cleared when it began; a resumed one's (after
        # a retry, or a deferral for capacity) says how far it got (the pods' start and ends,
        # ``gcp.report_pods_started`` and ``gcp.report_pod_ends``).
        report = launch_report(attempt.config.output_uri)
        if report.get("pods"):
            # The try that judged the pods died after recording their ends (its pods may be deleted).
            self.log.info(
                "attempt %d already ended (its pods' ends recorded): not touching its pods", attempt.number
            )
            codes = [e["exit_code"] for e in report["pods"].values() if e.get("exit_code") is not None]
            return self._finish(context, attempt.number, max(codes, default=1))
        if attempt.reattached and storage.exists(attempt.config.result_uri):
            # The trainer finished before the try that followed it died: end from what it wrote.
            result = storage.read_json(attempt.config.result_uri)
            rc = 0 if result.get("status") == "completed" else PREEMPTED_EXIT_CODE
            self.log.info(
                "attempt %d already ended (%s): not touching its pods", attempt.number, result.get("status")
            )
            return self._finish(context, attempt.number, rc)
        # The attempt's capacity (a recovery's new pool may still be in the making).
        placement = to_dict(attempt.placement)
        _capacity_or_defer(self, context, self.request, placement, "resume_capacity", attempt=attempt.number)
        pods = self._pods(context, ctx, attempt)
        phases = pods.phases() if report.get("pods_started") and not report.get("stopping") else {}
        if any(p["phase"] == "Gone" for p in phases.values()):
            # Every pod was created, and one is gone (its node reclaimed, or deleted): the attempt
            # has ended. Judged now; never created again.
            self.log.info("attempt %d: a pod of it is gone; judging its pods, creating none", attempt.number)
            return self._conclude(context, pods, attempt, phases)
        steps = pods.start()
        gcp.report_pods_started(attempt.config.output_uri)
        names = [pods.name(i) for i in range(len(pods))]
        self.log.info(
            "attempt %d: %d training pod(s) %s in namespace %s",
            attempt.number,
            len(pods),
            ", ".join(names),
            pods.config.namespace,
        )
        running = [s.trigger for s in steps if s.trigger is not None]
        if not running:  # every pod has ended already (a retried task found them so)
            status = {
                pods.name(i): {
                    "phase": "Succeeded" if s.exit_code == 0 else "Failed",
                    "exit_code": s.exit_code,
                }
                for i, s in enumerate(steps)
            }
            return self._conclude(context, pods, attempt, status)
        self._defer(context, pods, attempt.number, running[0])

    def _defer(self, context: Any, pods: Any, attempt: int, pod_trigger: Any) -> None:
        """Defer on every pod of the attempt (the cluster's address from the provider's pod
        trigger); the trigger renews the run's lease while no task runs."""
        from sailor_tasks.airflow_glue import gcp
        from sailor_tasks.airflow_glue.triggers import AttemptPodsTrigger

        cluster = pod_trigger.serialize()[1]
        trigger = AttemptPodsTrigger(
            pod_names=[pods.name(i) for i in range(len(pods))],
            namespace=pods.config.namespace,
            cluster_url=cluster["cluster_url"],
            ssl_ca_cert=cluster["ssl_ca_cert"],
            gcp_conn_id=pods.config.gcp_conn_id,
            poll_interval=gcp.POD_POLL_INTERVAL_S,
            startup_timeout=gcp.POD_STARTUP_TIMEOUT_S,
            state={"attempt": attempt},
            run_id=context["run_id"],
        )
        self.log.info("deferring on the %d pod(s) of attempt %d", len(pods), attempt)
        self.defer(trigger=trigger, method_name="resume_train")

    def _conclude(self, context: Any, pods: Any, attempt: Any, status: Mapping[str, Any]) -> Any:
        """Judge every pod, stop those still running, record the ends, finish the attempt."""
        from sailor_tasks.airflow_glue import gcp

        ends = pods.conclude(status, record=lambda e: gcp.report_pod_ends(attempt.config.output_uri, e))
        for index, end in sorted(ends.items(), key=lambda kv: int(kv[0])):
            self.log.info(
                "training pod %s: %s (%s)", pods.name(int(index)), end.get("outcome"), end.get("reason")
            )
        codes = [e["exit_code"] for e in ends.values() if e.get("exit_code") is not None]
        return self._finish(context, attempt.number, max(codes, default=1))

    def _finish(self, context: Any, attempt: int, exit_status: int) -> Any:
        from sailor_tasks import stages
        from sailor_tasks.errors import PreemptedError, RecoveryExhaustedError

        ti = context["ti"]
        try:
            return run_stage(
                stages.finish_train,
                self.request,
                context["run_id"],
                attempt,
                exit_status,
                try_number=ti.try_number,
                max_tries=ti.max_tries,
            )
        except RecoveryExhaustedError as exc:
            raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
        except PreemptedError as exc:
            self.log.warning("%s: recovering, then deferring on the next attempt's pods", exc)
        return self._launch(context, self._begin(context))
