"""Airflow glue for Google Cloud: credentials from an Airflow connection, training pods on GKE.

``install()`` (called by ``stage.run_stage`` before every stage) wires the Airflow-free core to
Airflow: ``gcp_auth`` gets a provider that reads the connection (``SAILOR_GCP_CONN_ID``, default
``google_cloud_default``) through the Google provider's ``GoogleBaseHook`` the first time gs:// or
GKE is used, and the GKE backend gets a pod runner built on ``GKEStartPodOperator``. Credentials
stay inside google-auth objects; nothing here logs or returns them.

``TrainingPods`` creates (or finds) the pods of one attempt through the provider's
``GKEStartPodOperator`` and ends them once ``triggers.AttemptPodsTrigger`` has fired, for
``operators.SailorTrainOperator``; ``judge_pod`` reads how a pod ended from the pod and its node;
``run_training_pods`` runs the pods inline (blocking) for callers of ``stages.train`` outside that
operator.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from sailor_tasks import gcp_auth, paths
from sailor_tasks.backends import gke
from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.settings import LEASE_RENEWAL_S
from sailor_tasks.train.config import TrainConfig

logger = logging.getLogger(__name__)

DEFAULT_CONN_ID = "google_cloud_default"
POD_STARTUP_TIMEOUT_S = gke.POD_STARTUP_TIMEOUT_S
POD_POLL_INTERVAL_S = int(LEASE_RENEWAL_S["gke"])
"""Seconds between the triggerer's status reads of a training pod: training runs for minutes to
days, and each read is one API call per pod; 15 s adds at most that to noticing the end."""
TRIGGER_STATE_KEY = "sailor_train"
"""Key of SAILOR's resume state in the pod trigger's ``trigger_kwargs``; the provider's trigger
returns its ``trigger_kwargs`` in every event (KubernetesPodTrigger: "additional keyword parameters
to send in the event")."""


RENDER_PROJECT = "my-project"
"""Project ``render_run`` names when none is known (the render needs none to exist)."""


def conn_id_from_env(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("SAILOR_GCP_CONN_ID") or DEFAULT_CONN_ID


def connection_credentials(conn_id: str) -> gcp_auth.GcpCredentials:
    """Credentials and project of an Airflow Google Cloud connection (key file, key JSON, ADC,
    impersonation or anonymous, as the connection's extras say); ADC when it does not exist."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    try:
        credentials, project = GoogleBaseHook(gcp_conn_id=conn_id).get_credentials_and_project_id()
    except AirflowNotFoundException:
        logger.info("Airflow connection %r does not exist; using application default credentials", conn_id)
        return gcp_auth.GcpCredentials()
    logger.info("Google Cloud credentials from Airflow connection %r (project %s)", conn_id, project)
    return gcp_auth.GcpCredentials(credentials, project, source=f"Airflow connection {conn_id!r}")


def install(conn_id: str | None = None) -> None:
    """Point the core at Airflow: connection credentials (resolved lazily, once) and the pod runner."""
    conn = conn_id or conn_id_from_env()
    gcp_auth.set_provider(lambda: connection_credentials(conn))
    gke.set_pod_runner(run_training_pods, delete_run_pods)


def install_for_command(conn_id: str | None = None) -> None:
    """``install`` in a ``sailor`` command: like ``airflow connections get``, the command reads
    connections from Airflow's database too (server context), not only from the environment."""
    os.environ.setdefault("_AIRFLOW_PROCESS_CONTEXT", "server")
    install(conn_id)


def training_pod_operator(
    config: gke.GkeConfig,
    launch: TrainLaunch,
    pod: Any,
    *,
    deferrable: bool = False,
    task_id: str | None = None,
    trigger_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """The GKEStartPodOperator that runs one training pod (built by ``gke.build_training_pods``).

    ``durable`` (reattach): a retried task finds the pod by its dag/task/run labels plus the run,
    plan and node-rank labels, and follows it instead of starting a second one. The provider
    keeps every pod it finds ended (``keep_pod``): with ``delete_succeeded_pod`` (or
    ``delete_pod``) a retry that finds its pod succeeded deletes it and creates it again, running
    the finished command a second time. SAILOR deletes a succeeded pod itself once its end is
    recorded (``TrainingPods.conclude``, ``follow_pods``).
    """
    from airflow.providers.google.cloud.operators.kubernetes_engine import GKEStartPodOperator

    pl = launch.placement
    rank = pod.metadata.labels[f"{gke.LABEL_PREFIX}/node-rank"]
    return GKEStartPodOperator(
        task_id=task_id or f"train-node-{rank}",
        project_id=config.project,
        location=pl.region,
        cluster_name=config.cluster_name(pl.region),
        gcp_conn_id=config.gcp_conn_id,
        namespace=config.namespace,
        name=pod.metadata.name,
        random_name_suffix=False,
        full_pod_spec=pod,
        labels=dict(pod.metadata.labels),
        image=pod.spec.containers[0].image,
        durable=True,
        on_finish_action="keep_pod",
        termination_grace_period=pod.spec.termination_grace_period_seconds,
        startup_timeout_seconds=POD_STARTUP_TIMEOUT_S,
        get_logs=True,
        do_xcom_push=False,
        deferrable=deferrable,
        poll_interval=POD_POLL_INTERVAL_S,
        trigger_kwargs=dict(trigger_kwargs or {}),
    )


def _delete_pod(core: Any, name: str, namespace: str) -> bool:
    """Delete pod ``name``; False when it was gone already (404)."""
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return True


def delete_run_pods(config: gke.GkeConfig, region: str, run_key: str) -> int:
    """Delete the run's pods that have not ended (every attempt's) and its rendezvous services, in
    the region's cluster, through the provider's GKE Kubernetes hook; pods that ended are kept for
    inspection. Returns how many pods were deleted."""
    from kubernetes.client.exceptions import ApiException

    op = _cluster_operator(config, region)
    core = op.hook.core_v1_client
    selector = gke.run_selector(run_key)
    deleted = 0
    for pod in core.list_namespaced_pod(config.namespace, label_selector=selector).items:
        if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
            continue
        if not _delete_pod(core, pod.metadata.name, config.namespace):
            continue  # gone meanwhile
        deleted += 1
        logger.warning("deleted training pod %s of run %s", pod.metadata.name, run_key)
    for service in core.list_namespaced_service(config.namespace, label_selector=selector).items:
        try:
            core.delete_namespaced_service(service.metadata.name, config.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            continue
        logger.info("deleted rendezvous service %s of run %s", service.metadata.name, run_key)
    return deleted


def _cluster_operator(config: gke.GkeConfig, region: str) -> Any:
    """A pod operator bound to the region's cluster, used only for its Kubernetes hook."""
    from airflow.providers.google.cloud.operators.kubernetes_engine import GKEStartPodOperator

    return GKEStartPodOperator(
        task_id="sailor-cancel",
        project_id=config.project,
        location=region,
        cluster_name=config.cluster_name(region),
        gcp_conn_id=config.gcp_conn_id,
        namespace=config.namespace,
        name="sailor-cancel",
        image="unused",
    )


def render_pod(config: gke.GkeConfig, launch: TrainLaunch, pod: Any) -> dict[str, Any]:
    """The pod exactly as the operator would submit it (no cluster needed), as API JSON."""
    op = training_pod_operator(config, launch, pod, deferrable=True)
    return gke.serialize(op.build_pod_request_obj(context=None, dry_run=True))


def ensure_pod_identity(core: Any, config: gke.GkeConfig) -> None:
    """Create the training pods' namespace and Kubernetes service account (``gke.build_namespace``,
    ``gke.build_service_account``: annotated for Workload Identity with the Google service account
    the pods act as) unless they exist. A fresh cluster has neither, and Kubernetes refuses a pod
    in a namespace that does not exist (404) or naming a service account that does not (403).

    A service account that exists is kept as it is (the operator may have made it); one whose
    annotation names another Google service account, or none, is logged: its pods act as that
    one, or have no Google identity. An identity that may not create them (403: Kubernetes checks
    the permission before the object) uses them when they exist.
    """
    from kubernetes.client.exceptions import ApiException

    namespace, account = gke.build_namespace(config), gke.build_service_account(config)
    try:
        core.create_namespace(namespace)
        logger.info("created namespace %s for the training pods", config.namespace)
    except ApiException as exc:
        if exc.status == 403:
            core.read_namespace(config.namespace)  # made by the operator, else this raises
        elif exc.status != 409:  # already exists
            raise
    try:
        core.create_namespaced_service_account(config.namespace, account)
        logger.info(
            "created service account %s/%s, acting as %s (Workload Identity)",
            config.namespace,
            config.service_account,
            config.gcp_service_account_email(),
        )
        return
    except ApiException as exc:
        if exc.status not in (403, 409):
            raise
    # It exists (409), or this identity may not create one (403): one the operator made is used.
    existing = core.read_namespaced_service_account(config.service_account, config.namespace)
    acts_as = ((existing.metadata.annotations if existing.metadata else None) or {}).get(
        gke.WORKLOAD_IDENTITY_ANNOTATION
    )
    if acts_as != config.gcp_service_account_email():
        logger.warning(
            "service account %s/%s acts as %s (annotation %s), not as %s (SAILOR_GKE_GCP_SERVICE_ACCOUNT); "
            "the training pods use it as it is",
            config.namespace,
            config.service_account,
            acts_as or "no Google service account",
            gke.WORKLOAD_IDENTITY_ANNOTATION,
            config.gcp_service_account_email(),
        )


def _ensure_service(op: Any, service: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        op.hook.core_v1_client.create_namespaced_service(service.metadata.namespace, service)
    except ApiException as exc:
        if exc.status != 409:  # already exists: a retry of the same run
            raise


def _exit_code(op: Any) -> int:
    """The failed pod's container exit status (75 = preempted after saving), or 1 when unknown."""
    try:
        code = gke.container_exit_code(op.pod_manager.read_pod(op.pod)) if op.pod is not None else None
    except Exception:  # the pod or its node is gone (e.g. the spot VM was reclaimed)
        code = None
    return 1 if code in (None, 0) else code


def run_training_pods(config: gke.GkeConfig, launch: TrainLaunch, pods: Sequence[Any], service: Any) -> int:
    """Run the launch's pods to completion inline; 0 when every pod succeeded.

    The pod runner of ``stages.train`` on the gke backend when it is called outside
    ``operators.SailorTrainOperator`` (a task of one's own, a script): the task holds its worker slot
    while the pods run. ``sailor_train`` defers instead (``TrainingPods``).
    """
    from airflow.sdk import get_current_context

    context = get_current_context()
    ops = [training_pod_operator(config, launch, pod) for pod in pods]
    ensure_pod_identity(ops[0].hook.core_v1_client, config)
    if service is not None:
        _ensure_service(ops[0], service)
        # Several pods from one task: reattach by labels (node-rank differs), not by the task's one
        # persisted pod identity.
        context = {k: v for k, v in context.items() if k != "task_state_store"}  # type: ignore[assignment]
    return follow_pods(config, launch, ops, context)


def follow_pods(config: gke.GkeConfig, launch: TrainLaunch, ops: Sequence[Any], context: Any) -> int:
    """Follow every pod operator of an attempt at once (a thread each): when one pod fails, the
    others are deleted at once; then each pod's end is judged (``judge_pod``) into the attempt's
    launch report, and the succeeded pods are deleted (failed ones are kept for inspection).
    Returns the highest exit status of the pods that were not stopped."""

    def run(op: Any) -> int:
        try:
            op.execute(context)
            return 0
        except Exception:
            logger.exception("training pod %s failed", op.name)
            return _exit_code(op)

    codes: dict[int, int] = {}
    stopped: set[int] = set()
    with ThreadPoolExecutor(max_workers=len(ops)) as pool:
        futures = {pool.submit(run, op): i for i, op in enumerate(ops)}
        for future in as_completed(futures):
            index = futures[future]
            codes[index] = future.result()
            if codes[index] == 0 or index in stopped:
                continue
            for other, op in enumerate(ops):  # a dead node fails the attempt now
                if other in codes or other in stopped:
                    continue
                stopped.add(other)
                logger.warning("stopping training pod %s: pod %s ended", op.name, ops[index].name)
                _delete_pod(op.hook.core_v1_client, op.name, config.namespace)
    spot = launch.placement.market == "spot"
    ends: dict[str, dict[str, Any]] = {}
    for index, op in enumerate(ops):
        if index in stopped:
            ends[str(index)] = end_dict(gke.PodEnd("failed", "stopped: another pod ended first", None))
        elif codes[index] == 0:
            ends[str(index)] = end_dict(gke.PodEnd("completed", "exit status 0", 0))
        else:
            ends[str(index)] = end_dict(judge_pod(op.hook.core_v1_client, config.namespace, op.name, spot=spot))
    report_pod_ends(launch.run_folder, ends)
    for index, op in enumerate(ops):
        if index not in stopped and codes[index] == 0:
            _delete_pod(op.hook.core_v1_client, op.name, config.namespace)
    return max(codes[i] for i in range(len(ops)) if i not in stopped)


def report_pods_started(run_uri: str) -> None:
    """Mark in the attempt's launch report that every pod of it was created: a later launch of
    the attempt (a retry, or one after a wait for capacity) then takes a pod missing as gone (its
    node reclaimed), never one to create."""
    from sailor_tasks.stages.usage import update_launch_report

    update_launch_report(run_uri, {"pods_started": True})


def report_pod_ends(run_uri: str, ends: Mapping[str, Mapping[str, Any]]) -> None:
    """Write how the attempt's pods ended into its launch report (``launch.json`` in ``run_uri``),
    which ``stages.finish_train`` reads with the trainer's result: a pod judged preempted (its Spot
    node reclaimed, gone with its node, stopped by the kubelet's node shutdown) makes the attempt a
    preemption even when the trainer could not write so."""
    import time

    from sailor_tasks import storage
    from sailor_tasks.stages.usage import launch_report

    preemption = attempt_preemption(ends, time.time())
    report = launch_report(run_uri)
    report["pods"] = dict(ends)
    report.setdefault("ended_at", time.time())  # when the pods were judged: the attempt's end
    if preemption is not None:
        report["preemption"] = preemption
    storage.write_json(paths.launch_report_uri(run_uri), report)


@dataclass(frozen=True)
class PodStep:
    """Where one training pod stands after driving its operator: still running, with the provider's
    ``trigger`` to defer on, or ended with ``exit_code`` (0 success, 75 preempted after saving) and
    SAILOR's judgement of the end (``end``: completed, preempted or failed, and why)."""

    trigger: Any = None
    exit_code: int | None = None
    end: gke.PodEnd | None = None


def judge_pod(core: Any, namespace: str, name: str, *, spot: bool) -> gke.PodEnd:
    """How a training pod that ended did end (``gke.classify_pod_end``), from the pod and its node
    as the Kubernetes API has them now (a 404 is the pod or node gone)."""
    from kubernetes.client.exceptions import ApiException

    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        pod = None
    node, node_gone = None, False
    node_name = getattr(getattr(pod, "spec", None), "node_name", None)
    if node_name:
        try:
            node = core.read_node(node_name)
        except ApiException as exc:
            if exc.status == 404:
                node_gone = True
            else:  # e.g. no RBAC to read nodes: judge from the pod alone
                logger.warning("could not read node %s of pod %s: %s", node_name, name, exc.reason)
    return gke.classify_pod_end(pod, node, spot=spot, node_gone=node_gone)


def _transient(exc: BaseException) -> bool:
    """An API error worth a retry of the task (which reattaches), not an answer about the pod."""
    from kubernetes.client.exceptions import ApiException

    status = getattr(exc, "status", None)
    return isinstance(exc, ApiException) and isinstance(status, int) and (status == 429 or status >= 500)


def _ended_code(op: Any) -> int | None:
    """Exit status of the pod ``op`` last saw (or reads now), None when it has not ended or is gone."""
    for read in (lambda: op.pod, lambda: op.pod_manager.read_pod(op.pod)):
        try:
            code = gke.container_exit_code(read()) if op.pod is not None else None
        except Exception:  # the pod or its node is gone (e.g. the spot VM was reclaimed)
            code = None
        if code is not None:
            return code
    return None


class TrainingPods:
    """The pods of one launched attempt, each driven by the provider's deferrable
    ``GKEStartPodOperator`` (built by ``training_pod_operator``), one step at a time.

    ``start`` creates the pods' namespace and service account unless they exist
    (``ensure_pod_identity``), then the rendezvous service and every pod, or finds them by their
    labels when a retried task reattaches (``durable``: dag/task/run labels without try_number,
    plus run, plan, attempt and node-rank, and not ``already_checked``), and returns a
    ``PodStep`` per pod: the provider's trigger when the pod runs (its cluster address is what
    ``AttemptPodsTrigger`` needs), else its exit status. ``conclude`` ends them all from the
    trigger's event: succeeded pods deleted, failed or gone ones judged (``judge_pod``) and kept,
    the rest stopped.

    Several pods of one task share the task's identity, so the provider's single persisted pod
    identity (``task_state_store``) is withheld: the pods are found by their labels.
    """

    def __init__(
        self,
        config: gke.GkeConfig,
        launch: TrainLaunch,
        context: Mapping[str, Any],
        pods: Sequence[Any],
        service: Any,
    ):
        self.config, self.launch = config, launch
        self.pods, self.service = list(pods), service
        self.context = {k: v for k, v in context.items() if k != "task_state_store"}
        self._ops: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.pods)

    def name(self, index: int) -> str:
        return self.pods[index].metadata.name

    def op(self, index: int) -> Any:
        if index not in self._ops:
            self._ops[index] = training_pod_operator(
                self.config, self.launch, self.pods[index], deferrable=True
            )
        return self._ops[index]

    def start(self) -> list[PodStep]:
        ensure_pod_identity(self.op(0).hook.core_v1_client, self.config)
        if self.service is not None:
            _ensure_service(self.op(0), self.service)
        return [self._drive(i, self._create_or_follow, ended=False) for i in range(len(self))]

    def phases(self) -> dict[str, dict[str, Any]]:
        """Every pod's phase now (``Gone`` for one the cluster no longer has), as the trigger
        reports them to ``conclude``."""
        from kubernetes.client.exceptions import ApiException

        out: dict[str, dict[str, Any]] = {}
        for index in range(len(self)):
            name = self.name(index)
            try:
                pod = self.op(index).hook.core_v1_client.read_namespaced_pod(name, self.config.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                out[name] = {"phase": "Gone", "exit_code": None}
                continue
            out[name] = {"phase": (pod.status.phase if pod.status else "") or "", "exit_code": None}
        return out

    def _create_or_follow(self, op: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            op.execute_async(self.context)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # The pod exists but an earlier try already followed it to its end (``already_checked``,
            # so the label search skipped it): follow it again for its exit status.
            logger.info("training pod %s already exists and has ended; reading its outcome", op.name)
            op.pod = op.hook.get_pod(op.name, self.config.namespace)
            op.invoke_defer_method(context=self.context)

    def conclude(
        self,
        status: Mapping[str, Mapping[str, Any]],
        record: Callable[[dict[str, dict[str, Any]]], None] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """End the attempt's pods from what ``AttemptPodsTrigger`` saw (pod name → phase, exit
        status): a succeeded pod is completed and deleted (cleanup); a failed or gone one is judged
        from the pod and its node (``judge_pod``) and kept for inspection; one still running or
        pending is deleted, since the attempt has ended with its peer. ``record`` gets every pod's
        end before any pod is deleted: a try that dies in between leaves the ends recorded, or
        the pods to judge again, never neither. Returns node index → ``end_dict``."""
        ends: dict[str, dict[str, Any]] = {}
        doomed = []
        failed = [n for n, p in status.items() if p.get("phase") in ("Failed", "Gone")]
        for index in range(len(self)):
            name = self.name(index)
            phase = (status.get(name) or {}).get("phase", "")
            if phase == "Succeeded":
                doomed.append(index)
                ends[str(index)] = end_dict(gke.PodEnd("completed", "exit status 0", 0))
            elif phase in ("Failed", "Gone"):
                ends[str(index)] = end_dict(self.judge(index))
            else:
                doomed.append(index)
                why = f"stopped: pod {failed[0]} ended first" if failed else f"stopped in phase {phase or '?'}"
                ends[str(index)] = end_dict(gke.PodEnd("failed", why, None))
                logger.warning("training pod %s %s", name, why)
        if record is not None:
            record(ends)
        for index in doomed:
            self._delete(index)
        return ends

    def give_up(
        self, why: str, record: Callable[[dict[str, dict[str, Any]]], None] | None = None
    ) -> dict[str, dict[str, Any]]:
        """End an attempt whose pods did not all start in time (no node came up for one): every
        pod is judged preempted without notice, ``why`` (the attempt trained nothing: torchrun
        waits for every node), ``record`` gets the ends, then every pod is deleted. Returns node
        index → ``end_dict``."""
        end = end_dict(gke.PodEnd("preempted", why, None, noticed=False))
        ends = {str(index): dict(end) for index in range(len(self))}
        if record is not None:
            record(ends)
        for index in range(len(self)):
            self._delete(index)
        return ends

    def _delete(self, index: int) -> None:
        _delete_pod(self.op(index).hook.core_v1_client, self.name(index), self.config.namespace)

    def _drive(self, index: int, action: Any, *, ended: bool) -> PodStep:
        """Run one provider step for a pod. An error is the pod's outcome when the pod has failed
        (its exit status; 1 when unreadable, e.g. gone with its reclaimed node, and ``ended``: the
        trigger said so), judged from the pod and its node (``judge_pod``); otherwise (API or
        config errors, a succeeded pod) it propagates, and Airflow's retry reattaches."""
        from airflow.sdk.exceptions import TaskDeferred

        op = self.op(index)
        try:
            action(op)
        except TaskDeferred as deferred:
            return PodStep(trigger=deferred.trigger)
        except Exception as exc:
            code = _ended_code(op)
            if _transient(exc) or code == 0 or (code is None and not ended):
                raise
            end = self.judge(index)
            logger.warning(
                "training pod %s ended with exit status %s (%s: %s): %s",
                self.name(index),
                code,
                end.outcome,
                end.reason,
                exc,
            )
            return PodStep(exit_code=1 if code is None else code, end=end)
        return PodStep(exit_code=0, end=gke.PodEnd("completed", "exit status 0", 0))

    def judge(self, index: int) -> gke.PodEnd:
        return judge_pod(
            self.op(index).hook.core_v1_client,
            self.config.namespace,
            self.name(index),
            spot=self.launch.placement.market == "spot",
        )


def end_dict(end: gke.PodEnd) -> dict[str, Any]:
    """A ``gke.PodEnd`` as JSON (the launch report's ``pods``)."""
    return {"outcome": end.outcome, "reason": end.reason, "noticed": end.noticed, "exit_code": end.exit_code}


def attempt_preemption(ends: Mapping[str, Mapping[str, Any]], at: float) -> dict[str, Any] | None:
    """The launch report's ``preemption`` for an attempt whose pods ended as ``ends`` (index →
    ``PodEnd`` as a dict): the first pod judged preempted decides (noticed or not, why); None when
    none was."""
    for index in sorted(ends, key=int):
        end = ends[index]
        if end.get("outcome") == "preempted":
            return {
                "noticed": bool(end.get("noticed")),
                "at": at,
                "reason": end.get("reason"),
                "node": int(index),
            }
    return None


KUBERNETES_VERSION = "1.30"
"""Kubernetes version the rendered manifests are validated against (GKE's oldest supported minor)."""


def render_run(
    params: Mapping[str, Any], settings: Any, run_id: str = "manual__render", state: Any = None
) -> dict[str, Any]:
    """What a ``backend=gke`` run of ``params`` would submit: the placement, the cluster and node
    pool bodies (validated by ``container_v1`` types) and the Kubernetes objects: the namespace
    and service account (created unless they exist), the pods as the operators build them and the
    rendezvous service (validated by ``kubernetes-validate`` for ``KUBERNETES_VERSION``). No cloud
    call is made.

    Raises:
        InvalidRequestError: bad params (names the field and the valid choices).
        kubernetes_validate.ValidationError: a manifest is not valid Kubernetes.
    """
    import kubernetes_validate

    from sailor_tasks import storage
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.model import ClusterState, run_key, to_dict
    from sailor_tasks.placement import plan
    from sailor_tasks.request import from_params

    notes = []
    if not settings.gcp_project:
        notes.append(
            f"no GCP project: none from {settings.gcp_project_source}, and SAILOR_GCP_PROJECT is unset; "
            f"rendered with project {RENDER_PROJECT!r}"
        )
        settings = dataclasses.replace(settings, gcp_project_override=RENDER_PROJECT)
    if storage.scheme_of(settings.bucket_uri("source")) != "gs":
        settings = dataclasses.replace(settings, bucket_template=gke.GCS_BUCKET_TEMPLATE)
        notes.append(f"SAILOR_BUCKET_TEMPLATE is not gs://; rendered with {gke.GCS_BUCKET_TEMPLATE}")
    catalog = load_catalog()
    request = from_params({**params, "backend": "gke"}, catalog)
    placement = plan(request, catalog, state or ClusterState(), run_id)
    config = gke.GkeConfig.from_env(settings)
    key = run_key(run_id)
    run_uri = paths.run_uri(placement.region, run_id, settings)
    launch = TrainLaunch(
        run_id, key, paths.train_config_uri(run_uri), request.num_workers, placement, image=request.image
    )
    train = TrainConfig(
        run_id=run_id,
        model=request.model,
        data_uri=paths.replica_uri(placement.region, request.dataset_uri, settings),
        output_uri=run_uri,
        total_steps=request.total_steps,
        checkpoint_every_steps=request.checkpoint_every_steps,
        seed=request.seed,
        batch_size=request.batch_size,
        learning_rate=request.learning_rate,
        command=request.command,
        env=dict(request.env),
    )
    cluster = gke.build_cluster_body(config, placement.region, placement.zone)
    node_pool = gke.build_node_pool_body(config, key, placement)
    gke.validate_cluster_body(cluster)
    gke.validate_node_pool_body(node_pool)
    pods = gke.build_training_pods(config, launch, train)
    service = gke.build_rendezvous_service(config, launch)
    manifests = [gke.serialize(gke.build_namespace(config)), gke.serialize(gke.build_service_account(config))]
    manifests += [render_pod(config, launch, pod) for pod in pods]
    if service is not None:
        manifests.append(gke.serialize(service))
    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    return {
        "placement": to_dict(placement),
        "cluster": {"parent": f"projects/{config.project}/locations/{placement.region}", "cluster": cluster},
        "node_pool": {"parent": config.cluster_path(placement.region), "node_pool": node_pool},
        "manifests": manifests,
        "kubernetes_version": KUBERNETES_VERSION,
        "grace_s": config.pod_grace_s(),
        "notes": notes,
    }
