"""What Istio's injector does with a pod's annotations once the pod template is in: the part of injection a
printed lint fix changes, applied to the lab's rendered (and patched) Pod, as a pod recreated with that template
would be injected.

- ``proxy.istio.io/config`` with ``holdApplicationUntilProxyStarts: true``: a classic istio-proxy first among the
  containers, with a postStart hook ``pilot-agent wait`` (istio/istio manifests/charts/istio-control/
  istio-discovery/files/injection-template.yaml). The lab then starts Envoy before the apps (lab.py).
- ``sidecar.istio.io/rewriteAppHTTPProbers`` true (Go's ParseBool: 1, t, T, TRUE, true, True): every app
  container's probes, and its preStop/postStart httpGet and tcpSocket handlers, pointed at pilot-agent on the
  status port (``status.sidecar.istio.io/port``, 15020), the originals kept in istio-proxy's
  ``ISTIO_KUBE_APP_PROBERS`` with named ports resolved to numbers (istio/istio pkg/kube/inject/app_probe.go:
  convertProbe, DumpAppProbers; pilot/cmd/pilot-agent/status/server.go: FormatProberURL). The lab's pods have
  no probes of their own, so this acts only on a probe a lint test patches in; without the annotation such a
  probe stays as written, as on a pod injected with the rewrite off.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from meshdoctor_lab.applied_fixes import PROXY_CONFIG, REWRITE_PROBES, holds_application

SIDECAR = "istio-proxy"
STATUS_PORT = 15020
STATUS_PORT_ANNOTATION = "status.sidecar.istio.io/port"
PROBES = (("readinessProbe", "/app-health/{}/readyz"), ("livenessProbe", "/app-health/{}/livez"),
          ("startupProbe", "/app-health/{}/startupz"))
HOOKS = (("preStop", "/app-lifecycle/{}/prestopz"), ("postStart", "/app-lifecycle/{}/poststartz"))
GO_TRUE, GO_FALSE = ("1", "t", "T", "TRUE", "true", "True"), ("0", "f", "F", "FALSE", "false", "False")


def _rewritten(handler: dict[str, Any], path: str, port: int) -> dict[str, Any] | None:
    """A probe or hook pointed at pilot-agent: httpGet keeps its other fields (host, headers) with HTTPS made
    HTTP; tcpSocket and grpc become a plain httpGet (rewriteHTTPGetAction)."""
    rest = {k: v for k, v in handler.items() if k not in ("httpGet", "tcpSocket", "grpc")}
    if isinstance(handler.get("httpGet"), dict):
        get = {**handler["httpGet"], "path": path, "port": port}
        if get.get("scheme") == "HTTPS":
            get["scheme"] = "HTTP"
        return {**rest, "httpGet": get}
    if isinstance(handler.get("tcpSocket"), dict) or isinstance(handler.get("grpc"), dict):
        return {**rest, "httpGet": {"path": path, "port": port, "scheme": "HTTP"}}
    return None


def _original(handler: dict[str, Any], ports: dict[str, int], status_port: int, probe: bool) -> dict | None:
    """What DumpAppProbers stores for one probe (or hook): its handler with a named port resolved, and a probe's
    timeoutSeconds; None for a handler it does not keep (a name no port has, one already on the status port)."""
    kind = next((k for k in ("httpGet", "tcpSocket", "grpc") if isinstance(handler.get(k), dict)), None)
    if kind is None or (kind == "grpc" and not probe):
        return None
    action = dict(handler[kind])
    if kind != "grpc":
        port = action.get("port")
        if isinstance(port, str) and not port.isdigit():
            if port not in ports:
                return None
            action["port"] = ports[port]
        elif port is not None and int(port) == status_port:
            return None
    out: dict[str, Any] = {kind: action}
    if probe:
        out["timeoutSeconds"] = handler.get("timeoutSeconds", 1)  # the API server's default
    return out


def _rewrite(spec: dict[str, Any], status_port: int) -> None:
    apps = [c for key in ("initContainers", "containers") for c in spec.get(key) or []
            if isinstance(c, dict) and c.get("name") != SIDECAR]
    proxy = next((c for key in ("containers", "initContainers") for c in spec.get(key) or []
                  if isinstance(c, dict) and c.get("name") == SIDECAR), None)
    if proxy is None:
        return
    probers: dict[str, Any] = {}
    for c in apps:
        ports = {p["name"]: p["containerPort"] for p in c.get("ports") or [] if p.get("name")}
        for kind, url in PROBES:
            if isinstance(c.get(kind), dict):
                path = url.format(c["name"])
                if (kept := _original(c[kind], ports, status_port, probe=True)) is not None:
                    probers[path] = kept
                if (new := _rewritten(c[kind], path, status_port)) is not None:
                    c[kind] = new
        hooks = c.get("lifecycle") or {}
        for hook, url in HOOKS:
            if isinstance(hooks.get(hook), dict) and "grpc" not in hooks[hook]:
                path = url.format(c["name"])
                if (kept := _original(hooks[hook], ports, status_port, probe=False)) is not None:
                    probers[path] = kept
                if (new := _rewritten(hooks[hook], path, status_port)) is not None:
                    hooks[hook] = new
    if probers:
        proxy.setdefault("env", []).append({"name": "ISTIO_KUBE_APP_PROBERS",
                                            "value": json.dumps(probers, separators=(",", ":"))})


def _hold(spec: dict[str, Any]) -> None:
    containers = spec.get("containers") or []
    at = next((i for i, c in enumerate(containers) if c.get("name") == SIDECAR), None)
    if at is None:
        return  # a native sidecar (an init container) starts first by design
    proxy = containers.pop(at)
    proxy["lifecycle"] = {**(proxy.get("lifecycle") or {}),
                          "postStart": {"exec": {"command": ["pilot-agent", "wait"]}}}
    containers.insert(0, proxy)


def inject(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` (a Pod object) with the injector's annotation-driven changes applied (a copy when any apply)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    hold = holds_application(annotations.get(PROXY_CONFIG, ""))
    rewrite = annotations.get(REWRITE_PROBES) in GO_TRUE
    if not (hold or rewrite):
        return pod
    pod = copy.deepcopy(pod)
    if rewrite:
        try:
            status_port = int(annotations.get(STATUS_PORT_ANNOTATION, STATUS_PORT))
        except ValueError:
            status_port = STATUS_PORT
        _rewrite(pod["spec"], status_port)
    if hold:
        _hold(pod["spec"])
    return pod
