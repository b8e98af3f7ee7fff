"""Issue 18: every fix a finding prints is proven in the lab. For each scenario with fixes (lab/fixes.py), the
failing pod reports its class and prints exactly the fixes the lab applies, as the same text; the same scenario
with each printed fix applied the way Istio renders it reports no error of that class, live nor offline, its
sidecar's access log shows no failure flag, and the round's traffic is served."""

from __future__ import annotations

import json

import pytest

from meshdoctor_lab.scenario_fixes import SCENARIO_FIXES, lab_fix
from meshdoctor_lab.scenario_fixes import printed_fixes as fixes_for
from kubectl_meshdoctor.envoy.access_log import parse_line
from meshdoctor_lab import lab
from meshdoctor_lab.scenarios.table import SLOW_ABANDONED, SLOW_HALF_CLOSED, SLOW_TOO_LONG

from .test_policy_classes_detected import EXPECTED as POLICY
from .test_policy_classes_detected import watch_round
from .test_scenarios_detected import analyze_files, judged, run_scenario
from .lab_names import lab_name

pytestmark = pytest.mark.lab

# scenario -> the detectors whose failures it reproduces (their findings when unfixed)
FAILING = {"collision": ("tuple-collision",), "refused": ("upstream-refused",),
           "refused-localhost": ("upstream-refused",), "framing": ("http-framing",),
           "stale-keepalive": ("stale-keepalive",), "port-exhaustion": ("source-port-exhaustion",),
           "downstream-idle": ("stale-keepalive",), "http10": ("downstream-protocol-error",),
           "slow-app": ("upstream-timeout", "downstream-disconnect"), "goaway": ("upstream-goaway",),
           "overflow": ("circuit-breaker-overflow",), "outlier": ("no-healthy-upstream",), "no-route": ("no-route",),
           "mtls-strict": ("tls-mismatch",), "tls-to-plaintext": ("tls-mismatch",),
           "conntrack-invalid": ("conntrack-invalid",)}
# the classes whose findings are warnings (the others' are errors)
WARNINGS = ("downstream-disconnect", "no-route")
# scenario -> the fix printed first: the one that keeps the most of the mesh
FIRST = {"collision": "tproxy", "refused": "app-listens", "refused-localhost": "bind-all", "framing": "app-framing",
         "stale-keepalive": "idle-timeout", "port-exhaustion": "reuse-connections",
         "downstream-idle": "caller-idle-timeout", "http10": "caller-http11",
         "slow-app": "route-timeout", "goaway": "retry-refused-stream", "overflow": "pool-limits",
         "outlier": "min-health-percent", "no-route": "default-route", "mtls-strict": "permissive-mtls",
         "tls-to-plaintext": "tls-disable", "conntrack-invalid": "invalid-drop"}
# A fix of one of a round's several failures: the request it is about is then served (the others fail still).
FIXED_REQUEST = {"caller-http11": "/http10", "accept-http10": "GET /http10", "caller-no-upgrade": "/upgrade",
                 "caller-valid-request": "/malformed", "route-timeout": f"/slow/{SLOW_TOO_LONG}",
                 "caller-timeout": f"/slow/{SLOW_ABANDONED}", "caller-no-half-close": SLOW_HALF_CLOSED}
# Requests the round's app answers with an error of its own (outlier's burst of 500s, which trips the ejection):
# what the app said, not a failure of the mesh.
APP_ERRORS = ("/status/500",)
# The lint finding of the same class, read from the Pod at watch's start: gone once the spec is fixed.
LINT_GONE = {("collision", "tproxy"): "redirect-exposure", ("collision", "exclude-port"): "redirect-exposure"}
CASES = [(scenario, fix.name) for scenario in FAILING for fix in fixes_for(scenario)]


def fixed_pod(scenario: str, fix: str) -> str:
    return f"{scenario}-{fix}"


@pytest.fixture(scope="module")
def fix_lab(tmp_path_factory):
    name = lab_name("f")
    pods = [*FAILING, *(f"{fixed_pod(s, f)}={s}" for s, f in CASES)]
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, pods, drivers=False,
                   fixes={fixed_pod(s, f): lab_fix(s, f) for s, f in CASES})
    try:
        yield state
    finally:
        lab.down(state.state_dir)


def failure_lines(state, pod: str, since: int) -> list[str]:
    """The sidecar's access-log lines after byte ``since`` that carry a response flag."""
    path = lab.access_log_path(state, pod)
    with open(path, "rb") as f:
        f.seek(since)
        lines = f.read().decode("utf-8", "replace").splitlines()
    return [line for line in lines if (entry := parse_line(line)) is not None and entry.flags]


def failed(result, request: str = "") -> bool:
    """The round saw the failure: an error, the live connection reset, or a request not answered 200 (only
    the request labelled ``request...``, when given)."""
    if request:
        return not any(label.startswith(request) and status == 200 for label, status, _ in result.http)
    return bool(result.errors or result.live_reset
                or any(status != 200 and not label.startswith(APP_ERRORS) for label, status, _ in result.http))


def printing(report: dict, scenario: str, fix: str | None = None) -> list[dict]:
    """The findings of the scenario's classes (WARNINGS' are warnings, the others' errors) that print ``fix``,
    when given."""
    return [f for f in judged(report) if f["detector"] in FAILING[scenario]
            and (f["severity"] == "error" or f["detector"] in WARNINGS)
            and (fix is None or fix in [x["name"] for x in f.get("fixes", ())])]


def watch(state, scenario: str, pod: str, out) -> tuple[dict, object, tuple]:
    """watch one round of ``pod`` (of ``scenario``): its report, the round, and the saved sidecar log where the
    class is one only Envoy's log shows (the watch waits for the round's lines, and analyze reads them)."""
    if scenario in POLICY:
        live, result, log = watch_round(state, pod, out, POLICY[scenario][1])
        return live, result, (log,)
    live, result = run_scenario(state, pod, out)
    return live, result, ()


def test_every_scenario_with_fixes_is_tested():
    # remap: collision's exposure, no failure; no-sidecar: lint's, proven in test_lint_lab.py; server-first and
    # outbound-stale fail only through a caller sidecar (its sniffing; its half-closed :15001 socket), proven in
    # test_server_first_lab.py and test_outbound_collision_lab.py
    assert set(SCENARIO_FIXES) - {"remap", "no-sidecar", "server-first", "outbound-stale"} == set(FAILING) == set(FIRST)


@pytest.mark.parametrize("scenario", list(FAILING))
def test_the_failing_pod_prints_the_fixes_the_lab_applies(fix_lab, scenario, tmp_path):
    live, result, _ = watch(fix_lab, scenario, scenario, tmp_path)
    assert failed(result), result  # the failure happened
    found = printing(live, scenario)
    assert found, json.dumps(judged(live))[:2000]
    by_name = {fix.name: fix for fix in fixes_for(scenario)}
    printed = []
    for finding in found:
        names = [fix["name"] for fix in finding["fixes"]]
        printed += [n for n in names if n not in printed]
        at = -1
        for name in names:  # each fix's text, in its order: what the lab applies is what is printed
            at = finding["remediation"].index(by_name[name].text, at + 1)
    # Every fix the lab applies was printed, in the order printed (one round may show several failures).
    assert printed == list(by_name), printed
    assert FIRST[scenario] in [f["fixes"][0]["name"] for f in found]


@pytest.mark.parametrize(("scenario", "fix"), CASES)
def test_each_printed_fix_removes_the_failure(fix_lab, scenario, fix, tmp_path):
    pod = fixed_pod(scenario, fix)
    log_at = lab.access_log_path(fix_lab, pod).stat().st_size
    live, result, logs = watch(fix_lab, scenario, pod, tmp_path)
    offline = analyze_files(tmp_path, pod, *logs)
    assert not failed(result, FIXED_REQUEST.get(fix, "")) and result.http_ok > 0, result  # served
    if scenario == "collision":
        assert result.http_ok == 6 and result.echo_ok == 1, result  # the live connection outlived the second
    for report in (live, offline):  # the failures this fix is printed for are gone
        assert not printing(report, scenario, fix), json.dumps(printing(report, scenario, fix), indent=1)[:2000]
    if fix not in FIXED_REQUEST:  # nothing of the class is left, not even an exposure (watch reads the spec)
        assert not [f for f in judged(live) if f["detector"] in FAILING[scenario]], json.dumps(judged(live))[:2000]
    # No failure flag in the access log but those of the round's other failures (their own findings' lines).
    others = {line for f in judged(live) for line in f.get("access_log", ())}
    assert [line for line in failure_lines(fix_lab, pod, log_at) if line not in others] == []
    if (scenario, fix) in LINT_GONE:
        assert not [f for f in live["findings"] if f["detector"] == LINT_GONE[scenario, fix]]
