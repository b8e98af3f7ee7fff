"""The pod as the lint rules read it (PodView: containers, ports, statuses, Istio's capture, each with its spec
path), the annotations they look at, and what a rule is.

Source for the classic and native sidecar layouts: istio/istio pkg/kube/inject.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# lint's only imports from the rest of the product; the rule modules take Finding and Severity from here.
from kubectl_meshdoctor.core.findings import SPEC, Evidence, Finding, NoFlow, Severity
from kubectl_meshdoctor.istio.redirect import PodCapture, capture_from_pod

SIDECAR = "istio-proxy"
STATUS_PORT = 15020  # pilot-agent status port; status.sidecar.istio.io/port changes it

ANN_EXCLUDE = "traffic.sidecar.istio.io/excludeInboundPorts"
ANN_INCLUDE = "traffic.sidecar.istio.io/includeInboundPorts"
ANN_MODE = "sidecar.istio.io/interceptionMode"
ANN_PROXY_CONFIG = "proxy.istio.io/config"
ANN_STATUS = "sidecar.istio.io/status"
ANN_REWRITE = "sidecar.istio.io/rewriteAppHTTPProbers"
# A pod template change reaches the pods only when they are recreated (and injected again): every rule's note.
RECREATE_NOTE = "# Then recreate the pods: {command}"
# The controllers `kubectl rollout restart` takes (kubectl/pkg/polymorphichelpers/objectrestarter.go)
RESTARTABLE = {"Deployment": "deployment", "StatefulSet": "statefulset", "DaemonSet": "daemonset"}


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


def json_key(key: str) -> str:
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

    def workload(self) -> str | None:
        """What owns the pod, as kubectl names it (``deployment/web``), from its controller ownerReference: a
        ReplicaSet a Deployment made is ``<deployment>-<pod-template-hash>`` (the pod's label of that name),
        so the Deployment's name is the ReplicaSet's without that suffix. None when the pod names no owner
        (a spec written by hand, a bare pod)."""
        refs = [r for r in self.meta.get("ownerReferences") or [] if isinstance(r, dict)]
        ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
        if ref is None or not ref.get("name"):
            return None
        kind, name = str(ref.get("kind", "")), str(ref["name"])
        suffix = f"-{self.labels.get('pod-template-hash', '')}"
        if kind == "ReplicaSet" and suffix != "-" and name.endswith(suffix):
            return f"deployment/{name[:-len(suffix)]}"
        return f"{RESTARTABLE.get(kind, kind.lower())}/{name}"

    def restart_command(self) -> str:
        """The command that recreates the pod through what owns it: ``kubectl rollout restart deployment/web -n
        NS`` for a controller rollout restart takes, ``deployment/<owner>`` when the pod names none, else
        deleting the pod for its owner to create it again."""
        workload = self.workload() or "deployment/<owner>"
        if workload.split("/")[0] in RESTARTABLE.values():
            return f"kubectl rollout restart {workload} -n {self.namespace}"
        return f"kubectl delete pod {self.name} -n {self.namespace} (its owner, {workload}, creates it again)"

    def recreate_note(self) -> str:
        """The note every pod-template fix ends with: how this pod is recreated, injected again."""
        return RECREATE_NOTE.format(command=self.restart_command())

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
        lines = [f"metadata.annotations[{json_key(k)}] = {self.annotations[k]}" for k in keys if k in self.annotations]
        return lines or ["metadata.annotations = (no traffic annotations: Istio defaults, every port but "
                         "15008,15020,15021,15090 captured)"]

    def env(self, c: Container, name: str) -> tuple[str, str] | None:
        """(value, path) of a literal env var of container ``c``."""
        for i, e in enumerate(c.spec.get("env") or []):
            if e.get("name") == name and "value" in e:
                return str(e["value"]), f"{c.path}.env[{i}].value"
        return None

    def finding(self, rule: str, severity: Severity, title: str, server_port, evidence: Iterable[str], path: str,
                explanation: str, remediation: str, fixes: tuple = (), **details) -> Finding:
        return Finding(
            detector=rule, severity=severity, title=title,
            flow=NoFlow(SPEC, f"{self.ip}:{server_port if server_port is not None else '-'}"),
            evidence=tuple(Evidence.spec_field(self.source, *w.split(" = ", 1)) if " = " in w else
                           Evidence(self.source, "", None, 0.0, w, kind=SPEC) for w in evidence),
            explanation=explanation, remediation=remediation, pod=self.name,
            details={"path": path, **details}, fixes=fixes,
        )

Rule = Callable[[PodView], list[Finding]]


def rule(rule_id: str, severities: str) -> Callable[[Rule], Rule]:
    # Marks only: rules.RULES lists the rules in their one order, which no import order of the modules gives.
    def mark(fn: Rule) -> Rule:
        fn.id = rule_id  # type: ignore[attr-defined]
        fn.severities = severities  # type: ignore[attr-defined]
        return fn
    return mark


def placeholder(what: str) -> str:
    """A value for the user to fill in, as YAML: quoted, so the fix still parses, and a string where a number
    belongs, so that one left in is refused (by the API server, and by lint) rather than taken for a value."""
    return json.dumps(f"<{what}>")


def indented(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line else line for line in text.splitlines())
