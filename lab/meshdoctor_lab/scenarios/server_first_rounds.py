"""server-first: a client of a server-first protocol (MySQL, SMTP shape) that waits for the server's greeting
before it writes, as such clients do, and gives up after SERVER_FIRST_WAIT seconds (a client's connect
timeout for the handshake)."""

from __future__ import annotations

import socket
import time

from meshdoctor_lab.apps import ECHO_PORT, GREETING
from meshdoctor_lab.state import LabPod

from .rounds import IO_TIMEOUT, echo_exchange, one_line, Tally
from .table import SERVER_FIRST_WAIT

_CONNECTIONS = 2  # bounded: each waits at most SERVER_FIRST_WAIT s when no greeting comes


def _greeting(sock: socket.socket, wait_s: float) -> bytes:
    """The bytes the server wrote first, read until a whole GREETING line or ``wait_s`` seconds (then b"" or
    what came so far); the connection is not written to meanwhile."""
    deadline, got = time.monotonic() + wait_s, b""
    while not got.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(len(GREETING))
        except TimeoutError:
            break
        if not chunk:
            break
        got += chunk
    return got


def server_first_round(pod: LabPod, tally: Tally) -> None:
    """``_CONNECTIONS`` connections to :5002, one after another: each waits for the greeting; greeted, it echoes
    one line (echo_ok); not greeted, it closes (FIN) and the round records the error."""
    for i in range(_CONNECTIONS):
        t0 = time.monotonic()
        try:
            with socket.create_connection((pod.pod_ip, ECHO_PORT), timeout=IO_TIMEOUT) as sock:
                tally.client_port = sock.getsockname()[1]
                got = _greeting(sock, SERVER_FIRST_WAIT)
                if got != GREETING:
                    tally.errors.append(f"no greeting on :{ECHO_PORT} after {time.monotonic() - t0:.1f} s "
                                        f"(got {got!r})")
                    continue
                sock.settimeout(IO_TIMEOUT)
                echoed = echo_exchange(sock, f"meshdoctor-after-greeting {i}\n".encode())
                tally.echo_ok += echoed
                if not echoed:
                    tally.errors.append(f"echo on :{ECHO_PORT} after the greeting came back wrong")
        except OSError as exc:
            tally.errors.append(f"server-first :{ECHO_PORT}: {one_line(exc)}")
