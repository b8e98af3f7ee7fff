"""load: steady keep-alive traffic at a stated packet rate (run_load), for the lab's driver and bench/live."""

from __future__ import annotations

import collections
import ipaddress
import os
import select
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from meshdoctor_lab.apps import HTTP_PORT
from meshdoctor_lab.netns import INBOUND_PASSTHROUGH_SOURCE, LAB_NETWORK
from meshdoctor_lab.state import LabPod

from .podns import pod_packets, PodNetns
from .rounds import IO_TIMEOUT, one_line, Tally

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
# The loop sleeps in epoll until a response comes or the next request is due, at most this long: a light load
# (bench/many's 50 pods at 40 packets/s) then costs next to nothing, where a 1 ms poll woke each driver 1,000
# times a second and kept both cores busy.
_LOAD_MAX_WAIT_S = 0.05
_LOAD_DRAIN_S = 1.0  # seconds to wait for answers in flight after the last request
_MAX_LOAD_ERRORS = 20


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
    podns = PodNetns(pod.netns)
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
            sock.settimeout(IO_TIMEOUT)
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
            drop(conn, one_line(exc))
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
        before = pod_packets(counters_fd)
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
                        drop(conn, one_line(exc))
                        continue
                    conn.busy = True
                    tok -= 1.0
                    result.sent += 1
                    result.by_path[p]["sent"] += 1
                tokens[p] = tok
            if now >= next_tick:
                next_tick += _LOAD_TICK_S
                counts = pod_packets(counters_fd)
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
                            result.error(f"{p}: reconnect: {one_line(exc)}")
            wait = min(next_tick, deadline) - now
            for p in paths:  # a path with an idle connection sends when its bucket holds a token
                rate = nominal[p] * gain
                if idle[p] and rate > 0 and result.sent < cap:
                    wait = min(wait, (1.0 - tokens[p]) / rate)
            # epoll rounds a timeout up to whole milliseconds: a busy load still polls every 1 ms, as before
            for fd, _ in ep.poll(min(max(wait, 0.0), _LOAD_MAX_WAIT_S)):
                on_readable(fd)
        result.ended = time.time()
        after = pod_packets(counters_fd)
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


def load_round(pod: LabPod, tally: Tally) -> None:
    try:
        result = run_load(pod, LOAD_ROUND_PPS, LOAD_ROUND_SECONDS)
    except (OSError, ValueError) as exc:
        tally.errors.append(f"load: {one_line(exc)}")
        return
    tally.http_ok += result.ok
    tally.errors.extend(result.errors)
    tally.load = result.to_json()
