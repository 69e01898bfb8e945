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
