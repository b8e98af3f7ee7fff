"""The fast path's PacketEvents (sources/fastpath.py), held compactly until the reader merges them with tshark's.

The fast path decides, while the pre-pass walks a file, the events of the records it reads; a 1M-packet capture
yields hundreds of thousands of them before any tshark line is read, so they are kept in typed arrays (about 46
bytes an event, against ~250 for a PacketEvent; an HTTP/1 or TLS start is held as its parsed object) and become
PacketEvents only as the reader hands them on, in frame order.

Each field is what tshark 4.0 prints for it and sources/tshark.py's packet_from_fields makes of it:
``frame.time_epoch`` is the record's time to the nanosecond (``secs.nnnnnnnnn``), read back with ``float``;
``ip.src``/``ipv6.src`` are the address as glibc's ``inet_ntop`` writes it (tshark 4.0's ws_inet_ntop4/6 call
it: RFC 5952's compression, an IPv4-mapped or -compatible address with its dotted quad), which Python's
``socket.inet_ntop`` calls too; the interface is ``iface_of`` of the pcapng interface name and the Linux cooked
header's hardware type and interface index, printed as tshark prints them (decimal).
"""

from __future__ import annotations

import socket
import sys
from array import array
from collections.abc import Iterator

from kubectl_meshdoctor.core.events import HttpStart, PacketEvent, TlsStart

from .tshark import FLAGS, iface_of


class FastEvents:
    """Events in frame order: ``add`` appends one, ``events`` gives them back as PacketEvents."""

    def __init__(self) -> None:
        self.frames = array("I")
        self.ts = array("d")
        self.seq = array("I")
        self.ack = array("I")
        self.ports = array("I")  # sport << 16 | dport
        self.flags = array("B")
        self.pair = array("I")  # index into _pairs: (src, dst) as tshark prints them
        # index into _wheres: (interface name, sll.hatype, sll.ifindex) as printed; not a short, a file can name
        # more than 65,536 (SLL2's interface index is 32 bits)
        self.where = array("I")
        self.payload = array("I")  # tcp.len
        self.starts: dict[int, tuple[HttpStart | None, TlsStart | None]] = {}  # event index -> its starts
        self._pairs: list[tuple[str, str]] = []
        self._pair_index: dict[bytes, int] = {}
        self._wheres: list[tuple[str, str, str]] = []
        self._where_index: dict[tuple[str, str, str], int] = {}

    def __len__(self) -> int:
        return len(self.frames)

    def add(self, frame: int, ts: float, src: bytes, dst: bytes, sport: int, dport: int, flags: int, seq: int,
            ack: int, where: tuple[str, str, str], payload: int = 0, http: HttpStart | None = None,
            tls: TlsStart | None = None) -> None:
        """One event: ``src``/``dst`` the addresses' bytes (4 or 16), ``flags`` the TCP header's low six bits,
        ``where`` (interface name, hatype, ifindex) as tshark prints them ("" where it prints nothing),
        ``payload`` its tcp.len, ``http``/``tls`` the start its payload holds."""
        key = src + dst
        p = self._pair_index.get(key)
        if p is None:
            p = self._pair_index[key] = len(self._pairs)
            self._pairs.append((address_text(src), address_text(dst)))
        w = self._where_index.get(where)
        if w is None:
            w = self._where_index[where] = len(self._wheres)
            self._wheres.append(where)
        if http is not None or tls is not None:
            self.starts[len(self.frames)] = (http, tls)
        self.frames.append(frame)
        self.payload.append(payload)
        self.ts.append(ts)
        self.seq.append(seq)
        self.ack.append(ack)
        self.ports.append(sport << 16 | dport)
        self.flags.append(flags)
        self.pair.append(p)
        self.where.append(w)

    def events(self, source: str, default_iface: str, force_iface: bool) -> Iterator[PacketEvent]:
        """The events in the order added, as packet_from_fields makes them for ``source`` (its interface
        ``default_iface``, on every event with ``force_iface``)."""
        ifaces = [default_iface if force_iface else iface_of(name, hatype, ifindex, default_iface)
                  for name, hatype, ifindex in self._wheres]
        pairs, starts, none = self._pairs, self.starts, (None, None)
        for i in range(len(self.frames)):
            src, dst = pairs[self.pair[i]]
            ports = self.ports[i]
            http, tls = starts.get(i, none)
            yield PacketEvent(self.ts[i], ifaces[self.where[i]], source, self.frames[i], src, ports >> 16, dst,
                              ports & 0xFFFF, FLAGS[self.flags[i]], self.seq[i], self.ack[i], self.payload[i],
                              http, tls)


def address_text(raw: bytes) -> str:
    """An address's bytes as tshark prints them (module docstring), interned as packet_from_fields does."""
    return sys.intern(socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw))


def epoch(secs: int, nsecs: int) -> float:
    """``float`` of tshark's ``frame.time_epoch`` text for a record at ``secs`` and ``nsecs`` (0 <= nsecs < 1e9).

    ``float("S.NNNNNNNNN")`` is the double nearest the decimal's exact value, and so is an int divided by an int
    (CPython rounds true division of integers correctly), so one integer division gives the same float as
    formatting the text and parsing it back, five to ten times sooner (tests/sources/test_fast_events.py)."""
    return (secs * 1_000_000_000 + nsecs) / 1_000_000_000
