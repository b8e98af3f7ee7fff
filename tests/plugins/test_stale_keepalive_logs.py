"""Stale keep-alive, our headline class, named from Envoy's logs alone: proven by the debug log (the pool's
reuse of an idle connection that then closed under the request); from the access log's 503 UC alone no cause is
named (issue 33: a conntrack-INVALID reset logs the same line), only what to capture next.
The lines are real Envoy 1.40's, recorded in the lab (tests/envoy/data/component_log/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..envoy.component_shapes import SHAPES, render_log
from ..helpers import analyze_json

LOG = Path(__file__).resolve().parent.parent / "envoy" / "data" / "component_log" / "stale-keepalive.log"


analyze = analyze_json


@pytest.mark.parametrize("shape", ["as-recorded", *SHAPES])
def test_the_debug_log_proves_it_in_every_shape(tmp_path, shape):
    lines = LOG.read_text().splitlines()
    debug_only = [ln for ln in lines if not ln.startswith("[20")]  # no access-log line: Envoy's own log alone
    if shape != "as-recorded":
        debug_only = render_log(debug_only, shape)
    log = tmp_path / "envoy.log"
    log.write_text("\n".join(debug_only) + "\n")
    code, report = analyze(log)
    assert code == 1, report["problems"]
    found = [f for f in report["findings"] if f["severity"] == "error"]
    assert found and {f["detector"] for f in found} == {"stale-keepalive"}
    for f in found:
        assert f["stands_on"] == ["envoy-log"] and f["details"]["proven"] is True
        said = " | ".join(e["what"] for e in f["evidence"])
        assert "using existing" in said and "connection termination" in said
    if shape != "bare":  # the idle spell the app closed after gives the printed timeout
        timed = [f for f in found if "idle_before_reuse_s" in f["details"]]
        assert timed and all(f["details"]["idle_before_reuse_s"] > 1.0 for f in timed)
        assert all("idleTimeout: 961ms" in f["remediation"] for f in timed)


def test_the_access_log_alone_names_no_cause(tmp_path):
    log = tmp_path / "access.log"
    log.write_text("\n".join(ln for ln in LOG.read_text().splitlines() if ln.startswith("[20")) + "\n")
    code, report = analyze(log)
    assert code == 1
    found = [f for f in report["findings"] if f["severity"] == "error"]
    assert found and {f["detector"] for f in found} == {"stale-keepalive"}
    assert all(f["stands_on"] == ["access-log"] and f["details"]["proven"] is False for f in found)
    assert all("cause not in this evidence" in f["title"] and "--envoy-debug" in f["explanation"]
               and "keep-alive race" not in f["title"] and not f.get("fixes") for f in found)


def test_both_logs_of_one_request_are_one_finding(tmp_path):
    code, report = analyze(LOG)
    found = [f for f in report["findings"] if f["detector"] == "stale-keepalive"]
    uc_lines = [ln for ln in LOG.read_text().splitlines() if '" 503 UC ' in ln]
    assert len(found) == len(uc_lines)  # joined by x-request-id: not one finding per log
    assert all(f["stands_on"] == ["access-log", "envoy-log"] and len(f["access_log"]) == 1 for f in found)


@pytest.mark.parametrize("shape", ["as-recorded", "envoy-1.15", "istio-1.9", "istio-pasted", "istio-json"])
def test_envoy_before_1_27_without_the_attach_line_still_proves_it(tmp_path, shape):
    """Envoy logs 'Attached upstream connection [C11] to downstream connection [C12]' from 1.27 on (PR #27856);
    before, the pool's 'using existing connection' on a worker and the stream's 'pool ready' right after on
    the same worker are the link (docs/envoy-component-log.md)."""
    lines = [ln for ln in LOG.read_text().splitlines()
             if not ln.startswith("[20") and "Attached upstream connection" not in ln]
    if shape != "as-recorded":
        lines = render_log(lines, shape, tags=False)
    log = tmp_path / "envoy.log"
    log.write_text("\n".join(lines) + "\n")
    code, report = analyze(log)
    found = [f for f in report["findings"] if f["severity"] == "error"]
    assert code == 1 and found and {f["detector"] for f in found} == {"stale-keepalive"}
    assert all(f["details"]["proven"] is True for f in found)
    assert any(f["details"].get("idle_before_reuse_s", 0) > 1.0 for f in found)


def test_the_text_report_shows_the_instance_envoys_own_log_proves(tmp_path):
    """The debug log's proof and a newer line the access log alone cannot explain are two problems, the proven one
    first: a 503 UC with no cause shown is not counted as one more keep-alive race (issue 33), and prints no fix."""
    import re
    import subprocess
    import sys

    lines = LOG.read_text().splitlines()
    uc = next(ln for ln in lines if '" 503 UC ' in ln)
    later = re.sub(r"\[2026-12-03T(\d\d):", r"[2026-12-03T23:", re.sub(r'"[0-9a-f]{8}-', '"ffffffff-', uc), count=1)
    log = tmp_path / "proxy.log"
    log.write_text("\n".join([*lines, later]) + "\n")
    out = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(log)], capture_output=True,
                         text=True, timeout=120).stdout
    assert "2 failure problems" in out
    proven, unproven = out.split("ERROR stale-keepalive [UC]: ")[1:3]
    assert proven.startswith("request on a connection the app was closing")
    assert "envoy log: [C" in proven and "using existing" in proven and "idleTimeout" in proven
    assert unproven.startswith("connection closed under the request (cause not in this evidence)")
    assert "none yet: the cause is not in this evidence" in unproven and "idleTimeout" not in unproven


def test_the_counters_alone_name_no_cause():
    """Envoy's stats of the lab's stale-keepalive round count 503 UC closes; so would a conntrack-INVALID reset
    (issue 33): the counters finding names no cause, prints no fix and says what to capture."""
    data = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40" / "stale-keepalive"
    code, report = analyze(data / "stats-before.txt", data / "stats-after.txt")
    found = [f for f in report["findings"] if f["detector"] == "stale-keepalive"]
    assert code == 1 and found
    for f in found:
        assert "cause not in the counters" in f["title"] and "conntrack-invalid" in f["explanation"]
        assert "Most often" not in f["explanation"] and not f.get("fixes") and "none yet" in f["remediation"]
