"""The probe and restart rules: probe-port, restart-loop, probe-not-rewritten, over the app containers' probes
with Istio's rewrite to pilot-agent undone (istio/istio pkg/kube/inject/app_probe.go, the originals in
``ISTIO_KUBE_APP_PROBERS``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kubectl_meshdoctor.core.findings import Finding, Severity
from kubectl_meshdoctor.core.fixes import Fix, render

from .podview import ANN_PROXY_CONFIG, ANN_REWRITE, Container, PodView, json_key, placeholder, rule

RESTART_THRESHOLD = 3  # restartCount at or above which restart-loop reports
PROBE_KINDS = (("livenessProbe", "livez"), ("readinessProbe", "readyz"), ("startupProbe", "startupz"))
PROBE_HANDLERS = ("httpGet", "tcpSocket", "grpc")
PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"
# restart-loop reads restarts, not their cause: what it prints is where to look, then the usual change.
NOT_PROVEN = "# Not a fix the spec proves: the restarts' cause is in the logs and events; read them first.\n"


@dataclass(frozen=True, slots=True)
class Probe:
    container: Container
    kind: str  # livenessProbe | readinessProbe | startupProbe
    handler: str  # httpGet | tcpSocket | grpc
    port: object  # int or named port
    path: str  # spec path of the port read
    body: dict  # the (original) probe
    rewritten_from: str = ""  # "spec....httpGet.port = 15020 path /app-health/..." when undone
    missing_original: bool = False


def _handler(probe: dict) -> tuple[str, object] | None:
    for h in PROBE_HANDLERS:
        if isinstance(probe.get(h), dict):
            return h, probe[h].get("port")
    return None


def _probers(pv: PodView) -> tuple[dict, str]:
    if pv.sidecar is None:
        return {}, ""
    found = pv.env(pv.sidecar, PROBERS_ENV)
    if not found:
        return {}, ""
    try:
        data = json.loads(found[0])
    except ValueError:
        return {}, found[1]
    return (data if isinstance(data, dict) else {}), found[1]


def probes(pv: PodView) -> list[Probe]:
    """Every probe of the app containers, with Istio's rewrite to /app-health/<container>/<kind>z on the status
    port undone from istio-proxy's ISTIO_KUBE_APP_PROBERS (istio/istio pkg/kube/inject/app_probe.go)."""
    probers, probers_path = _probers(pv)
    out = []
    for c in pv.app_containers:
        for kind, short in PROBE_KINDS:
            probe = c.spec.get(kind)
            if not isinstance(probe, dict):
                continue
            h = _handler(probe)
            if h is None:
                continue  # exec probe: no port
            handler, port = h
            path = f"{c.path}.{kind}.{handler}.port"
            http_path = str((probe.get("httpGet") or {}).get("path", ""))
            if handler == "httpGet" and str(port) == str(pv.status_port) and http_path.startswith("/app-health/"):
                rewritten = f"{path} = {port} ({c.path}.{kind}.httpGet.path = {http_path})"
                original = probers.get(http_path)
                oh = _handler(original) if isinstance(original, dict) else None
                if oh is None:
                    if probers_path:
                        mpath = f"{probers_path}[{json_key(http_path)}]"
                    elif pv.sidecar is not None:
                        mpath = f"{pv.sidecar.path}.env[name={PROBERS_ENV}]"
                    else:
                        mpath = path
                    out.append(Probe(c, kind, handler, port, mpath, probe, rewritten, True))
                    continue
                ohandler, oport = oh
                out.append(Probe(c, kind, ohandler, oport, f"{probers_path}[{json_key(http_path)}].{ohandler}.port",
                                 original, rewritten))
            else:
                out.append(Probe(c, kind, handler, port, path, probe))
    return out


def _port_matches(c: Container, port) -> bool:
    """Whether ``port`` (a number or a name) is one the container declares; a declaration whose containerPort
    is not a number (a fix's placeholder left in) declares nothing."""
    for p in c.spec.get("ports") or []:
        number = p.get("containerPort")
        if not isinstance(number, int) or isinstance(number, bool):
            continue
        if isinstance(port, int) and number == port:
            return True
        if isinstance(port, str) and (p.get("name") == port or str(number) == port):
            return True
    return False


def _declared(c: Container) -> str:
    ports = c.spec.get("ports") or []
    return ", ".join(f"{p.get('name') or '-'}={p.get('containerPort')}" for p in ports) or "none"


@rule("probe-port", "error")
def probe_port(pv: PodView) -> list[Finding]:
    out = []
    for pr in probes(pv):
        c = pr.container
        ev = [pr.rewritten_from] if pr.rewritten_from else []
        if pr.missing_original:
            ev.append(f"{pr.path} = (absent)")
            out.append(pv.finding(
                "probe-port", Severity.ERROR,
                f"{pr.kind} of container {c.name} is rewritten to the Istio status port but "
                f"{PROBERS_ENV} has no original for it",
                pr.port, ev, pr.path,
                f"Istio's injector rewrites app probes to pilot-agent on {pv.status_port} "
                f"(/app-health/<container>/<kind>z) and stores the original in istio-proxy's {PROBERS_ENV} env "
                f"(istio/istio pkg/kube/inject/app_probe.go; pod_istio_sample.yaml). Here that entry is missing, so "
                f"pilot-agent has nothing to forward the kubelet's probe to and the probe fails: the container is "
                f"restarted (liveness) or never Ready (readiness). This happens when the probe was edited on the "
                f"pod after injection or copied from another pod.",
                render(fixes := (Fix(
                    "probe-original-form", f"write the {pr.kind} of {c.name} in its original form in the pod "
                                           f"template and let the injector rewrite it again",
                    "the whole mesh; pilot-agent forwards the kubelet's probe to the app again",
                    "the probe's original handler, path and port are not in the pod any more: the quoted "
                    "placeholders are yours to fill in (left in, the API server refuses the port); the pods are "
                    "recreated to apply it",
                    yaml=f"# pod template (spec.template of the Deployment), container {c.name}:\nspec:\n"
                         f"  containers:\n  - name: {c.name}\n    {pr.kind}:\n      httpGet:\n"
                         f"        path: {placeholder('the path the app answers the probe on')}\n"
                         f"        port: {placeholder('an app port: ' + _declared(c))}"),),
                       note=pv.recreate_note()),
                fixes=fixes, container=c.name, probe=pr.kind))
            continue
        if pr.port is None or _port_matches(c, pr.port):
            continue
        ports = c.spec.get("ports") or []
        ev.append(f"{pr.path} = {pr.port}")
        ev.append(f"{c.path}.ports[*].containerPort = {_declared(c)}")
        named = isinstance(pr.port, str)
        what = f'named port "{pr.port}"' if named else f"port {pr.port}"
        title = f"{pr.kind} of container {c.name} probes {what}, which the container does not declare"
        if named:
            consequence = ("Kubernetes resolves a named probe port only among the ports of the probed container; "
                           "with no such name the kubelet cannot even start the probe and counts it as failed")
        else:
            consequence = ("The port the kubelet (through pilot-agent when Istio rewrote the probe) connects to is "
                           "not one the container says it serves: almost always a stale or mistyped port, and "
                           "the probe gets connection refused")
        rewrite = (f" Istio had rewritten this probe to {pv.status_port}; the real target was read from "
                   f"istio-proxy's {PROBERS_ENV} (istio/istio pkg/kube/inject/app_probe.go).") if pr.rewritten_from \
            else ""
        explanation = (f"{consequence}.{rewrite} A failing livenessProbe restarts {c.name} (see restart-loop), a "
                       f"failing readinessProbe keeps the pod out of its Services' endpoints, a failing "
                       f"startupProbe does both. Declared ports of {c.name}: {_declared(c)}.")
        first = ports[0] if ports else None
        handler_yaml = f"      {pr.handler}:\n"
        if pr.handler == "httpGet":
            handler_yaml += f"        path: {(pr.body.get('httpGet') or {}).get('path', '/')}\n"
        if first is not None:
            fix_port = first.get("name") if named and first.get("name") else first.get("containerPort")
            handler_yaml += f"        port: {fix_port}   # was {pr.port}; declared: {_declared(c)}"
        else:
            fix_port = placeholder("the port the app serves the probe on")
            handler_yaml += f"        port: {fix_port}"
        decl_name = pr.port if named else f"probe-{pr.port}"
        decl_num = placeholder(f"the number of port {pr.port}") if named else pr.port
        template = f"# pod template (spec.template of the Deployment), container {c.name}:\nspec:\n  containers:\n"
        fixes = (
            Fix("probe-declared-port", f"point the {pr.kind} of {c.name} at a port it declares ({fix_port})",
                "the whole mesh; the probe is in its original form, which Istio rewrites again at injection",
                "nothing, if the app serves the probe on that port; the pods are recreated to apply it",
                yaml=template + f"  - name: {c.name}\n    {pr.kind}:\n{handler_yaml}"),
            Fix("declare-probe-port", f"declare the port the app really serves the probe on ({decl_num})",
                "the whole mesh",
                "a declared port is captured by the sidecar too (under REDIRECT it shares the inbound listener: "
                "see redirect-exposure); the pods are recreated to apply it",
                yaml=template + f"  - name: {c.name}\n    ports:\n    - containerPort: {decl_num}\n"
                                f"      name: {decl_name}\n      protocol: TCP"),
        )
        remediation = render(fixes, note=pv.recreate_note())
        out.append(pv.finding("probe-port", Severity.ERROR, title, pr.port if not named else None, ev, pr.path,
                              explanation, remediation, fixes=fixes, container=c.name, probe=pr.kind,
                              port=pr.port))
    return out


@rule("restart-loop", "error, warning")
def restart_loop(pv: PodView) -> list[Finding]:
    out = []
    specs = {c.name: c for c in [*pv.containers, *pv.init_containers]}
    for name, (st, spath) in pv.statuses.items():
        count = st.get("restartCount") or 0
        if count < RESTART_THRESHOLD:
            continue
        term = (st.get("lastState") or {}).get("terminated") or {}
        code, reason = term.get("exitCode"), str(term.get("reason") or "")
        waiting = ((st.get("state") or {}).get("waiting") or {}).get("reason")
        c = specs.get(name)
        liveness = c is not None and isinstance(c.spec.get("livenessProbe"), dict)
        ev = [f"{spath}.restartCount = {count}"]
        if term:
            ev.append(f"{spath}.lastState.terminated.exitCode = {code}")
            ev.append(f"{spath}.lastState.terminated.reason = {reason or '(none)'}")
        if waiting:
            ev.append(f"{spath}.state.waiting.reason = {waiting}")
        path = f"{spath}.lastState.terminated" if term else f"{spath}.restartCount"
        if reason == "OOMKilled":
            sev, cause = Severity.ERROR, "oom"
            title = f"container {name} restarted {count} times, last killed for memory (OOMKilled, exit {code})"
            explanation = (f"The kernel OOM killer ended {name} at its memory limit (reason OOMKilled, exit code 137 "
                           f"= 128+SIGKILL). That is memory, not probes: raising probe timeouts will not help. "
                           f"Limits: {json.dumps((c.spec.get('resources') or {}).get('limits', {})) if c else '?'}.")
            remediation = (f"{NOT_PROVEN}# If the working set needs more, in the pod template:\n"
                           f"spec:\n  containers:\n  - name: {name}\n    resources:\n      limits:\n"
                           f"        memory: <above the working set seen in `kubectl top pod {pv.name} "
                           f"--containers`>")
        elif liveness and code in (137, 143) and reason != "Completed":
            sev, cause = Severity.ERROR, "liveness"
            title = (f"container {name} restarted {count} times, killed by the kubelet (exit {code}): "
                     f"failed liveness probe")
            explanation = (f"{name} ended with exit code {code} ({'SIGKILL' if code == 137 else 'SIGTERM'}) and reason "
                           f"{reason or 'none'}, not OOMKilled: the signature of the kubelet killing it after its "
                           f"livenessProbe failed failureThreshold times (SIGTERM, SIGKILL after the grace period). "
                           f"With Istio the probe goes through pilot-agent on {pv.status_port} "
                           f"(/app-health/{name}/livez) to the port in {PROBERS_ENV}; check probe-port findings, "
                           f"and confirm with `kubectl get events -n {pv.namespace} --field-selector "
                           f"involvedObject.name={pv.name}` ('Liveness probe failed'). Pod spec and status alone "
                           f"cannot prove the event.")
            remediation = (f"{NOT_PROVEN}# If the events show 'Liveness probe failed', give the app time to start and "
                           f"slack under load\n# (pod template, original probe form):\n"
                           f"spec:\n  containers:\n  - name: {name}\n    startupProbe:   # same handler as the "
                           f"livenessProbe\n      failureThreshold: 30\n      periodSeconds: 2\n    livenessProbe:\n"
                           f"      timeoutSeconds: 3\n      failureThreshold: 5")
        else:
            sev, cause = Severity.WARNING, "other"
            detail = f"exit code {code}, reason {reason or 'none'}" if term else "no lastState.terminated recorded"
            title = f"container {name} restarted {count} times ({detail})"
            explanation = (f"{name} keeps restarting but the status does not point at probes ({detail}; a liveness "
                           f"kill shows exit 137/143 with a livenessProbe, a memory kill shows OOMKilled). An "
                           f"app exiting on its own often means a start-up call failed: with a classic sidecar "
                           f"the app can start before Envoy is ready (see hold-application). Read "
                           f"`kubectl logs {pv.name} -c {name} --previous -n {pv.namespace}`.")
            remediation = (f"{NOT_PROVEN}kubectl logs {pv.name} -c {name} --previous -n {pv.namespace}\n"
                           f"# if it fails calling out at start-up, hold it until the sidecar is ready "
                           f"(hold-application):\n"
                           f"metadata:\n  annotations:\n    {ANN_PROXY_CONFIG}: |\n"
                           f"      holdApplicationUntilProxyStarts: true")
        out.append(pv.finding("restart-loop", sev, title, None, ev, path, explanation, remediation,
                              container=name, restarts=count, exit_code=code, reason=reason, cause=cause))
    return out


@rule("probe-not-rewritten", "warning")
def probe_not_rewritten(pv: PodView) -> list[Finding]:
    """A probe the kubelet sends straight to a captured app port: Istio did not rewrite it to pilot-agent."""
    if pv.sidecar is None or pv.capture.mode == "NONE":
        return []
    out = []
    for pr in probes(pv):
        if pr.rewritten_from or pr.missing_original:
            continue
        port = pr.port
        if isinstance(port, str):
            num = next((p.get("containerPort") for p in pr.container.spec.get("ports") or []
                        if p.get("name") == port), None)
        else:
            num = port
        if not isinstance(num, int) or not pv.capture.captured(num):
            continue
        flag = pv.annotations.get(ANN_REWRITE)
        ev = [f"{pr.path} = {port}", *pv.capture_evidence(),
              f"metadata.annotations[{json_key(ANN_REWRITE)}] = {flag if flag is not None else '(absent)'}"]
        effect = ("Envoy accepts the TCP connection itself, so the probe passes even when the app is down"
                  if pr.handler == "tcpSocket" else
                  "the kubelet's plaintext request meets Envoy's inbound listener, which under STRICT mTLS "
                  "(PeerAuthentication) rejects it, so the probe fails although the app is healthy")
        out.append(pv.finding(
            "probe-not-rewritten", Severity.WARNING,
            f"{pr.kind} of container {pr.container.name} goes straight to captured port {num}, through Envoy",
            num, ev, pr.path,
            f"Port {num} is captured by the sidecar ({pv.capture.path}), and this {pr.handler} probe was not "
            f"rewritten to pilot-agent's /app-health/{pr.container.name}/... on {pv.status_port}: {effect}. Istio "
            f"rewrites probes by default (sidecar.istio.io/rewriteAppHTTPProbers, istio/istio "
            f"pkg/kube/inject/app_probe.go); it was off when this pod was injected, or the probe was changed after.",
            render(fixes := (Fix(
                "rewrite-probes", f"let the injector rewrite the probe to pilot-agent on {pv.status_port}",
                "the whole mesh; the kubelet's probe reaches the app through pilot-agent, around Envoy, and says "
                "whether the app is up",
                "the pods are recreated to apply it",
                annotations=((ANN_REWRITE, "true"),)),), note=pv.recreate_note()),
            fixes=fixes, container=pr.container.name, probe=pr.kind, port=num))
    return out
