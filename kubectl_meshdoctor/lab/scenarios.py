"""Scenario drivers: downstream clients that reproduce a failure (or its absence) against a lab pod.

Run in the pod's CLIENT namespace. Each round is self-contained (opens and closes its own sockets); the driver
loop is bounded by a round count AND a time limit. One JSON line per round goes to stdout.

    ip netns exec <client-ns> python -m kubectl_meshdoctor.lab.scenarios collision \\
        --pod-ip 198.18.1.2 --client-ip 198.18.1.1 --pod-netns mdlab-collision --rounds 1

Scenarios:
  collision  client_ip:X holds a live HTTP keep-alive to pod:5000; conntrack is flushed in the pod namespace;
             a second socket bound to the same client_ip:X dials pod:5002. REDIRECT maps both to
             pod:15006, so the SYN lands on the live four-tuple: the pod answers with an RFC 5961 challenge
             ACK, the client resets (which kills the live connection), and the retransmitted SYN succeeds.
  remap      the same port reuse without the flush: conntrack still knows the live connection, so NAT
             remaps the source port of the second one. Exposure, no failure, no challenge ACK.
  healthy    HTTP GETs on new connections (kernel-chosen ports) and TCP echo exchanges. No errors.
  healthy-http
             negative cases for the HTTP detectors: a Content-Length response and a valid chunked one on one
             keep-alive, `/close` (the app answers `Connection: close` and FINs; no request follows on that
             upstream connection), then 20 short connections. 200s only, no RST on lo.
  framing    one GET per FRAMING_VARIANTS path, each on a new connection; the app answers with broken framing,
             Envoy's HTTP/1 codec rejects it, closes the upstream connection (FIN from 127.0.0.6: it has read the
             response) and answers 502 UPE.
  stale-keepalive
             GET 1 leaves a pooled upstream connection; the app's idle timer fires STALE_IDLE_TIMEOUT later and
             its close() comes STALE_CLOSE_DELAY after that. GET 2, on a new downstream connection, is sent in
             that window: Envoy, which has seen no FIN, writes it on the pooled connection, the app never reads
             it, and its close() with unread data is an RST (no FIN at all). The client gets 503 UC.
  refused    nothing listens on :5000: the sidecar's SYN from 127.0.0.6 gets RST, the client gets 503 UF.
  refused-localhost
             the app listens on 127.0.0.1:5000 only; the sidecar dials pod_ip:5000: same RST, same 503 UF.
  syn-drop   the pod drops SYNs to :5002 (raw PREROUTING) for SYN_DROP_SECONDS (2.5 s) while the client
             connects: the client kernel retransmits the same SYN (same seq) after ~1 s (and ~2 s on kernels with
             linear SYN timeouts); the retransmit at ~3 s passes, so the connect succeeds after ~3 s (it never
             times out) and the echo works.
  load       steady keep-alive GETs for LOAD_ROUND_SECONDS at LOAD_ROUND_PPS packets/s on the pod's lo + eth0
             (run_load; bench/live drives it at its own rate): a share through the sidecar (client -> :5000), the
             rest straight to the app, on eth0 to :15020 (istio-iptables excludes it from REDIRECT) and on lo
             from 127.0.0.6 (the sidecar's upstream leg, without Envoy's CPU per request). The app
             is a canned responder (apps http --fast). 200s only; no RST, no detector finding.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import ipaddress
import http.client
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from kubectl_meshdoctor.lab.apps import CHUNKED_BODY, ECHO_PORT, FRAMING_VARIANTS, HTTP_PORT
from kubectl_meshdoctor.lab.bootstrap import SidecarSettings
from kubectl_meshdoctor.lab.netns import CLIENT_FIXED_PORTS, INBOUND_PASSTHROUGH_SOURCE, LAB_NETWORK, in_netns
from kubectl_meshdoctor.lab.state import LabPod, LabPort

SCENARIOS = (
    "collision", "remap", "healthy", "healthy-http", "framing", "stale-keepalive", "refused", "refused-localhost",
    "syn-drop", "load",
)
STALE_IDLE_TIMEOUT = 0.5  # seconds: the stale-keepalive app closes idle keep-alive connections after this
# Seconds between the app's idle timer firing and its close(), with reading paused: a request that arrives then
# is answered RST (it is unread when the socket closes). Envoy drops a pooled connection as soon as it reads the
# app's FIN, so the race it loses is this window, before any FIN (or a request crossing the FIN on the wire).
STALE_CLOSE_DELAY = 0.4
# When the stale-keepalive driver sends its second request: after the first response, in the middle of the window.
STALE_REUSE_AFTER = STALE_IDLE_TIMEOUT + STALE_CLOSE_DELAY / 2
# Seconds the syn-drop rule stays. The client kernel retransmits a SYN after 1 s, then 3 s (classic exponential
# backoff: 1, 3, 7 s) or, with net.ipv4.tcp_syn_linear_timeouts (default 4 since Linux 6.7), after 1, 2, 3, 4 s.
# 2.5 s is half a second clear of both schedules: the SYN at ~3 s is the first to pass, under either.
SYN_DROP_SECONDS = 2.5
HEALTHY_SHORT_CONNECTIONS = 20
DEFAULT_ROUNDS = 1500
DEFAULT_SECONDS = 3000.0  # keeps a forgotten lab's traffic under an hour
DEFAULT_PERIOD = 2.0  # seconds between round starts

_IO_TIMEOUT = 5.0  # seconds per socket operation
_LIVE_INTERVAL = 0.3  # seconds between requests on the live connection
_LIVE_REQUESTS = 3  # requests on the live connection before and after the second connect
_HEALTHY_CONNECTIONS = 3
_HTTP_REQUEST = b"GET / HTTP/1.1\r\nHost: lab\r\nUser-Agent: meshdoctor-lab\r\n\r\n"
_SYN_CONNECT_TIMEOUT = 10.0  # seconds; covers the SYN retransmits at ~1 s and ~3 s


@dataclass(frozen=True)
class PodSetup:
    """The processes of a scenario's pod: extra args of `apps http` (None: nothing listens on :5000) and the
    Istio settings its Envoy runs with."""

    app_http: tuple[str, ...] | None = ()
    sidecar: SidecarSettings = SidecarSettings()


SETUPS: dict[str, PodSetup] = {
    "collision": PodSetup(),
    "remap": PodSetup(),
    "healthy": PodSetup(),
    "healthy-http": PodSetup(),
    "framing": PodSetup(app_http=("--broken-framing",)),
    "stale-keepalive": PodSetup(app_http=("--idle-timeout", str(STALE_IDLE_TIMEOUT),
                                          "--close-delay", str(STALE_CLOSE_DELAY))),
    "refused": PodSetup(app_http=None),
    "refused-localhost": PodSetup(app_http=("--bind", "127.0.0.1")),
    "syn-drop": PodSetup(),
    "load": PodSetup(app_http=("--fast", "--also-port", "15020")),  # 15020: LOAD_DIRECT_PORT
}


@dataclass(frozen=True)
class RoundResult:
    """What one round did, from the client's side plus the pod kernel's challenge-ACK counter.

    `challenge_acks` is the increase of TcpExtTCPChallengeACK in the pod namespace during the round (None when
    nstat could not be read). `second_connect_s` is how long the colliding connect took (seconds).
    """

    scenario: str
    pod: str
    started: float  # seconds since epoch
    duration_s: float
    client_port: int | None = None
    http_ok: int = 0
    echo_ok: int = 0
    second_connect_s: float | None = None
    live_reset: bool = False
    challenge_acks: int | None = None
    errors: tuple[str, ...] = ()
    # HTTP scenarios: (path, status, body) of every request in order; the body only when it is not 200.
    http: tuple[tuple[str, int, str], ...] = ()
    connect_s: float | None = None  # syn-drop: how long the connect to :5002 took (seconds)
    reused_after_s: float | None = None  # stale-keepalive: response 1 -> request 2 (seconds)
    load: dict[str, Any] | None = None  # load: LoadResult.to_json()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["errors"] = list(self.errors)
        data["http"] = [list(h) for h in self.http]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RoundResult":
        return cls(**{**data, "errors": tuple(data.get("errors", ())),
                      "http": tuple((p, int(c), b) for p, c, b in data.get("http", ()))})

    @property
    def statuses(self) -> tuple[int, ...]:
        return tuple(status for _, status, _ in self.http)


@dataclass
class _Tally:
    """Mutable counters filled while a round runs, frozen into a RoundResult at the end."""

    client_port: int | None = None
    http_ok: int = 0
    echo_ok: int = 0
    second_connect_s: float | None = None
    live_reset: bool = False
    errors: list[str] = field(default_factory=list)
    http: list[tuple[str, int, str]] = field(default_factory=list)
    connect_s: float | None = None
    reused_after_s: float | None = None
    load: dict[str, Any] | None = None


def challenge_ack_count(pod_netns: str) -> int | None:
    """TcpExtTCPChallengeACK of the pod namespace's kernel (absolute), or None when nstat fails."""
    try:
        out = subprocess.run(
            in_netns(pod_netns, "nstat", "-azs", "TcpExtTCPChallengeACK"),
            capture_output=True, text=True, timeout=_IO_TIMEOUT, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "TcpExtTCPChallengeACK":
            return int(fields[1])
    return None


def flush_conntrack(pod_netns: str) -> None:
    """Forget every conntrack entry in the pod namespace (the live connection's NAT mapping included).

    Raises OSError or subprocess.CalledProcessError when conntrack fails.
    """
    subprocess.run(
        in_netns(pod_netns, "conntrack", "-F"), capture_output=True, timeout=_IO_TIMEOUT, check=True
    )


def _bound_socket(client_ip: str, port: int) -> socket.socket:
    # SO_REUSEADDR on both sockets is what lets the second one share client_ip:port with the live one;
    # their four-tuples differ only in the destination port, which REDIRECT then erases.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.settimeout(_IO_TIMEOUT)
    try:
        sock.bind((client_ip, port))
    except OSError:
        sock.close()
        raise
    return sock


def _http_exchange(sock: socket.socket) -> int:
    """Send one keep-alive GET on a connected socket; return the status code. Raises OSError."""
    sock.sendall(_HTTP_REQUEST)
    response = http.client.HTTPResponse(sock)
    try:
        response.begin()
        response.read()
        return response.status
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP response: {exc!r}") from None
    finally:
        response.close()  # closes only the response's file object; the socket stays open


def _echo_exchange(sock: socket.socket, message: bytes) -> bool:
    sock.sendall(message)
    got = b""
    while len(got) < len(message):
        chunk = sock.recv(len(message) - len(got))
        if not chunk:
            break
        got += chunk
    return got == message


def _live_requests(live: socket.socket, tally: _Tally) -> bool:
    """Send _LIVE_REQUESTS keep-alive GETs ~0.3 s apart; False (and an error noted) if the connection died."""
    for i in range(_LIVE_REQUESTS):
        if i:
            time.sleep(_LIVE_INTERVAL)  # the keep-alive cadence a capture sees
        try:
            status = _http_exchange(live)
        except OSError as exc:
            tally.live_reset = True
            tally.errors.append(f"live connection to :{HTTP_PORT}: {_one_line(exc)}")
            return False
        if status == 200:
            tally.http_ok += 1
        else:
            tally.errors.append(f"live connection got HTTP {status}")
    return True


def _port_reuse_round(pod: LabPod, tally: _Tally, *, flush: bool, used_ports: set[int]) -> None:
    """Hold client_ip:X -> pod:5000 live, optionally flush conntrack, then dial pod:5002 from client_ip:X."""
    live, port = _open_live_connection(pod, used_ports)
    tally.client_port = port
    second: socket.socket | None = None
    try:
        if not _live_requests(live, tally):
            return
        if flush:
            # Flush right before the SYN, with the live connection idle: any packet of it in between would let
            # conntrack pick it up again and NAT would remap instead of colliding.
            flush_conntrack(pod.netns)
        second = _bound_socket(pod.client_ip, port)
        t0 = time.monotonic()
        second.connect((pod.pod_ip, ECHO_PORT))
        tally.second_connect_s = time.monotonic() - t0
        if _echo_exchange(second, b"meshdoctor-echo\n"):
            tally.echo_ok += 1
        else:
            tally.errors.append(f"echo on :{ECHO_PORT} came back wrong")
        time.sleep(_LIVE_INTERVAL)
        _live_requests(live, tally)
    except (OSError, subprocess.SubprocessError) as exc:
        tally.errors.append(_one_line(exc))
    finally:
        live.close()
        if second is not None:
            second.close()


def _open_live_connection(pod: LabPod, used_ports: set[int]) -> tuple[socket.socket, int]:
    """Connect client_ip:X -> pod:5000 with a fresh X from CLIENT_FIXED_PORTS; raises OSError after 5 tries."""
    last: OSError | None = None
    for _ in range(5):
        port = random.randint(*CLIENT_FIXED_PORTS)
        if port in used_ports:
            continue
        used_ports.add(port)
        try:
            sock = _bound_socket(pod.client_ip, port)
        except OSError as exc:  # another driver holds it; pick again
            last = exc
            continue
        try:
            sock.connect((pod.pod_ip, HTTP_PORT))
        except OSError as exc:
            sock.close()
            last = exc
            continue
        return sock, port
    raise OSError(f"no usable client port in {CLIENT_FIXED_PORTS}: {last}")


def _healthy_round(pod: LabPod, tally: _Tally) -> None:
    for i in range(_HEALTHY_CONNECTIONS):
        conn = http.client.HTTPConnection(pod.pod_ip, HTTP_PORT, timeout=_IO_TIMEOUT)
        try:
            conn.request("GET", f"/healthy/{i}", headers={"User-Agent": "meshdoctor-lab"})
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                tally.http_ok += 1
            else:
                tally.errors.append(f"GET :{HTTP_PORT} answered HTTP {response.status}")
        except (OSError, http.client.HTTPException) as exc:
            tally.errors.append(f"GET :{HTTP_PORT}: {_one_line(exc)}")
        finally:
            conn.close()
    for i in range(_HEALTHY_CONNECTIONS):
        try:
            with socket.create_connection((pod.pod_ip, ECHO_PORT), timeout=_IO_TIMEOUT) as sock:
                if _echo_exchange(sock, f"meshdoctor-echo {i}\n".encode()):
                    tally.echo_ok += 1
                else:
                    tally.errors.append(f"echo on :{ECHO_PORT} came back wrong")
        except OSError as exc:
            tally.errors.append(f"echo :{ECHO_PORT}: {_one_line(exc)}")


def _get(pod: LabPod, tally: _Tally, path: str, conn: http.client.HTTPConnection | None = None,
         expect_body: bytes | None = None) -> int | None:
    """GET `path` (on `conn`, else on a new connection closed afterwards); record (path, status, body).

    Returns the status, or None when the exchange failed (noted in tally.errors). A non-200 is an error too.
    """
    own = conn is None
    conn = conn or http.client.HTTPConnection(pod.pod_ip, HTTP_PORT, timeout=_IO_TIMEOUT)
    try:
        conn.request("GET", path, headers={"User-Agent": "meshdoctor-lab"})
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        tally.errors.append(f"GET {path}: {_one_line(exc)}")
        return None
    finally:
        if own:
            conn.close()
    tally.http.append((path, response.status, "" if response.status == 200 else body.decode("latin-1")))
    if response.status == 200:
        tally.http_ok += 1
        if expect_body is not None and body != expect_body:
            tally.errors.append(f"GET {path}: body {body[:40]!r} is not {expect_body[:40]!r}")
    else:
        tally.errors.append(f"GET {path} answered HTTP {response.status}")
    return response.status


def _healthy_http_round(pod: LabPod, tally: _Tally) -> None:
    conn = http.client.HTTPConnection(pod.pod_ip, HTTP_PORT, timeout=_IO_TIMEOUT)
    try:
        _get(pod, tally, "/length", conn)  # Content-Length only
        _get(pod, tally, "/chunked", conn, expect_body=CHUNKED_BODY)  # one valid Transfer-Encoding: chunked
    finally:
        conn.close()
    _get(pod, tally, "/close")  # the app FINs after answering; nothing is sent on that connection again
    for i in range(HEALTHY_SHORT_CONNECTIONS):
        _get(pod, tally, f"/short/{i}")


def _framing_round(pod: LabPod, tally: _Tally) -> None:
    for path in FRAMING_VARIANTS:
        _get(pod, tally, path)


def _refused_round(pod: LabPod, tally: _Tally) -> None:
    _get(pod, tally, "/refused")


def _stale_keepalive_round(pod: LabPod, tally: _Tally) -> None:
    if _get(pod, tally, "/stale/1") != 200:
        return
    done = time.monotonic()
    # The app's idle timer fires STALE_IDLE_TIMEOUT after its response; Envoy still holds the connection idle in
    # its pool (no FIN has come), so a request now is written on it and lands in the app's unread window.
    time.sleep(STALE_REUSE_AFTER)  # the race's timing itself, not a wait for a condition
    tally.reused_after_s = round(time.monotonic() - done, 3)
    _get(pod, tally, "/stale/2")  # a NEW downstream connection: the sidecar serves it from its pool


def _syn_drop_rule(pod: LabPod, action: str) -> list[str]:
    return in_netns(pod.netns, "iptables", "-w", "5", "-t", "raw", action, "PREROUTING", "-p", "tcp",
                    "--dport", str(ECHO_PORT), "--syn", "-m", "comment", "--comment",
                    f"meshdoctor-lab-syn-drop-{os.getpid()}", "-j", "DROP")


def _syn_drop_round(pod: LabPod, tally: _Tally) -> None:
    subprocess.run(_syn_drop_rule(pod, "-I"), capture_output=True, timeout=_IO_TIMEOUT, check=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            sock.setblocking(False)
            t0 = time.monotonic()
            err = sock.connect_ex((pod.pod_ip, ECHO_PORT))  # the SYN leaves now and is dropped
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, os.strerror(err))
            time.sleep(SYN_DROP_SECONDS)  # the drop window itself, not a wait for a condition
        finally:
            subprocess.run(_syn_drop_rule(pod, "-D"), capture_output=True, timeout=_IO_TIMEOUT, check=True)
        _, writable, _ = select.select([], [sock], [], max(0.0, t0 + _SYN_CONNECT_TIMEOUT - time.monotonic()))
        if not writable:
            raise OSError(f"connect to :{ECHO_PORT} not done after {_SYN_CONNECT_TIMEOUT:g} s")
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, os.strerror(err))
        tally.connect_s = round(time.monotonic() - t0, 3)
        sock.setblocking(True)
        sock.settimeout(_IO_TIMEOUT)
        if _echo_exchange(sock, b"meshdoctor-echo after syn drop\n"):
            tally.echo_ok += 1
        else:
            tally.errors.append(f"echo on :{ECHO_PORT} came back wrong")
    except (OSError, subprocess.SubprocessError) as exc:
        tally.errors.append(f"syn-drop :{ECHO_PORT}: {_one_line(exc)}")
    finally:
        sock.close()


# --- load: steady keep-alive traffic at a stated packet rate ------------------------------------------------

LOAD_DIRECT_PORT = 15020  # pilot-agent's status port: istio-iptables excludes it from REDIRECT (-d ...,15020)
LOAD_ROUND_PPS = 2000.0  # packets/s on the pod's lo + eth0 during a `load` round of the lab's driver
LOAD_ROUND_SECONDS = 1.0
LOAD_MAX_PPS = 200_000.0  # hard limits of run_load, whatever it is asked
LOAD_MAX_SECONDS = 3600.0
LOAD_MAX_CONNECTIONS = 64  # per path
LOAD_DEFAULT_CONNECTIONS = 16
LOAD_REQUEST = b"GET /load HTTP/1.1\r\nHost: lab\r\nUser-Agent: meshdoctor-load\r\n\r\n"
# The three ways a load request crosses the pod, and the packets each puts on the pod's lo + eth0 when every
# ACK rides on the next request or response (keep-alive, a few ms between requests on a connection). The rate
# controller starts from these and then goes by the pod's own packet counters.
LOAD_PATHS = {
    "sidecar": 4.0,  # client -> pod:5000, REDIRECTed to the sidecar, proxied over lo: 2 on eth0, 2 on lo
    "eth0": 2.0,  # client -> pod:15020, not REDIRECTed: straight to the app, eth0 only
    "lo": 2.0,  # 127.0.0.6 -> pod:5000 inside the pod: the sidecar's upstream leg without the sidecar, lo only
}
_LOAD_TICK_S = 0.5  # seconds between rate-controller steps (and reconnects of lost connections)
_LOAD_BURST_S = 0.02  # seconds of requests a path may bank while its connections are all busy
_LOAD_DRAIN_S = 1.0  # seconds to wait for answers in flight after the last request
_MAX_LOAD_ERRORS = 20
_CLONE_NEWNET = 0x40000000


@dataclass
class LoadResult:
    """What run_load did. Times are seconds since the epoch; `packets` are the pod namespace's own counters
    over [started, ended] (lo counted once, eth0 in both directions), None when they could not be read."""

    target_pps: float
    seconds: float
    started: float = 0.0
    ended: float = 0.0
    sent: int = 0
    ok: int = 0  # 200 responses
    late: int = 0  # requests the pacing wanted while every connection of the path was still busy
    stopped_by: str = "time"  # "time" or "count" (the request cap)
    by_path: dict[str, dict[str, int]] = field(default_factory=dict)
    packets: dict[str, int] | None = None
    achieved_pps: float | None = None
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (seconds from start, pod packets/s)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["timeline"] = [list(t) for t in self.timeline]
        return data

    def error(self, text: str) -> None:
        if len(self.errors) < _MAX_LOAD_ERRORS:
            self.errors.append(text)


class _LoadConn:
    __slots__ = ("path", "sock", "buf", "busy")

    def __init__(self, path: str, sock: socket.socket) -> None:
        self.path, self.sock, self.buf, self.busy = path, sock, b"", False


def _lab_address(text: str) -> str:
    if ipaddress.ip_address(text) not in LAB_NETWORK:
        raise ValueError(f"{text} is not a lab address ({LAB_NETWORK}): load goes to lab pods only")
    return text


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class _PodNetns:
    """Enter the pod's network namespace for a moment (sockets keep the namespace they were made in)."""

    def __init__(self, name: str) -> None:
        self._pod = os.open(f"/run/netns/{name}", os.O_RDONLY)
        self._home = os.open("/proc/self/ns/net", os.O_RDONLY)

    def __enter__(self) -> "_PodNetns":
        _setns(self._pod)
        return self

    def __exit__(self, *exc: object) -> None:
        _setns(self._home)

    def close(self) -> None:
        os.close(self._pod)
        os.close(self._home)


def _pod_packets(fd: int) -> dict[str, int] | None:
    """lo and eth0 packet counters of the namespace `fd` (a /proc/self/net/dev opened inside it) was opened in."""
    try:
        text = os.pread(fd, 1 << 16, 0).decode()
    except OSError:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        cols = rest.split()
        if name.strip() == "lo":
            out["lo"] = int(cols[9])
        elif name.strip() == "eth0":
            out["eth0_rx"], out["eth0_tx"] = int(cols[1]), int(cols[9])
    if len(out) != 3:
        return None
    out["total"] = out["lo"] + out["eth0_rx"] + out["eth0_tx"]
    return out


def _response_length(buf: bytes) -> tuple[int, int] | None:
    """(bytes of the first whole response in buf, its status), None when it is not all there yet."""
    end = buf.find(b"\r\n\r\n")
    if end == -1:
        return None
    i = buf.find(b"ontent-Length:", 0, end)  # the app writes Content-Length, the sidecar content-length
    if i == -1:
        i = buf.find(b"ontent-length:", 0, end)
    length = int(buf[i + 14:buf.find(b"\r\n", i, end + 2)]) if i != -1 else 0
    total = end + 4 + length
    if len(buf) < total:
        return None
    return total, int(buf[9:12])


def run_load(
    pod: LabPod,
    rate_pps: float,
    seconds: float,
    *,
    sidecar_share: float = 0.1,
    connections: int = LOAD_DEFAULT_CONNECTIONS,
    max_requests: int | None = None,
    on_start: Callable[[LoadResult], None] | None = None,
) -> LoadResult:
    """Keep-alive GETs that put about `rate_pps` packets/s on the pod's lo + eth0 for `seconds` seconds.

    Must run inside pod.client_netns, as root (the lo path enters pod.netns to make its sockets). A share
    `sidecar_share` of the packets goes through the sidecar, the rest half on eth0 straight to the app and half
    on lo (LOAD_PATHS). Each path has `connections` connections with at most one request in flight; a token
    bucket paces requests, and a controller steers the request rate by the pod's packet counters. Bounded: it
    stops at `seconds`, after `max_requests` requests (default rate_pps * seconds), and never exceeds
    LOAD_MAX_PPS or LOAD_MAX_SECONDS. `on_start` is called once the connections are open and the clock starts.

    Raises ValueError for a non-lab address or a limit out of range, OSError when the connections cannot be
    opened; failures during the run land in LoadResult.errors.
    """
    _lab_address(pod.pod_ip)
    _lab_address(pod.client_ip)
    if not 0 < rate_pps <= LOAD_MAX_PPS:
        raise ValueError(f"rate {rate_pps:g} packets/s is out of range (0, {LOAD_MAX_PPS:g}]")
    if not 0 < seconds <= LOAD_MAX_SECONDS:
        raise ValueError(f"{seconds:g} s is out of range (0, {LOAD_MAX_SECONDS:g}]")
    if not 0 <= sidecar_share <= 1:
        raise ValueError(f"sidecar share {sidecar_share:g} is not within [0, 1]")
    if not 1 <= connections <= LOAD_MAX_CONNECTIONS:
        raise ValueError(f"{connections} connections per path is out of range [1, {LOAD_MAX_CONNECTIONS}]")
    cap = int(rate_pps * seconds) if max_requests is None else min(max_requests, int(rate_pps * seconds))
    shares = {"sidecar": sidecar_share, "eth0": (1 - sidecar_share) / 2, "lo": (1 - sidecar_share) / 2}
    paths = [p for p in LOAD_PATHS if shares[p] > 0]
    nominal = {p: rate_pps * shares[p] / LOAD_PATHS[p] for p in paths}  # requests/s
    ppr_guess = rate_pps / sum(nominal.values())  # packets per request of the mix
    result = LoadResult(target_pps=rate_pps, seconds=seconds,
                        by_path={p: {"sent": 0, "ok": 0, "connections": 0, "lost": 0} for p in paths})
    podns = _PodNetns(pod.netns)
    with podns:
        counters_fd = os.open("/proc/self/net/dev", os.O_RDONLY)  # keeps reading the pod's counters
    ep = select.epoll()
    conns: dict[int, _LoadConn] = {}
    idle: dict[str, collections.deque[_LoadConn]] = {p: collections.deque() for p in paths}
    lost: dict[str, int] = {p: 0 for p in paths}

    def open_conn(path: str) -> None:
        if path == "lo":
            with podns:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((INBOUND_PASSTHROUGH_SOURCE, 0))
            dst = (pod.pod_ip, HTTP_PORT)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            dst = (pod.pod_ip, HTTP_PORT if path == "sidecar" else LOAD_DIRECT_PORT)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(_IO_TIMEOUT)
            sock.connect(dst)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        conn = _LoadConn(path, sock)
        conns[sock.fileno()] = conn
        ep.register(sock.fileno(), select.EPOLLIN)
        idle[path].append(conn)
        result.by_path[path]["connections"] += 1

    def drop(conn: _LoadConn, why: str) -> None:
        result.error(f"{conn.path} connection: {why}")
        result.by_path[conn.path]["lost"] += 1
        lost[conn.path] += 1
        fd = conn.sock.fileno()
        conns.pop(fd, None)
        try:
            ep.unregister(fd)
        except OSError:
            pass
        if not conn.busy:
            try:
                idle[conn.path].remove(conn)
            except ValueError:
                pass
        conn.sock.close()

    def on_readable(fd: int) -> None:
        conn = conns.get(fd)
        if conn is None:
            return
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            drop(conn, _one_line(exc))
            return
        if not data:
            drop(conn, "closed by the pod")
            return
        buf = conn.buf + data if conn.buf else data
        while (done := _response_length(buf)) is not None:
            size, status = done
            buf = buf[size:]
            if not conn.busy:
                drop(conn, "a response nobody asked for")
                return
            conn.busy = False
            idle[conn.path].append(conn)
            if status == 200:
                result.ok += 1
                result.by_path[conn.path]["ok"] += 1
            else:
                result.error(f"{conn.path}: HTTP {status}")
        conn.buf = buf

    try:
        for path in paths:
            for _ in range(connections):
                open_conn(path)
        before = _pod_packets(counters_fd)
        result.started = time.time()
        t0 = last = time.monotonic()
        deadline = t0 + seconds
        next_tick = t0 + _LOAD_TICK_S
        tokens = {p: 0.0 for p in paths}
        burst = {p: max(1.0, nominal[p] * _LOAD_BURST_S) for p in paths}
        gain = 1.0  # request rate / nominal, steered by the measured packets per request
        ppr = ppr_guess
        tick_packets = before["total"] if before else None
        tick_sent = 0
        if on_start is not None:
            on_start(result)
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            if result.sent >= cap:
                result.stopped_by = "count"
                break
            dt, last = now - last, now
            for p in paths:
                tok = tokens[p] + dt * nominal[p] * gain
                if tok > burst[p]:
                    if not idle[p]:
                        result.late += int(tok - burst[p])
                    tok = burst[p]
                queue = idle[p]
                while tok >= 1.0 and queue and result.sent < cap:
                    conn = queue.popleft()
                    try:
                        conn.sock.send(LOAD_REQUEST)
                    except OSError as exc:
                        drop(conn, _one_line(exc))
                        continue
                    conn.busy = True
                    tok -= 1.0
                    result.sent += 1
                    result.by_path[p]["sent"] += 1
                tokens[p] = tok
            if now >= next_tick:
                next_tick += _LOAD_TICK_S
                counts = _pod_packets(counters_fd)
                if counts is not None and tick_packets is not None:
                    moved, asked = counts["total"] - tick_packets, result.sent - tick_sent
                    result.timeline.append((round(now - t0, 3), int(moved / _LOAD_TICK_S)))
                    if asked >= 50:
                        ppr = 0.5 * ppr + 0.5 * moved / asked
                        # Never more requests than rate_pps / 1.5 per second, never fewer than a fifth of nominal.
                        gain = min(max(ppr_guess / ppr, 0.2), ppr_guess / 1.5)
                    tick_packets, tick_sent = counts["total"], result.sent
                for p in paths:  # replace connections the pod closed, one per path and tick
                    if lost[p]:
                        try:
                            open_conn(p)
                            lost[p] -= 1
                        except OSError as exc:
                            result.error(f"{p}: reconnect: {_one_line(exc)}")
            for fd, _ in ep.poll(0.001):
                on_readable(fd)
        result.ended = time.time()
        after = _pod_packets(counters_fd)
        if before is not None and after is not None:
            result.packets = {k: after[k] - before[k] for k in after}
            result.achieved_pps = round(result.packets["total"] / max(result.ended - result.started, 1e-9), 1)
        drain_until = time.monotonic() + _LOAD_DRAIN_S
        while any(c.busy for c in conns.values()) and time.monotonic() < drain_until:
            for fd, _ in ep.poll(0.01):
                on_readable(fd)
    finally:
        for conn in list(conns.values()):
            conn.sock.close()
        ep.close()
        os.close(counters_fd)
        podns.close()
    return result


def _load_round(pod: LabPod, tally: _Tally) -> None:
    try:
        result = run_load(pod, LOAD_ROUND_PPS, LOAD_ROUND_SECONDS)
    except (OSError, ValueError) as exc:
        tally.errors.append(f"load: {_one_line(exc)}")
        return
    tally.http_ok += result.ok
    tally.errors.extend(result.errors)
    tally.load = result.to_json()


_ROUNDS: dict[str, Callable[[LabPod, "_Tally"], None]] = {
    "healthy": _healthy_round,
    "healthy-http": _healthy_http_round,
    "framing": _framing_round,
    "stale-keepalive": _stale_keepalive_round,
    "refused": _refused_round,
    "refused-localhost": _refused_round,
    "syn-drop": _syn_drop_round,
    "load": _load_round,
}


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


def run_round(pod: LabPod, scenario: str, *, used_ports: set[int] | None = None) -> RoundResult:
    """Run one round of `scenario` against `pod`. Must run inside pod.client_netns.

    Takes about 1-3 seconds. Never raises for network failures (they land in RoundResult.errors); raises
    ValueError for an unknown scenario.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
    ports = used_ports if used_ports is not None else set()
    started, t0 = time.time(), time.monotonic()
    acks_before = challenge_ack_count(pod.netns)
    tally = _Tally()
    if scenario in _ROUNDS:
        _ROUNDS[scenario](pod, tally)
    else:
        _port_reuse_round(pod, tally, flush=scenario == "collision", used_ports=ports)
    acks_after = challenge_ack_count(pod.netns)
    acks = None if acks_before is None or acks_after is None else acks_after - acks_before
    return RoundResult(
        scenario=scenario,
        pod=pod.name,
        started=started,
        duration_s=round(time.monotonic() - t0, 6),
        client_port=tally.client_port,
        http_ok=tally.http_ok,
        echo_ok=tally.echo_ok,
        second_connect_s=tally.second_connect_s,
        live_reset=tally.live_reset,
        challenge_acks=acks,
        errors=tuple(tally.errors),
        http=tuple(tally.http),
        connect_s=tally.connect_s,
        reused_after_s=tally.reused_after_s,
        load=tally.load,
    )


def drive(
    pod: LabPod,
    scenario: str,
    *,
    rounds: int = DEFAULT_ROUNDS,
    seconds: float = DEFAULT_SECONDS,
    period: float = DEFAULT_PERIOD,
    emit: Callable[[RoundResult], None] = lambda r: print(json.dumps(r.to_json()), flush=True),
) -> int:
    """Run at most `rounds` rounds, starting one every `period` seconds, for at most `seconds` seconds.

    Returns the number of rounds run. Raises ValueError for an unknown scenario.
    """
    deadline = time.monotonic() + seconds
    used_ports: set[int] = set()
    done = 0
    while done < rounds and time.monotonic() < deadline:
        round_start = time.monotonic()
        emit(run_round(pod, scenario, used_ports=used_ports))
        done += 1
        if len(used_ports) > 1000:  # TIME_WAIT is long gone for ports used this many rounds ago
            used_ports.clear()
        pause = min(period - (time.monotonic() - round_start), deadline - time.monotonic())
        if done < rounds and pause > 0:
            time.sleep(pause)
    return done


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kubectl_meshdoctor.lab.scenarios",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--pod-ip", required=True)
    parser.add_argument("--client-ip", required=True)
    parser.add_argument("--pod-netns", required=True, help="for conntrack -F and nstat")
    parser.add_argument("--pod-name", help="pod name in the results (default: the scenario)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="time limit of the whole run")
    parser.add_argument("--period", type=float, default=DEFAULT_PERIOD, help="seconds between round starts")
    args = parser.parse_args(argv)
    pod = LabPod(
        name=args.pod_name or args.scenario,
        scenario=args.scenario,
        netns=args.pod_netns,
        client_netns="",
        pod_ip=args.pod_ip,
        client_ip=args.client_ip,
        ports=(LabPort("http", HTTP_PORT), LabPort("tcp-echo", ECHO_PORT)),
        uid="",
    )
    # `lab down` sends SIGTERM: unwind (finally blocks remove e.g. the syn-drop rule) instead of dying mid-round.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        drive(pod, args.scenario, rounds=args.rounds, seconds=args.seconds, period=args.period)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
