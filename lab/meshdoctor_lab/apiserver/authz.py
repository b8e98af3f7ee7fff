"""Authorization reviews: SelfSubjectAccessReview (`kubectl auth can-i VERB RESOURCE`) and SelfSubjectRulesReview
(`kubectl auth can-i --list`), answered from the faults table's `deny` entries.

The lab's user is a cluster-admin (RBAC `*` on everything) unless a deny entry takes something away. RBAC rules
only ever add, so with denies the rules review cannot say "all but this": it then lists, per resource the lab
serves, the verbs that stay allowed (what a Role granting exactly that would show), and `incomplete: false`.
Shapes: k8s.io/api/authorization/v1 types.go (SelfSubjectRulesReviewStatus, ResourceRule, NonResourceRule).
"""

from __future__ import annotations

from typing import Any

from .faults import Faults

USER = "meshdoctor-lab"
API_VERSION = "authorization.k8s.io/v1"

# (group, resource[/subresource], verbs) the lab serves, as discovery.py lists them.
RESOURCES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "namespaces", ("get", "list")),
    ("", "pods", ("get", "list", "watch", "delete")),
    ("", "pods/attach", ("get", "create")),
    ("", "pods/ephemeralcontainers", ("get", "patch", "update")),
    ("", "pods/exec", ("get", "create")),
    ("", "pods/log", ("get",)),
    ("", "pods/portforward", ("get", "create")),
    ("apps", "deployments", ("get", "list", "watch")),
    ("authorization.k8s.io", "selfsubjectaccessreviews", ("create",)),
    ("authorization.k8s.io", "selfsubjectrulesreviews", ("create",)),
)


class ReviewError(ValueError):
    """The request body is not a review of the expected shape (the API answers 400)."""


def _spec(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
        raise ReviewError("the body of the request was in an unknown format")
    return body["spec"]


def access_review(faults: Faults, body: Any) -> dict[str, Any]:
    """The SelfSubjectAccessReview answer for `body`. Raises ReviewError."""
    spec = _spec(body)
    attrs = spec.get("resourceAttributes")
    if isinstance(attrs, dict):
        allowed = not faults.denied(
            str(attrs.get("verb", "")), str(attrs.get("resource", "")), str(attrs.get("subresource", "")),
            str(attrs.get("group", "")), str(attrs.get("namespace", "")), str(attrs.get("name", "")))
    else:
        allowed = True  # nonResourceAttributes: the lab's user may read every non-resource URL
    status: dict[str, Any] = {"allowed": allowed}
    if allowed:
        status["reason"] = ('RBAC: allowed by ClusterRoleBinding "meshdoctor-lab" of ClusterRole '
                            f'"cluster-admin" to User "{USER}"')
    return {"kind": "SelfSubjectAccessReview", "apiVersion": API_VERSION, "metadata": {"creationTimestamp": None},
            "spec": spec, "status": status}


def rules_review(faults: Faults, body: Any) -> dict[str, Any]:
    """The SelfSubjectRulesReview answer for `body` (spec.namespace). Raises ReviewError."""
    spec = _spec(body)
    namespace = str(spec.get("namespace") or "")
    if not faults.deny:
        rules: list[dict[str, Any]] = [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]
    else:
        rules = []
        for group, full, verbs in RESOURCES:
            resource, _, sub = full.partition("/")
            left = [v for v in verbs if not faults.denied(v, resource, sub, group, namespace)]
            if left:
                rules.append({"verbs": left, "apiGroups": [group], "resources": [full]})
    return {
        "kind": "SelfSubjectRulesReview", "apiVersion": API_VERSION, "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": {"resourceRules": rules, "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                   "incomplete": False},
    }
