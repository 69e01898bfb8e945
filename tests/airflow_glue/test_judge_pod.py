"""How a training pod ended, read from the Kubernetes API (pod, then its node) by ``judge_pod``."""

from __future__ import annotations

import pytest
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from sailor_tasks.airflow_glue.gcp import judge_pod
from sailor_tasks.backends.gke import CONTAINER_NAME, IMPENDING_TERMINATION_TAINT

pytestmark = pytest.mark.gke


class Core:
    """``read_namespaced_pod``/``read_node`` answering from dicts; an int answer is an API error."""

    def __init__(self, pods, nodes):
        self.pods, self.nodes = pods, nodes

    def _answer(self, table, name):
        value = table.get(name, 404)
        if isinstance(value, int):
            raise ApiException(status=value, reason="fake")
        return value

    def read_namespaced_pod(self, name, namespace):
        return self._answer(self.pods, name)

    def read_node(self, name):
        return self._answer(self.nodes, name)


def _pod(code, node="n1"):
    state = k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=code))
    status = k8s.V1ContainerStatus(name=CONTAINER_NAME, image="i", image_id="", ready=False, restart_count=0, state=state)
    return k8s.V1Pod(
        spec=k8s.V1PodSpec(containers=[], node_name=node),
        status=k8s.V1PodStatus(phase="Failed", container_statuses=[status]),
    )


def _node(*taints):
    return k8s.V1Node(spec=k8s.V1NodeSpec(taints=[k8s.V1Taint(key=t, effect="NoSchedule") for t in taints]))


def test_the_pod_and_its_node_decide():
    core = Core(
        pods={"reclaimed": _pod(1), "orphan": _pod(1, node="gone"), "bug": _pod(1), "no-rbac": _pod(1, node="secret")},
        nodes={"n1": _node(), "secret": 403},
    )
    assert judge_pod(core, "sailor", "vanished", spot=True).outcome == "preempted"  # pod 404
    assert judge_pod(core, "sailor", "orphan", spot=True).reason == "node gone"  # node 404
    assert judge_pod(core, "sailor", "bug", spot=True).outcome == "failed"
    assert judge_pod(core, "sailor", "no-rbac", spot=True).outcome == "failed"  # judged from the pod alone
    core.nodes["n1"] = _node(IMPENDING_TERMINATION_TAINT)
    end = judge_pod(core, "sailor", "reclaimed", spot=True)
    assert end.outcome == "preempted" and IMPENDING_TERMINATION_TAINT in end.reason and not end.noticed


def test_an_api_error_reading_the_pod_is_not_an_answer():
    with pytest.raises(ApiException):
        judge_pod(Core(pods={"p": 500}, nodes={}), "sailor", "p", spot=True)


# --- following the pods inline (stages.train outside the deferrable operator) ------------------


class LivePods(Core):
    """Pods that run until the test ends them or they are deleted (``delete_namespaced_pod``)."""

    def __init__(self):
        import threading

        super().__init__(pods={}, nodes={"n1": _node()})
        self.ended: dict[str, threading.Event] = {}
        self.deleted: list[str] = []

    def delete_namespaced_pod(self, name, namespace):
        self.deleted.append(name)
        self.pods.pop(name, None)
        self.ended[name].set()


class PodOperator:
    """What ``follow_pods`` uses of a GKEStartPodOperator: ``execute`` blocks while the pod runs
    and raises when it failed or was deleted (as the provider's does)."""

    def __init__(self, core: LivePods, name: str):
        import threading

        self.name, self.pod = name, name
        self.hook = type("Hook", (), {"core_v1_client": core})()
        self.pod_manager = type("PM", (), {"read_pod": lambda _, pod: core.read_namespaced_pod(pod, "sailor")})()
        core.pods[name] = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[], node_name="n1"), status=k8s.V1PodStatus(phase="Running"))
        core.ended[name] = threading.Event()
        self.core = core

    def execute(self, context):
        assert self.core.ended[self.name].wait(30), f"{self.name} was never ended"
        pod = self.core.pods.get(self.name)
        if pod is None or pod.status.phase != "Succeeded":
            raise RuntimeError(f"pod {self.name} failed")


def _follow(tmp_path, ending):
    """Three pods; ``ending(core, names)`` ends some of them; returns (exit status, report, core)."""
    import threading

    from sailor_tasks import paths, storage
    from sailor_tasks.airflow_glue.gcp import follow_pods
    from sailor_tasks.backends import TrainLaunch
    from sailor_tasks.backends.gke import GkeConfig
    from tests.backends.test_gke import _placement

    core = LivePods()
    names = [f"sailor-x-a1-node-{i}" for i in range(3)]
    ops = [PodOperator(core, n) for n in names]
    run_uri = f"file://{tmp_path}/run"
    launch = TrainLaunch("r", "r", f"{run_uri}/train_config.json", 3, _placement("L4", 1, 3))
    threading.Timer(0.2, ending, (core, names)).start()
    code = follow_pods(GkeConfig(project="p"), launch, ops, {})
    return code, storage.read_json(paths.launch_report_uri(run_uri)), core


def test_a_failed_pod_stops_its_peers_and_is_judged(tmp_path):
    def node1_fails(core, names):
        core.pods[names[1]] = _pod(3)
        core.ended[names[1]].set()

    code, report, core = _follow(tmp_path, node1_fails)
    assert code == 3 and sorted(core.deleted) == [f"sailor-x-a1-node-{i}" for i in (0, 2)]
    assert report["pods"]["1"]["outcome"] == "failed" and report["pods"]["0"]["reason"].startswith("stopped")
    assert "preemption" not in report


def test_a_pod_gone_with_its_node_makes_the_attempt_a_preemption(tmp_path):
    def node2_reclaimed(core, names):
        del core.pods[names[2]]
        core.ended[names[2]].set()

    code, report, core = _follow(tmp_path, node2_reclaimed)
    assert code == 1 and sorted(core.deleted) == [f"sailor-x-a1-node-{i}" for i in (0, 1)]
    assert report["preemption"]["node"] == 2 and report["preemption"]["noticed"] is False


def test_succeeded_pods_are_deleted_once_their_ends_are_recorded(tmp_path):
    def every_node_succeeds(core, names):
        for name in names:
            core.pods[name] = k8s.V1Pod(
                spec=k8s.V1PodSpec(containers=[], node_name="n1"), status=k8s.V1PodStatus(phase="Succeeded")
            )
            core.ended[name].set()

    code, report, core = _follow(tmp_path, every_node_succeeds)
    assert code == 0 and sorted(core.deleted) == [f"sailor-x-a1-node-{i}" for i in range(3)]
    assert {end["outcome"] for end in report["pods"].values()} == {"completed"}
