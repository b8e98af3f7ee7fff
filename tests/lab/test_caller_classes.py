"""Issue 14's log-visible classes through real Envoy: the route's timeout firing (504 UT), a caller giving up
first (0 DC) and requests the sidecar's codec refuses (426 low_version, 403 upgrade_failed, 400 DPE). Each is
found live by `watch` and offline by `analyze` on the saved captures plus the sidecar's log, naming the line
real Envoy wrote; the slow request answered in time and the ordinary one give nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshdoctor_lab import lab
from meshdoctor_lab.scenarios.table import (
    EXHAUSTION_PORTS,
    EXHAUSTION_REQUESTS,
    GOAWAY_REFUSE_EVERY,
    GOAWAY_REQUESTS,
    SLOW_ABANDONED,
    SLOW_CALLER_GIVES_UP,
    SLOW_HALF_CLOSED,
    SLOW_ROUTE_TIMEOUT,
)

from ..waiting import wait_until
from .test_scenarios_detected import judged
from .watching import capturing
from .lab_names import lab_name

pytestmark = pytest.mark.lab

PODS = ("slow-app", "http10", "port-exhaustion", "goaway", "healthy-h2")
CLASS_PODS = PODS[:4]

# Per pod: the access-log lines real Envoy writes for its round (what each finding must carry), and the
# (detector, severity) each of them becomes.
EXPECTED = {
    "slow-app": {" 504 UT response_timeout ": ("upstream-timeout", "error"),
                 f'/slow/{SLOW_ABANDONED} HTTP/1.1" 0 DC downstream_remote_disconnect ': ("downstream-disconnect",
                                                                                       "warning"),
                 f'{SLOW_HALF_CLOSED} HTTP/1.1" 0 DC downstream_remote_disconnect ': ("downstream-disconnect",
                                                                                   "warning")},
    "http10": {" 426 DPE low_version ": ("downstream-protocol-error", "error"),
               " 403 - upgrade_failed ": ("downstream-protocol-error", "error"),
               " 400 DPE http1.codec_error ": ("downstream-protocol-error", "error")},
    "port-exhaustion": {" 503 UF upstream_reset_before_response_started{remote_connection_failure|"
                        "immediate_connect_error:_Cannot_assign_requested_address": ("source-port-exhaustion",
                                                                                     "error")},
    # HTTP/2 to the app: the streams it refuses (REFUSED_STREAM), with no retry on the inbound route.
    "goaway": {" 503 UR upstream_reset_before_response_started{remote_refused_stream_reset} ": ("upstream-goaway",
                                                                                                "error")},
    # The same HTTP/2 app refusing nothing: nine 200s, no finding.
    "healthy-h2": {},
}


# A refused pod whose status counts restarts of its app container, as a crash-looping one's does.
RESTARTING = {"restarting": [
    {"op": "test", "path": "/status/containerStatuses/0/name", "value": "app"},
    {"op": "replace", "path": "/status/containerStatuses/0/restartCount", "value": 5},
]}


@pytest.fixture(scope="module")
def caller_lab(tmp_path_factory):
    name = lab_name("c")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, (*PODS, "restarting=refused"), drivers=False,
                   spec_patches=RESTARTING)
    try:
        yield state
    finally:
        lab.down(state.state_dir)


PORTS = EXHAUSTION_PORTS[1] - EXHAUSTION_PORTS[0] + 1
# The pods whose classes the wire shows (eth0: the request and Envoy's own answer, or the caller's FIN).
WIRE_PODS = ("slow-app", "http10")


def lines_expected(pod: str) -> int:
    """How many failing lines a round makes Envoy write: one per class, but every request past the pod's
    source ports for port-exhaustion (one round per test run: its ports stay in TIME_WAIT for 60 s)."""
    if pod == "port-exhaustion":
        return EXHAUSTION_REQUESTS - PORTS
    if pod == "goaway":
        return GOAWAY_REQUESTS // GOAWAY_REFUSE_EVERY
    return len(EXPECTED[pod])


def watch_round(state, pod: str, out: Path) -> tuple[dict, Path]:
    """watch the pod while one round runs; stopped once Envoy has written every expected line. Returns the
    report and a copy of the sidecar's log (what `kubectl logs POD -c istio-proxy` prints)."""
    log = lab.access_log_path(state, pod)
    before = log.read_text() if log.exists() else ""
    with capturing(state, f"pod/{pod}", "--write-pcap", str(out)) as run:
        lab.trigger_round(state, pod)
        wait_until(f"Envoy's lines for {pod}", 30,
                   lambda: sum(log.read_text()[len(before):].count(n) for n in EXPECTED[pod]) >= lines_expected(pod)
                   and (pod != "healthy-h2" or log.read_text()[len(before):].count(" 200 - via_upstream ")
                        >= GOAWAY_REQUESTS))
        report = run.stop()
    saved = out / f"{pod}-istio-proxy.log"
    saved.write_text(log.read_text()[len(before):])
    return report, saved


def by_line(findings: list[dict]) -> dict[str, tuple]:
    """Each finding by the Envoy line it carries: (detector, severity, client, server)."""
    out = {}
    for f in findings:
        (line,) = f["access_log"]
        needle = next(n for n in EXPECTED_ALL if n in line)
        out[needle] = (f["detector"], f["severity"], f["flow"]["client"], f["flow"]["server"])
    return out


EXPECTED_ALL = {n: v for table in EXPECTED.values() for n, v in table.items()}


@pytest.mark.parametrize("pod", CLASS_PODS)
def test_live_and_offline_name_the_class_of_each_envoy_line(caller_lab, pod, tmp_path):
    live, log = watch_round(caller_lab, pod, tmp_path)
    found = judged(live)
    assert {(f["detector"], f["severity"]) for f in found} == set(EXPECTED[pod].values()), \
        json.dumps(found, indent=1)[:3000]
    assert len(found) == lines_expected(pod)
    lab_pod = caller_lab.pod(pod)
    live_lines = by_line(found)
    assert {n: v[:2] for n, v in live_lines.items()} == EXPECTED[pod]
    for detector, severity, client, server in live_lines.values():
        assert client.startswith(lab_pod.client_ip + ":") and server == f"{lab_pod.pod_ip}:5000"
    for f in found:  # what the wire shows is named from the packets, the rest from Envoy's line
        assert f["evidence"][0]["source"] == (f"{pod}/eth0" if pod in WIRE_PODS else f"pod/{pod} istio-proxy")
        assert f["remediation"]
    live_keys = sorted((f["detector"], f["access_log"][0]) for f in found)
    if pod == "port-exhaustion":
        # The ports are held by connections the sidecar closed first (maxRequestsPerConnection: 1): its FINs
        # from 127.0.0.6 on lo are the finding's evidence next to Envoy's line.
        first = found[0]
        fins = first["evidence"][1:]
        assert fins and all(e["iface"] == "lo" and e["src"].startswith("127.0.0.6:") and "F" in e["flags"]
                            for e in fins), first["evidence"]
        assert first["details"]["sidecar_closes_before"] == PORTS
        assert f"closing {PORTS} connections" in first["explanation"]
        assert first["counters"]["cluster.inbound|5000||.upstream_cx_connect_fail"] >= 1
        assert "maxRequestsPerConnection: 0" in first["remediation"]

    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(tmp_path / f"{pod}-lo.pcap"),
                           str(tmp_path / f"{pod}-eth0.pcap"), str(log), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    offline = json.loads(proc.stdout)
    assert by_line(judged(offline)) == live_lines
    assert sorted((f["detector"], f["access_log"][0]) for f in judged(offline)) == live_keys
    for f in judged(offline):
        e = f["evidence"][0]
        if pod in WIRE_PODS:
            assert e["source"] == str(tmp_path / f"{pod}-eth0.pcap") and e["iface"] == "eth0"
        else:
            assert e["source"] == str(log) and log.read_text().splitlines()[e["frame"] - 1] == f["access_log"][0]
    if pod in WIRE_PODS:  # the captures alone say as much, without Envoy's words
        wire = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze",
                               str(tmp_path / f"{pod}-lo.pcap"), str(tmp_path / f"{pod}-eth0.pcap"), "-o", "json"],
                              capture_output=True, text=True, timeout=120)
        alone_wire = judged(json.loads(wire.stdout))
        assert sorted((f["detector"], f["severity"], f["flow"]["client"], f["flow"]["server"])
                      for f in alone_wire) == sorted(live_lines.values())
        assert all(not f.get("access_log") for f in alone_wire)

    alone = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(log), "-o", "json"],
                           capture_output=True, text=True, timeout=120)
    assert by_line(judged(json.loads(alone.stdout))) == live_lines  # the log alone says as much


def test_the_timeout_and_the_impatient_caller_are_timed_as_envoy_timed_them(caller_lab, tmp_path):
    live, _ = watch_round(caller_lab, "slow-app", tmp_path)
    (ut,) = [f for f in live["findings"] if f["detector"] == "upstream-timeout"]
    dcs = {f["access_log"][0].split('"')[1]: f for f in live["findings"] if f["detector"] == "downstream-disconnect"}
    waited = int(ut["title"].split("gave up after ")[1].split(" ms")[0])
    assert abs(waited - 1000 * SLOW_ROUTE_TIMEOUT) < 100  # Envoy's clock: the route's 1 s timeout
    assert "timeout: 2s" in ut["remediation"]  # twice the timeout that fired
    dc = dcs[f"GET /slow/{SLOW_ABANDONED} HTTP/1.1"]
    gave_up = int(dc["title"].split(" after ")[1].split(" ms")[0])
    assert abs(gave_up - 1000 * SLOW_CALLER_GIVES_UP) < 100
    assert [x["name"] for x in dc["fixes"]] == ["caller-timeout"]
    # The half-closing caller: its FIN follows its request at once, and it is told to keep its side open.
    half = dcs[f"GET {SLOW_HALF_CLOSED} HTTP/1.1"]
    assert "half-closed its connection" in half["title"] and half["evidence"][0]["iface"] == "eth0"
    assert [x["name"] for x in half["fixes"]] == ["caller-no-half-close"] and "half-close" in half["explanation"]
    assert ut["response_code_details"] == "response_timeout" and ut["envoy_flags"] == ["UT"]
    assert ut["counters"]["cluster.inbound|5000||.upstream_rq_timeout"] >= 1  # what real Envoy counts for it


def test_the_protocol_errors_say_what_the_caller_did(caller_lab, tmp_path):
    live, _ = watch_round(caller_lab, "http10", tmp_path)
    kinds = sorted(f["details"]["kind"] for f in live["findings"] if f["detector"] == "downstream-protocol-error")
    assert kinds == ["codec", "http10", "upgrade"]
    (http10,) = [f for f in live["findings"] if f.get("details", {}).get("kind") == "http10"]
    assert "ISTIO_META_HTTP10" in http10["remediation"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")
def test_kubectl_logs_with_timestamps_reads_as_the_log_does(caller_lab, tmp_path):
    """What users hand us most: `kubectl logs POD -c istio-proxy --timestamps > proxy.log`."""
    _, log = watch_round(caller_lab, "slow-app", tmp_path)
    out = subprocess.run(["kubectl", "--kubeconfig", str(caller_lab.kubeconfig), "logs", "slow-app", "-c",
                          "istio-proxy", "--timestamps"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    stamped = tmp_path / "proxy.log"
    stamped.write_text(out.stdout)
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(stamped), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    found = {f["detector"] for f in judged(json.loads(proc.stdout))}
    assert found == {"upstream-timeout", "downstream-disconnect"}, proc.stdout[:2000]



def test_refused_http2_streams_carry_what_envoy_counted(caller_lab, tmp_path):
    live, _ = watch_round(caller_lab, "goaway", tmp_path)
    refused = [f for f in live["findings"] if f["detector"] == "upstream-goaway"]
    assert len(refused) == GOAWAY_REQUESTS // GOAWAY_REFUSE_EVERY
    for f in refused:
        assert f["envoy_flags"] == ["UR"] and "REFUSED_STREAM" in f["explanation"]
        assert "refused-stream" in f["remediation"]
    # The app's GOAWAY after four streams closed its connections gracefully: Envoy counted the notices.
    assert live["envoy"]["counters_moved"]["inbound|5000||"]["upstream_cx_close_notify"] >= 1


def test_healthy_http2_through_the_sidecar_gives_no_finding(caller_lab, tmp_path):
    live, log = watch_round(caller_lab, "healthy-h2", tmp_path)
    assert judged(live) == [], json.dumps(judged(live), indent=1)[:2000]
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(tmp_path / "healthy-h2-lo.pcap"),
                           str(tmp_path / "healthy-h2-eth0.pcap"), str(log), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[:2000]
    assert judged(json.loads(proc.stdout)) == []
    assert log.read_text().count(" 200 - via_upstream ") == GOAWAY_REQUESTS


def test_a_refusal_in_a_restarting_pod_says_so(caller_lab):
    """watch reads the pod's status: refused connections in a pod whose app has restarted are its restarts."""
    with capturing(caller_lab, "pod/restarting") as run:
        lab.trigger_round(caller_lab, "restarting")
        report = run.stop()
    refused = [f for f in report["findings"] if f["detector"] == "upstream-refused"]
    assert refused and all(f["details"] == {"cause": "restarting", "restarts": 5} for f in refused)
    assert "restarted 5 time(s)" in refused[0]["explanation"]
