"""Static lint rules over one Pod object (API JSON, camelCase): what can be seen wrong before any packet flows.

Every rule is a function ``(PodView) -> list[Finding]`` registered under a stable id (DESIGN.md "Detector ids"):
the finding's ``detector`` is that id, its evidence quotes the spec path read and its value
(``spec.containers[0].ports[1].containerPort = 5002``), ``details["path"]`` holds the deciding path, and the
remediation is YAML (or commands) that can be pasted.

Sources for the Istio behaviour relied on: istio/istio tools/istio-iptables/pkg/capture/run.go and the
injection template's annotation -> flag mapping, and istio/istio pkg/kube/inject (probe rewrite to the
pilot-agent status port with the originals in ``ISTIO_KUBE_APP_PROBERS``, classic and native sidecar layouts).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import yaml

from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity

from ..istio.redirect import PodCapture, capture_from_pod

SIDECAR = "istio-proxy"
STATUS_PORT = 15020  # pilot-agent status port; status.sidecar.istio.io/port changes it
RESTART_THRESHOLD = 3  # restartCount at or above which restart-loop reports
PROBE_KINDS = (("livenessProbe", "livez"), ("readinessProbe", "readyz"), ("startupProbe", "startupz"))
PROBE_HANDLERS = ("httpGet", "tcpSocket", "grpc")
PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"

ANN_EXCLUDE = "traffic.sidecar.istio.io/excludeInboundPorts"
ANN_INCLUDE = "traffic.sidecar.istio.io/includeInboundPorts"
ANN_MODE = "sidecar.istio.io/interceptionMode"
ANN_PROXY_CONFIG = "proxy.istio.io/config"
ANN_STATUS = "sidecar.istio.io/status"
ANN_REWRITE = "sidecar.istio.io/rewriteAppHTTPProbers"
ISTIO_OWN_EXCLUDES = {15090, 15021, 15020, 15008}


# ---------------------------------------------------------------------------------------------------- the pod


@dataclass(frozen=True, slots=True)
class Container:
    spec: dict
    path: str  # "spec.containers[0]" or "spec.initContainers[1]"

    @property
    def name(self) -> str:
        return str(self.spec.get("name", ""))

    @property
    def restartable_init(self) -> bool:
        return self.path.startswith("spec.initContainers") and self.spec.get("restartPolicy") == "Always"


@dataclass(frozen=True, slots=True)
class AppPort:
    port: int
    name: str
    container: str
    path: str  # "spec.containers[0].ports[1].containerPort"


def _q(key: str) -> str:
    return json.dumps(key)


class PodView:
    """The parts of a Pod the rules read, each with its spec path."""

    def __init__(self, pod: dict) -> None:
        self.pod = pod
        self.meta = pod.get("metadata") or {}
        self.spec = pod.get("spec") or {}
        self.status = pod.get("status") or {}
        self.name = str(self.meta.get("name") or "?")
        self.namespace = str(self.meta.get("namespace") or "default")
        self.ip = str(self.status.get("podIP") or self.name)
        self.source = f"pod/{self.name}"
        self.annotations: dict = self.meta.get("annotations") or {}
        self.labels: dict = self.meta.get("labels") or {}
        self.containers = [Container(c, f"spec.containers[{i}]")
                           for i, c in enumerate(self.spec.get("containers") or [])]
        self.init_containers = [Container(c, f"spec.initContainers[{i}]")
                                for i, c in enumerate(self.spec.get("initContainers") or [])]
        classic = next((c for c in self.containers if c.name == SIDECAR), None)
        native = next((c for c in self.init_containers if c.name == SIDECAR and c.restartable_init), None)
        self.sidecar: Container | None = classic or native
        self.native = classic is None and native is not None
        # containers that run next to the sidecar and may serve traffic and carry probes
        self.app_containers = [c for c in self.containers if c.name != SIDECAR] + \
                              [c for c in self.init_containers if c.restartable_init and c.name != SIDECAR]
        self.statuses: dict[str, tuple[dict, str]] = {}
        for key in ("initContainerStatuses", "containerStatuses"):
            for i, st in enumerate(self.status.get(key) or []):
                self.statuses[str(st.get("name"))] = (st, f"status.{key}[{i}]")
        self.capture: PodCapture = capture_from_pod(pod)
        try:
            self.status_port = int(self.annotations.get("status.sidecar.istio.io/port", STATUS_PORT))
        except ValueError:
            self.status_port = STATUS_PORT

    def app_ports(self) -> list[AppPort]:
        """TCP container ports of the app containers, first declaration of each number only."""
        seen: set[int] = set()
        out = []
        for c in self.app_containers:
            for j, p in enumerate(c.spec.get("ports") or []):
                num = p.get("containerPort")
                if not isinstance(num, int) or str(p.get("protocol", "TCP")).upper() != "TCP" or num in seen:
                    continue
                seen.add(num)
                out.append(AppPort(num, str(p.get("name", "")), c.name, f"{c.path}.ports[{j}].containerPort"))
        return out

    def capture_evidence(self) -> list[str]:
        """What the capture was read from, one ``path = value`` line each."""
        cap = self.capture
        if cap.path != "metadata.annotations":
            return [f"{cap.path} = {cap.value}"]
        keys = (ANN_MODE, ANN_INCLUDE, ANN_EXCLUDE)
        lines = [f"metadata.annotations[{_q(k)}] = {self.annotations[k]}" for k in keys if k in self.annotations]
        return lines or ["metadata.annotations = (no traffic annotations: Istio defaults, every port but "
                         "15008,15020,15021,15090 captured)"]

    def env(self, c: Container, name: str) -> tuple[str, str] | None:
        """(value, path) of a literal env var of container ``c``."""
        for i, e in enumerate(c.spec.get("env") or []):
            if e.get("name") == name and "value" in e:
                return str(e["value"]), f"{c.path}.env[{i}].value"
        return None

    def finding(self, rule: str, severity: Severity, title: str, server_port, evidence: Iterable[str], path: str,
                explanation: str, remediation: str, **details) -> Finding:
        return Finding(
            detector=rule, severity=severity, title=title,
            flow=FlowRef(client="-", server=f"{self.ip}:{server_port if server_port is not None else '-'}", iface=""),
            evidence=tuple(Evidence(self.source, "", 0, 0.0, w) for w in evidence),
            explanation=explanation, remediation=remediation, pod=self.name,
            details={"path": path, **details},
        )


# ---------------------------------------------------------------------------------------------------- registry

Rule = Callable[[PodView], list[Finding]]
RULES: dict[str, Rule] = {}
SEVERITIES: dict[str, str] = {}  # id -> the severities it can emit, for docs and `lint --list`


def rule(rule_id: str, severities: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        fn.id = rule_id  # type: ignore[attr-defined]
        RULES[rule_id] = fn
        SEVERITIES[rule_id] = severities
        return fn
    return register


def _ports_text(ports: Iterable[int]) -> str:
    return ",".join(str(p) for p in ports)


def _user_excludes(pv: PodView) -> list[int]:
    """The excludeInboundPorts the user set (Istio's own ports dropped), from what was applied."""
    if pv.capture.path.startswith("spec.initContainers"):
        nums = pv.capture.ports.excluded
    else:
        nums = {int(p) for p in str(pv.annotations.get(ANN_EXCLUDE, "")).split(",") if p.strip().isdigit()}
    return sorted(p for p in nums if p not in ISTIO_OWN_EXCLUDES)


def _workload_labels(pv: PodView) -> dict:
    skip = ("pod-template-hash", "security.istio.io/tlsMode", "service.istio.io/canonical-revision",
            "service.istio.io/canonical-name")
    labels = {k: v for k, v in pv.labels.items() if k not in skip}
    if "app" in labels:
        return {"app": labels["app"]}
    return labels or {"app": "<your-app>"}


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line else line for line in text.splitlines())


# ---------------------------------------------------------------------------------------------------- redirect-exposure


@rule("redirect-exposure", "warning")
def redirect_exposure(pv: PodView) -> list[Finding]:
    """Two or more app ports REDIRECTed to the one inbound listener.

    Decision on TPROXY: not reported. TPROXY (mangle ISTIO_TPROXY, iptables_rules.txt section 6) delivers the
    packet to Envoy's transparent listener without rewriting the destination, so the accepted socket keeps the
    original (pod ip, app port): connections to two ports from one client ip:port stay distinct four-tuples.
    REDIRECT is a DNAT to 15006: both become (pod ip, 15006, client ip, client port), the same socket key.
    NONE captures nothing.
    """
    if pv.sidecar is None or pv.capture.mode != "REDIRECT":
        return []
    cap = pv.capture
    captured = [p for p in pv.app_ports() if cap.captured(p.port)]
    if len(captured) < 2:
        return []
    keep, move = captured[0], captured[1:]
    listener = cap.ports.listener_port
    exclude_value = _ports_text(sorted(set(_user_excludes(pv)) | {p.port for p in move}))
    move_text = _ports_text(p.port for p in move)
    ports_text = ", ".join(str(p.port) for p in captured)
    labels = _workload_labels(pv)
    label_yaml = _indent(yaml.safe_dump(labels, default_flow_style=False).rstrip(), 6)
    sidecar_ports = "\n".join(
        f"  - port:\n      number: {p.port}\n      protocol: TCP\n      name: tcp-{p.port}\n"
        f"    defaultEndpoint: 127.0.0.1:{p.port}\n    captureMode: NONE" for p in captured)
    remediation = f"""\
# Fix A (pod template annotation): take {move_text} out of inbound capture; {keep.port} stays on the sidecar.
# Traffic to {move_text} then bypasses Envoy (no mTLS termination, AuthorizationPolicy or telemetry there).
metadata:
  annotations:
    {ANN_EXCLUDE}: "{exclude_value}"
# (equivalently, list only what stays captured:  {ANN_INCLUDE}: "{keep.port}")
---
# Fix B (heavier): no iptables capture for the pod; Envoy binds each port itself and forwards on loopback.
# Needs the app to listen on 127.0.0.1 only, and removes outbound capture too (add egress listeners).
metadata:
  annotations:
    {ANN_MODE}: NONE
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: {pv.labels.get('app') or pv.name}-no-capture
  namespace: {pv.namespace}
spec:
  workloadSelector:
    labels:
{label_yaml}
  ingress:
{sidecar_ports}"""
    explanation = (
        f"istio-iptables REDIRECTs every captured inbound TCP port to Envoy's virtualInbound listener on {listener} "
        f"(nat ISTIO_INBOUND -> ISTIO_IN_REDIRECT 'REDIRECT --to-ports {listener}'; which ports from -b/-d, i.e. "
        f"{ANN_INCLUDE} / {ANN_EXCLUDE}; source istio/istio tools/istio-iptables/pkg/capture/run.go, "
        f"iptables_rules.txt sections 1, 2 and 5). Here {ports_text} are all captured. REDIRECT rewrites the "
        f"destination port, so a connection from client ip:port X to {captured[0].port} and one from the same X to "
        f"{captured[1].port} are the same kernel four-tuple (pod ip, {listener}, X): if a client reuses a source "
        f"port across these ports (fixed bind, SO_REUSEADDR port pools, a NAT in front) while the first "
        f"connection lives, the second SYN gets a challenge ACK or is dropped, a 1-3 s connect stall the client "
        f"Envoy logs as UF/URX. This is an exposure read from the spec, not an observed failure; `watch` reports "
        f"the failure as tuple-collision. TPROXY mode is not reported: it does not rewrite the destination port, "
        f"so the four-tuples stay distinct."
    )
    evidence = pv.capture_evidence() + [f"{p.path} = {p.port}" for p in captured]
    return [pv.finding(
        "redirect-exposure", Severity.WARNING,
        f"app ports {ports_text} are all REDIRECTed to the one inbound listener {listener}",
        move[0].port, evidence, move[0].path, explanation, remediation,
        ports=[p.port for p in captured], listener=listener, exclude=exclude_value,
        capture_path=cap.path,
    )]


# ---------------------------------------------------------------------------------------------------- probes


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
                        mpath = f"{probers_path}[{_q(http_path)}]"
                    elif pv.sidecar is not None:
                        mpath = f"{pv.sidecar.path}.env[name={PROBERS_ENV}]"
                    else:
                        mpath = path
                    out.append(Probe(c, kind, handler, port, mpath, probe, rewritten, True))
                    continue
                ohandler, oport = oh
                out.append(Probe(c, kind, ohandler, oport, f"{probers_path}[{_q(http_path)}].{ohandler}.port",
                                 original, rewritten))
            else:
                out.append(Probe(c, kind, handler, port, path, probe))
    return out


def _port_matches(c: Container, port) -> bool:
    for p in c.spec.get("ports") or []:
        if isinstance(port, int) and p.get("containerPort") == port:
            return True
        if isinstance(port, str) and (p.get("name") == port or str(p.get("containerPort")) == port):
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
                f"# Write the probe in its original form in the pod template (container {c.name}) and let the "
                f"injector rewrite it again:\nspec:\n  containers:\n  - name: {c.name}\n    {pr.kind}:\n"
                f"      httpGet:\n        path: /healthz\n        port: <an app port: {_declared(c)}>\n"
                f"# then: kubectl rollout restart deployment/<owner> -n {pv.namespace}",
                container=c.name, probe=pr.kind))
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
            handler_yaml += f"        port: {fix_port}   # was {pr.port}; declared: {_declared(c)}\n"
        else:
            handler_yaml += "        port: <the port the app serves>\n"
        decl_name = pr.port if named else f"probe-{pr.port}"
        decl_num = "<port number>" if named else pr.port
        remediation = (
            f"# Either point the probe at a declared port (pod template, original probe form; Istio rewrites it "
            f"again at injection):\nspec:\n  containers:\n  - name: {c.name}\n    {pr.kind}:\n{handler_yaml}"
            f"# or declare the port the app really serves the probe on:\nspec:\n  containers:\n  - name: {c.name}\n"
            f"    ports:\n    - containerPort: {decl_num}\n      name: {decl_name}\n      protocol: TCP")
        out.append(pv.finding("probe-port", Severity.ERROR, title, pr.port if not named else None, ev, pr.path,
                              explanation, remediation, container=c.name, probe=pr.kind, port=pr.port))
    return out


# ---------------------------------------------------------------------------------------------------- restarts


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
            remediation = (f"spec:\n  containers:\n  - name: {name}\n    resources:\n      limits:\n"
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
            remediation = (f"# Give the app time to start and slack under load (pod template, original probe form):\n"
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
            remediation = (f"kubectl logs {pv.name} -c {name} --previous -n {pv.namespace}\n"
                           f"# if it fails calling out at start-up, hold it until the sidecar is ready:\n"
                           f"metadata:\n  annotations:\n    {ANN_PROXY_CONFIG}: |\n"
                           f"      holdApplicationUntilProxyStarts: true")
        out.append(pv.finding("restart-loop", sev, title, None, ev, path, explanation, remediation,
                              container=name, restarts=count, exit_code=code, reason=reason, cause=cause))
    return out


# ---------------------------------------------------------------------------------------------------- sidecar


@rule("no-sidecar", "error")
def no_sidecar(pv: PodView) -> list[Finding]:
    if pv.sidecar is not None:
        return []
    names = ", ".join(c.name for c in pv.containers) or "none"
    inits = ", ".join(f"{c.name}{' (restartPolicy Always)' if c.restartable_init else ''}"
                      for c in pv.init_containers) or "none"
    status = pv.annotations.get(ANN_STATUS)
    ev = [f"spec.containers[*].name = {names}", f"spec.initContainers[*].name = {inits}",
          f"metadata.annotations[{_q(ANN_STATUS)}] = {status if status is not None else '(absent)'}"]
    opt_out = [f"{where}[{_q('sidecar.istio.io/inject')}] = {d['sidecar.istio.io/inject']}"
               for where, d in (("metadata.labels", pv.labels), ("metadata.annotations", pv.annotations))
               if "sidecar.istio.io/inject" in d]
    ev += opt_out
    why = ("The pod opts out of injection (" + "; ".join(opt_out) + ").") if opt_out else (
        "Injection happens only at pod creation by the istio-sidecar-injector webhook, when the namespace has "
        "istio-injection=enabled or istio.io/rev, or the pod has sidecar.istio.io/inject: \"true\"; a pod created "
        "before that, or in a namespace without the label, has none.")
    if status is not None:
        why += f" The {ANN_STATUS} annotation says it was injected, so the container was removed afterwards."
    ambient = pv.annotations.get("ambient.istio.io/redirection") == "enabled"
    if ambient:
        why += " The pod is in ambient mode (ambient.istio.io/redirection: enabled): no sidecar by design."
    return [pv.finding(
        "no-sidecar", Severity.INFO if ambient else Severity.ERROR,
        f"pod {pv.name} has no {SIDECAR} sidecar (neither a container nor a native-sidecar init container)",
        None, ev, "spec.containers[*].name",
        f"No container named {SIDECAR} in spec.containers (classic layout) and no init container {SIDECAR} with "
        f"restartPolicy: Always (native sidecar, Istio >= 1.28 on Kubernetes >= 1.33; pod_istio_sample.yaml). "
        f"Without it the pod is outside the mesh: no mTLS, no policy, nothing for meshdoctor to capture. {why}",
        f"kubectl label namespace {pv.namespace} istio-injection=enabled\n"
        f"# or per workload (pod template):\nmetadata:\n  labels:\n    sidecar.istio.io/inject: \"true\"\n"
        f"# then recreate the pods: kubectl rollout restart deployment/<owner> -n {pv.namespace}",
        containers=[c.name for c in pv.containers])]


@rule("sidecar-not-ready", "error")
def sidecar_not_ready(pv: PodView) -> list[Finding]:
    if pv.sidecar is None or SIDECAR not in pv.statuses:
        return []
    st, spath = pv.statuses[SIDECAR]
    state = st.get("state") or {}
    ready = bool(st.get("ready"))
    if ready and "running" in state:
        return []
    ev = [f"{spath}.ready = {str(ready).lower()}"]
    if "running" in state:
        detail, path = "running but not ready", f"{spath}.ready"
    else:
        which = next(iter(state), "unknown")
        reason = (state.get(which) or {}).get("reason") or ""
        detail, path = f"{which}{': ' + reason if reason else ''}", f"{spath}.state.{which}"
        ev.append(f"{path}.reason = {reason or '(none)'}")
    layout = "native sidecar (init container)" if pv.native else "classic sidecar"
    return [pv.finding(
        "sidecar-not-ready", Severity.ERROR, f"{SIDECAR} of pod {pv.name} is not ready ({detail})", None, ev, path,
        f"The {layout} {SIDECAR} is {detail}. Its readiness is Envoy's /healthz/ready on 15021, which turns true "
        f"only once Envoy got its first configuration from istiod (listeners and clusters) and certificates. "
        f"While it is not ready every captured inbound and outbound connection of the pod fails or hangs "
        f"(iptables still REDIRECTs to 15006/15001), and the pod is out of its Services' endpoints. Common causes: "
        f"istiod unreachable (port 15012), a rejected config (LDS/CDS NACK), certificate issues.",
        f"kubectl logs {pv.name} -c {SIDECAR} -n {pv.namespace} --tail=100\n"
        f"istioctl proxy-status {pv.name}.{pv.namespace}\n"
        f"kubectl exec {pv.name} -c {SIDECAR} -n {pv.namespace} -- pilot-agent request GET /healthz/ready",
        ready=ready, native=pv.native)]


def _hold_effective(pv: PodView) -> tuple[bool, str]:
    """Native sidecars start (and pass their startupProbe) before app containers; a classic sidecar holds the
    app only when the injector put it first with a postStart `pilot-agent wait` hook."""
    if pv.native:
        return True, "native sidecar"
    first = pv.containers[0] if pv.containers else None
    if first is None or first.name != SIDECAR:
        return False, ""
    cmd = ((((first.spec.get("lifecycle") or {}).get("postStart") or {}).get("exec") or {}).get("command")) or []
    return ("pilot-agent" in cmd and "wait" in cmd), "postStart pilot-agent wait"


@rule("hold-application", "warning")
def hold_application(pv: PodView) -> list[Finding]:
    if pv.sidecar is None:
        return []
    effective, _ = _hold_effective(pv)
    if effective:
        return []
    raw = pv.annotations.get(ANN_PROXY_CONFIG)
    cfg = {}
    if raw:
        try:
            cfg = yaml.safe_load(raw) or {}
        except yaml.YAMLError:
            cfg = {}
        if not isinstance(cfg, dict):
            cfg = {}
    ann_path = f"metadata.annotations[{_q(ANN_PROXY_CONFIG)}]"
    idx = next(i for i, c in enumerate(pv.containers) if c.name == SIDECAR)
    ev = [f"{ann_path} = {raw.strip() if raw else '(absent)'}",
          f"spec.containers[{idx}].name = {SIDECAR} (position {idx + 1} of {len(pv.containers)}, "
          f"no postStart pilot-agent wait)"]
    asked = cfg.get("holdApplicationUntilProxyStarts") is True
    cfg = {**cfg, "holdApplicationUntilProxyStarts": True}
    block = _indent(yaml.safe_dump(cfg, default_flow_style=False, sort_keys=False).rstrip(), 6)
    title = (f"pod {pv.name} asks for holdApplicationUntilProxyStarts but was injected without it" if asked else
             f"app containers of pod {pv.name} can start before the {SIDECAR} sidecar is ready")
    explanation = (
        f"With a classic sidecar Kubernetes starts all containers at once, so the app can run before Envoy has its "
        f"configuration: iptables already REDIRECTs the app's outbound connections to 15001, and start-up calls "
        f"(config server, database, token fetch) can fail before Envoy is ready (connection refused/reset, 503), "
        f"often ending in a restart loop. holdApplicationUntilProxyStarts makes the injector put {SIDECAR} first "
        f"with a postStart hook `pilot-agent wait` that blocks the next containers until Envoy is ready "
        f"(istio/istio injection-template.yaml; Istio >= 1.7); native sidecars (Istio >= 1.28 on Kubernetes >= "
        f"1.33) start first by design.")
    if asked:
        explanation += (" The annotation already asks for it but the pod was injected before it was set (or the "
                        "injector ignored it): the spec shows no hold. Recreate the pod.")
    remediation = (f"# pod template annotation (or mesh-wide: "
                   f"meshConfig.defaultConfig.holdApplicationUntilProxyStarts: true), then recreate the pods:\n"
                   f"metadata:\n  annotations:\n    {ANN_PROXY_CONFIG}: |\n{block}\n"
                   f"# kubectl rollout restart deployment/<owner> -n {pv.namespace}")
    return [pv.finding("hold-application", Severity.WARNING, title, None, ev, ann_path, explanation, remediation,
                       annotation_asks=asked)]


# ---------------------------------------------------------------------------------------------------- extra rules


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
              f"metadata.annotations[{_q(ANN_REWRITE)}] = {flag if flag is not None else '(absent)'}"]
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
            f"metadata:\n  annotations:\n    {ANN_REWRITE}: \"true\"\n"
            f"# then recreate the pods: kubectl rollout restart deployment/<owner> -n {pv.namespace}",
            container=pr.container.name, probe=pr.kind, port=num))
    return out


@rule("excluded-port-exposed", "info")
def excluded_port_exposed(pv: PodView) -> list[Finding]:
    """An app port the sidecar does not capture: it is reachable around Envoy."""
    if pv.sidecar is None or pv.capture.mode == "NONE":
        return []
    out = []
    for p in pv.app_ports():
        if pv.capture.captured(p.port):
            continue
        ev = [f"{p.path} = {p.port}", *pv.capture_evidence()]
        rest = _ports_text(q for q in _user_excludes(pv) if q != p.port)
        recapture = (f"metadata:\n  annotations:\n    {ANN_EXCLUDE}: \"{rest}\"" if rest else
                     f"# remove the {ANN_EXCLUDE} annotation from the pod template")
        out.append(pv.finding(
            "excluded-port-exposed", Severity.INFO,
            f"app port {p.port} ({p.container}) is not captured by the sidecar: reachable without mTLS or policy",
            p.port, ev, p.path,
            f"Port {p.port} is left out of inbound capture ({pv.capture.path}: RETURNed before ISTIO_IN_REDIRECT, "
            f"iptables_rules.txt section 5). Connections to it reach the app directly: no mTLS termination, "
            f"PeerAuthentication STRICT and AuthorizationPolicy do not apply, no Envoy telemetry. Fine for a "
            f"port that must bypass Envoy on purpose (metrics scraped by a non-mesh Prometheus, the usual fix for "
            f"redirect-exposure); otherwise a hole in the mesh.",
            f"# If {p.port} must be protected, capture it again (pod template), keeping excluded only the ports "
            f"that must bypass Envoy:\n{recapture}\n"
            f"# or restrict who can reach it with a Kubernetes NetworkPolicy on port {p.port}.",
            port=p.port))
    return out


# ---------------------------------------------------------------------------------------------------- entry points


def _as_dict(pod) -> dict:
    if isinstance(pod, dict):
        return pod
    from kubernetes.client import ApiClient  # a V1Pod from the client: the API's camelCase JSON

    return ApiClient().sanitize_for_serialization(pod)


def lint_pod(pod, rules: Iterable[str] | None = None) -> list[Finding]:
    """Findings for one Pod (API JSON as a dict, camelCase; a kubernetes V1Pod is converted), every rule in
    registration order unless ``rules`` names some."""
    pv = PodView(_as_dict(pod))
    out: list[Finding] = []
    for rid, fn in RULES.items():
        if rules is None or rid in rules:
            out.extend(fn(pv))
    return out


def lint_pods(pods: Iterable, rules: Iterable[str] | None = None) -> list[Finding]:
    """Findings for many pods, pod by pod."""
    wanted = None if rules is None else set(rules)
    return [f for pod in pods for f in lint_pod(pod, wanted)]
