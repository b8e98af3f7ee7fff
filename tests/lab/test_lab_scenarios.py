"""Every failure class of the pod lab, reproduced for real and checked on the wire.

One quiet lab (no periodic drivers, no API server) holds a pod per scenario. Each test captures the pod's lo and
eth0 with tcpdump (started and listening before the round), triggers one round, stops tcpdump with SIGINT and
reads the frames back with tshark. The client's view (RoundResult) and the sidecar's access log must agree
with the wire. The sidecar is real Envoy: what is asserted here is what Envoy 1.40 does. Needs root, iproute2,
iptables, conntrack, tcpdump and tshark.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from meshdoctor_lab import lab, netns
from meshdoctor_lab.apps import FRAMING_VARIANTS
from meshdoctor_lab.scenarios import (
    HEALTHY_SHORT_CONNECTIONS,
    STALE_CLOSE_DELAY,
    STALE_IDLE_TIMEOUT,
    SYN_DROP_SECONDS,
)
from meshdoctor_lab.state import LabPod, LabState
from tests.lab.test_lab_network import _require_lab_host

from ..waiting import wait_until as _wait_until
from .lab_names import lab_name

pytestmark = pytest.mark.lab

PODS = ("healthy-http", "framing", "stale-keepalive", "refused", "refused-localhost", "syn-drop")
_FIN, _SYN, _RST, _ACK = 0x01, 0x02, 0x04, 0x10
_SIDECAR = "127.0.0.6"
_BODY = "upstream connect error or disconnect/reset before headers. reset reason: "
# Envoy 1.40's local reply for a refused upstream: no "transport failure reason" text (98 bytes).
UF_BODY = _BODY + "remote connection failure"




@pytest.fixture(scope="module")
def scenario_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    _require_lab_host()
    name = lab_name(hex_digits=5)
    state_dir = tmp_path_factory.mktemp("lab") / name
    state = lab.up(name=name, state_dir=state_dir, pods=PODS, apiserver=False, drivers=False)
    try:
        yield state
    finally:
        lab.down(state_dir)


@dataclass(frozen=True)
class Frame:
    number: int
    src: str
    sport: int
    dst: str
    dport: int
    flags: int
    seq: int
    payload: bytes

    def is_(self, src: tuple[str, int], dst: tuple[str, int]) -> bool:
        return (self.src, self.sport) == src and (self.dst, self.dport) == dst


def _frames(pcap: Path) -> list[Frame]:
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-n", "-Y", "tcp", "-T", "fields", "-e", "frame.number", "-e", "ip.src",
         "-e", "tcp.srcport", "-e", "ip.dst", "-e", "tcp.dstport", "-e", "tcp.flags", "-e", "tcp.seq_raw",
         "-e", "tcp.payload"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    frames = []
    for line in out.splitlines():
        n, src, sport, dst, dport, flags, seq, payload = line.split("\t")
        frames.append(Frame(int(n), src, int(sport), dst, int(dport), int(flags, 16), int(seq),
                            bytes.fromhex(payload.replace(":", ""))))
    return frames


@contextlib.contextmanager
def _capture(pod: LabPod, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """tcpdump on the pod's lo and eth0 for the block; yields {"lo": pcap, "eth0": pcap}, complete on exit."""
    pcaps = {iface: tmp_path / f"{pod.name}-{iface}.pcap" for iface in ("lo", "eth0")}
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for iface, pcap in pcaps.items():
            err = pcap.with_suffix(".stderr")
            with open(err, "wb") as err_file:
                procs.append((subprocess.Popen(
                    # -B 32768 (KiB), as the product's tcpdump: with --immediate-mode libpcap's ring holds frames of
                    # the snap length, 8 of them in the default 2 MiB, and a tcpdump starved by a busy machine lost
                    # packets mid-connection (no FIN, no SYN in the capture).
                    netns.in_netns(pod.netns, "tcpdump", "-i", iface, "-n", "-B", "32768", "-U", "--immediate-mode",
                                   "-w", str(pcap), "tcp"),
                    stdout=subprocess.DEVNULL, stderr=err_file), err))
        for proc, err in procs:
            _wait_until(f"tcpdump listening ({err.name})", 10.0,
                        lambda: b"listening on" in err.read_bytes() or proc.poll() is not None)
            assert proc.poll() is None, err.read_text()
        yield pcaps
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, _ in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _new_log_lines(state: LabState, pod: str, before: int, count: int) -> list[str]:
    """Wait until the pod's access log has `count` lines after the first `before`; return them."""
    path = lab.access_log_path(state, pod)
    _wait_until(f"{count} new access-log lines in {path}", 10.0,
                lambda: len(path.read_text().splitlines()) >= before + count)
    return path.read_text().splitlines()[before:]


def _log_len(state: LabState, pod: str) -> int:
    path = lab.access_log_path(state, pod)
    return len(path.read_text().splitlines()) if path.exists() else 0


def _show(frames: list[Frame]) -> str:
    return "\n".join(f"{f.number} {f.src}:{f.sport}>{f.dst}:{f.dport} {f.flags:#05x} len={len(f.payload)}"
                     for f in frames[:80])


def test_framing_gets_the_upstream_closed_and_502_upe(scenario_lab: LabState, tmp_path: Path) -> None:
    pod = scenario_lab.pod("framing")
    before = _log_len(scenario_lab, "framing")
    with _capture(pod, tmp_path) as pcaps:
        result = lab.trigger_round(scenario_lab, "framing")

    body = _BODY + "protocol error"
    assert result.http == tuple((path, 502, body) for path in FRAMING_VARIANTS), result
    lo = _frames(pcaps["lo"])
    app = (pod.pod_ip, 5000)
    for path, fields in FRAMING_VARIANTS.items():
        broken = ("\r\n".join(fields) + "\r\n").encode()
        # The app's response: status line and the whole header block in ONE segment, the broken fields in it.
        response = [f for f in lo if (f.src, f.sport) == app and f.dst == _SIDECAR
                    and f.payload.startswith(b"HTTP/1.1 200 OK\r\n") and broken in f.payload]
        assert len(response) == 1, f"{path}: no single segment with {broken!r}\n{_show(lo)}"
        seg = response[0]
        assert b"\r\n\r\n" in seg.payload
        # ... and then Envoy closes that upstream connection: a FIN from 127.0.0.6 (it has read the response, so no
        # RST), and nothing more is sent on it.
        upstream = [f for f in lo if f.number > seg.number and f.is_((_SIDECAR, seg.dport), app)]
        fins = [f for f in upstream if f.flags & _FIN]
        assert fins, f"{path}: no FIN from {_SIDECAR}:{seg.dport} after frame {seg.number}\n{_show(lo)}"
        assert not [f for f in upstream if f.flags & _RST or f.payload], _show(lo)
        print(f"{path}: response frame {seg.number} ({len(seg.payload)} bytes), FIN frame {fins[0].number}")
    # The client's 502s cross eth0 with Envoy's local-reply body.
    eth0 = _frames(pcaps["eth0"])
    replies = [f for f in eth0 if f.sport == 5000 and f.payload.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")]
    assert len(replies) == len(FRAMING_VARIANTS) and all(f.payload.endswith(body.encode()) for f in replies)

    lines = _new_log_lines(scenario_lab, "framing", before, len(FRAMING_VARIANTS))
    for path, line in zip(FRAMING_VARIANTS, lines):
        assert f'"GET {path} HTTP/1.1" 502 UPE upstream_reset_before_response_started{{protocol_error}} - "-" 0 87 ' \
            in line, line
        assert f" inbound|5000|| {_SIDECAR}:" in line
    print(lines[0])


def test_stale_keepalive_reuse_in_the_apps_close_window_gets_rst_and_503_uc(scenario_lab: LabState,
                                                                            tmp_path: Path) -> None:
    pod = scenario_lab.pod("stale-keepalive")
    before = _log_len(scenario_lab, "stale-keepalive")
    with _capture(pod, tmp_path) as pcaps:
        result = lab.trigger_round(scenario_lab, "stale-keepalive")

    assert result.http == (("/stale/1", 200, ""), ("/stale/2", 503, _BODY + "connection termination")), result
    assert STALE_IDLE_TIMEOUT < result.reused_after_s < STALE_IDLE_TIMEOUT + STALE_CLOSE_DELAY, result
    lo = _frames(pcaps["lo"])
    app = (pod.pod_ip, 5000)
    first = next(f for f in lo if f.dst == pod.pod_ip and f.payload.startswith(b"GET /stale/1 HTTP/1.1\r\n"))
    upstream = (first.src, first.sport)
    assert first.src == _SIDECAR
    # Envoy wrote request 2 on the same pooled connection, after request 1's response ...
    response = next(f for f in lo if f.number > first.number and f.is_(app, upstream) and f.payload)
    request = next((f for f in lo if f.number > response.number and f.is_(upstream, app) and f.payload), None)
    assert request is not None and request.payload.startswith(b"GET /stale/2 HTTP/1.1\r\n"), _show(lo)
    # ... the app never answered it and closed with it unread: an RST, and no FIN on that connection at all.
    reset = next((f for f in lo if f.number > request.number and f.is_(app, upstream) and f.flags & _RST), None)
    assert reset is not None, _show(lo)
    assert not [f for f in lo if f.is_(app, upstream) and f.flags & _FIN], _show(lo)
    assert not [f for f in lo if response.number < f.number < reset.number and f.is_(app, upstream) and f.payload]
    print(f"request 1 frame {first.number}, response frame {response.number}, request 2 frame {request.number}, "
          f"RST frame {reset.number}; request 2 sent {result.reused_after_s} s after response 1")

    lines = _new_log_lines(scenario_lab, "stale-keepalive", before, 2)
    assert '"GET /stale/1 HTTP/1.1" 200 - via_upstream ' in lines[0]
    assert '"GET /stale/2 HTTP/1.1" 503 UC upstream_reset_before_response_started{connection_termination} - "-" 0 95 '\
        in lines[1], lines[1]
    assert f" {_SIDECAR}:{upstream[1]} " in lines[1]  # the log names the stale upstream connection
    print(lines[1])


@pytest.mark.parametrize("pod_name", ["refused", "refused-localhost"])
def test_refused_upstream_gets_rst_and_503_uf(scenario_lab: LabState, tmp_path: Path, pod_name: str) -> None:
    pod = scenario_lab.pod(pod_name)
    before = _log_len(scenario_lab, pod_name)
    with _capture(pod, tmp_path) as pcaps:
        result = lab.trigger_round(scenario_lab, pod_name)

    assert result.http == (("/refused", 503, UF_BODY),), result
    lo = _frames(pcaps["lo"])
    app = (pod.pod_ip, 5000)
    syns = [f for f in lo if f.src == _SIDECAR and (f.dst, f.dport) == app and f.flags & (_SYN | _ACK) == _SYN]
    assert len(syns) == 1, _show(lo)
    answer = next(f for f in lo if f.number > syns[0].number and f.is_(app, (_SIDECAR, syns[0].sport)))
    assert answer.flags & _RST, _show(lo)
    print(f"SYN frame {syns[0].number} {_SIDECAR}:{syns[0].sport} -> {pod.pod_ip}:5000, RST frame {answer.number}")

    (line,) = _new_log_lines(scenario_lab, pod_name, before, 1)
    assert ('"GET /refused HTTP/1.1" 503 UF upstream_reset_before_response_started{remote_connection_failure|'
            'delayed_connect_error:_Connection_refused} - "delayed_connect_error:_Connection_refused" 0 98 ') in line
    assert f" inbound|5000|| - {pod.pod_ip}:5000 " in line  # no upstream local address: never connected
    print(line)


def test_syn_drop_retransmits_the_same_syn_until_the_rule_goes(scenario_lab: LabState, tmp_path: Path) -> None:
    pod = scenario_lab.pod("syn-drop")
    with _capture(pod, tmp_path) as pcaps:
        result = lab.trigger_round(scenario_lab, "syn-drop")

    assert result.errors == () and result.echo_ok == 1, result
    assert result.connect_s is not None and SYN_DROP_SECONDS < result.connect_s < SYN_DROP_SECONDS + 3, result
    eth0 = _frames(pcaps["eth0"])
    server = (pod.pod_ip, 5002)
    syns = [f for f in eth0 if (f.dst, f.dport) == server and f.flags & (_SYN | _ACK) == _SYN]
    assert syns, _show(eth0)
    client = (syns[0].src, syns[0].sport)
    assert all((f.src, f.sport) == client and f.seq == syns[0].seq for f in syns), _show(eth0)  # one SYN, resent
    synack = next(f for f in eth0 if f.is_(server, client) and f.flags & (_SYN | _ACK) == _SYN | _ACK)
    unanswered = [f for f in syns if f.number < synack.number]
    assert not any(f.is_(server, client) and f.number < synack.number for f in eth0)  # nothing answered them
    assert len(unanswered) >= 3, _show(eth0)  # the original, the one at ~1 s, then the one that passed
    rules = netns.run(netns.in_netns(pod.netns, "iptables", "-t", "raw", "-S", "PREROUTING"))
    assert "DROP" not in rules  # bounded: the rule is gone
    print(f"SYN seq {syns[0].seq} sent {len(unanswered)} times (frames {[f.number for f in unanswered]}), "
          f"SYN-ACK frame {synack.number}, connect took {result.connect_s} s")


def _closed_back(pcap: Path, app: tuple[str, int]) -> bool:
    """Whether the capture so far holds the app's FIN and the sidecar's FIN on the /close connection."""
    try:
        lo = _frames(pcap)
    except (subprocess.CalledProcessError, ValueError):  # read while tcpdump writes: a record may be half there
        return False
    close = next((f for f in lo if (f.src, f.sport) == app and b"\r\nConnection: close\r\n" in f.payload), None)
    if close is None:
        return False
    upstream = (_SIDECAR, close.dport)
    fin = next((f for f in lo if f.number >= close.number and f.is_(app, upstream) and f.flags & _FIN), None)
    # Envoy destroys a `Connection: close` upstream as soon as it has the response, so its FIN may cross the
    # app's: either order is a clean close.
    return fin is not None and any(f.number > close.number and f.is_(upstream, app) and f.flags & _FIN for f in lo)


def test_healthy_http_has_200s_only_and_no_rst_on_lo(scenario_lab: LabState, tmp_path: Path) -> None:
    pod = scenario_lab.pod("healthy-http")
    before = _log_len(scenario_lab, "healthy-http")
    with _capture(pod, tmp_path) as pcaps:
        result = lab.trigger_round(scenario_lab, "healthy-http")
        # Both sides of /close's upstream connection close; on a busy machine the last FIN can come after the
        # round has returned, so the capture waits for it (bounded).
        _wait_until("both FINs of the /close upstream connection on lo", 10.0,
                    lambda: _closed_back(pcaps["lo"], (pod.pod_ip, 5000)))

    assert result.errors == (), result
    assert result.statuses == (200,) * (3 + HEALTHY_SHORT_CONNECTIONS)
    lo = _frames(pcaps["lo"])
    assert not [f for f in lo if f.flags & _RST], _show(lo)
    app = (pod.pod_ip, 5000)
    # One valid chunked response, one Content-Length-only response, each in one segment from the app.
    chunked = [f for f in lo if (f.src, f.sport) == app and b"\r\nTransfer-Encoding: chunked\r\n" in f.payload]
    assert len(chunked) == 1 and chunked[0].payload.count(b"Transfer-Encoding") == 1
    assert chunked[0].payload.endswith(b"\r\n0\r\n\r\n") and b"Content-Length" not in chunked[0].payload
    # /close: the app FINs after answering, and nothing is sent on that connection after the FIN.
    close = next(f for f in lo if (f.src, f.sport) == app and b"\r\nConnection: close\r\n" in f.payload)
    upstream = (_SIDECAR, close.dport)
    fin = next(f for f in lo if f.number >= close.number and f.is_(app, upstream) and f.flags & _FIN)
    assert not [f for f in lo if f.number > fin.number and f.is_(upstream, app) and f.payload]
    assert _closed_back(pcaps["lo"], app)  # the sidecar closed its side too (before or after the app's FIN)
    # Many short downstream connections on eth0, one per request after the first keep-alive.
    eth0 = _frames(pcaps["eth0"])
    client_syns = {f.sport for f in eth0 if f.dport == 5000 and f.flags & (_SYN | _ACK) == _SYN}
    # One SYN per downstream connection; the client kernel may give a later one a port an earlier one had.
    syns = [f for f in eth0 if f.dport == 5000 and f.flags & (_SYN | _ACK) == _SYN]
    assert len(syns) == 2 + HEALTHY_SHORT_CONNECTIONS

    lines = _new_log_lines(scenario_lab, "healthy-http", before, 3 + HEALTHY_SHORT_CONNECTIONS)
    assert all(" 200 - via_upstream - " in line for line in lines), lines
    print(f"{len(lines)} requests, {len(client_syns)} downstream connections, {len(lo)} frames on lo, no RST")
