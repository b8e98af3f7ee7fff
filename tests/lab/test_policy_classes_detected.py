"""The classes a sidecar's Istio policy causes, live: a connectionPool's circuit breaker (503 UO), every endpoint
ejected (503 UH), no route (404 NR), and mTLS on one side only (0 NR filter_chain_not_found, 503 UF TLS_error),
each reproduced by real Envoy 1.40 in the lab. `watch` (real tcpdump through the exec stream, the followed
istio-proxy log) and `analyze` on what it saved (its captures and the sidecar's log) report exactly the class,
one finding for each request Envoy failed, on the scenario's flow, quoting Envoy's line; no packet detector
mistakes the round's traffic for another class."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line
from meshdoctor_lab import lab
from meshdoctor_lab.scenarios import RoundResult
from meshdoctor_lab.scenarios.table import OUTLIER_AFTER, OUTLIER_CONSECUTIVE_5XX

from ..waiting import wait_until
from .test_scenarios_detected import judged
from .watching import capturing
from .lab_names import lab_name

pytestmark = pytest.mark.lab

# pod -> the (detector, severity) its round's failures are, and how many access-log lines its round writes
EXPECTED = {
    "overflow": ({("circuit-breaker-overflow", "error")}, 3),
    "outlier": ({("no-healthy-upstream", "error")}, OUTLIER_CONSECUTIVE_5XX + OUTLIER_AFTER),
    "no-route": ({("no-route", "warning")}, 2),
    "mtls-strict": ({("tls-mismatch", "error")}, 2),
    "tls-to-plaintext": ({("tls-mismatch", "error")}, 1),
}
# The class as each failing line says it: flags and details (docs/lab-envoy.md, what Envoy 1.40 did)
SAID = {
    "overflow": " 503 UO upstream_reset_before_response_started{overflow} ",
    "outlier": " 503 UH no_healthy_upstream ",
    "no-route": " 404 NR route_not_found ",
    "mtls-strict": '"- - -" 0 NR filter_chain_not_found ',
    "tls-to-plaintext": " 503 UF upstream_reset_before_response_started{remote_connection_failure|TLS_error:",
}
# The cluster stat real Envoy 1.40 moves for the failure (docs/lab-envoy.md), on the cluster the line names: the
# pod's inbound cluster, or the callers' outbound one where the DestinationRule acts. watch backs each finding with
# it. (mtls-strict's no_filter_chain_match is a listener's stat, no-route's no_route an HCM's: no cluster's.)
BACKED_BY = {"overflow": ("inbound|5000||", "upstream_rq_pending_overflow"),
             "outlier": ("outbound|5000||{pod}.{ns}.svc.cluster.local", "upstream_cx_none_healthy"),
             "tls-to-plaintext": ("outbound|5000||{pod}.{ns}.svc.cluster.local", "ssl.connection_error")}
# What tells the variant of the class (its finding's details.kind), where the class has several.
KIND = {"mtls-strict": "plaintext-to-mtls", "tls-to-plaintext": "tls-to-plaintext"}


@pytest.fixture(scope="module")
def policy_lab(tmp_path_factory):
    name = lab_name("t")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, tuple(EXPECTED), drivers=False)
    try:
        yield state
    finally:
        lab.down(state.state_dir)


def access_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if parse_line(line) is not None]


def failing(lines: list[str]) -> list[str]:
    """The lines with a response flag: the failures Envoy logged."""
    return [line for line in lines if (entry := parse_line(line)) is not None and entry.flags]


def watch_round(state, pod: str, out: Path, want: int) -> tuple[dict, RoundResult, Path]:
    """watch the pod while one round runs, stopped once Envoy has written the round's ``want`` access-log lines
    (a class only Envoy's log shows is found from its line: the watch must have read it). Returns the report,
    the round and the sidecar's log over the watch (what `kubectl logs POD -c istio-proxy` prints of it)."""
    log = lab.access_log_path(state, pod)
    at = log.stat().st_size

    def since() -> str:
        with open(log, "rb") as f:
            f.seek(at)
            return f.read().decode("utf-8", "replace")
    with capturing(state, f"pod/{pod}", "--write-pcap", str(out)) as run:
        result = lab.trigger_round(state, pod)
        wait_until(f"{want} access-log lines of {pod}", 30, lambda: len(access_lines(since())) >= want)
        report = run.stop()
    saved = out / f"{pod}-istio-proxy.log"
    saved.write_text(since())
    return report, result, saved


def analyze(*paths: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *map(str, paths), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def key(f: dict) -> tuple:
    """What must agree between watch and analyze: detector, severity, flow (server, and the caller's address),
    the lines it quotes."""
    client = f["flow"]["client"].rsplit(":", 1)[0]
    return (f["detector"], f["severity"], client, f["flow"]["server"], tuple(f.get("access_log", ())))


@pytest.mark.parametrize("pod", EXPECTED)
def test_watch_and_analyze_name_the_policy_class(policy_lab, pod, tmp_path):
    classes, lines_of_round = EXPECTED[pod]
    live, _, log = watch_round(policy_lab, pod, tmp_path, lines_of_round)
    found = judged(live)
    assert {(f["detector"], f["severity"]) for f in found} == classes, json.dumps(found, indent=1)[:3000]
    lines = failing(access_lines(log.read_text()))
    assert lines and all(SAID[pod] in line for line in lines), lines
    # one finding a request Envoy failed, quoting its line; beside them only the round's 5xx answers a finding
    # names as its cause (the burst that made outlier detection eject), each once
    quoted = [line for f in found for line in f.get("access_log", ())]
    assert sorted(q for q in quoted if q in lines) == sorted(lines), json.dumps(found, indent=1)[:3000]
    causes = [q for q in quoted if q not in lines]
    round_lines = access_lines(log.read_text())
    assert all(q in round_lines and parse_line(q).code >= 500 for q in causes) and len(set(causes)) == len(causes)
    assert len(found) == len(lines)
    lab_pod = policy_lab.pod(pod)
    for f in found:
        assert f["flow"]["client"].startswith(lab_pod.client_ip + ":"), f["flow"]
        assert f["flow"]["server"] == f"{lab_pod.pod_ip}:5000", f["flow"]
        assert f["fixes"] and f["remediation"], f
        if pod in KIND:
            assert f["details"]["kind"] == KIND[pod], f["details"]
        if pod in BACKED_BY:
            cluster, stat = BACKED_BY[pod]
            name = f"cluster.{cluster.format(pod=pod, ns=policy_lab.namespace)}.{stat}"
            assert f.get("counters", {}).get(name, 0) >= 1, (name, f.get("counters"))
    assert [f for f in live["findings"] if f["detector"] == "access-log"] == []  # every line was claimed

    code, offline = analyze(tmp_path / f"{pod}-lo.pcap", tmp_path / f"{pod}-eth0.pcap", log)
    assert code == (1 if any(sev == "error" for _, sev in classes) else 0)
    assert sorted(map(key, judged(offline))) == sorted(map(key, found)), json.dumps(judged(offline))[:3000]
    _, wire = analyze(tmp_path / f"{pod}-lo.pcap", tmp_path / f"{pod}-eth0.pcap")
    # the captures alone: only what the wire shows of the class (the plaintext request the pod reset unread)
    assert {(f["detector"], f["severity"]) for f in judged(wire)} == (classes if pod == "mtls-strict" else set()), \
        json.dumps(judged(wire), indent=1)[:3000]
