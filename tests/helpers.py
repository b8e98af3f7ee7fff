"""Hand-built PacketEvent sequences for detector unit tests (real captures are used by the lab tests)."""

from __future__ import annotations

from kubectl_meshdoctor.core.events import PacketEvent, TcpFlags

S, A, F, R, P = TcpFlags.SYN, TcpFlags.ACK, TcpFlags.FIN, TcpFlags.RST, TcpFlags.PSH


class Wire:
    """Builds numbered packets on one interface; ``t`` is advanced by each packet's ``dt`` (seconds)."""

    def __init__(self, iface: str = "eth0", source: str = "test.pcap", t0: float = 1_764_439_363.0) -> None:
        self.iface, self.source, self.t, self.frame = iface, source, t0, 0
        self.events: list[PacketEvent] = []

    def pkt(self, src: str, dst: str, flags, seq: int = 0, ack: int = 0, dt: float = 0.001,
            payload_len: int = 0, http: bytes | None = None, tls: bytes | None = None) -> PacketEvent:
        """One packet; ``http`` is the start of an HTTP/1 message it carries, ``tls`` its bytes starting with a
        TLS record (each parsed as the reader parses it)."""
        (sip, sport), (dip, dport) = _ep(src), _ep(dst)
        self.t += dt
        self.frame += 1
        start = None
        if http is not None:
            from kubectl_meshdoctor.sources.http1 import parse_http_start

            start = parse_http_start(http)
            payload_len = payload_len or len(http)
        record = None
        if tls is not None:
            from kubectl_meshdoctor.sources.tls_records import parse_tls_start

            record = parse_tls_start(tls)
            payload_len = payload_len or len(tls)
        ev = PacketEvent(self.t, self.iface, self.source, self.frame, sip, sport, dip, dport, TcpFlags(flags),
                         seq, ack, payload_len, start, record)
        self.events.append(ev)
        return ev

    def handshake(self, client: str, server: str, cseq: int = 1000, sseq: int = 5000) -> None:
        self.pkt(client, server, S, cseq)
        self.pkt(server, client, S | A, sseq, cseq + 1)
        self.pkt(client, server, A, cseq + 1, sseq + 1)


def _ep(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def run(events, only=None):
    from kubectl_meshdoctor.core.pipeline import Pipeline

    p = Pipeline.with_detectors(only=only)
    for ev in events:
        p.feed(ev)
    return p.finish()


def prefiltered(*paths) -> int:
    """How many packets of these captures tshark itself keeps with the reader's display filter (what the
    detectors read and the counts report)."""
    import subprocess

    from kubectl_meshdoctor.sources.tshark import FILE_PREFILTER

    return sum(len(subprocess.run(["tshark", "-r", str(p), "-n", "-Y", FILE_PREFILTER, "-T", "fields", "-e",
                                   "frame.number"], capture_output=True, text=True, check=True).stdout.split())
               for p in paths)


def analyze_json(*args) -> tuple[int, dict]:
    """`kubectl meshdoctor analyze ARGS -o json` in a process of its own: (exit code, report). The run must end
    with a report (0, 1, or 2 for nothing read), never a traceback."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *map(str, args), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1, 2) and proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)
