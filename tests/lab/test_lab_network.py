"""The pod lab on the real kernel: namespaces, Istio's REDIRECT, real Envoy as the sidecar, and the scenarios.

Needs root, iproute2, iptables, conntrack, tcpdump and tshark. No mocks: a collision round must make the pod's
kernel send a real challenge ACK, seen both on the wire (tcpdump on the pod's eth0) and in its counters.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from meshdoctor_lab import lab, netns
from meshdoctor_lab.scenarios import challenge_ack_count
from meshdoctor_lab.state import LabError, LabState

from ..waiting import wait_until as _wait_until
from .lab_names import lab_name

_TOOLS = ("ip", "iptables-restore", "conntrack", "nstat", "ss", "tcpdump", "tshark")
_SYN, _ACK = 0x02, 0x10


def _require_lab_host() -> None:
    if os.geteuid() != 0:
        pytest.skip("the pod lab needs root")
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"the pod lab needs {', '.join(missing)}")




@pytest.fixture(scope="module")
def quiet_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    """A lab with pods `collision` and `healthy`, no periodic drivers (tests trigger rounds), no API server."""
    _require_lab_host()
    name = lab_name("", 8)
    state_dir = tmp_path_factory.mktemp("lab") / name
    state = lab.up(name=name, state_dir=state_dir, apiserver=False, drivers=False)
    try:
        yield state
    finally:
        lab.down(state_dir)


@contextlib.contextmanager
def _tcpdump(ns: str, pcap: Path) -> Iterator[None]:
    """tcpdump on the pod's eth0 for the duration of the block; returns once the file is complete."""
    err = pcap.with_suffix(".stderr")
    with open(err, "wb") as err_file:
        proc = subprocess.Popen(
            netns.in_netns(ns, "tcpdump", "-i", "eth0", "-n", "-B", "32768", "-U", "--immediate-mode", "-w", str(pcap),
                           "tcp"),
            stdout=subprocess.DEVNULL, stderr=err_file,
        )
    try:
        _wait_until("tcpdump listening", 10.0, lambda: b"listening on" in err.read_bytes() or proc.poll() is not None)
        assert proc.poll() is None, err.read_text()
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _packets(pcap: Path) -> list[tuple[int, int, int, int]]:
    """(frame, tcp flags, sport, dport) of every packet in a capture, via tshark fields."""
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-T", "fields",
         "-e", "frame.number", "-e", "tcp.flags", "-e", "tcp.srcport", "-e", "tcp.dstport"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        frame, flags, sport, dport = line.split("\t")
        rows.append((int(frame), int(flags, 16), int(sport), int(dport)))
    return rows


@pytest.mark.lab
def test_collision_round_makes_the_pod_send_a_challenge_ack(quiet_lab: LabState, tmp_path: Path) -> None:
    pod = quiet_lab.pod("collision")
    before = challenge_ack_count(pod.netns)
    pcap = tmp_path / "eth0.pcap"
    with _tcpdump(pod.netns, pcap):
        result = lab.trigger_round(quiet_lab, "collision")
    after = challenge_ack_count(pod.netns)

    assert result.client_port is not None and result.echo_ok == 1, result
    packets = _packets(pcap)
    x = result.client_port
    syns = [f for f, flags, s, d in packets if (s, d) == (x, 5002) and flags & (_SYN | _ACK) == _SYN]
    assert syns, f"no SYN from :{x} to :5002 in {packets}"
    # The first answer from pod:5002 to that SYN is the challenge ACK: ACK set, SYN not set.
    answer = next((p for p in packets if p[0] > syns[0] and (p[2], p[3]) == (5002, x)), None)
    assert answer is not None, f"SYN {syns[0]} unanswered in {packets}"
    assert answer[1] & _ACK and not answer[1] & _SYN, f"frame {answer[0]} flags {answer[1]:#x} is not a challenge ACK"
    # ... and the retransmitted SYN then gets its SYN-ACK.
    assert any(f > answer[0] and (s, d) == (5002, x) and flags & (_SYN | _ACK) == _SYN | _ACK
               for f, flags, s, d in packets)

    assert before is not None and after is not None and after > before
    assert result.challenge_acks is not None and result.challenge_acks >= 1
    assert result.live_reset  # the client's RST to the challenge ACK kills the live connection


@pytest.mark.lab
def test_remap_round_reuses_the_port_without_a_challenge_ack(quiet_lab: LabState) -> None:
    result = lab.trigger_round(quiet_lab, "collision", scenario="remap")
    assert result.errors == () and not result.live_reset, result
    assert result.http_ok == 6 and result.echo_ok == 1
    assert result.challenge_acks == 0


@pytest.mark.lab
def test_healthy_round_gets_200s_through_the_sidecar(quiet_lab: LabState) -> None:
    pod = quiet_lab.pod("healthy")
    sidecar_log = lab.access_log_path(quiet_lab, "healthy")
    lines_before = len(sidecar_log.read_text().splitlines())

    result = lab.trigger_round(quiet_lab, "healthy")

    assert result.errors == (), result
    assert result.http_ok == 3 and result.echo_ok == 3
    assert result.challenge_acks == 0

    def new_lines() -> list[str]:
        return sidecar_log.read_text().splitlines()[lines_before:]

    # One access-log line per HTTP request (port 5000) and per TCP connection (5002, written when it closes).
    _wait_until("6 sidecar access-log lines", 10.0, lambda: len(new_lines()) >= 6)
    http_lines = [line for line in new_lines() if " inbound|5000|| " in line]
    assert len(http_lines) == 3
    for i, line in enumerate(http_lines):
        # upstream_local_address 127.0.0.6 (inbound passthrough), downstream_remote the client namespace
        assert " 127.0.0.6:" in line and f" {pod.pod_ip}:5000 {pod.client_ip}:" in line
        assert f'"GET /healthy/{i} HTTP/1.1" 200 - via_upstream - "-" ' in line  # no flags: the upstream worked
    tcp_lines = [line for line in new_lines() if " inbound|5002|| " in line]
    assert len(tcp_lines) == 3 and all('"- - -" 0 - ' in line for line in tcp_lines)


_HALF_CLOSE_CLIENT = """
import socket, sys
payload = b"m" * 32768
s = socket.create_connection((sys.argv[1], 5002), timeout=5)
s.sendall(payload)
s.shutdown(socket.SHUT_WR)  # our FIN must reach the app through the sidecar ...
got = b""
while chunk := s.recv(65536):  # ... and the app's FIN must come back as EOF
    got += chunk
print(len(got), got == payload)
"""


@pytest.mark.lab
def test_sidecar_relays_half_close_both_ways(quiet_lab: LabState) -> None:
    pod = quiet_lab.pod("healthy")
    out = subprocess.run(
        netns.in_netns(pod.client_netns, sys.executable, "-c", _HALF_CLOSE_CLIENT, pod.pod_ip),
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout
    assert out.split() == ["32768", "True"]


_REFUSED_CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], 5003), timeout=5)  # accepted by the sidecar: REDIRECT took it
print(repr(s.recv(100)))
"""


@pytest.mark.lab
def test_sidecar_closes_downstream_when_upstream_is_refused(quiet_lab: LabState) -> None:
    pod = quiet_lab.pod("healthy")
    sidecar_log = lab.access_log_path(quiet_lab, "healthy")
    out = subprocess.run(
        netns.in_netns(pod.client_netns, sys.executable, "-c", _REFUSED_CLIENT, pod.pod_ip),
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout
    assert out.strip() == "b''"  # a clean close, no bytes

    def refused_lines() -> list[str]:
        return [line for line in sidecar_log.read_text().splitlines() if f"{pod.pod_ip}:5003 " in line]

    _wait_until("a UF access-log line for :5003", 10.0, lambda: bool(refused_lines()))
    # A port the pod does not declare goes to Istio's InboundPassthroughCluster (tcp_proxy): no status, UF with
    # URX (tcp_proxy's connect attempts are spent), and the transport failure as Envoy 1.40 renders it.
    line = refused_lines()[-1]
    assert '"- - -" 0 UF,URX - - "delayed_connect_error:_Connection_refused" ' in line, line
    assert f' InboundPassthroughCluster - {pod.pod_ip}:5003 ' in line, line


@pytest.mark.lab
def test_status_reports_processes_and_namespaces(quiet_lab: LabState) -> None:
    seen = lab.status(quiet_lab.state_dir)
    assert seen is not None and seen.observed is not None
    assert set(seen.observed.running) == set(quiet_lab.pids) and seen.observed.dead == ()
    assert seen.observed.netns_missing == ()
    assert set(seen.observed.netns_present) == {
        ns for pod in quiet_lab.pods for ns in (pod.netns, pod.client_netns)
    }


@pytest.mark.lab
def test_down_leaves_no_namespace_and_no_process(tmp_path: Path) -> None:
    _require_lab_host()
    name = lab_name("", 8)
    state_dir = tmp_path / name
    # With the test API server when it is installed, so `down` is shown to stop it too.
    with_apiserver = importlib.util.find_spec("meshdoctor_lab.apiserver.__main__") is not None
    state = lab.up(name=name, state_dir=state_dir, pods=("healthy",), apiserver=with_apiserver,
                   rounds=100, period=0.5)
    try:
        expected = {"healthy/app-http", "healthy/app-tcp", "healthy/sidecar", "healthy/scenario"}
        assert set(state.pids) == expected | ({"apiserver"} if with_apiserver else set())
        assert state.kubeconfig.exists() == with_apiserver
    finally:
        lab.down(state_dir)
    _assert_gone(state)
    lab.down(state_dir)  # idempotent
    assert lab.status(state_dir) is None


@pytest.mark.lab
def test_failed_up_cleans_up_after_itself(tmp_path: Path) -> None:
    _require_lab_host()
    name = lab_name("", 8)
    state_dir = tmp_path / name
    # No process can listen within 0 s, so up fails after creating namespaces and starting processes.
    with pytest.raises(LabError, match="not ready after"):
        lab.up(name=name, state_dir=state_dir, pods=("healthy",), apiserver=False, ready_timeout=0.0)
    prefix = netns.netns_prefix(name)
    assert not netns.netns_exists(f"{prefix}-healthy") and not netns.netns_exists(f"{prefix}-healthy-c")
    assert not state_dir.exists()


@pytest.mark.lab
def test_up_refuses_unknown_pods_and_taken_namespaces(quiet_lab: LabState, tmp_path: Path) -> None:
    with pytest.raises(LabError, match="unknown lab pod"):
        lab.up(name="mdtest-x", state_dir=tmp_path / "x", pods=("nope",), apiserver=False)
    # Same name, other state dir: its namespaces are taken, and the running lab must stay untouched.
    with pytest.raises(LabError, match="already exists"):
        lab.up(name=quiet_lab.name, state_dir=tmp_path / "y", apiserver=False)
    assert all(netns.netns_exists(pod.netns) for pod in quiet_lab.pods)
    assert not (tmp_path / "y").exists()
    # A directory with someone else's files is refused, and `down` never removes a directory without state.
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "keep.txt").write_text("not the lab's")
    with pytest.raises(LabError, match="not empty"):
        lab.up(name="mdtest-z", state_dir=tmp_path / "z", apiserver=False)
    lab.down(tmp_path / "z")
    assert (tmp_path / "z" / "keep.txt").exists()


def _assert_gone(state: LabState) -> None:
    for pod in state.pods:
        assert not netns.netns_exists(pod.netns) and not netns.netns_exists(pod.client_netns)
    for key, pid in state.pids.items():
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        assert abs(proc.create_time() - state.started[key]) > 1.0, f"{key} (pid {pid}) still runs"
    assert not state.state_dir.exists()
