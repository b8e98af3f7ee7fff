"""RBAC preflight: ask the API server (SelfSubjectAccessReview) for each verb a run needs, before touching the
pod, and name in one message what is missing with a Role that grants it.

WebSocket upgrades for exec and port-forward are authorized as ``get``, and since Kubernetes 1.35 also as
``create`` (feature gate AuthorizePodWebsocketUpgradeCreatePermission, kubernetes/kubernetes#134577): we
ask for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .client import Kube, KubeError


@dataclass(frozen=True, slots=True)
class Permission:
    verb: str
    resource: str
    subresource: str = ""
    required: bool = True  # without it the capture cannot run; otherwise only the Envoy side is lost
    why: str = ""

    def __str__(self) -> str:
        res = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {res}"


WATCH_PERMISSIONS = (
    Permission("get", "pods", why="read the pod and its containers"),
    Permission("patch", "pods", "ephemeralcontainers", why="add the meshdoctor debug container"),
    Permission("get", "pods", "exec", why="run tcpdump in the debug container (websocket)"),
    Permission("create", "pods", "exec", why="run tcpdump in the debug container"),
    Permission("get", "pods", "portforward", False, "read the sidecar's Envoy admin API (websocket)"),
    Permission("create", "pods", "portforward", False, "read the sidecar's Envoy admin API"),
    Permission("get", "pods", "log", False, "follow the istio-proxy access log"),
    Permission("list", "events", "", False, "quote the kubelet's events of the pod's containers (restarts)"),
)
EVENTS = WATCH_PERMISSIONS[-1]


def missing_permissions(kube: Kube, namespace: str, needed=WATCH_PERMISSIONS) -> list[Permission] | None:
    """The permissions the API server denies in ``namespace``; None when it cannot tell (SSAR not served or
    itself forbidden), in which case the run goes on and the first refusal speaks for itself."""
    api = k8s.AuthorizationV1Api(kube.api)
    missing = []
    for p in needed:
        body = k8s.V1SelfSubjectAccessReview(spec=k8s.V1SelfSubjectAccessReviewSpec(
            resource_attributes=k8s.V1ResourceAttributes(namespace=namespace, verb=p.verb, resource=p.resource,
                                                         subresource=p.subresource or None)))
        try:
            review = api.create_self_subject_access_review(body, _request_timeout=kube.request_timeout_s)
        except ApiException:
            return None
        except Exception:  # unreachable server: the next call reports it properly
            return None
        if not (review.status and review.status.allowed):
            missing.append(p)
    return missing


def role_yaml(namespace: str, permissions) -> str:
    """A Role (and the RoleBinding to fill in) granting ``permissions`` in ``namespace``."""
    by_resource: dict[str, list[str]] = {}
    for p in permissions:
        res = f"{p.resource}/{p.subresource}" if p.subresource else p.resource
        by_resource.setdefault(res, [])
        if p.verb not in by_resource[res]:
            by_resource[res].append(p.verb)
    rules = "\n".join(f"- apiGroups: [\"\"]\n  resources: [\"{res}\"]\n  verbs: [{', '.join(repr(v) for v in verbs)}]"
                      .replace("'", '"') for res, verbs in by_resource.items())
    return f"""apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: meshdoctor
  namespace: {namespace}
rules:
{rules}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: meshdoctor
  namespace: {namespace}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: meshdoctor
subjects:
- kind: User            # or Group / ServiceAccount
  name: <you>"""


def preflight(kube: Kube, namespace: str) -> list[str]:
    """Raise KubeError naming every missing permission and a Role that grants them when a required one is
    missing; return warnings (one line each) for missing optional ones."""
    missing = missing_permissions(kube, namespace)
    if not missing:
        return []
    required = [p for p in missing if p.required]
    if required:
        names = ", ".join(str(p) for p in missing)
        raise KubeError(f"missing RBAC in namespace {namespace}: {names}; this Role grants them:\n"
                        + role_yaml(namespace, missing))
    return [f"no permission to {p} ({p.why}): continuing without it" for p in missing]
