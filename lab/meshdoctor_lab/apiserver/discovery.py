"""Discovery documents (/version, /api, /apis, resource lists): minimal, in the real shapes."""

from __future__ import annotations

from typing import Any

VERSION: dict[str, Any] = {
    "major": "1",
    "minor": "30",
    "gitVersion": "v1.30.4",
    "gitCommit": "a51b3b711150f57ffc1f526a640ec058514ed596",
    "gitTreeState": "clean",
    "buildDate": "2024-08-14T19:04:36Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions(host: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
    }


def _group(name: str, version: str) -> dict[str, Any]:
    gv = {"groupVersion": f"{name}/{version}", "version": version}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


API_GROUPS: dict[str, Any] = {
    "kind": "APIGroupList",
    "apiVersion": "v1",
    "groups": [_group("apps", "v1"), _group("authorization.k8s.io", "v1")],
}


def _res(name: str, kind: str, verbs: list[str], namespaced: bool = True, short: list[str] | None = None,
         group: str | None = None, version: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": verbs}
    if group is not None:
        out["group"], out["version"] = group, version
    if short:
        out["shortNames"] = short
    return out


CORE_V1_RESOURCES: dict[str, Any] = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        {**_res("namespaces", "Namespace", ["get", "list"], namespaced=False, short=["ns"]),
         "singularName": "namespace"},
        {**_res("pods", "Pod", ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                short=["po"]), "singularName": "pod", "categories": ["all"]},
        {**_res("events", "Event", ["create", "delete", "deletecollection", "get", "list", "patch", "update",
                                    "watch"], short=["ev"]), "singularName": "event"},
        _res("pods/attach", "PodAttachOptions", ["create", "get"]),
        _res("pods/ephemeralcontainers", "Pod", ["get", "patch", "update"]),
        _res("pods/exec", "PodExecOptions", ["create", "get"]),
        _res("pods/log", "Pod", ["get"]),
        _res("pods/portforward", "PodPortForwardOptions", ["create", "get"]),
        _res("pods/status", "Pod", ["get", "patch", "update"]),
    ],
}

APPS_V1_RESOURCES: dict[str, Any] = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": "apps/v1",
    "resources": [
        {**_res("deployments", "Deployment",
                ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                short=["deploy"]), "singularName": "deployment", "categories": ["all"]},
    ],
}

AUTHORIZATION_V1_RESOURCES: dict[str, Any] = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": "authorization.k8s.io/v1",
    "resources": [
        {**_res("selfsubjectaccessreviews", "SelfSubjectAccessReview", ["create"], namespaced=False),
         "singularName": "selfsubjectaccessreview"},
        {**_res("selfsubjectrulesreviews", "SelfSubjectRulesReview", ["create"], namespaced=False),
         "singularName": "selfsubjectrulesreview"},
    ],
}
