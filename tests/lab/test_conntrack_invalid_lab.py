"""Issue 33, class 4, live through the mesh lab's caller sidecar and the pod's (Istio mTLS, real Envoy 1.40): an
upload into whose connection the round writes one out-of-window segment (meshdoctor_lab/scenarios/invalid_rounds.py).
`watch` of the pod names conntrack-invalid with the RST from the app's port and conntrack's invalid counter;
`analyze` names it from the pod's directory, and from both pods' directories quoting the caller's 503 UC; the
caller's directory alone names no cause (its 503 UC is no proof of a keep-alive race) and says what to capture.
The same round on pods with each printed fix applied as Istio renders it (istio-init's INVALID_DROP rule; the pod
namespace's nf_conntrack_tcp_be_liberal) completes the upload with no error.
Needs root, iproute2, iptables, openssl, tcpdump, tshark and kubectl."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor.lint import RULES
from meshdoctor_lab import lab
from meshdoctor_lab.scenario_fixes import lab_fix
from meshdoctor_lab.state import caller_pod_name

from .lab_names import lab_name
from .test_mesh_watch import analyze, kubectl_logs
from .watching import capturing_all, stop_all

pytestmark = [pytest.mark.lab, pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")]

SCENARIO = "conntrack-invalid"
FIXED = {"drop": "invalid-drop", "liberal": "conntrack-be-liberal"}  # pod -> the printed fix applied to it
UC = " 503 UC upstream_reset_before_response_started{connection_termination} "


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    name = lab_name("i")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, (SCENARIO, *(f"{p}={SCENARIO}" for p in FIXED)),
                   drivers=False, mesh=lab.MeshOptions(caller="sidecar"),
                   fixes={pod: lab_fix(SCENARIO, fix) for pod, fix in FIXED.items()})
    try:
        yield state
    finally:
        lab.down(state.state_dir)


def errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error" and f["detector"] not in RULES]


def watched_round(state, server: str, tmp_path: Path):
    """watch the pod and its caller (each writing its captures to a directory named after it) while one round
    runs; each directory then gets its sidecar's log. Returns (round, {side: report}, {side: directory})."""
    caller = caller_pod_name(server)
    dirs = {"server": tmp_path / server, "caller": tmp_path / caller}
    sides = {"server": server, "caller": caller}
    with capturing_all(state, *((f"pod/{pod}", "--write-pcap", str(dirs[side])) for side, pod in sides.items())) \
            as runs:
        result = lab.trigger_round(state, server)
        reports = dict(zip(sides, stop_all(runs)))
    for side, pod in (("server", server), ("caller", caller)):
        (dirs[side] / "istio-proxy.log").write_text(kubectl_logs(state, pod))
    return result, reports, dirs


def test_watch_and_analyze_name_the_invalid_segment_at_the_pod(mesh, tmp_path):
    result, reports, dirs = watched_round(mesh, SCENARIO, tmp_path)
    (label, status, said), = result.http
    assert status == 0 and "reset" in said.lower() and not result.errors, result
    caller_log = (dirs["caller"] / "istio-proxy.log").read_text()
    (uc,) = [line for line in caller_log.splitlines() if UC in line and "POST /upload" in line]

    (live,) = errors(reports["server"])
    assert live["detector"] == "conntrack-invalid" and live["flow"]["iface"] == "eth0"
    rst = live["evidence"][-1]
    assert rst["flags"] == "R" and rst["src"] == f"{mesh.pod(SCENARIO).pod_ip}:5000"
    assert live["counters"].get("kernel.ConntrackInvalid", 0) >= 1  # conntrack -S invalid, read in the pod

    # The caller's watch: the same RST on its eth0, and its outbound cluster's connection closed by the peer.
    (at_caller,) = errors(reports["caller"])
    assert at_caller["detector"] == "conntrack-invalid" and at_caller["access_log"] == [uc]
    assert any(k.endswith("upstream_cx_destroy_remote_with_active_rq") for k in at_caller["counters"]), at_caller

    (alone,) = errors(analyze(dirs["server"]))
    assert alone["detector"] == "conntrack-invalid" and alone["evidence"][-1]["frame"] == rst["frame"]

    both = errors(analyze(dirs["server"], dirs["caller"]))
    assert {f["detector"] for f in both} == {"conntrack-invalid"}, [(f["detector"], f["title"]) for f in both]
    assert [uc] in [f.get("access_log") for f in both]

    # The caller's side alone: its eth0 shows the same RST arriving from the pod's port 5000, with no FIN or RST of
    # the pod's before it; the finding quotes the caller's 503 UC, so no keep-alive race is guessed from that line.
    (caller_only,) = errors(analyze(dirs["caller"]))
    assert caller_only["detector"] == "conntrack-invalid" and caller_only["access_log"] == [uc]
    assert caller_only["evidence"][-1]["src"] == rst["src"] and "pod that serves" in caller_only["explanation"]


@pytest.mark.parametrize("pod", list(FIXED))
def test_each_printed_fix_lets_the_upload_finish(mesh, pod, tmp_path):
    result, reports, dirs = watched_round(mesh, pod, tmp_path)
    assert result.http_ok == 1 and not result.errors, result
    for side in ("server", "caller"):
        assert errors(reports[side]) == [], (side, reports[side]["findings"])
        log = (dirs[side] / "istio-proxy.log").read_text()
        entries = [e for e in map(parse_line, log.splitlines()) if e is not None]
        assert entries and all(e.code == 200 and not e.flags for e in entries), log
    assert errors(analyze(dirs["server"], dirs["caller"])) == []
