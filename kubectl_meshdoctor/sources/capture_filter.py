"""The BPF filters a live capture runs with in the pod (tcpdump's, in the kernel): what crosses the exec stream.

The filter is the first stage of the budget: pyshark sees only what passes it, so it keeps just the packets a
detector reads (bench/RESULTS.md has what it saves on a busy pod).
"""

from __future__ import annotations

from kubectl_meshdoctor.sources.http1 import START_PREFIXES

FULL_FILTER = "tcp"


def lean_filter(iface: str | None = None) -> str:
    """The BPF a live watch captures with on ``iface`` (None: what either interface needs).

    Only what a detector reads crosses the exec stream: SYN, FIN and RST everywhere; the segments that start an
    HTTP/1 message everywhere (framing and stale keep-alive on ``lo``; on eth0 a caller reusing a connection
    this pod's sidecar closed, and requests the sidecar refuses); on the pod's other interfaces pure ACKs too (a
    challenge ACK is one: four-tuple collisions are seen on eth0). Full-size data segments and the ACKs of
    transfers on lo, most of a busy pod's packets and nearly all its bytes, stay in the pod. IPv6 is kept
    whole: BPF cannot index TCP behind an IPv6 header. bench/RESULTS.md has what it saves."""
    payload = "tcp[((tcp[12]&0xf0)>>2):4]"
    starts = " or ".join(f"{payload} = 0x{p.hex()}" for p in START_PREFIXES)
    pure_ack = "ip[2:2] - ((ip[0]&0xf)<<2) - ((tcp[12]&0xf0)>>2) == 0"
    wanted = [starts] if iface == "lo" else [pure_ack, starts]
    return (f"(ip and tcp and (tcp[tcpflags] & (tcp-syn|tcp-fin|tcp-rst) != 0 or {' or '.join(wanted)}))"
            " or (ip6 and tcp)")


LEAN_FILTER = lean_filter()


def without_admin(bpf: str, port: int) -> str:
    """``bpf`` on ``lo`` less the sidecar's admin API (127.0.0.1:``port``): watch's own /stats, /clusters and
    /logging requests come in through the port-forward there and are not the pod's traffic."""
    return f"({bpf}) and not (host 127.0.0.1 and tcp port {int(port)})"
