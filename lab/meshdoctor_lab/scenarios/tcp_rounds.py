"""healthy and syn-drop: new connections from kernel-chosen ports, HTTP and TCP echo, one of them delayed by
dropped SYNs."""

from __future__ import annotations

import errno
import http.client
import os
import select
import socket
import subprocess
import time

from meshdoctor_lab.apps import ECHO_PORT, HTTP_PORT
from meshdoctor_lab.netns import in_netns
from meshdoctor_lab.state import LabPod

from .rounds import IO_TIMEOUT, echo_exchange, one_line, Tally

# Seconds the syn-drop rule stays. The client kernel retransmits a SYN after 1 s, then 3 s (classic exponential
# backoff: 1, 3, 7 s) or, with net.ipv4.tcp_syn_linear_timeouts (default 4 since Linux 6.7), after 1, 2, 3, 4 s.
# 2.5 s is half a second clear of both schedules: the SYN at ~3 s is the first to pass, under either.
SYN_DROP_SECONDS = 2.5
_HEALTHY_CONNECTIONS = 3
_SYN_CONNECT_TIMEOUT = 10.0  # seconds; covers the SYN retransmits at ~1 s and ~3 s


def healthy_round(pod: LabPod, tally: Tally) -> None:
    for i in range(_HEALTHY_CONNECTIONS):
        conn = http.client.HTTPConnection(pod.pod_ip, HTTP_PORT, timeout=IO_TIMEOUT)
        try:
            conn.request("GET", f"/healthy/{i}", headers={"User-Agent": "meshdoctor-lab"})
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                tally.http_ok += 1
            else:
                tally.errors.append(f"GET :{HTTP_PORT} answered HTTP {response.status}")
        except (OSError, http.client.HTTPException) as exc:
            tally.errors.append(f"GET :{HTTP_PORT}: {one_line(exc)}")
        finally:
            conn.close()
    for i in range(_HEALTHY_CONNECTIONS):
        try:
            with socket.create_connection((pod.pod_ip, ECHO_PORT), timeout=IO_TIMEOUT) as sock:
                if echo_exchange(sock, f"meshdoctor-echo {i}\n".encode()):
                    tally.echo_ok += 1
                else:
                    tally.errors.append(f"echo on :{ECHO_PORT} came back wrong")
        except OSError as exc:
            tally.errors.append(f"echo :{ECHO_PORT}: {one_line(exc)}")


def _syn_drop_rule(pod: LabPod, action: str) -> list[str]:
    return in_netns(pod.netns, "iptables", "-w", "5", "-t", "raw", action, "PREROUTING", "-p", "tcp",
                    "--dport", str(ECHO_PORT), "--syn", "-m", "comment", "--comment",
                    f"meshdoctor-lab-syn-drop-{os.getpid()}", "-j", "DROP")


def syn_drop_round(pod: LabPod, tally: Tally) -> None:
    subprocess.run(_syn_drop_rule(pod, "-I"), capture_output=True, timeout=IO_TIMEOUT, check=True)
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
            subprocess.run(_syn_drop_rule(pod, "-D"), capture_output=True, timeout=IO_TIMEOUT, check=True)
        _, writable, _ = select.select([], [sock], [], max(0.0, t0 + _SYN_CONNECT_TIMEOUT - time.monotonic()))
        if not writable:
            raise OSError(f"connect to :{ECHO_PORT} not done after {_SYN_CONNECT_TIMEOUT:g} s")
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, os.strerror(err))
        tally.connect_s = round(time.monotonic() - t0, 3)
        sock.setblocking(True)
        sock.settimeout(IO_TIMEOUT)
        if echo_exchange(sock, b"meshdoctor-echo after syn drop\n"):
            tally.echo_ok += 1
        else:
            tally.errors.append(f"echo on :{ECHO_PORT} came back wrong")
    except (OSError, subprocess.SubprocessError) as exc:
        tally.errors.append(f"syn-drop :{ECHO_PORT}: {one_line(exc)}")
    finally:
        sock.close()
