"""Static lint rules over one Pod object (API JSON, camelCase): what can be seen wrong before any packet flows.

Every rule is a function ``(PodView) -> list[Finding]`` registered under a stable id (docs/DESIGN.md "Detector ids"):
the finding's ``detector`` is that id, its evidence quotes the spec path read and its value
(``spec.containers[0].ports[1].containerPort = 5002``), ``details["path"]`` holds the deciding path, and the
remediation is YAML (or commands) that can be pasted.

The rules live with what they read: ports.py (Istio's inbound capture), probes.py (probes and restarts),
sidecar.py (the istio-proxy container); podview.py reads the pod for them.

Sources for the Istio behaviour relied on: istio/istio tools/istio-iptables/pkg/capture/run.go and the
injection template's annotation -> flag mapping, and istio/istio pkg/kube/inject (probe rewrite to the
pilot-agent status port with the originals in ``ISTIO_KUBE_APP_PROBERS``, classic and native sidecar layouts).
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.findings import Finding

from .podview import PodView, Rule
from .ports import excluded_port_exposed, redirect_exposure
from .probes import probe_not_rewritten, probe_port, restart_loop
from .sidecar import hold_application, no_sidecar, sidecar_not_ready

# The order lint runs the rules in, which is the order of a pod's findings.
RULES: dict[str, Rule] = {fn.id: fn for fn in (  # type: ignore[attr-defined]
    redirect_exposure, probe_port, restart_loop, no_sidecar, sidecar_not_ready, hold_application,
    probe_not_rewritten, excluded_port_exposed,
)}
SEVERITIES: dict[str, str] = {  # id -> the severities it can emit, for docs and tests
    rid: fn.severities for rid, fn in RULES.items()  # type: ignore[attr-defined]
}


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
