"""What Istio's injector does with a pod's annotations once the pod template is in: the part of injection a
printed lint fix changes, applied to the lab's rendered (and patched) Pod, as a pod recreated with that template
would be injected.

- ``proxy.istio.io/config`` with ``holdApplicationUntilProxyStarts: true``: istio-proxy first among the
  containers, with a postStart hook ``pilot-agent wait`` (istio/istio manifests/charts/istio-control/
  istio-discovery/files/injection-template.yaml). The lab then starts Envoy before the apps (lab.py).
- ``sidecar.istio.io/rewriteAppHTTPProbers: "true"``: each app container's httpGet, tcpSocket and grpc probe
  rewritten to pilot-agent's ``/app-health/<container>/<kind>z`` on the status port, the original kept in
  istio-proxy's ``ISTIO_KUBE_APP_PROBERS`` (istio/istio pkg/kube/inject/app_probe.go). The lab's pods have no
  probes of their own, so this acts only on a probe a lint test patches in; without the annotation such a probe
  stays as written, as on a pod injected with the rewrite off.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from kubectl_meshdoctor.lab.fixes import PROXY_CONFIG, REWRITE_PROBES, holds_application

SIDECAR = "istio-proxy"
STATUS_PORT = 15020
PROBES = (("livenessProbe", "livez"), ("readinessProbe", "readyz"), ("startupProbe", "startupz"))
HANDLERS = ("httpGet", "tcpSocket", "grpc")


def _hold(spec: dict[str, Any]) -> None:
    containers = spec.get("containers") or []
    at = next((i for i, c in enumerate(containers) if c.get("name") == SIDECAR), None)
    if at is None:
        return
    proxy = containers.pop(at)
    proxy["lifecycle"] = {"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}}
    containers.insert(0, proxy)


def _rewrite(spec: dict[str, Any]) -> None:
    containers = spec.get("containers") or []
    proxy = next((c for c in containers if c.get("name") == SIDECAR), None)
    if proxy is None:
        return
    probers: dict[str, Any] = {}
    for c in containers:
        if c is proxy:
            continue
        for kind, short in PROBES:
            probe = c.get(kind)
            handler = next((h for h in HANDLERS if isinstance((probe or {}).get(h), dict)), None)
            if handler is None:
                continue
            path = f"/app-health/{c['name']}/{short}"
            probers[path] = {handler: probe[handler], "timeoutSeconds": probe.get("timeoutSeconds", 1)}
            c[kind] = {**{k: v for k, v in probe.items() if k not in HANDLERS},
                       "httpGet": {"path": path, "port": STATUS_PORT, "scheme": "HTTP"}}
    if probers:
        proxy.setdefault("env", []).append({"name": "ISTIO_KUBE_APP_PROBERS",
                                            "value": json.dumps(probers, separators=(",", ":"))})


def inject(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` (a Pod object) with the injector's annotation-driven changes applied (a copy when any apply)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    hold = holds_application(annotations.get(PROXY_CONFIG, ""))
    rewrite = annotations.get(REWRITE_PROBES) == "true"
    if not (hold or rewrite):
        return pod
    pod = copy.deepcopy(pod)
    if rewrite:
        _rewrite(pod["spec"])
    if hold:
        _hold(pod["spec"])
    return pod
