"""Issue 33, class 3, live through the mesh lab's caller sidecar (istiod's sniffed outbound listener, real Envoy
1.40): a server-first app (it writes a greeting on accept) on a port whose name declares no protocol
(meshdoctor_lab/scenarios/server_first_rounds.py: two connections, each waiting 3 s for the greeting).

`watch` of the caller's pod names server-first-protocol from its lo (the connection to 15001 that carried no byte
until the client's FIN), backed by the sniffed listener's downstream_listener_filter_remote_close; `analyze` names
it from the caller's directory and from both pods' directories. The server's pod sees nothing of it (its sidecar
never gets a SYN: its captures hold no frame), so its directory alone names nothing, and neither sidecar logs a
line. The same round on pods with each printed fix applied (the port declared TCP) gets the greeting, with no
error. Needs root, iproute2, iptables, openssl, tcpdump, tshark and kubectl."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line
from meshdoctor_lab.apps import ECHO_PORT
from meshdoctor_lab.scenario_fixes import lab_fix
from meshdoctor_lab.scenarios.table import SERVER_FIRST_WAIT

from .lab_names import caller_sidecar_lab
from .test_conntrack_invalid_lab import errors, watched_round  # watch the pod and its caller during one round
from .test_mesh_watch import analyze

pytestmark = [pytest.mark.lab, pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")]

SCENARIO = "server-first"
FIXED = {"declared": "app-protocol-tcp", "named": "tcp-port-name"}  # pod -> the printed fix applied to it
DETECTOR = "server-first-protocol"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    fixes = {pod: lab_fix(SCENARIO, fix) for pod, fix in FIXED.items()}
    with caller_sidecar_lab(tmp_path_factory, "f", (SCENARIO, *(f"{p}={SCENARIO}" for p in FIXED)), fixes) as state:
        yield state


def test_watch_and_analyze_name_the_sniffed_server_first_port(mesh, tmp_path):
    result, reports, dirs = watched_round(mesh, SCENARIO, tmp_path)
    assert result.echo_ok == 0 and len(result.errors) == 2 and all("no greeting" in e for e in result.errors), result
    dest = f"{mesh.pod(SCENARIO).pod_ip}:{ECHO_PORT}"
    for side in ("server", "caller"):  # no access-log line in either sidecar: no request, no upstream connection
        log = (dirs[side] / "istio-proxy.log").read_text()
        assert [e for e in map(parse_line, log.splitlines()) if e is not None] == [], (side, log)

    live = errors(reports["caller"])
    assert {f["detector"] for f in live} == {DETECTOR}, [(f["detector"], f["title"]) for f in live]
    assert len(live) == 2 and all(f["flow"]["server"] == dest and f["flow"]["iface"] == "lo" for f in live)
    first = live[0]
    syn, syn_ack, fin = first["evidence"]
    assert syn["flags"] == "S" and syn["dst"].endswith(":15001") and syn_ack["src"] == dest
    assert fin["flags"] == "F." and fin["ts"] - syn_ack["ts"] >= SERVER_FIRST_WAIT - 0.1
    assert {f["name"] for f in first["fixes"]} == set(FIXED.values())
    # the caller's sniffed listener counted both connections the clients closed while it waited
    remote_close = {k: v for k, v in first["counters"].items()
                    if k.endswith(".downstream_listener_filter_remote_close")}
    assert list(remote_close.values()) == [2], first["counters"]
    assert errors(reports["server"]) == [], reports["server"]["findings"]

    for seen in (analyze(dirs["caller"]), analyze(dirs["server"], dirs["caller"])):
        found = errors(seen)
        assert {f["detector"] for f in found} == {DETECTOR}, [(f["detector"], f["title"]) for f in found]
        assert sorted(e["frame"] for f in found for e in f["evidence"]) == \
            sorted(e["frame"] for f in live for e in f["evidence"])
    # Nothing of it reached the server's pod: its captures hold no frame, which analyze says (exit 2, no input).
    alone = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(dirs["server"]), "-o", "json"],
                           capture_output=True, text=True, timeout=180)
    assert alone.returncode == 2 and json.loads(alone.stdout)["stats"]["packets"] == 0, alone.stdout[-2000:]


@pytest.mark.parametrize("pod", list(FIXED))
def test_each_printed_fix_lets_the_greeting_through(mesh, pod, tmp_path):
    result, reports, dirs = watched_round(mesh, pod, tmp_path)
    assert result.echo_ok == 2 and not result.errors, result
    for side in ("server", "caller"):
        assert errors(reports[side]) == [], (side, reports[side]["findings"])
        log = (dirs[side] / "istio-proxy.log").read_text()
        entries = [e for e in map(parse_line, log.splitlines()) if e is not None]
        assert len(entries) == 2 and all(not e.flags for e in entries), log
    assert errors(analyze(dirs["server"], dirs["caller"])) == []
