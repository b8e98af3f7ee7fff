"""The conntrack-invalid driver: an upload whose connection to the pod gets one segment conntrack marks INVALID.

The client POSTs UPLOAD_BYTES in UPLOAD_CHUNK pieces, one every UPLOAD_PAUSE_S, to the pod's port 5000. Through a
caller sidecar (`lab up --caller sidecar`) the connection that reaches the pod is the sidecar's (uid 1337), else
the client's own. Once the pod has answered on it, a raw socket in this (the caller's) namespace writes one ACK
into it: the live four-tuple, its ACK the pod's next sequence number (read from the pod's last segment, on an
AF_PACKET socket on eth0), its sequence number OUT_OF_WINDOW bytes past what the pod has acknowledged. conntrack
in the pod finds it out of the window (nf_conntrack_proto_tcp.c tcp_in_window) and marks it INVALID; the nat
REDIRECT skips it and the app's port answers RST, which resets the caller's connection (plugins/conntrack_invalid.py
has what the lab showed). Python's socket module does it all: no packet library. One segment a round, bounded in
time by IO_TIMEOUT.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

from meshdoctor_lab.apps import HTTP_PORT
from meshdoctor_lab.state import LabPod

from .rounds import IO_TIMEOUT, one_line, Tally

UPLOAD_BYTES = 400_000
UPLOAD_CHUNK = 4000
UPLOAD_PAUSE_S = 0.02  # 2 s for the whole upload: time for the segment to land while it runs
OUT_OF_WINDOW = 2**30  # bytes past the pod's last ACK: beyond any window (at most 2^30 with scaling, RFC 7323)
SIDECAR_UID = "1337"
ETH_P_IP = 0x0800


def _upload(pod: LabPod, result: list) -> None:
    head = (f"POST /upload HTTP/1.1\r\nHost: {pod.pod_ip}:{HTTP_PORT}\r\nUser-Agent: meshdoctor-lab\r\n"
            f"Content-Length: {UPLOAD_BYTES}\r\n\r\n").encode()
    try:
        with socket.create_connection((pod.pod_ip, HTTP_PORT), timeout=IO_TIMEOUT) as s:
            result.append(s.getsockname()[1])
            s.sendall(head)
            for _ in range(UPLOAD_BYTES // UPLOAD_CHUNK):
                s.sendall(b"x" * UPLOAD_CHUNK)
                time.sleep(UPLOAD_PAUSE_S)  # the upload's own pace, not a wait for a condition
            answer = s.recv(4096)
        first = answer.split(b"\r\n", 1)[0].decode("latin-1")
        status = int(first.split(" ")[1]) if first.count(" ") and first.split(" ")[1].isdigit() else 0
        result.append((status, first))
    except OSError as exc:
        result.append((0, one_line(exc)))


def _connection_port(pod: LabPod, client_port: int | None) -> int | None:
    """The local port of the established connection to the pod's HTTP port that reaches the pod: the caller
    sidecar's (uid 1337), else the client's own (/proc/net/tcp, Documentation/networking/proc_net_tcp.rst)."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    ports = {}
    for row in rows:
        local, remote, state, uid = row[1], row[2], row[3], row[7]
        if state == "01" and int(remote.split(":")[1], 16) == HTTP_PORT:
            ports[int(local.split(":")[1], 16)] = uid
    sidecar = [p for p, uid in ports.items() if uid == SIDECAR_UID]
    if pod.caller == "sidecar":
        return sidecar[0] if sidecar else None
    return client_port if client_port in ports else None


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _pods_next(pod: LabPod, port: int, deadline: float) -> tuple[int, int] | None:
    """(the pod's next sequence number, the pod's ACK) from its next segment to ``port``, read on eth0."""
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP)) as sniff:
        sniff.bind(("eth0", 0))
        while (left := deadline - time.monotonic()) > 0:
            sniff.settimeout(left)
            try:
                frame = sniff.recv(65535)
            except socket.timeout:
                return None
            ip = frame[14:]
            ihl = (ip[0] & 0x0F) * 4
            if ip[9] != socket.IPPROTO_TCP or socket.inet_ntoa(ip[12:16]) != pod.pod_ip:
                continue
            tcp = ip[ihl:]
            sport, dport, seq, ack = struct.unpack("!HHII", tcp[:12])
            if sport == HTTP_PORT and dport == port:
                payload = struct.unpack("!H", ip[2:4])[0] - ihl - (tcp[12] >> 4) * 4
                return (seq + payload) % 2**32, ack
    return None


def _inject(pod: LabPod, port: int, seq: int, ack: int) -> None:
    """One ACK segment from (client ip, ``port``) to the pod's HTTP port, written whole (IP header included)."""
    src, dst = socket.inet_aton(pod.client_ip), socket.inet_aton(pod.pod_ip)
    tcp = struct.pack("!HHIIBBHHH", port, HTTP_PORT, seq, ack, 5 << 4, 0x10, 502, 0, 0)
    pseudo = src + dst + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, socket.IPPROTO_TCP, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as raw:
        raw.sendto(ip + tcp, (pod.pod_ip, 0))


def conntrack_invalid_round(pod: LabPod, tally: Tally) -> None:
    result: list = []
    upload = threading.Thread(target=_upload, args=(pod, result), daemon=True)
    upload.start()
    deadline = time.monotonic() + IO_TIMEOUT
    port = None
    while port is None and time.monotonic() < deadline and upload.is_alive():
        client_port = result[0] if result and isinstance(result[0], int) else None
        port = _connection_port(pod, client_port)
        if port is None:
            time.sleep(0.01)  # polls /proc/net/tcp for the connection, bounded by the deadline
    pods = _pods_next(pod, port, deadline) if port is not None else None
    if pods is None:
        tally.errors.append("no live connection to the pod to write the out-of-window segment into")
    else:
        next_seq, pods_ack = pods
        tally.client_port = port
        _inject(pod, port, (pods_ack + OUT_OF_WINDOW) % 2**32, next_seq)
    upload.join(IO_TIMEOUT + UPLOAD_BYTES // UPLOAD_CHUNK * UPLOAD_PAUSE_S)
    status, first = next((r for r in result if isinstance(r, tuple)), (0, "the upload did not end"))
    tally.http.append(("POST /upload (one out-of-window segment)", status, first))
    if status == 200:
        tally.http_ok += 1
