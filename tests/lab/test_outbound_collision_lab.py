"""Issue 33, item 5, live through the mesh lab's caller sidecar (real Envoy 1.40, Istio mTLS to the pod's): the
app reconnects from a source port whose earlier connection the caller sidecar still holds half-closed on
127.0.0.1:15001 after conntrack forgot it (meshdoctor_lab/scenarios/outbound_stale.py). `watch` of the caller pod
names tuple-collision's outbound variant with the SYN, the old connection's ACK (kept on lo by the lean capture
filter, and by the reader's display filter and pre-pass, as a pure ACK between non-loopback addresses on a
conversation that saw a FIN and no SYN), the app's RST and the SYN-ACK of the SYN sent again; `analyze` of what
watch saved names the same, frame for frame. The same round with the printed fix (client-port: the kernel picks
the port) gives no error. Needs root, iproute2, iptables, conntrack, openssl, tcpdump, tshark and kubectl."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor.lint import RULES
from kubectl_meshdoctor_plugins.tuple_collision import OUTBOUND_VARIANT
from meshdoctor_lab import lab
from meshdoctor_lab.scenario_fixes import lab_fix
from meshdoctor_lab.state import caller_pod_name

from .lab_names import lab_name
from .test_mesh_watch import analyze, kubectl_logs
from .watching import capturing

pytestmark = [pytest.mark.lab, pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")]

SCENARIO = "outbound-stale"
FIXED = "fixed"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    name = lab_name("o")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, (SCENARIO, f"{FIXED}={SCENARIO}"), drivers=False,
                   mesh=lab.MeshOptions(caller="sidecar"), fixes={FIXED: lab_fix(SCENARIO, "client-port")})
    try:
        yield state
    finally:
        lab.down(state.state_dir)


def watched_round(state, pod: str, out: Path):
    """watch the pod's caller (writing its captures to ``out``) while one round runs: (round, report)."""
    with capturing(state, f"pod/{caller_pod_name(pod)}", "--write-pcap", str(out)) as run:
        result = lab.trigger_round(state, pod)
        report = run.stop()
    return result, report


def outbound(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["detector"] == "tuple-collision"]


def errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error" and f["detector"] not in RULES]


def test_watch_and_analyze_name_the_stale_socket_at_the_caller(mesh, tmp_path):
    result, report = watched_round(mesh, SCENARIO, tmp_path / "caller")
    assert result.statuses == (200, 200) and not result.errors, result
    port, pod = result.client_port, mesh.pod(SCENARIO)

    (live,) = outbound(report)
    assert live["variant"] == OUTBOUND_VARIANT and live["flow"]["iface"] == "lo"
    assert live["flow"]["client"] == f"{pod.client_ip}:{port}" and live["flow"]["server"] == "127.0.0.1:15001"
    syn, ack, rst, synack = live["evidence"]
    assert [e["flags"] for e in live["evidence"]] == ["S", ".", "R", "S."]
    # the old connection's ACK comes from the original destination, restored by conntrack, to the app's port
    assert ack["src"] == f"{pod.pod_ip}:5000" and ack["dst"] == syn["src"] == f"{pod.client_ip}:{port}"
    assert syn["frame"] < ack["frame"] < rst["frame"] < synack["frame"]
    assert live["severity"] == "warning"  # the RST got through: the SYN sent again was answered
    assert [f["name"] for f in live["fixes"]] == ["client-port"]
    assert not [f for f in report["findings"] if f["detector"] == "syn-timeout"]

    # The SYN never reached Envoy: the caller sidecar logged the two GETs, each 200 with no response flag.
    entries = [e for e in map(parse_line, kubectl_logs(mesh, caller_pod_name(SCENARIO)).splitlines()) if e]
    assert [(e.code, e.flags) for e in entries][-2:] == [(200, ())] * 2, entries

    (saved,) = outbound(analyze(tmp_path / "caller"))
    assert saved["variant"] == OUTBOUND_VARIANT
    assert [(e["flags"], e["frame"]) for e in saved["evidence"]] == [(e["flags"], e["frame"]) for e in live["evidence"]]


def test_the_printed_fix_lets_the_app_reconnect_without_meeting_the_stale_socket(mesh, tmp_path):
    result, report = watched_round(mesh, FIXED, tmp_path / "caller")
    assert result.statuses == (200, 200) and not result.errors, result
    assert outbound(report) == [] and errors(report) == [], report["findings"]
    assert outbound(analyze(tmp_path / "caller")) == []
