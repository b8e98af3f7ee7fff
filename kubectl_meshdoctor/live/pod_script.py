"""What runs in the pod's debug container for a live capture: tcpdump (or tcpdump piped into tshark, with
``--dissect pod``) under a dead-man's switch, and the BPF filter it captures with.

The filter is the first stage of the budget: pyshark sees only what passes it, so it keeps just the packets a
detector reads (bench/RESULTS.md has what it saves on a busy pod).
"""

from __future__ import annotations

from kubectl_meshdoctor.sources.http1 import START_PREFIXES
from kubectl_meshdoctor.sources.tls_records import RECORD_PREFIXES

# The capture runs under a dead-man's switch: a watchdog reads the exec stdin (saved on fd 3, because sh gives
# background jobs /dev/null as stdin) and SIGINTs tcpdump when stdin closes, which happens when we half-close it
# on exit or when our websocket dies with us. `exec` keeps the shell's pid, so $$ is tcpdump's. SIGINT lets
# tcpdump flush its last packets and print its drop counts. `timeout` bounds it even if stdin never closes.
CAPTURE_SCRIPT = (
    'exec 3<&0; '
    '( cat <&3 >/dev/null 2>&1; kill -INT $$ 2>/dev/null ) >/dev/null 2>&1 & '
    'exec timeout -s INT "$1" tcpdump -i "$2" -p -n -s 262144 -B 32768 --immediate-mode -U -w - "$3"'
)
# --dissect pod: tcpdump's pcap goes through a pipe into tshark (its arguments: those after the first three) and
# only tshark's lines come out. A pipe, not a fifo: tshark reads to the end and exits when tcpdump has ended,
# even one that failed at once. The watchdog SIGINTs tcpdump's `timeout` (which passes it on) by the pid the
# pipeline's first part wrote down, and that part writes down tcpdump's exit status too: the script exits with
# it, or with tshark's, said on stderr in a "tshark:" line that ExecCapture reports.
DISSECT_SCRIPT = (
    'exec 3<&0; '
    'command -v tshark >/dev/null 2>&1 || { echo "tshark: not found in the debug container; --dissect pod needs an '
    'image with tshark (netshoot has it)" >&2; exit 127; }; '
    'max=$1 iface=$2 bpf=$3; shift 3; '
    'd=$(mktemp -d) || { echo "tshark: cannot make a directory in the debug container" >&2; exit 1; }; '
    '{ timeout -s INT "$max" tcpdump -i "$iface" -p -n -s 262144 -B 32768 --immediate-mode -U -w - "$bpf" '
    '</dev/null & echo $! >"$d/pid"; wait $!; echo $? >"$d/rc"; } 3<&- | tshark "$@" -r - 3<&- & t=$!; '
    '( cat <&3 >/dev/null 2>&1; while [ -d "$d" ] && [ ! -s "$d/pid" ]; do sleep 0.1; done; '
    'kill -INT "$(cat "$d/pid" 2>/dev/null)" 2>/dev/null ) >/dev/null 2>&1 & '
    'wait $t; trc=$?; rc=$(cat "$d/rc" 2>/dev/null) || rc=1; rm -rf "$d"; '
    'if [ "$trc" -ne 0 ]; then echo "tshark: exited $trc in the debug container" >&2; '
    '[ "$rc" -eq 0 ] && rc=$trc; fi; exit $rc'
)
# -B 32768 (KiB): with --immediate-mode libpcap gives each ring slot the snaplen (capped near 64 KiB), so the
# default 2 MiB ring held ~32 packets and dropped bursts even at 5k packets/s (lo sees every packet twice).


def capture_command(iface: str, max_seconds: int, bpf: str, tshark_args: list[str] | None = None) -> list[str]:
    """argv for the exec: tcpdump on ``iface`` for at most ``max_seconds``, pcap on stdout; with ``tshark_args``
    (all but ``-r``), the output of a tshark in the pod that reads tcpdump's pcap, instead."""
    if tshark_args:
        return ["sh", "-c", DISSECT_SCRIPT, "meshdoctor-capture", str(int(max_seconds)), iface, bpf, *tshark_args]
    return ["sh", "-c", CAPTURE_SCRIPT, "meshdoctor-capture", str(int(max_seconds)), iface, bpf]


FULL_FILTER = "tcp"


def lean_filter(iface: str | None = None) -> str:
    """The BPF a live watch captures with on ``iface`` (None: what either interface needs).

    Only what a detector reads crosses the exec stream: SYN, FIN and RST everywhere; the segments that start an
    HTTP/1 message everywhere (framing and stale keep-alive on ``lo``; on eth0 a caller reusing a connection
    this pod's sidecar closed, and requests the sidecar refuses); the TLS records an mTLS hop shows without
    keys, as the offline prefilter keeps them (sources/tls_records.py: hellos, alerts, TLS 1.3's encrypted
    alert); on the pod's other interfaces pure ACKs too (a
    challenge ACK is one: four-tuple collisions are seen on eth0); on lo the pure ACKs between two addresses
    outside 127.0.0.0/8 only. Those are the replies of the app's outbound connections, whose source conntrack
    restores to the original destination after nat OUTPUT's REDIRECT to 127.0.0.1:15001: a caller sidecar's
    FIN-WAIT-2 socket answering the app's new SYN from the same port with the old connection's ACK is one
    (tuple-collision's outbound variant). The inbound hop's pure ACKs (127.0.0.6 to the app) and the app's own
    towards 127.0.0.1:15001 stay in the pod. Full-size data segments and the ACKs of transfers on lo, most of a
    busy pod's packets and nearly all its bytes, stay in the pod. IPv6 is kept whole: BPF cannot index TCP
    behind an IPv6 header. bench/RESULTS.md has what it saves."""
    payload = "tcp[((tcp[12]&0xf0)>>2):4]"
    offset = "((tcp[12]&0xf0)>>2)"
    # A BPF load reads 1, 2 or 4 bytes: a longer prefix is a 4-byte load and the bytes after it, last, because
    # a load past the packet's end rejects it (a shorter payload is no such record anyway).
    records = [" and ".join(f"tcp[{offset}+{at}:{len(part)}] = 0x{part.hex()}"
                            for at, part in ((0, p[:4]), (4, p[4:])) if part) for p in RECORD_PREFIXES]
    starts = " or ".join([f"{payload} = 0x{p.hex()}" for p in START_PREFIXES] + [f"({r})" for r in records])
    pure_ack = "ip[2:2] - ((ip[0]&0xf)<<2) - ((tcp[12]&0xf0)>>2) == 0"
    replies = f"({pure_ack} and not src net 127.0.0.0/8 and not dst net 127.0.0.0/8)"
    wanted = [replies, starts] if iface == "lo" else [pure_ack, starts]
    return (f"(ip and tcp and (tcp[tcpflags] & (tcp-syn|tcp-fin|tcp-rst) != 0 or {' or '.join(wanted)}))"
            " or (ip6 and tcp)")


LEAN_FILTER = lean_filter()


def without_admin(bpf: str, port: int) -> str:
    """``bpf`` on ``lo`` less the sidecar's admin API (127.0.0.1:``port``): watch's own /stats, /clusters and
    /logging requests come in through the port-forward there and are not the pod's traffic."""
    return f"({bpf}) and not (host 127.0.0.1 and tcp port {int(port)})"
