"""The outbound-stale driver (issue 33, item 5): the app's SYN from a source port whose earlier connection the caller
sidecar still holds half-closed on 127.0.0.1:15001.

Runs in the caller's pod namespace, through its sidecar (`lab up --caller sidecar`): nat OUTPUT REDIRECTs the app's
connection to the pod's port 5000 to 127.0.0.1:15001. One round:

1. the app connects (the kernel picks its port P) and GETs with `Connection: close`: the caller sidecar answers
   and closes first, so its accepted socket goes FIN-WAIT-2 once the app's kernel ACKs the FIN; Envoy closed it,
   so it lingers as an orphan for net.ipv4.tcp_fin_timeout (60 s);
2. the app keeps its end open (CLOSE-WAIT) until conntrack has forgotten the connection. The lab knob: during the
   round the caller namespace's nf_conntrack_tcp_timeout_close_wait and _fin_wait are CONNTRACK_TIMEOUT_S (60 s
   and 120 s by default; the kernel keeps them per network namespace), and restored after;
3. the app closes: with no conntrack entry its FIN is INVALID, skips the REDIRECT, leaves on eth0 un-NATed and
   meets the pod's RST;
4. the app connects again from P (bind with SO_REUSEADDR, as an app with a fixed source port or a port pool does;
   the client-port fix: no bind, the kernel picks) and GETs again. The REDIRECT makes the new SYN the old
   four-tuple inside the pod: the FIN-WAIT-2 socket answers it with the old connection's ACK (RFC 9293 section
   3.10.7.4: an unacceptable segment is answered with an ACK; Linux counts it in TcpExtTCPACKSkippedFinWait2),
   the app's kernel answers that with RST, and the SYN sent again is the listener's.

Seen in the lab with an INVALID drop in the caller's namespace (mangle PREROUTING `--ctstate INVALID -j DROP`,
as Istio's INVALID_DROP renders it): the pod's RST to step 3's FIN is INVALID too and dropped, the app's socket
stays in LAST-ACK, and the round times out waiting for it to go.

Every wait is a condition with a deadline (ROUND_DEADLINE_S in all); the round's socket operations time out after
IO_TIMEOUT.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from meshdoctor_lab.apps import HTTP_PORT
from meshdoctor_lab.state import LabPod

from .rounds import IO_TIMEOUT, Tally, one_line
from .table import CLIENT_PORT_FIX

CONNTRACK_TIMEOUT_S = 1  # the caller namespace's close_wait and fin_wait conntrack timeouts during a round
TIMEOUTS = ("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
            "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_fin_wait")
ROUND_DEADLINE_S = 20.0
OUTBOUND_PORT = 15001  # Istio's virtualOutbound listener, where nat OUTPUT REDIRECTs the app's connections
FIN_WAIT2, TCP_STATES_FILE = "05", "/proc/net/tcp"


@contextmanager
def short_conntrack_timeouts(seconds: int) -> Iterator[None]:
    """This namespace's conntrack close_wait and fin_wait timeouts set to ``seconds``, restored on the way out."""
    before = {}
    try:
        for path in TIMEOUTS:
            with open(path) as f:
                before[path] = f.read().strip()
            with open(path, "w") as f:
                f.write(str(seconds))
        yield
    finally:
        for path, value in before.items():
            with open(path, "w") as f:
                f.write(value)


def _endpoint(hex_endpoint: str) -> tuple[str, int]:
    ip, port = hex_endpoint.split(":")
    return socket.inet_ntoa(struct.pack("<I", int(ip, 16))), int(port, 16)


def tcp_sockets() -> list[tuple[tuple[str, int], tuple[str, int], str]]:
    """(local, remote, state in hex) of every IPv4 TCP socket of this namespace, time-wait ones included
    (Documentation/networking/proc_net_tcp.rst; an orphaned FIN-WAIT-2 socket shows its substate, 05)."""
    with open(TCP_STATES_FILE) as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return [(_endpoint(r[1]), _endpoint(r[2]), r[3]) for r in rows if len(r) > 3]


def conntrack_has(src: str, sport: int) -> bool:
    """Whether this namespace's conntrack table has a TCP entry from ``src``:``sport`` (conntrack -L)."""
    out = subprocess.run(["conntrack", "-L", "-p", "tcp", "--orig-src", src, "--sport", str(sport)],
                         capture_output=True, text=True, timeout=IO_TIMEOUT).stdout
    return any(line.strip() for line in out.splitlines())


def _half_closed(app: tuple[str, int]) -> bool:
    """Whether the caller sidecar's socket of the connection from ``app`` waits in FIN-WAIT-2 on :15001."""
    return any(local == ("127.0.0.1", OUTBOUND_PORT) and remote == app and state == FIN_WAIT2
               for local, remote, state in tcp_sockets())


def _apps_socket(app: tuple[str, int]) -> bool:
    """Whether the app still has a socket from ``app`` to the pod's HTTP port (any state)."""
    return any(local == app and remote[1] == HTTP_PORT for local, remote, _ in tcp_sockets())


def _wait(what: str, done: Callable[[], bool], deadline: float, tally: Tally) -> bool:
    """Polls ``done`` until it holds (True) or ``deadline`` (time.monotonic) passes (False, an error tallied)."""
    while not done():
        if time.monotonic() > deadline:
            tally.errors.append(f"timed out waiting for {what}")
            return False
        time.sleep(0.05)  # polls the kernel's tables, bounded by the round's deadline
    return True


def _get(s: socket.socket, pod: LabPod, path: str, tally: Tally) -> None:
    """GET ``path`` with `Connection: close` on ``s`` and read until the peer's FIN; record (label, status, line)."""
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {pod.pod_ip}:{HTTP_PORT}\r\nUser-Agent: meshdoctor-lab\r\n"
              "Connection: close\r\n\r\n".encode())
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    first = answer.split(b"\r\n", 1)[0].decode("latin-1")
    parts = first.split(" ")
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    tally.http.append((f"GET {path}", status, first))
    if status == 200:
        tally.http_ok += 1


def outbound_stale_round(pod: LabPod, tally: Tally) -> None:
    """One round (module docstring), in the caller's namespace: the two GETs in ``tally.http``, the second
    connect's time in ``tally.second_connect_s``, its source port in ``tally.client_port``."""
    if pod.caller != "sidecar":
        tally.errors.append("outbound-stale needs a caller sidecar (lab up --caller sidecar)")
        return
    deadline = time.monotonic() + ROUND_DEADLINE_S
    try:
        with short_conntrack_timeouts(CONNTRACK_TIMEOUT_S):
            first = socket.create_connection((pod.pod_ip, HTTP_PORT), timeout=IO_TIMEOUT)
            port = first.getsockname()[1]
            try:
                _get(first, pod, "/first", tally)
                app = (pod.client_ip, port)
                if not _wait("the caller sidecar's FIN-WAIT-2 socket", lambda: _half_closed(app), deadline, tally):
                    return
                if not _wait("conntrack to forget the connection", lambda: not conntrack_has(*app), deadline, tally):
                    return
            finally:
                first.close()
            if not _wait("the app's closed socket to go", lambda: not _apps_socket(app), deadline, tally):
                return
            second = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            with second:
                second.settimeout(IO_TIMEOUT)
                if pod.fix != CLIENT_PORT_FIX:
                    second.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    second.bind(app)  # the bug: the app reuses its source port
                t0 = time.monotonic()
                second.connect((pod.pod_ip, HTTP_PORT))
                tally.second_connect_s = round(time.monotonic() - t0, 6)
                tally.client_port = second.getsockname()[1]
                _get(second, pod, "/second", tally)
    except OSError as exc:
        tally.errors.append(one_line(exc))
