import pytest
from kubernetes import client as k8s

from kubectl_meshdoctor.kube.client import KubeError
from kubectl_meshdoctor.kube.target import Target, check_capturable, parse_targets


def pod(phase="Running", containers=("app", "istio-proxy"), init=(), os_name=None, selector=None):
    c = [k8s.V1Container(name=n) for n in containers]
    ic = [k8s.V1Container(name=n, restart_policy="Always") for n in init]
    return k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="p", namespace="ns"),
                     spec=k8s.V1PodSpec(containers=c, init_containers=ic, node_selector=selector,
                                        os=k8s.V1PodOS(name=os_name) if os_name else None),
                     status=k8s.V1PodStatus(phase=phase))


def test_capturable_pods():
    check_capturable(pod())
    check_capturable(pod(containers=("app",), init=("istio-proxy",)))  # native sidecar


@pytest.mark.parametrize("p, needle", [
    (pod(phase="Pending"), "is Pending, not Running"),
    (pod(containers=("app",)), "no istio-proxy container"),
    (pod(os_name="windows"), "Windows node"),
    (pod(selector={"kubernetes.io/os": "windows"}), "Windows node"),
])
def test_refused_pods(p, needle):
    with pytest.raises(KubeError, match=needle):
        check_capturable(p)


@pytest.mark.parametrize("text, kind, name", [("pod/a", "pod", "a"), ("deploy/b", "deployment", "b"),
                                              ("po/c", "pod", "c"), ("d", "pod", "d")])
def test_targets(text, kind, name):
    assert Target.parse(text) == Target(kind, name)


@pytest.mark.parametrize("args, expected", [
    (["pod/a", "pod/b"], [("pod", "a"), ("pod", "b")]),
    (["pods", "a", "b"], [("pod", "a"), ("pod", "b")]),  # kubectl's TYPE NAME... form
    (["deploy", "web"], [("deployment", "web")]),
    (["a", "deploy/web", "pod/a"], [("pod", "a"), ("deployment", "web")]),  # each once, in the order given
    (["pod/pods"], [("pod", "pods")]),  # a pod named after a kind: by KIND/NAME
])
def test_several_targets(args, expected):
    assert parse_targets(args) == tuple(Target(k, n) for k, n in expected)


@pytest.mark.parametrize("args", [["pods", "pod/a"], ["pod/a", "svc/b"], ["pods", ""], ["pods"], ["deploy"], ["po"]])
def test_several_targets_refused(args):
    """A kind word alone names no pod (the new-user trial's `watch pods` was told pod "pods" was not found)."""
    with pytest.raises(ValueError) as e:
        parse_targets(args)
    assert "\n" not in str(e.value)
