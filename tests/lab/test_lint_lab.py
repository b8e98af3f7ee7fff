"""`lint` against the lab's API server: for each rule, a lab pod whose Pod object breaks it and the plain pod
that does not. The breaking specs are RFC 6902 patches the test API server applies to the rendered Pod."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from meshdoctor_lab import lab
from meshdoctor_lab.applied_fixes import EXCLUDE_INBOUND_PORTS, LabFix
from .lab_names import lab_name

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
    # Rewritten to pilot-agent with no original kept (ISTIO_KUBE_APP_PROBERS): the probe edited after injection.
    "rewritten": [{"op": "add", "path": "/spec/containers/0/readinessProbe",
                   "value": {"httpGet": {"path": "/app-health/app/readyz", "port": 15020, "scheme": "HTTP"}}}],
    "restarts": [
        {"op": "test", "path": "/status/containerStatuses/0/name", "value": "app"},
        {"op": "replace", "path": "/status/containerStatuses/0/restartCount", "value": 7},
        {"op": "replace", "path": "/status/containerStatuses/0/lastState",
         "value": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": "2026-11-29T20:00:00Z",
                                  "finishedAt": "2026-11-29T20:01:00Z"}}},
        {"op": "add", "path": "/spec/containers/0/livenessProbe",
         "value": {"httpGet": {"path": "/healthz", "port": 5000}, "periodSeconds": 5}},
    ],
    "unready": [
        {"op": "test", "path": "/status/containerStatuses/1/name", "value": "istio-proxy"},
        {"op": "replace", "path": "/status/containerStatuses/1/ready", "value": False},
    ],
}
# A port left out of capture the way the lab renders a printed fix (the annotation, and istio-init's -d).
EXCLUDED = {"excluded": LabFix("exclude-port", ((EXCLUDE_INBOUND_PORTS, "5002"),))}
# A pod whose template opts out of injection: the lab runs it with no sidecar and no rules, as Istio would.
SCENARIO_OF = {"nosidecar": "no-sidecar"}
PODS = ["plain=healthy", *(f"{name}={SCENARIO_OF.get(name, 'healthy')}"
                           for name in [*PATCHES, *EXCLUDED, *SCENARIO_OF])]

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
    "excluded-port-exposed": ("excluded", "info", "plain"),
}


def lint_lab(state) -> dict:
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "lint", "-l", "version=v1",
                           "--kubeconfig", str(state.kubeconfig), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> tuple[dict, dict[str, dict]]:
    """The lint report of the lab's broken pods, and their Pod objects as the API server returns them."""
    name = lab_name("i")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, PODS, drivers=False, spec_patches=PATCHES,
                   fixes=EXCLUDED)
    try:
        assert "nosidecar/app-http" in state.pids and "nosidecar/sidecar" not in state.pids  # no Envoy at all
        report = lint_lab(state)
        pods = subprocess.run([sys.executable, "-c", GET_PODS, str(state.kubeconfig)], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    finally:
        lab.down(state.state_dir)
    return report, {p["metadata"]["name"]: p for p in json.loads(pods)}


# The Pod objects through the official client, as lint reads them (kubectl is not needed for this part).
GET_PODS = """
import json, sys
from kubernetes import client, config
api = client.CoreV1Api(config.new_client_from_config(sys.argv[1]))
pods = api.list_namespaced_pod(config.list_kube_config_contexts(sys.argv[1])[1]["context"]["namespace"])
print(json.dumps([api.api_client.sanitize_for_serialization(p) for p in pods.items]))
"""


@pytest.fixture(scope="module")
def report(broken) -> dict:
    return broken[0]


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
    assert lint_lab_rc(report) == 1  # error findings among the broken pods


def lint_lab_rc(report: dict) -> int:
    return 1 if any(f["severity"] == "error" for f in report["findings"]) else 0


# ------------------------------------------------------------------ every printed lint fix, applied and linted again

# Rules that print where to look, not a fix: their cause is not in the spec (restarts, an unready proxy).
NO_FIX = {"restart-loop", "sidecar-not-ready"}


# More pods that break a rule another way, each with fixes of its own.
ALSO_BROKEN = (("probe-port", "rewritten"),)
# What the user fills a fix's placeholders with ("<...>", quoted), by how the placeholder begins.
FILLED = {"the path the app answers the probe on": "/healthz", "an app port": "5000"}


def filled(text: str) -> str:
    """``text`` with its placeholders filled in (FILLED); AssertionError for one the test does not know."""
    def value(m: re.Match) -> str:
        known = [v for k, v in FILLED.items() if m.group(1).startswith(k)]
        assert known, f"no value for the placeholder {m.group(0)}"
        return known[0]
    return re.sub(r'"<([^">]*)>"', value, text)


def printed(report: dict) -> list[tuple[str, str, dict]]:
    """(rule, broken pod, fix) for every fix the broken pods' findings print."""
    out = []
    for rule, pod in sorted([(rule, pod) for rule, (pod, _, _) in BROKEN_BY.items()] + list(ALSO_BROKEN)):
        for finding in (f for f in report["findings"] if f["pod"] == pod and f["detector"] == rule):
            out += [(rule, pod, fix) for fix in finding.get("fixes", ())]
    return out


def by_injector(fix: dict) -> bool:
    """A fix that acts when the injector renders the pod: it sets pod template annotations or labels."""
    return bool(fix.get("annotations") or fix.get("labels"))


def fixed_name(pod: str, fix: dict) -> str:
    return f"{pod}-{fix['name']}"


@pytest.fixture(scope="module")
def injected(broken, tmp_path_factory) -> tuple[dict, object]:
    """The fixes that act through the injector (pod annotations and labels), each on a copy of its broken pod:
    the lab renders them as the injector does. The lint report of those pods, and the lab's state."""
    cases = [(rule, pod, fix) for rule, pod, fix in printed(broken[0]) if by_injector(fix)]
    pods = [f"{fixed_name(pod, fix)}={SCENARIO_OF.get(pod, 'healthy')}" for _, pod, fix in cases]
    patches = {fixed_name(pod, fix): PATCHES[pod] for _, pod, fix in cases if pod in PATCHES}
    fixes = {fixed_name(pod, fix): LabFix(fix["name"], tuple(fix.get("annotations", {}).items()),
                                          labels=tuple(fix.get("labels", {}).items())) for _, pod, fix in cases}
    name = lab_name("j")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, pods, drivers=False, spec_patches=patches,
                   fixes=fixes)
    try:
        return lint_lab(state), state
    finally:
        lab.down(state.state_dir)


def test_every_rule_prints_a_fix_but_those_that_say_where_to_look(report):
    rules = {rule for rule, _, _ in printed(report)}
    assert rules == set(BROKEN_BY) - NO_FIX
    for rule in NO_FIX:
        pod = BROKEN_BY[rule][0]
        (finding,) = [f for f in report["findings"] if f["pod"] == pod and f["detector"] == rule]
        assert "Not a fix the spec proves" in finding["remediation"] and not finding.get("fixes")


def test_each_fix_by_annotation_or_label_is_gone_once_the_injector_renders_it(broken, injected):
    report, state = injected
    cases = [(rule, pod, fix) for rule, pod, fix in printed(broken[0]) if by_injector(fix)]
    assert {fix["name"] for _, _, fix in cases} >= {"tproxy", "exclude-port", "hold-application", "rewrite-probes",
                                                    "capture-port", "inject-sidecar"}
    for rule, pod, fix in cases:
        assert rule in rules_of(broken[0], pod)
        assert rule not in rules_of(report, fixed_name(pod, fix)), (fix["name"], rules_of(report, fixed_name(pod, fix)))
    injected_pod = fixed_name("nosidecar", next(f for r, _, f in cases if r == "no-sidecar"))
    assert f"{injected_pod}/sidecar" in state.pids  # the label let the injector in: Envoy runs
    # Held: the lab started Envoy before the app, as pilot-agent wait makes the kubelet do.
    held = fixed_name("plain", next(f for r, _, f in cases if r == "hold-application"))
    assert state.started[f"{held}/sidecar"] < state.started[f"{held}/app-http"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")
def test_each_spec_fix_merged_as_kubectl_merges_it_leaves_no_finding(broken, tmp_path):
    """A fix of the pod's own spec, merged into the broken Pod by kubectl itself (strategic merge, as `kubectl
    apply` and `patch` do), then linted from the file: `lint -f`."""
    report, pods = broken
    cases = [(rule, pod, fix) for rule, pod, fix in printed(report) if not by_injector(fix)
             and not fix.get("settings")]
    assert {fix["name"] for _, _, fix in cases} == {"probe-declared-port", "declare-probe-port",
                                                    "probe-original-form"}

    def lint_merged(pod: str, text: str) -> set[str]:
        path = tmp_path / f"{pod}.json"
        path.write_text(json.dumps(pods[pod]))
        merged = subprocess.run(["kubectl", "patch", "--local", "-f", str(path), "--type", "strategic", "-p",
                                 text, "-o", "json"], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "KUBECONFIG": os.devnull})
        assert merged.returncode == 0, merged.stderr
        proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "lint", "-f", "-", "-o", "json"],
                              input=merged.stdout, capture_output=True, text=True, timeout=60)
        assert proc.returncode in (0, 1), proc.stderr
        return {f["detector"] for f in json.loads(proc.stdout)["findings"]}

    for rule, pod, fix in cases:
        if filled(fix["text"]) != fix["text"]:  # left in, a placeholder is refused: no false all-clear
            assert rule in lint_merged(pod, fix["text"]), fix["name"]
        left = lint_merged(pod, filled(fix["text"]))
        assert rule not in left, (fix["name"], left)
