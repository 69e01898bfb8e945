"""``sailor_train``'s deferrable tasks: ``SailorPlanOperator`` (``plan``: waits in SAILOR's queue
without a worker slot) and ``SailorTrainOperator`` (``train``: inline on the local backend,
deferrable on GKE)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from sailor_tasks.airflow_glue.stage import run_stage
from sailor_tasks.errors import PREEMPTED_EXIT_CODE


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
        from sailor_tasks.airflow_glue.triggers import POLL_S, QueueAdmissionTrigger
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
       (``gke.build_training_pods``: one per node, torchrun ``--nnodes`` with a per-attempt
       rendezvous service) through ``GKEStartPodOperator``, or reattaches to them by label; the
       task defers on the provider's ``GKEStartPodTrigger`` and frees its worker slot.
    2. ``resume_train(event)``: the provider's ``trigger_reentry`` ends that pod (its log into the
       task log, cleanup, exit status). The provider's trigger follows one pod, so a multi-node
       attempt defers on its pods in sequence, node 0 first; a pod that ended meanwhile answers
       at once, so the wait is as long as the slowest pod (torchrun on the others stops when a
       peer dies: its collectives fail).
    3. When every pod has ended, ``stages.finish_train`` with the highest exit status, read with
       what the trainer wrote (as on local): 0 and a completed result → the result (XCom); a
       ``preempted`` result (the trainer saved on SIGTERM and exited 75; torchrun, the pod's
       main process, then exits 1) → ``PreemptedError``: the recovery strategy re-plans,
       places data, moves the checkpoint and provisions (``stages.launch_train``), and the task
       defers on the new attempt's pods, within the same try, at most ``max_tries + 1`` attempts
       (``RecoveryExhaustedError`` then fails the task without retry); anything else
       ``TrainingFailedError`` (retried by Airflow; the retry relaunches on the same placement).

    **on_kill** (the run marked failed, e.g. by ``sailor cancel``, while the task runs): stops
    everything it started, every local worker process or every pod still running
    (``stages.stop_training``); ``teardown``, which still runs, stops whatever is left (a task that
    was deferred is not running, so it has nothing to kill) and releases the capacity.

    The resume state (attempt, pod index, exit statuses so far) rides in the trigger's
    ``trigger_kwargs``, which the provider's trigger returns in its event, so it reaches
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
        return self._launch(context, self._begin(context))

    def on_kill(self) -> None:
        """Stop every worker process or pod this task started (the task is being killed)."""
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue import gcp

        run_id = getattr(self, "_run_id", None)
        if run_id is None:  # killed before execute began: nothing started
            return
        gcp.install()
        self.log.warning("train of run %s killed: stopping its training processes or pods", run_id)
        stopped = stages.stop_training(run_id)
        self.log.warning("stopped %d training process(es) or pod(s) of run %s", stopped, run_id)

    def resume_train(self, context: Any, event: Mapping[str, Any] | None = None, **_: Any) -> Any:
        """Re-entry from the pod trigger: finish that pod, then defer on the next, or end the attempt."""
        from sailor_tasks import stages
        from sailor_tasks.airflow_glue import gcp
        from sailor_tasks.stages import attempts

        self._run_id = context["run_id"]
        state = (event or {}).get(gcp.TRIGGER_STATE_KEY)
        if not isinstance(state, Mapping) or "attempt" not in state:
            raise AirflowFailException(
                f"train resumed by an event without SAILOR's state ({gcp.TRIGGER_STATE_KEY!r}): {event!r}"
            )
        gcp.install()
        ctx = stages.StageContext.from_env()
        attempt = attempts.resume_attempt(ctx, self.request, context["run_id"], int(state["attempt"]))
        pods = self._pods(context, ctx, attempt)
        index = int(state["pod"])
        step = pods.resume(index, event or {})
        if step.trigger is not None:  # the provider re-defers on the same pod (still running)
            self._defer(step.trigger, state)
        codes = {**state["exit"], str(index): step.exit_code}
        self.log.info("training pod %s ended with exit status %s", pods.name(index), step.exit_code)
        return self._advance(context, pods, attempt.number, codes, {})

    # --- gke helpers -------------------------------------------------------------------------

    def _begin(self, context: Any) -> Any:
        """The run's next attempt (recovering first after a preemption), or the one a dead try left."""
        from sailor_tasks import stages

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

        return gcp.TrainingPods(get_backend("gke", ctx.settings).cfg, attempt.launch, context)

    def _launch(self, context: Any, attempt: Any) -> Any:
        from sailor_tasks import stages, storage

        ctx = stages.StageContext.from_env()
        if attempt.reattached and storage.exists(attempt.config.result_uri):
            # The trainer finished before the try that followed it died: end from what it wrote.
            result = storage.read_json(attempt.config.result_uri)
            rc = 0 if result.get("status") == "completed" else PREEMPTED_EXIT_CODE
            self.log.info(
                "attempt %d already ended (%s): not touching its pods", attempt.number, result.get("status")
            )
            return self._finish(context, attempt.number, rc)
        pods = self._pods(context, ctx, attempt)
        steps = pods.start()
        self.log.info(
            "attempt %d: %d training pod(s) %s in namespace %s",
            attempt.number,
            len(pods),
            ", ".join(pods.name(i) for i in range(len(pods))),
            pods.config.namespace,
        )
        codes = {str(i): s.exit_code for i, s in enumerate(steps) if s.exit_code is not None}
        pending = {i: s for i, s in enumerate(steps) if s.trigger is not None}
        return self._advance(context, pods, attempt.number, codes, pending)

    def _advance(self, context: Any, pods: Any, attempt: int, codes: dict[str, int], pending: dict) -> Any:
        """Defer on the first pod still running, or end the attempt when none is."""
        for index in range(len(pods)):
            if str(index) in codes:
                continue
            step = pending.pop(index, None) or pods.watch(index)
            if step.trigger is not None:
                self._defer(step.trigger, {"attempt": attempt, "pod": index, "exit": codes})
            codes[str(index)] = step.exit_code
        return self._finish(context, attempt, max(codes.values()))

    def _defer(self, trigger: Any, state: Mapping[str, Any]) -> None:
        from sailor_tasks.airflow_glue import gcp

        trigger.trigger_kwargs = {**(trigger.trigger_kwargs or {}), gcp.TRIGGER_STATE_KEY: dict(state)}
        self.log.info("deferring on pod %s (attempt %s)", trigger.pod_name, state["attempt"])
        self.defer(trigger=trigger, method_name="resume_train")

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
