"""collision and remap: one client ip:port dials :5000 and then :5002, which REDIRECT maps onto one four-tuple."""

from __future__ import annotations

import http.client
import random
import socket
import subprocess
import time

from meshdoctor_lab.apps import ECHO_PORT, HTTP_PORT
from meshdoctor_lab.netns import CLIENT_FIXED_PORTS, in_netns
from meshdoctor_lab.state import LabPod

from .rounds import IO_TIMEOUT, echo_exchange, one_line, Tally
from .table import CLIENT_PORT_FIX

_LIVE_INTERVAL = 0.3  # seconds between requests on the live connection
_LIVE_REQUESTS = 3  # requests on the live connection before and after the second connect
_HTTP_REQUEST = b"GET / HTTP/1.1\r\nHost: lab\r\nUser-Agent: meshdoctor-lab\r\n\r\n"


def flush_conntrack(pod_netns: str) -> None:
    """Forget every conntrack entry in the pod namespace (the live connection's NAT mapping included).

    Raises OSError or subprocess.CalledProcessError when conntrack fails.
    """
    subprocess.run(
        in_netns(pod_netns, "conntrack", "-F"), capture_output=True, timeout=IO_TIMEOUT, check=True
    )


def _bound_socket(client_ip: str, port: int) -> socket.socket:
    # SO_REUSEADDR on both sockets is what lets the second one share client_ip:port with the live one;
    # their four-tuples differ only in the destination port, which REDIRECT then erases.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.settimeout(IO_TIMEOUT)
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


def _live_requests(live: socket.socket, tally: Tally) -> bool:
    """Send _LIVE_REQUESTS keep-alive GETs ~0.3 s apart; False (and an error noted) if the connection died."""
    for i in range(_LIVE_REQUESTS):
        if i:
            time.sleep(_LIVE_INTERVAL)  # the keep-alive cadence a capture sees
        try:
            status = _http_exchange(live)
        except OSError as exc:
            tally.live_reset = True
            tally.errors.append(f"live connection to :{HTTP_PORT}: {one_line(exc)}")
            return False
        if status == 200:
            tally.http_ok += 1
        else:
            tally.errors.append(f"live connection got HTTP {status}")
    return True


def port_reuse_round(pod: LabPod, tally: Tally, *, flush: bool, used_ports: set[int]) -> None:
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
        # The client-side fix: the second connection gets a port of its own from the kernel.
        second = _bound_socket(pod.client_ip, 0 if pod.fix == CLIENT_PORT_FIX else port)
        t0 = time.monotonic()
        second.connect((pod.pod_ip, ECHO_PORT))
        tally.second_connect_s = time.monotonic() - t0
        if echo_exchange(second, b"meshdoctor-echo\n"):
            tally.echo_ok += 1
        else:
            tally.errors.append(f"echo on :{ECHO_PORT} came back wrong")
        time.sleep(_LIVE_INTERVAL)
        _live_requests(live, tally)
    except (OSError, subprocess.SubprocessError) as exc:
        tally.errors.append(one_line(exc))
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
