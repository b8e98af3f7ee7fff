"""Issue 18: every fix a finding prints is proven in the lab. For each scenario with fixes (lab/fixes.py), the
failing pod reports its class and prints exactly the fixes the lab applies, as the same text; the same scenario
with each printed fix applied the way Istio renders it reports no error of that class, live nor offline, its
sidecar's access log shows no failure flag, and the round's traffic is served."""

from __future__ import annotations

import json
import secrets

import pytest

from kubectl_meshdoctor.commands.scenario_fixes import SCENARIO_FIXES, lab_fix
from kubectl_meshdoctor.commands.scenario_fixes import printed_fixes as fixes_for
from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor.lab import lab

from .test_scenarios_detected import analyze_files, judged, run_scenario

pytestmark = pytest.mark.lab

# scenario -> the detector whose failure it reproduces (an error finding when unfixed)
FAILING = {"collision": "tuple-collision", "refused": "upstream-refused", "refused-localhost": "upstream-refused",
           "framing": "http-framing", "stale-keepalive": "stale-keepalive"}
# scenario -> the fix printed first: the one that keeps the most of the mesh
FIRST = {"collision": "tproxy", "refused": "app-listens", "refused-localhost": "bind-all", "framing": "app-framing",
         "stale-keepalive": "idle-timeout"}
# The lint finding of the same class, read from the Pod at watch's start: gone once the spec is fixed.
LINT_GONE = {("collision", "tproxy"): "redirect-exposure", ("collision", "exclude-port"): "redirect-exposure"}
CASES = [(scenario, fix.name) for scenario in FAILING for fix in fixes_for(scenario)]


def fixed_pod(scenario: str, fix: str) -> str:
    return f"{scenario}-{fix}"


@pytest.fixture(scope="module")
def fix_lab(tmp_path_factory):
    name = f"mdtest-f{secrets.token_hex(2)}"
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


def test_every_scenario_with_fixes_is_tested():
    assert set(SCENARIO_FIXES) - {"remap"} == set(FAILING) == set(FIRST)  # remap: collision's exposure, no failure


@pytest.mark.parametrize("scenario", list(FAILING))
def test_the_failing_pod_prints_the_fixes_the_lab_applies(fix_lab, scenario, tmp_path):
    live, result = run_scenario(fix_lab, scenario, tmp_path)
    assert result.errors, result  # the failure happened
    found = [f for f in judged(live) if f["detector"] == FAILING[scenario] and f["severity"] == "error"]
    assert found, json.dumps(judged(live))[:2000]
    for finding in found:
        printed = [fix["name"] for fix in finding["fixes"]]
        assert printed == [fix.name for fix in fixes_for(scenario)]
        at = -1
        for fix in fixes_for(scenario):  # each fix's text, in its order: what the lab applies is what is printed
            at = finding["remediation"].index(fix.text, at + 1)
        assert printed[0] == FIRST[scenario]


@pytest.mark.parametrize(("scenario", "fix"), CASES)
def test_each_printed_fix_removes_the_failure(fix_lab, scenario, fix, tmp_path):
    pod = fixed_pod(scenario, fix)
    log_at = lab.access_log_path(fix_lab, pod).stat().st_size
    live, result = run_scenario(fix_lab, pod, tmp_path)
    offline = analyze_files(tmp_path, pod)
    assert not result.errors and not result.live_reset and result.http_ok > 0, result  # all of it served
    if scenario == "collision":
        assert result.http_ok == 6 and result.echo_ok == 1, result  # the live connection outlived the second
    for report in (live, offline):
        errors = [f for f in judged(report) if f["detector"] == FAILING[scenario] and f["severity"] == "error"]
        assert not errors, json.dumps(errors, indent=1)[:2000]
    # watch reads the pod's spec: under TPROXY or with the port excluded nothing is folded, not even an exposure
    assert not [f for f in judged(live) if f["detector"] == FAILING[scenario]], json.dumps(judged(live))[:2000]
    assert not failure_lines(fix_lab, pod, log_at)
    if (scenario, fix) in LINT_GONE:
        assert not [f for f in live["findings"] if f["detector"] == LINT_GONE[scenario, fix]]
