"""Resolving ``pod/x``, ``deploy/x`` (or a bare pod name) to the pods to capture."""

from __future__ import annotations

from dataclasses import dataclass

from .client import Kube, KubeError, api_call

SIDECAR = "istio-proxy"
_KINDS = {"pod": "pod", "pods": "pod", "po": "pod", "deploy": "deployment", "deployment": "deployment",
          "deployments": "deployment"}


@dataclass(frozen=True, slots=True)
class Target:
    kind: str  # "pod" | "deployment"
    name: str

    @classmethod
    def parse(cls, text: str) -> "Target":
        """``pod/x``, ``deploy/x``, ``deployment/x`` or ``x`` (a pod). Raises ValueError on anything else."""
        kind, sep, name = text.partition("/")
        if not sep:
            kind, name = "pod", text
        if kind.lower() not in _KINDS or not name:
            raise ValueError(f'cannot capture "{text}": use pod/NAME or deploy/NAME')
        return cls(_KINDS[kind.lower()], name)


def resolve_pods(kube: Kube, target: Target, namespace: str):
    """The V1Pod objects ``target`` names, running ones first. Raises KubeError when there are none."""
    missing = f'{target.kind} "{target.name}" not found in namespace "{namespace}"'
    what = f"reading {target.kind}/{target.name}"
    if target.kind == "pod":
        return [api_call(kube, what, kube.core.read_namespaced_pod, target.name, namespace, not_found=missing)]
    dep = api_call(kube, what, kube.apps.read_namespaced_deployment, target.name, namespace, not_found=missing)
    labels = (dep.spec.selector.match_labels or {}) if dep.spec and dep.spec.selector else {}
    if not labels:
        raise KubeError(f"deployment/{target.name} has no matchLabels selector to find its pods")
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    pods = api_call(kube, f"listing the pods of deployment/{target.name}", kube.core.list_namespaced_pod,
                    namespace, label_selector=selector).items
    if not pods:
        raise KubeError(f"deployment/{target.name} has no pods in namespace \"{namespace}\"")
    return sorted(pods, key=lambda p: (p.status.phase != "Running", p.metadata.name))


def pods_by_selector(kube: Kube, selector: str, namespace: str):
    """Running pods matching a label selector (``-l app=reviews``). Raises KubeError when none match."""
    pods = api_call(kube, f"listing pods with -l {selector}", kube.core.list_namespaced_pod, namespace,
                    label_selector=selector).items
    running = [p for p in pods if p.status is not None and p.status.phase == "Running"]
    if not running:
        raise KubeError(f'no running pod matches -l {selector} in namespace "{namespace}"')
    return sorted(running, key=lambda p: p.metadata.name)


def sidecar_of(pod) -> object | None:
    """The istio-proxy container: in ``spec.containers`` (classic) or an init container (native sidecar)."""
    for c in list(pod.spec.containers or []) + list(pod.spec.init_containers or []):
        if c.name == SIDECAR:
            return c
    return None


def check_capturable(pod) -> None:
    """Raise KubeError unless the pod runs and has an Istio sidecar."""
    name = pod.metadata.name
    if pod.status is None or pod.status.phase != "Running":
        phase = pod.status.phase if pod.status else "unknown"
        raise KubeError(f"pod/{name} is {phase}, not Running: nothing to capture")
    node_os = (pod.spec.os.name if pod.spec.os else None) or (pod.spec.node_selector or {}).get("kubernetes.io/os")
    if node_os and node_os.lower() == "windows":
        raise KubeError(f"pod/{name} runs on a Windows node: the tcpdump debug container needs Linux")
    if sidecar_of(pod) is None:
        raise KubeError(f"pod/{name} has no {SIDECAR} container: not in the mesh (is sidecar injection on?)")


def capturable_pods(kube: Kube, target: Target | None, selector: str | None, namespace: str, max_pods: int) -> list:
    """The pods a watch captures: ``pod/x``, or every running pod of ``deploy/x`` / ``-l selector`` that has a
    sidecar (at most ``max_pods``). Raises KubeError when none can be captured (not found, not running, no
    sidecar: the first pod's reason) or when more than ``max_pods`` match."""
    pods = pods_by_selector(kube, selector, namespace) if selector else resolve_pods(kube, target, namespace)
    if len(pods) == 1 or target is not None and target.kind == "pod":
        check_capturable(pods[0])
        return pods[:1]
    capturable = []
    for pod in pods:
        try:
            check_capturable(pod)
            capturable.append(pod)
        except KubeError:
            pass
    if not capturable:
        check_capturable(pods[0])  # raises with the first pod's reason
    if len(capturable) > max_pods:
        raise KubeError(f"{len(capturable)} pods match; watch takes at most {max_pods} at once (narrow with -l)")
    return capturable
