"""The packets pane's filters: a typed one (ip, port, flag, interface, frame) and one per finding.

Plain functions over PacketEvents, so the TUI only renders what they select."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.findings import PACKET, Finding

_FLAG_CHARS = frozenset("SFRP.")
HELP = "terms, all must match: an ip, a port, flags (S F R P . e.g. R or S.), lo/eth0, frame:N; key:value works too"


class FilterError(ValueError):
    """A term the filter does not understand; the message is one line for the screen."""


@dataclass(frozen=True, slots=True)
class PacketFilter:
    """Terms AND-ed together; an empty filter matches every packet."""

    hosts: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    flags: tuple[str, ...] = ()
    ifaces: tuple[str, ...] = ()
    frames: tuple[int, ...] = ()
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> "PacketFilter":
        """``198.18.1.1 5002 R eth0`` or ``host:198.18.1.1 port:5002 flag:R iface:eth0 frame:20``.
        Raises FilterError naming the first term it does not understand."""
        hosts, ports, flags, ifaces, frames = [], [], [], [], []
        for term in text.split():
            key, sep, value = term.partition(":")
            if sep and key in ("host", "ip", "port", "flag", "flags", "iface", "if", "frame"):
                kind = {"ip": "host", "flags": "flag", "if": "iface"}.get(key, key)
            else:
                kind, value = _kind_of(term), term
            try:
                if kind == "host":
                    hosts.append(str(ipaddress.ip_address(value.strip("[]"))))
                elif kind == "port":
                    ports.append(_number(value, 65535))
                elif kind == "frame":
                    frames.append(_number(value, 2**63))
                elif kind == "flag":
                    if not value or not set(value.upper()) <= _FLAG_CHARS:
                        raise ValueError
                    flags.append(value.upper())
                elif kind == "iface":
                    ifaces.append(value)
                else:
                    raise ValueError
            except ValueError:
                raise FilterError(f"not understood: {term!r} ({HELP})") from None
        return cls(tuple(hosts), tuple(ports), tuple(flags), tuple(ifaces), tuple(frames), text.strip())

    def matches(self, ev: PacketEvent) -> bool:
        if any(h not in (ev.src, ev.dst) for h in self.hosts):
            return False
        if any(p not in (ev.sport, ev.dport) for p in self.ports):
            return False
        if self.ifaces and ev.iface not in self.ifaces:
            return False
        if self.frames and ev.frame not in self.frames:
            return False
        short = ev.flags.short()
        return all(all(c in short for c in f) for f in self.flags)


def _number(value: str, limit: int) -> int:
    n = int(value)
    if not 0 <= n <= limit:
        raise ValueError
    return n


def _kind_of(term: str) -> str:
    if term.isdigit():
        return "port"
    if set(term) <= _FLAG_CHARS | set("sfrp"):
        return "flag"
    try:
        ipaddress.ip_address(term.strip("[]"))
        return "host"
    except ValueError:
        pass
    if term == "lo" or term.startswith(("eth", "net", "en", "veth")) or term == "any":
        return "iface"
    return "?"


def of_finding(f: Finding, ev: PacketEvent) -> bool:
    """Whether ``ev`` belongs to finding ``f``: one of its evidence frames, or a packet of its client endpoint on
    its interface (a collision's two connections, a keep-alive's pooled connection)."""
    for e in f.evidence:
        if e.frame == ev.frame and e.source == ev.source:
            return True
    conn = f.connection  # a finding of no connection (a spec's, the counters') has only its evidence frames
    return conn is not None and ev.iface == conn.iface and conn.client in (ev.src_endpoint, ev.dst_endpoint)


def of_selected(f: Finding) -> tuple[str, Callable[[PacketEvent], bool]]:
    """The packets pane's title and filter for the selected finding ``f``: its packets (``of_finding``: its
    client on its interface, else what it is about); for a finding of no connection and no packet evidence (a
    pod's spec, Envoy's counters) the latest packets, said so, rather than an empty pane titled by a placeholder
    flow (issue 32)."""
    conn = f.connection
    if conn is None and not any(e.kind == PACKET for e in f.evidence):
        return f"selected: {f.flow.text(labelled=False)}, no packets of its own; latest packets analysed", \
            (lambda ev: True)
    where = f"{conn.client} on {conn.iface}" if conn is not None and conn.iface else f.flow.text(labelled=False)
    return f"packets of the selected finding ({where})", (lambda ev: of_finding(f, ev))
