"""Resolving ``pod/x``, ``deploy/x`` (or a bare pod name) to the pods to capture."""

from __future__ import annotations

from collections.abc import Sequence
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
    read = kube.core.read_namespaced_pod if target.kind == "pod" else kube.apps.read_namespaced_deployment
    try:
        found = api_call(kube, what, read, target.name, namespace, not_found=missing)
    except KubeError as e:
        if str(e) == missing and not _namespace_exists(kube, namespace):
            raise KubeError(f'namespace "{namespace}" not found (looking for {target.kind}/{target.name}; '
                            "kubectl get namespaces lists them)") from None
        raise
    if target.kind == "pod":
        return [found]
    dep = found
    labels = (dep.spec.selector.match_labels or {}) if dep.spec and dep.spec.selector else {}
    if not labels:
        raise KubeError(f"deployment/{target.name} has no matchLabels selector to find its pods")
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    pods = api_call(kube, f"listing the pods of deployment/{target.name}", kube.core.list_namespaced_pod,
                    namespace, label_selector=selector).items
    if not pods:
        raise KubeError(f"deployment/{target.name} has no pods in namespace \"{namespace}\"")
    return sorted(pods, key=lambda p: (p.status.phase != "Running", p.metadata.name))


def _namespace_exists(kube: Kube, namespace: str) -> bool:
    """False only when the API server says the namespace does not exist (404); True when it does, or cannot
    be asked (reading namespaces is cluster-scoped, and often not granted)."""
    try:
        api_call(kube, f"reading namespace {namespace}", kube.core.read_namespace, namespace, not_found="absent")
    except KubeError as e:
        return str(e) != "absent"
    return True


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


def parse_targets(args: Sequence[str]) -> tuple[Target, ...]:
    """The pods and deployments a command names, in kubectl's forms: ``pod/a deploy/b`` (each KIND/NAME, a bare
    NAME being a pod) or ``pods a b`` (a kind, then names of that kind). Each once, in the order given. Raises
    ValueError on an unknown kind, a kind word alone, or a kind word followed by a KIND/NAME (kubectl refuses
    that mix too)."""
    if len(args) == 1 and args[0].lower() in _KINDS:  # `watch pods`: kubectl would list them; we need a name
        raise ValueError(f'"{args[0]}" names a kind but no {args[0]}: give at least one ({args[0]} NAME..., '
                         f'{args[0]}/NAME, or -l SELECTOR)')
    if len(args) > 1 and "/" not in args[0] and args[0].lower() in _KINDS:
        if any("/" in name for name in args[1:]):
            raise ValueError(f'"{args[0]}" names a kind, so the names after it take no KIND/ of their own '
                             f'(use {args[0]} NAME... or KIND/NAME...)')
        return tuple(dict.fromkeys(Target.parse(f"{args[0]}/{name}") for name in args[1:]))
    return tuple(dict.fromkeys(Target.parse(arg) for arg in args))


def describe_targets(targets: Sequence[Target], selector: str | None) -> str:
    """``-l app=x`` or ``pod/a deployment/b``: what the user asked for, to name it in progress and errors."""
    return f"-l {selector}" if selector else " ".join(f"{t.kind}/{t.name}" for t in targets)


def _capturable_of(kube: Kube, target: Target, namespace: str) -> list:
    """A named pod, which must be capturable, or the capturable pods of a deployment (the first pod's reason
    raised when it has none)."""
    pods = resolve_pods(kube, target, namespace)
    if len(pods) == 1 or target.kind == "pod":
        check_capturable(pods[0])
        return pods[:1]
    return _only_capturable(pods)


def _only_capturable(pods: list) -> list:
    capturable = []
    for pod in pods:
        try:
            check_capturable(pod)
            capturable.append(pod)
        except KubeError:
            pass
    if not capturable:
        check_capturable(pods[0])  # raises with the first pod's reason
    return capturable


def capturable_pods(kube: Kube, targets: Sequence[Target], selector: str | None, namespace: str,
                    max_pods: int) -> list:
    """The pods a watch captures: each ``pod/x`` named, and every running pod of each ``deploy/x`` (or of
    ``-l selector``) that has a sidecar; each pod once, at most ``max_pods``. Raises KubeError when a named pod
    cannot be captured (not found, not running, no sidecar), when a deployment or selector has no pod that can
    (its first pod's reason), or when more than ``max_pods`` match."""
    if selector:
        pods = pods_by_selector(kube, selector, namespace)
        chosen = pods[:1] if len(pods) == 1 else _only_capturable(pods)
        if len(pods) == 1:
            check_capturable(pods[0])
    else:
        chosen = [pod for target in targets for pod in _capturable_of(kube, target, namespace)]
    unique = list({pod.metadata.name: pod for pod in chosen}.values())
    if len(unique) > max_pods:
        raise KubeError(f"{len(unique)} pods match; watch takes at most {max_pods} at once (narrow with -l)")
    return unique
