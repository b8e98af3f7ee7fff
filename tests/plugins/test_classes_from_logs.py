"""Each class Envoy logs is named from its debug log alone and from its access log alone, in every shape the
debug log is printed in. The lines are real Envoy 1.40's, one round of each lab scenario
(tests/data/envoy-1.40/: the same requests in both logs, so both must name the same class)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line

from ..envoy.component_shapes import SHAPES, render_log
from ..helpers import analyze_json

DATA = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40"

# scenario -> the (detector, severity) pairs its failing requests are; what Envoy's logs must be read as.
CLASSES = {
    "stale-keepalive": {("stale-keepalive", "error")},
    "refused": {("upstream-refused", "error")},
    "refused-localhost": {("upstream-refused", "error")},
    "framing": {("http-framing", "error")},
    "slow-app": {("upstream-timeout", "error"), ("downstream-disconnect", "warning")},
    "goaway": {("upstream-goaway", "error")},
    "port-exhaustion": {("source-port-exhaustion", "error")},
    "http10": {("downstream-protocol-error", "error")},
    "overflow": {("circuit-breaker-overflow", "error")},
    "outlier": {("no-healthy-upstream", "error")},
    "no-route": {("no-route", "warning")},
    "mtls-strict": {("tls-mismatch", "error")},
    "tls-to-plaintext": {("tls-mismatch", "error")},
    # Classes only the wire shows: Envoy logs nothing that failed (the caller's stale connection meets this
    # pod's RST, the challenge ACK and the SYN drops are the kernel's), and healthy traffic.
    "downstream-idle": set(), "collision": set(), "syn-drop": set(), "healthy-http": set(),
}


def analyze(lines: list[str], tmp_path: Path) -> tuple[int, dict]:
    log = tmp_path / "istio-proxy.log"
    log.write_text("\n".join(lines) + "\n")
    return analyze_json(log)


def named(report: dict) -> set[tuple[str, str]]:
    return {(f["detector"], f["severity"]) for f in report["findings"] if f["severity"] in ("error", "warning")}


@pytest.mark.parametrize("shape", ["as-recorded", *SHAPES])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_debug_log_alone_names_the_class(name, shape, tmp_path):
    lines = [ln for ln in (DATA / name / "istio-proxy.log").read_text().splitlines() if not ln.startswith("[20")]
    if shape != "as-recorded":
        lines = render_log(lines, shape)
    code, report = analyze(lines, tmp_path)
    assert named(report) == CLASSES[name], json.dumps(report["findings"], indent=1)[:2000]
    assert code == (1 if any(sev == "error" for _, sev in CLASSES[name]) else 0)
    for f in report["findings"]:
        assert f["stands_on"] == ["envoy-log"] and f["envoy_log"]
        assert all(e["kind"] == "envoy-log" and e["frame"] >= 1 for e in f["evidence"])


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_access_log_alone_names_the_class(name, tmp_path):
    lines = [ln for ln in (DATA / name / "istio-proxy.log").read_text().splitlines() if ln.startswith("[20")]
    code, report = analyze(lines, tmp_path)
    assert named(report) == CLASSES[name], json.dumps(report["findings"], indent=1)[:2000]
    assert code == (1 if any(sev == "error" for _, sev in CLASSES[name]) else 0)
    assert all(f["stands_on"] == ["access-log"] for f in report["findings"])


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_access_log_pasted_without_its_times_names_the_class(name, tmp_path):
    """Lines copied into a ticket with the leading `[START_TIME] ` cut off: each is still read, and the flags,
    details and addresses alone name the class."""
    lines = [ln.split("] ", 1)[1] for ln in (DATA / name / "istio-proxy.log").read_text().splitlines()
             if ln.startswith("[20")]
    code, report = analyze(lines, tmp_path)
    assert report["envoy"]["access_log_lines"] == len(lines)
    assert named(report) == CLASSES[name], json.dumps(report["findings"], indent=1)[:2000]
    assert code == (1 if any(sev == "error" for _, sev in CLASSES[name]) else 0)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_both_logs_of_a_request_make_one_finding(name, tmp_path):
    lines = (DATA / name / "istio-proxy.log").read_text().splitlines()
    code, report = analyze(lines, tmp_path)
    assert named(report) == CLASSES[name]
    entries = [e for e in map(parse_line, lines) if e is not None]
    failing = [e.raw for e in entries if e.flags or (e.details and e.details != "via_upstream")]
    quoted = [line for f in report["findings"] for line in f.get("access_log", ())]
    # each failing line in exactly one finding; beside them only the 5xx answers a finding names as its cause
    # (the burst that made outlier detection eject: no-healthy-upstream), each once too
    assert sorted(q for q in quoted if q in failing) == sorted(failing)
    causes = [q for q in quoted if q not in failing]
    assert all(parse_line(q).code >= 500 for q in causes) and len(set(causes)) == len(causes)
    # where both logs tell of a request, its finding stands on both
    both = [f for f in report["findings"] if f.get("access_log") and f.get("envoy_log")]
    assert len(both) == len([f for f in report["findings"] if f.get("envoy_log") and f.get("access_log")])
    if CLASSES[name]:
        assert both, "no finding joined a request's access-log line and its debug-log lines"


@pytest.mark.parametrize("line", [
    # A websocket whose upstream closed after the 101: the app had read the request (Envoy 1.40, loopback).
    '[2026-12-03T18:10:02.101Z] "GET /die HTTP/1.1" 101 UC upstream_reset_after_response_started'
    '{connection_termination} - "-" 0 0 312 - "-" "-" "b0f3c1aa-6d0b-4a8e-9d7e-1f2a3b4c5d6e" "127.0.0.1:37613" '
    '"127.0.0.1:37613" outbound|80||ws.default.svc.cluster.local 127.0.0.1:50210 127.0.0.1:15001 '
    '127.0.0.1:50200 - default',
    # Retries spent: each attempt's connection closed under it (the app resets every request).
    '[2026-12-03T18:11:02.101Z] "GET /r HTTP/1.1" 503 URX,UC upstream_reset_before_response_started'
    '{connection_termination} - "-" 0 95 4 - "-" "-" "c0f3c1aa-6d0b-4a8e-9d7e-1f2a3b4c5d6e" "127.0.0.1:37613" '
    '"127.0.0.1:37613" outbound|80||app.default.svc.cluster.local 127.0.0.1:50212 127.0.0.1:15001 '
    '127.0.0.1:50202 - default',
])
def test_a_close_after_the_response_or_with_retries_spent_is_no_keepalive_race(line, tmp_path):
    """Found by a break-it review on real Envoy: the access log alone named these stale keep-alive races."""
    code, report = analyze([line], tmp_path)
    assert [f["detector"] for f in report["findings"]] == ["access-log"], report["findings"]


def test_a_timeout_whose_start_the_debug_log_does_not_show_has_an_unknown_wait(tmp_path):
    """A debug log pasted from the router's `upstream timeout` line on (envoyproxy/envoy#13068's paste) shows no
    start: the wait is unknown, never "0 ms", and the fix names the value to choose instead of a timeout of 2s."""
    lines = [ln for ln in (DATA / "slow-app" / "istio-proxy.log").read_text().splitlines()
             if not ln.startswith("[20")]
    cut = next(i for i, ln in enumerate(lines) if "upstream timeout" in ln)
    code, report = analyze(lines[cut:], tmp_path)
    (f,) = [f for f in report["findings"] if f["detector"] == "upstream-timeout"]
    assert code == 1 and "0 ms" not in f["title"] and "shows no start" in f["title"]
    assert "<twice the app's slowest answer>" in f["fixes"][0]["text"]
