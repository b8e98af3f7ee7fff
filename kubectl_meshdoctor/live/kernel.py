"""The kernel's view of the pod's network namespace, read by exec in the debug container: its counters
(challenge ACKs, SYN retransmissions, listen drops, conntrack failures: deltas over a run) and the sockets
that listen (which address an app is bound to).

Formats: /proc/net/netstat and /proc/net/snmp (header line then value line per group, as nstat reads them:
``TcpExt: A B C`` / ``TcpExt: 1 2 3``); /proc/net/stat/nf_conntrack (a header, then one line of hex per CPU);
/proc/net/tcp and tcp6 (Linux Documentation/networking/proc_net_tcp.rst: ``local_address`` as hex
``ADDR:PORT``, the address in the kernel's byte order, state ``0A`` for LISTEN).
"""

from __future__ import annotations

import ipaddress

from kubectl_meshdoctor.envoy.numbers import ascii_int
from kubectl_meshdoctor.kube.exec import exec_output

WATCHED = ("TcpExtTCPChallengeACK", "TcpExtTCPSynRetrans", "TcpExtListenDrops", "TcpExtListenOverflows",
           "TcpExtTCPAbortOnData", "TcpExtTCPAbortOnClose", "TcpAttemptFails", "TcpEstabResets", "TcpOutRsts",
           "ConntrackInsertFailed", "ConntrackDrop")
READ_COMMAND = ["sh", "-c", "cat /proc/net/netstat /proc/net/snmp; echo '#conntrack'; "
                            "cat /proc/net/stat/nf_conntrack 2>/dev/null || true; echo '#tcp'; "
                            "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null || true"]
TCP_LISTEN = "0A"


def parse_counters(text: str) -> dict[str, int]:
    """Counters named as nstat names them (``TcpExtTCPChallengeACK``), conntrack ones summed over CPUs as
    ``ConntrackInsertFailed``/``ConntrackDrop``/``ConntrackInvalid`` (``conntrack -S``'s insert_failed, drop,
    invalid). Unknown or malformed lines are skipped."""
    out: dict[str, int] = {}
    proc, _, conntrack = text.partition("#tcp")[0].partition("#conntrack")
    lines = proc.splitlines()
    for header, values in zip(lines, lines[1:]):
        hp, _, hnames = header.partition(":")
        vp, _, vvalues = values.partition(":")
        if hp != vp or not hnames or ascii_int(hnames.split()[0], signed=True) is not None:
            continue
        for name, value in zip(hnames.split(), vvalues.split()):
            number = ascii_int(value, signed=True)  # /proc/net/snmp prints TcpMaxConn as -1
            if number is not None:
                out[f"{hp}{name}"] = number
    rows = [ln.split() for ln in conntrack.strip().splitlines()]
    if rows and rows[0] and rows[0][0] == "entries":
        head = rows[0]
        for key, name in (("insert_failed", "ConntrackInsertFailed"), ("drop", "ConntrackDrop"),
                          ("invalid", "ConntrackInvalid")):
            if key in head:
                i = head.index(key)
                out[name] = sum(n for r in rows[1:] if len(r) > i and (n := _hex32(r[i])) is not None)
    return out


def _hex32(text: str) -> int | None:
    # The kernel prints these as %08x; anything else (a cut line, a per-CPU row we do not know) is skipped.
    if len(text) > 16 or not all(c in "0123456789abcdefABCDEF" for c in text) or not text:
        return None
    return int(text, 16)


def counter_deltas(before: dict[str, int], after: dict[str, int], names=WATCHED) -> dict[str, int]:
    """The watched counters that moved: name -> after - before."""
    return {n: after[n] - before.get(n, 0) for n in names if n in after and after[n] != before.get(n, 0)}


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # IPv6: four 32-bit words, each in the kernel's (little-endian) byte order.
    return str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))


def parse_listeners(text: str) -> frozenset[tuple[str, int]]:
    """The (address, port) of every listening TCP socket in the ``#tcp`` part of READ_COMMAND's output
    (``0.0.0.0`` and ``::`` are every address). Malformed lines are skipped."""
    found = set()
    for line in text.partition("#tcp")[2].splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[3] != TCP_LISTEN or ":" not in fields[1]:
            continue
        addr, _, port = fields[1].partition(":")
        number = _hex32(port)
        if number is None or number > 0xFFFF or len(addr) not in (8, 32):
            continue  # not a TCP port or an IPv4/IPv6 address: a cut or foreign line
        try:
            found.add((_address(addr), number))
        except ValueError:
            continue
    return frozenset(found)


def read_kernel(kube, namespace: str, pod: str, container: str) -> tuple[dict[str, int], frozenset[tuple[str, int]]]:
    """The counters and the listening sockets as seen from ``container`` (the debug container shares the pod's
    network namespace). Raises KubeError when the exec is refused."""
    out = exec_output(kube, namespace, pod, container, READ_COMMAND, "reading kernel counters")
    return parse_counters(out), parse_listeners(out)
