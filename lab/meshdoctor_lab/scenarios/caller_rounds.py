"""The drivers where the caller or the app's pace is the story: slow-app (the route's timeout fires, a caller gives up
first, another half-closes, a slow answer still in time), http10 (requests the sidecar's codec refuses before the
app sees them), port-exhaustion (short requests that use up the sidecar's source ports) and downstream-idle (a
caller reusing a connection the sidecar closed on its idle timeout)."""

from __future__ import annotations

import select
import socket
import time

from meshdoctor_lab.apps import HTTP_PORT
from meshdoctor_lab.state import LabPod

from .http_rounds import http_get
from .rounds import IO_TIMEOUT, one_line, Tally
from .table import (
    CALLER_HTTP11_FIX,
    CALLER_IDLE_FIX,
    CALLER_IDLE_REUSE_AFTER,
    CALLER_IDLE_TIMEOUT,
    CALLER_NO_HALF_CLOSE_FIX,
    CALLER_NO_UPGRADE_FIX,
    CALLER_TIMEOUT_FIX,
    CALLER_VALID_REQUEST_FIX,
    DOWNSTREAM_FIN_WITHIN,
    EXHAUSTION_REQUESTS,
    GOAWAY_REQUESTS,
    SLOW_ABANDONED,
    SLOW_CALLER_GIVES_UP,
    SLOW_HALF_CLOSED,
    SLOW_IN_TIME,
    SLOW_TOO_LONG,
)

# Raw requests: http.client cannot speak HTTP/1.0 on purpose, nor send a header name with a space in it. Each
# names the service as http.client would (Host: POD_IP:PORT, the pod IP standing in for the ClusterIP), so a
# caller sidecar routes it by the service's virtual host, not to PassthroughCluster (policy_rounds.py does too).
HTTP10_REQUEST = "GET /http10 HTTP/1.0\r\nHost: {host}\r\n\r\n"
UPGRADE_REQUEST = "GET /upgrade HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: meshdoctor-lab/1\r\n\r\n"
MALFORMED_REQUEST = "GET /malformed HTTP/1.1\r\nHost: {host}\r\nBad Header: space in its name\r\n\r\n"


def _get(pod: LabPod, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {pod.pod_ip}:{HTTP_PORT}\r\n\r\n".encode()


def _raw(pod: LabPod, tally: Tally, label: str, request: str) -> int | None:
    """Send ``request`` (its ``{host}`` filled in) on a new connection, read the status line; record (label,
    status, first line)."""
    try:
        with socket.create_connection((pod.pod_ip, HTTP_PORT), timeout=IO_TIMEOUT) as s:
            s.sendall(request.format(host=f"{pod.pod_ip}:{HTTP_PORT}").encode())
            head = b""
            while b"\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
    except OSError as exc:
        tally.errors.append(f"{label}: {one_line(exc)}")
        return None
    first = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = first.split(" ")
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    if status is None:
        tally.errors.append(f"{label}: no status line ({first[:40]!r})")
        return None
    tally.http.append((label, status, first))
    return status


def _abandoned(pod: LabPod, tally: Tally, path: str, patience_s: float) -> None:
    """A caller that sends a request and closes its connection after ``patience_s`` without an answer."""
    try:
        with socket.create_connection((pod.pod_ip, HTTP_PORT), timeout=IO_TIMEOUT) as s:
            s.sendall(_get(pod, path))
            s.settimeout(patience_s)
            try:
                early = s.recv(4096)
            except socket.timeout:
                early = b""
    except OSError as exc:
        tally.errors.append(f"GET {path} (abandoned): {one_line(exc)}")
        return
    if early:
        tally.errors.append(f"GET {path} was answered within {patience_s} s: {early[:40]!r}")
    tally.http.append((f"{path} (abandoned after {patience_s} s)", 0, ""))


def _half_closed(pod: LabPod, tally: Tally, path: str) -> None:
    """A caller that shuts its write side once its request is out, and reads until the connection ends."""
    label = f"{path} (write side shut after the request)"
    try:
        with socket.create_connection((pod.pod_ip, HTTP_PORT), timeout=IO_TIMEOUT) as s:
            # Corked, the request and the FIN leave in one segment: Envoy reads both at once. Sent apart, a
            # caller descheduled between them (a loaded machine) let Envoy answer first, and nothing failed.
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            s.sendall(_get(pod, path))
            s.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
    except OSError as exc:
        tally.errors.append(f"{label}: {one_line(exc)}")
        return
    first = answer.split(b"\r\n", 1)[0].decode("latin-1")
    status = int(first.split(" ")[1]) if first.count(" ") and first.split(" ")[1].isdigit() else 0
    tally.http.append((label, status, first))


def slow_app_round(pod: LabPod, tally: Tally) -> None:
    http_get(pod, tally, f"/slow/{SLOW_IN_TIME}")  # slow, but within the route's timeout: 200
    http_get(pod, tally, f"/slow/{SLOW_TOO_LONG}")  # the route's timeout fires first: Envoy's 504 UT
    if pod.fix == CALLER_TIMEOUT_FIX:  # the fixed caller waits as long as http_get does, past the route's timeout
        http_get(pod, tally, f"/slow/{SLOW_ABANDONED}")
    else:  # the caller goes first: 0 DC
        _abandoned(pod, tally, f"/slow/{SLOW_ABANDONED}", SLOW_CALLER_GIVES_UP)
    if pod.fix == CALLER_NO_HALF_CLOSE_FIX:
        http_get(pod, tally, SLOW_HALF_CLOSED)
    else:  # Envoy takes the half-close for a disconnect: 0 DC at once
        _half_closed(pod, tally, SLOW_HALF_CLOSED)


def http10_round(pod: LabPod, tally: Tally) -> None:
    # A caller-side fix sends its one request the right way; an ordinary request comes last either way.
    if pod.fix == CALLER_HTTP11_FIX:
        http_get(pod, tally, "/http10")
    else:
        _raw(pod, tally, "GET /http10 HTTP/1.0", HTTP10_REQUEST)
    if pod.fix == CALLER_NO_UPGRADE_FIX:
        http_get(pod, tally, "/upgrade")
    else:
        _raw(pod, tally, "GET /upgrade (Upgrade: meshdoctor-lab/1)", UPGRADE_REQUEST)
    if pod.fix == CALLER_VALID_REQUEST_FIX:
        http_get(pod, tally, "/malformed")
    else:
        _raw(pod, tally, "GET /malformed (a header name with a space)", MALFORMED_REQUEST)
    http_get(pod, tally, "/ok")  # an ordinary request on the same pod still works


def port_exhaustion_round(pod: LabPod, tally: Tally) -> None:
    # Short requests one after another: each upstream connection is closed by the sidecar after its one
    # request and holds its source port in TIME_WAIT, until no port is left for the next connect().
    for i in range(EXHAUSTION_REQUESTS):
        http_get(pod, tally, f"/exhaust/{i}")


def response_of(sock: socket.socket) -> bytes:
    """One response with a Content-Length body (the lab app's), read whole; b"" when the peer closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head


def _fin_arrived(sock: socket.socket, within_s: float) -> bool:
    """Whether the peer's FIN arrives within ``within_s`` seconds, seen without reading it (MSG_PEEK): a pool
    that does not poll its idle connections has not noticed it either."""
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            return sock.recv(1, socket.MSG_PEEK) == b""
    return False


def downstream_idle_round(pod: LabPod, tally: Tally) -> None:
    if pod.caller == "sidecar":
        _idle_close_at_the_caller(pod, tally)
        return
    request = _get(pod, "/idle")
    try:
        with socket.create_connection((pod.pod_ip, HTTP_PORT), timeout=IO_TIMEOUT) as s:
            s.sendall(request)
            first = response_of(s)
            tally.http.append(("/idle", int(first.split(b" ")[1]) if first[:5] == b"HTTP/" else 0, ""))
            done = time.monotonic()
            if pod.fix == CALLER_IDLE_FIX:  # the fixed caller's pool: idle too long, so a new connection
                time.sleep(CALLER_IDLE_TIMEOUT)  # the caller's own idle timer, not a wait for a condition
                s.close()
                http_get(pod, tally, "/idle/new-connection")
                return
            if not _fin_arrived(s, DOWNSTREAM_FIN_WITHIN):
                tally.errors.append(f"the sidecar did not close the idle connection within {DOWNSTREAM_FIN_WITHIN} s")
                return
            tally.reused_after_s = round(time.monotonic() - done, 3)
            s.sendall(request)  # on the connection the sidecar closed: its kernel answers RST
            try:
                second = response_of(s)
            except ConnectionResetError:
                second = b"reset"
    except OSError as exc:
        tally.errors.append(f"GET /idle: {one_line(exc)}")
        return
    tally.http.append(("/idle again on the same connection", 0, second[:40].decode("latin-1")))


def h2_round(pod: LabPod, tally: Tally) -> None:
    # The caller speaks HTTP/1.1 to the sidecar; the sidecar speaks HTTP/2 to the app.
    for i in range(GOAWAY_REQUESTS):
        http_get(pod, tally, f"/h2/{i}")


def _idle_close_at_the_caller(pod: LabPod, tally: Tally) -> None:
    """Through a caller sidecar: GET /idle leaves the caller's connection to the pod's sidecar pooled; a second
    GET, on a new client connection, goes out CALLER_IDLE_REUSE_AFTER later, inside the pod sidecar's delayed
    close (table.py): the caller writes it on that pooled connection and gets no answer (503 UC at the caller)."""
    if http_get(pod, tally, "/idle") != 200:
        return
    done = time.monotonic()
    time.sleep(CALLER_IDLE_REUSE_AFTER)  # the race's timing itself, not a wait for a condition
    tally.reused_after_s = round(time.monotonic() - done, 3)
    http_get(pod, tally, "/idle/after-the-pod-closed")
