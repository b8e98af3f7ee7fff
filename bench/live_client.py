"""The side of bench/live that runs in the lab pod's client network namespace: the load and the planter.

bench/live starts ``live.py _generate`` and ``live.py _plant`` there (``ip netns exec``), so their sockets are
the client's. Each prints one JSON event a line on stdout, which bench/live reads as it arrives (the load's
start and result; each planted failure with its wall-clock time and the flow it should be found on).
"""

from __future__ import annotations

import json
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from typing import Any

POD = "load"  # the lab pod bench/live brings up and loads
REFUSED_BASE_PORT = 5100  # plant i of kind refused dials pod:5100+i; nothing in a lab pod listens there


def _pod_from(args) -> Any:
    from meshdoctor_lab.state import LabPod

    return LabPod(name=POD, scenario="load", netns=args.pod_netns, client_netns="", pod_ip=args.pod_ip,
                  client_ip=args.client_ip, ports=(), uid="")


def _emit(event: dict) -> None:
    print(json.dumps(event), flush=True)


def cmd_generate(args) -> int:
    """Run the load (in the client namespace) and print {"event": "started"} and then the LoadResult."""
    from meshdoctor_lab.scenarios import run_load

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cpu0 = []

    def started(r) -> None:
        cpu0.append(_cpu_s())
        _emit({"event": "started", "t": r.started})

    result = run_load(_pod_from(args), args.rate, args.seconds, sidecar_share=args.sidecar_share,
                      connections=args.connections, on_start=started)
    _emit({"event": "done", "cpu_s": round(_cpu_s() - cpu0[0], 3), **result.to_json()})
    return 0


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _http_get(sock: socket.socket, path: str) -> int:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: lab\r\nUser-Agent: meshdoctor-bench\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("connection closed before the response")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    need = int(m.group(1)) if m else 0
    while len(body) < need:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(head[9:12])


def _plant_refused(args, i: int) -> dict:
    port = REFUSED_BASE_PORT + i
    out = {"kind": "refused", "detector": "upstream-refused", "client": None, "server": f"{args.pod_ip}:{port}"}
    out["t"] = time.time()
    try:
        with socket.create_connection((args.pod_ip, port), timeout=5.0) as sock:
            out["connected"] = True
            try:
                out["eof"] = sock.recv(1024) == b""  # the sidecar closes us once its connect failed
            except OSError as exc:
                out["eof"] = str(exc)
    except OSError as exc:
        out["error"] = str(exc)
    return out


def _plant_collision(args, used: set[int]) -> dict:
    from meshdoctor_lab.apps import ECHO_PORT, HTTP_PORT
    from meshdoctor_lab.netns import CLIENT_FIXED_PORTS, in_netns

    port = random.randint(*CLIENT_FIXED_PORTS)
    while port in used:
        port = random.randint(*CLIENT_FIXED_PORTS)
    used.add(port)
    out = {"kind": "collision", "detector": "tuple-collision", "client": f"{args.client_ip}:{port}",
           "server": f"{args.pod_ip}:{ECHO_PORT}"}

    def bound() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.settimeout(5.0)
        sock.bind((args.client_ip, port))
        return sock

    live = second = None
    try:
        live = bound()
        live.connect((args.pod_ip, HTTP_PORT))
        out["live_status"] = _http_get(live, "/plant")
        time.sleep(0.1)  # the client's ACK of the response is out: the live connection is idle now
        # Only this connection's entry goes: the load's own NAT mappings must stay (a flush would break them).
        done = subprocess.run(in_netns(args.pod_netns, "conntrack", "-D", "-p", "tcp", "--orig-src", args.client_ip,
                                       "--sport", str(port)), capture_output=True, text=True, timeout=5)
        out["conntrack"] = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [""]
        second = bound()
        out["t"] = time.time()
        t0 = time.monotonic()
        second.connect((args.pod_ip, ECHO_PORT))  # challenge ACK, RST, the SYN resent at once passes (12 ms in the lab)
        out["second_connect_s"] = round(time.monotonic() - t0, 3)
    except OSError as exc:
        out["error"] = str(exc)
        out.setdefault("t", time.time())
    finally:
        for sock in (live, second):
            if sock is not None:
                sock.close()
    return out


def cmd_plant(args) -> int:
    """Plant failures every --every seconds until --until (epoch), alternating the --kinds; one line each."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kinds = args.kinds.split(",")
    used: set[int] = set()
    start = time.time()
    i = 0
    while True:
        at = start + args.every * (i + 0.5)
        if at > args.until - 1.5:  # a collision takes over a second: plant only what ends inside the window
            break
        time.sleep(max(0.0, at - time.time()))
        kind = kinds[i % len(kinds)]
        _emit({"event": "plant", "n": i,
               **(_plant_refused(args, i) if kind == "refused" else _plant_collision(args, used))})
        i += 1
    return 0
