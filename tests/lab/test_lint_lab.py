"""`lint` against the lab's API server: for each rule, a lab pod whose Pod object breaks it and the plain pod
that does not. The breaking specs are RFC 6902 patches the test API server applies to the rendered Pod."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

import pytest

from kubectl_meshdoctor.lab import lab

pytestmark = pytest.mark.lab

# istio-init's args as the lab renders them: "-d" at 15, its port list at 16.
EXCLUDE_5002 = [
    {"op": "test", "path": "/spec/initContainers/0/args/15", "value": "-d"},
    {"op": "replace", "path": "/spec/initContainers/0/args/16", "value": "15090,15021,15020,5002"},
    {"op": "add", "path": "/metadata/annotations/traffic.sidecar.istio.io~1excludeInboundPorts", "value": "5002"},
]
HOLD = [  # what the injector does for holdApplicationUntilProxyStarts: istio-proxy first, postStart wait
    {"op": "move", "from": "/spec/containers/1", "path": "/spec/containers/0"},
    {"op": "test", "path": "/spec/containers/0/name", "value": "istio-proxy"},
    {"op": "add", "path": "/spec/containers/0/lifecycle",
     "value": {"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}}},
]
PATCHES = {
    # fine for every rule: the exposure removed and the app held until the proxy starts
    "fine": EXCLUDE_5002 + HOLD,
    "probe": [{"op": "add", "path": "/spec/containers/0/readinessProbe",
               "value": {"tcpSocket": {"port": 5999}, "periodSeconds": 5}}],
    "restarts": [
        {"op": "test", "path": "/status/containerStatuses/0/name", "value": "app"},
        {"op": "replace", "path": "/status/containerStatuses/0/restartCount", "value": 7},
        {"op": "replace", "path": "/status/containerStatuses/0/lastState",
         "value": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": "2026-11-29T20:00:00Z",
                                  "finishedAt": "2026-11-29T20:01:00Z"}}},
        {"op": "add", "path": "/spec/containers/0/livenessProbe",
         "value": {"httpGet": {"path": "/healthz", "port": 5000}, "periodSeconds": 5}},
    ],
    "nosidecar": [
        {"op": "test", "path": "/spec/containers/1/name", "value": "istio-proxy"},
        {"op": "remove", "path": "/spec/containers/1"},
        {"op": "test", "path": "/status/containerStatuses/1/name", "value": "istio-proxy"},
        {"op": "remove", "path": "/status/containerStatuses/1"},
    ],
    "unready": [
        {"op": "test", "path": "/status/containerStatuses/1/name", "value": "istio-proxy"},
        {"op": "replace", "path": "/status/containerStatuses/1/ready", "value": False},
    ],
}
PODS = ["plain=healthy", *(f"{name}=healthy" for name in PATCHES)]

# rule -> (the pod that breaks it, its severity, a pod that does not)
BROKEN_BY = {
    "redirect-exposure": ("plain", "warning", "fine"),
    "hold-application": ("plain", "warning", "fine"),
    "probe-port": ("probe", "error", "fine"),
    "restart-loop": ("restarts", "error", "fine"),
    "no-sidecar": ("nosidecar", "error", "fine"),
    "sidecar-not-ready": ("unready", "error", "fine"),
    # a probe Istio did not rewrite, on a captured port; and a port left out of capture (the fine pod's 5002)
    "probe-not-rewritten": ("probe", "warning", "plain"),
    "excluded-port-exposed": ("fine", "info", "plain"),
}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    name = f"mdtest-i{secrets.token_hex(2)}"
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, PODS, drivers=False, spec_patches=PATCHES)
    try:
        proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "lint", "-l", "version=v1",
                               "--kubeconfig", str(state.kubeconfig), "-o", "json"],
                              capture_output=True, text=True, timeout=120)
    finally:
        lab.down(state.state_dir)
    assert proc.returncode == 1, proc.stderr  # error findings among them
    return json.loads(proc.stdout)


def rules_of(report: dict, pod: str) -> dict[str, str]:
    return {f["detector"]: f["severity"] for f in report["findings"] if f["pod"] == pod}


@pytest.mark.parametrize("rule", sorted(BROKEN_BY))
def test_rule_fires_on_the_pod_that_breaks_it_and_not_on_one_that_does_not(report, rule):
    pod, severity, fine = BROKEN_BY[rule]
    assert rules_of(report, pod).get(rule) == severity, rules_of(report, pod)
    assert rule not in rules_of(report, fine), rules_of(report, fine)


def test_every_lint_rule_is_covered_here():
    from kubectl_meshdoctor.lint import RULES

    assert set(BROKEN_BY) == set(RULES)


def test_the_fine_pod_has_no_warning_or_error(report):
    assert {r: s for r, s in rules_of(report, "fine").items() if s != "info"} == {}
