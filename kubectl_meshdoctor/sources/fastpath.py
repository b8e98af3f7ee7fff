"""The pre-pass's fast path: the events of kept records, decided here as tshark would.

With the pre-pass (sources/prepass.py) alone, every kept record goes to tshark, chunk by chunk, and tshark's
display filter (FILE_PREFILTER, sources/tshark.py) picks the ones yielded. Here each chunk of kept records (the
same chunks the pass writes, ``per_chunk`` records each) is read once more, in order, and:

- a record without TCP payload is decided by its conversation: kept when it has SYN, FIN or RST, or when its
  conversation's ``tcp.completeness`` passes one of FILE_PREFILTER's three pure-ACK tests;
- a record with TCP payload is decided by itself alone (payload_event): whether FILE_PREFILTER keeps it and what
  its event is depend on its flags, its payload's first captured bytes and tcp.len, never on the conversation
  before it; its HTTP/1 or TLS start is parsed as sources/tshark.py parses tshark's tcp.payload;
- either way its PacketEvent is made here (sources/fast_events.py), so a chunk of plain Ethernet/IP/TCP needs no
  tshark at all, whose ~160 MB of RSS before its first frame was most of issue 34's 250 MB;
- a record that is no TCP and can hold none (ARP, DNS over UDP, an ICMP echo, ICMPv6's informational messages)
  yields nothing and changes nothing in tshark's TCP state: it is dropped;
- anything else (IP fragments, tunnels, an ICMP error quoting a TCP header, IPv6 extension headers, a TCP header
  cut or shorter than 20 bytes, TCP options other than Linux's or of a bad length (_plain_options), a time stamp
  not read here, Simple or obsolete Packet Blocks): the whole chunk goes to tshark as without the fast path, in a
  chunk file of its own, so tshark sees exactly what it saw before.

tcp.completeness as tshark 4.0 computes it (epan/dissectors/packet-tcp.c, dissect_tcp), with the options
analyze runs it with (tcp.analyze_sequence_numbers off), checked against tshark 4.0.17 itself
(tests/sources/test_fastpath.py): one tshark reads one chunk; a conversation is one address/port pair in either
direction, until a SYN without ACK whose seq differs from its flow's base sequence number (the flow's first seq,
or seq - 1 when that segment was no SYN, or the other flow's first ACK - 1; a SYN-ACK of another seq moves it)
starts a new one at completeness 1 (port reuse, even with no FIN or RST before it). Each frame shows the value
from before its own update. A new conversation starts at 0, and its first frame adds SYN (1) only when it is a
SYN without ACK (and data, 8, when such a SYN carries payload); every later frame adds SYN-ACK (2) for SYN+ACK,
ACK (4) or DATA (8) for ACK without SYN (by tcp.len), FIN (16) for FIN with ACK, RST (32) for RST.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kubectl_meshdoctor.pcap_header import PcapHeader, pcap_header, pcapng_order

from kubectl_meshdoctor.core.events import HttpStart, TlsStart

from .fast_events import FastEvents, epoch
from .http1 import START_PREFIXES, parse_http_start
from .tls_records import RECORD_PREFIXES, TLS_BYTES_READ, parse_tls_start
from .prepass import (BSD_INET6, ETHERNET, LOOP, NULL, RAW, RAW4, RAW6, SLL, SLL2, SLL_HATYPES, ChunkFiles,
                      PrepassResult, prepass)

# Whether the fast path runs; MESHDOCTOR_FASTPATH=0 turns it off, =1 on (tests and bench/run compare the two).
FASTPATH = True


def fastpath_wanted() -> bool:
    env = os.environ.get("MESHDOCTOR_FASTPATH")
    return env == "1" if env in ("0", "1") else FASTPATH


IRRELEVANT, DIRTY = 0, 1  # what _segment says of a record that is no TCP segment read here
_NO_TCP_ETHERTYPES = frozenset((0x0806, 0x8035, 0x88CC))  # ARP, RARP, LLDP: never an IP datagram
_DNS = 53
_STARTS = frozenset(START_PREFIXES)


@dataclass
class FastPrepass:
    """The pre-pass's result (its chunks: the records left for tshark) and the events decided here."""

    result: PrepassResult
    events: FastEvents


def _link(buf: bytes, o: int, caplen: int, link: int) -> tuple[int, int, str, str] | int:
    """(EtherType, offset of the IP header, sll.hatype, sll.ifindex as tshark prints them) of the frame at
    ``buf[o:]``, or IRRELEVANT/DIRTY. Walks what prepass.classify walks, no more."""
    hatype = ifindex = ""
    if link == ETHERNET:
        if caplen < 14:
            return DIRTY
        etype, ip = (buf[o + 12] << 8) | buf[o + 13], o + 14
        if etype in (0x8100, 0x88A8):
            if caplen < 18:
                return DIRTY
            etype, ip = (buf[o + 16] << 8) | buf[o + 17], o + 18
    elif link == SLL:
        if caplen < 16:
            return DIRTY
        ha = (buf[o + 2] << 8) | buf[o + 3]
        etype, ip, hatype = (buf[o + 14] << 8) | buf[o + 15], o + 16, str(ha)
        if ha not in SLL_HATYPES:
            return DIRTY
    elif link == SLL2:
        if caplen < 20:
            return DIRTY
        ha = (buf[o + 8] << 8) | buf[o + 9]
        etype, ip, hatype = (buf[o] << 8) | buf[o + 1], o + 20, str(ha)
        ifindex = str(int.from_bytes(buf[o + 4:o + 8], "big"))
        if ha not in SLL_HATYPES:
            return DIRTY
    elif link in (RAW, RAW4, RAW6):
        if caplen < 1:
            return DIRTY
        version = buf[o] >> 4
        etype, ip = (0x0800 if version == 4 else 0x86DD if version == 6 else 0), o
        # tshark's IPv4 dissector hands a version-6 header to IPv6, its IPv6 dissector takes no version 4
        if not etype or (link == RAW6 and version == 4):
            return DIRTY
    elif link in (NULL, LOOP):
        # DLT_NULL's family is in the capturing host's byte order; DLT_LOOP's big-endian always (tshark's
        # dissect_loop reads it with tvb_get_ntohl): a little-endian one is no IP to tshark, its chunk is its
        if caplen < 4 or buf[o + 1] or buf[o + 2] or (buf[o] and (buf[o + 3] or link == LOOP)):
            return DIRTY
        family = buf[o + 3] if buf[o] == 0 else buf[o]
        etype, ip = (0x0800 if family == 2 else 0x86DD if family in BSD_INET6 else 0), o + 4
        if not etype:
            return DIRTY
    else:
        return DIRTY
    if etype not in (0x0800, 0x86DD):
        return IRRELEVANT if etype in _NO_TCP_ETHERTYPES else DIRTY
    return etype, ip, hatype, ifindex


def _segment(buf: bytes, o: int, caplen: int, wirelen: int, link: int) -> tuple | int:
    """The TCP segment of the frame at ``buf[o:]``: (src, dst, sport, dport, flags, seq, ack, payload length,
    hatype, ifindex, payload start, captured payload end), addresses as bytes, the payload's captured bytes
    ``buf[start:end]`` (a link trailer is not payload); or IRRELEVANT (it holds no TCP) or DIRTY (not read
    here)."""
    if caplen > wirelen:
        return DIRTY
    if link == ETHERNET and caplen >= 54 and buf[o + 12] == 8 and buf[o + 13] == 0 and buf[o + 14] == 0x45:
        # Most records: Ethernet, IPv4 without options, a whole TCP header captured. The checks below in one
        # struct read and the same order (a third of the time of reading the fields one by one).
        _, total, fragment, proto, src, dst, sport, dport, seq, ack, offset, flags = _ETHERNET_IPV4(buf, o + 14)
        if total < 20 or total > wirelen - 14 or fragment & 0x3FFF:
            return DIRTY
        l4, end = o + 34, o + caplen
        if proto != 6:
            return _no_tcp(buf, l4, end, proto, 1)
        doff = (offset >> 4) * 4
        if doff < 20 or end - l4 < doff or total - 20 < doff:
            return DIRTY
        if doff > 20 and not _plain_options(buf, l4 + 20, l4 + doff):
            return DIRTY
        start, payload = l4 + doff, total - 20 - doff
        return src, dst, sport, dport, flags & 0x3F, seq, ack, payload, "", "", start, min(end, start + payload)
    if link == ETHERNET and caplen >= 14 and buf[o + 12:o + 14] == b"\x08\x00":  # _link's IPv4
        etype, ip, hatype, ifindex = 0x0800, o + 14, "", ""
    else:
        found = _link(buf, o, caplen, link)
        if isinstance(found, int):
            return found
        etype, ip, hatype, ifindex = found
    end = o + caplen
    wire_ip = wirelen - (ip - o)
    if etype == 0x0800:
        if end - ip < 20 or buf[ip] >> 4 != 4:
            return DIRTY
        ihl = (buf[ip] & 0x0F) * 4
        total = (buf[ip + 2] << 8) | buf[ip + 3]
        if ihl < 20 or total < ihl or total > wire_ip or end - ip < ihl:
            return DIRTY
        proto = buf[ip + 9]
        if (buf[ip + 6] & 0x3F) | buf[ip + 7]:
            return DIRTY  # a fragment: tshark reassembles
        l4, seg = ip + ihl, total - ihl
        src, dst = buf[ip + 12:ip + 16], buf[ip + 16:ip + 20]
        if proto != 6:
            return _no_tcp(buf, l4, end, proto, 1)
    else:
        if end - ip < 40 or buf[ip] >> 4 != 6:
            return DIRTY
        proto = buf[ip + 6]
        seg = (buf[ip + 4] << 8) | buf[ip + 5]
        if seg == 0 or seg > wire_ip - 40:
            return DIRTY
        l4 = ip + 40
        src, dst = buf[ip + 8:ip + 24], buf[ip + 24:ip + 40]
        if proto != 6:
            return _no_tcp(buf, l4, end, proto, 58)
    if end - l4 < 20:
        return DIRTY
    doff = (buf[l4 + 12] >> 4) * 4
    if doff < 20 or end - l4 < doff or seg < doff:
        return DIRTY  # tshark counts these undissectable, or stops in their options: its call
    if doff > 20 and not _plain_options(buf, l4 + 20, l4 + doff):
        return DIRTY
    sport, dport, seq, ack = _PORTS_SEQ_ACK(buf, l4)
    start = l4 + doff
    return (bytes(src), bytes(dst), sport, dport, buf[l4 + 13] & 0x3F, seq, ack, seg - doff, hatype, ifindex,
            start, min(end, start + seg - doff))


_PORTS_SEQ_ACK = struct.Struct("!HHII").unpack_from  # compiled once: struct.unpack_from looks its format up
# An IPv4 header of 20 bytes and a TCP header's first 14: version/IHL, total length, flags/fragment offset,
# protocol, source, destination (RFC 791 section 3.1); ports, seq, ack, data offset, flags (RFC 9293 section 3.1).
_ETHERNET_IPV4 = struct.Struct("!BxH2xHxB2x4s4sHHIIBB").unpack_from


# The TCP options read here, by kind: their one length, or their lengths (RFC 9293 section 3.2: MSS; RFC 7323:
# window scale, time stamps; RFC 2018: SACK permitted, SACK of one to four blocks). Linux sends only these.
_OPTION_LENGTHS = {2: (4,), 3: (3,), 4: (2,), 5: (10, 18, 26, 34), 8: (10,)}


_NOP_NOP_TIMESTAMPS = bytes((1, 1, 8, 10))


def _plain_options(buf: bytes, pos: int, end: int) -> bool:
    """Whether the TCP options at ``buf[pos:end]`` are all of those read here (_OPTION_LENGTHS, NOP, then an end
    of list with only zeros after it), each of its length. Any other leaves the record to tshark: tshark 4.0 stops
    dissecting a segment at an option of a bad length (no tcp.payload then: a 3-byte SACK, checked against
    tshark 4.0.17), and its analysis of Multipath TCP (kind 30, RFC 8684) ties conversations together."""
    if end - pos == 12 and buf[pos:pos + 4] == _NOP_NOP_TIMESTAMPS:  # what Linux puts on every segment but a SYN
        return True
    while pos < end:
        kind = buf[pos]
        if kind == 0:
            return not any(buf[pos:end])
        if kind == 1:
            pos += 1
            continue
        if pos + 1 >= end or buf[pos + 1] not in _OPTION_LENGTHS.get(kind, ()):
            return False
        pos += buf[pos + 1]
    return pos == end


def _no_tcp(buf: bytes, l4: int, end: int, proto: int, icmp: int) -> int:
    """IRRELEVANT for a datagram that can hold no TCP: UDP to or from port 53 (DNS), an ICMP echo (types 0, 8)
    or an ICMPv6 informational message (type 128 and up, RFC 4443 section 2.1); DIRTY for any other, which may
    quote or tunnel a TCP header."""
    if proto == 17 and end - l4 >= 4:
        sport, dport = struct.unpack_from("!HH", buf, l4)
        return IRRELEVANT if _DNS in (sport, dport) else DIRTY
    if proto == icmp and end - l4 >= 1:
        kind = buf[l4]
        return IRRELEVANT if (kind in (0, 8) if icmp == 1 else kind >= 128) else DIRTY
    return DIRTY


def shown_completeness(conversations: dict[bytes, list], src: bytes, sport: int, dst: bytes, dport: int,
                       flags: int, seq: int, ack: int, payload: int) -> int:
    """The tcp.completeness tshark 4.0 shows for a TCP frame (``flags`` its header's, ``payload`` bytes of it),
    given ``conversations`` (address/port pair -> [completeness, base seq of flow 1, of flow 2], a base None
    until set), which it then updates as tshark does (module docstring)."""
    a, b = src + sport.to_bytes(2, "big"), dst + dport.to_bytes(2, "big")
    key = a + b if a <= b else b + a
    # tshark's flow of this direction (get_tcp_conversation_data): flow 1 when the source address sorts after
    # the destination's, or the addresses are equal and the source port is the larger
    fwd, rev = (1, 2) if src > dst or (src == dst and sport > dport) else (2, 1)
    conv = conversations.get(key)
    new = conv is None
    pure_syn = flags & 0x12 == 0x02
    if new:
        conv = conversations[key] = [0, None, None]
    elif conv[fwd] is not None and seq != conv[fwd]:
        if pure_syn:  # a SYN of another connection on the same ports: tshark starts a new conversation, at 1
            conv = conversations[key] = [1, None, None]
        elif flags & 0x12 == 0x12:  # a SYN-ACK of another: its base moves
            conv[fwd] = seq
    shown = conv[0]
    if new:
        conv[0] = (9 if payload else 1) if pure_syn else 0
    else:
        n = shown
        if flags & 0x12 == 0x12:
            n |= 2
        elif flags & 0x12 == 0x10:
            n |= 8 if payload else 4
        if flags & 0x11 == 0x11:
            n |= 16
        if flags & 0x04:
            n |= 32
        conv[0] = n
    # Each flow's base sequence number, from its first segment (a SYN's seq, else seq - 1), or from the first
    # ACK the other flow sends (ack - 1): what the next SYN's seq is compared with.
    if conv[fwd] is None:
        conv[fwd] = seq if flags & 0x02 else (seq - 1) & 0xFFFFFFFF
    if conv[rev] is None and flags & 0x10:
        conv[rev] = (ack - 1) & 0xFFFFFFFF
    return shown


def prefilter_keeps_pure_ack(c: int) -> bool:
    """FILE_PREFILTER's three tests of a segment without payload or SYN/FIN/RST, on its tcp.completeness."""
    return bool((c & 1 and not c & 2) or (c & 0x30 and not c & 1) or c == 0)


def payload_event(flags: int, payload: bytes, http_start: Callable[[bytes], object] = parse_http_start
                  ) -> tuple[bool, HttpStart | None, TlsStart | None]:
    """What FILE_PREFILTER and sources/tshark.py's _packet make of a segment with TCP payload, from ``payload``,
    its captured bytes (tshark's tcp.payload): whether it is kept (SYN, FIN or RST, or a payload whose first
    captured bytes are an HTTP/1 start's or a TLS record's: ``tcp.payload[0:N] == ...`` is false when fewer
    than N bytes were captured), and its HTTP/1 start (up to its header block's end) or TLS record start (none
    for an RST, whose data tshark does not show as tcp.payload), as ``http_start`` makes it of the header block's
    bytes (sources/reader_process.py has another process parse them)."""
    tls_start = payload.startswith(RECORD_PREFIXES)
    if not (flags & 0x07 or tls_start or payload[:4] in _STARTS):
        return False, None, None
    if not payload or flags & 0x04:
        # An RST's data is tcp.reset_cause in tshark, never tcp.payload (packet-tcp.c, dissect_tcp: RFC 1122
        # section 4.2.2.12's "ASCII text that ... explained the cause of the RST"): no start is parsed from it.
        return True, None, None
    if tls_start:
        return True, None, parse_tls_start(payload[:TLS_BYTES_READ])
    end = payload.find(b"\r\n\r\n")
    return True, http_start(payload if end < 0 else payload[:end + 4]), None


def decide(conversations: dict[bytes, list], seg: tuple, data: bytes, http_start: Callable[[bytes], object] =
           parse_http_start) -> tuple[bool, HttpStart | None, TlsStart | None]:
    """Whether FILE_PREFILTER keeps the segment ``seg`` (as _segment gives it) of record ``data``, and the HTTP/1 or
    TLS start its payload holds (``http_start`` as in payload_event); ``conversations`` is updated as tshark
    updates tcp.completeness."""
    src, dst, sport, dport, flags, seq, ack, payload, _, _, start, end = seg
    shown = shown_completeness(conversations, src, sport, dst, dport, flags, seq, ack, payload)
    if payload:
        return payload_event(flags, data[start:end], http_start)
    return bool(flags & 0x07) or prefilter_keeps_pure_ack(shown), None, None


class _Iface:
    """What a pcapng Interface Description Block says that the fast path reads: link type, time units a second
    (None: a resolution not read here), its name as tshark prints it ("" for none; None: not read here)."""

    def __init__(self, block: bytes, order: str) -> None:
        u16 = struct.Struct(order + "HH").unpack_from
        self.link = u16(block, 8)[0]
        self.units: int | None = 1_000_000
        self.name: str | None = ""
        described = named = resolved = False
        pos, end = 16, len(block) - 4
        while pos + 4 <= end:
            code, length = u16(block, pos)
            value = block[pos + 4:pos + 4 + length]
            if code == 0:
                break
            # an option given twice: tshark 4.0 shows the first if_name and uses the first if_tsresol of one byte
            # (the option's only length; tshark skips one of another, checked against tshark 4.0.17)
            if code == 2 and not named:
                named = True
                text = value.split(b"\0", 1)[0]
                self.name = text.decode("ascii") if text.isascii() and text.decode("ascii").isprintable() else None
            elif code == 3:
                described = True
            elif code == 9 and not resolved and length == 1 and value:
                resolved = True
                resol = value[0]
                self.units = 10 ** resol if resol <= 9 else None  # 2^-n and finer than ns: not read here
            elif code == 14:
                self.units = None  # if_tsoffset: not read here
            pos += 4 + (length + 3) // 4 * 4
        if described and not named:
            self.name = None  # tshark may show the description: not read here


class FastSink:
    """The pre-pass's output (prepass.ChunkFiles's interface): kept records held a chunk at a time, then split
    between tshark's chunk files and the events decided here (module docstring)."""

    def __init__(self, into: str, ext: str, per_chunk: int) -> None:
        self._out = ChunkFiles(into, ext, per_chunk)
        self.preamble = self._out.preamble
        self.chunks = self._out.chunks
        self.per_chunk = per_chunk
        self.events = FastEvents()
        self.pcap: PcapHeader | None = None
        self._ifaces: list[_Iface] = []
        self._held: list[tuple[int, bytes]] = []  # (frame, record) or (0, another block)
        self._records = 0
        self._preamble_at_start = b""
        self._order: str | None = None  # pcapng: the section's byte order, from its header block
        self._record_header = struct.Struct("<IIII")  # pcap: set with the file header's byte order
        self._epb = struct.Struct("<7I")

    def record(self, data, frame: int) -> None:
        if self.pcap is None and not self._ifaces:  # a pcap file: its header is the preamble
            self.pcap = pcap_header(bytes(self.preamble))
            if self.pcap is not None:
                self._record_header = struct.Struct(self.pcap.order + "IIII")
        if not self._records:
            self._preamble_at_start = bytes(self.preamble)
        self._held.append((frame, bytes(data)))
        self._records += 1
        if self._records >= self.per_chunk:
            self._flush()

    def other(self, data) -> None:
        data = bytes(data)
        if self.pcap is None:  # pcapng: an Interface Description Block is read for the records after it
            if self._order is None:
                self._order = pcapng_order(bytes(self.preamble[:12])) or "<"
                self._epb = struct.Struct(self._order + "7I")
            if len(data) >= 20 and struct.unpack_from(self._order + "I", data)[0] == 1:
                self._ifaces.append(_Iface(data, self._order))
        if self._records:
            self._held.append((0, data))
        else:
            self._out.other(data)

    def close(self) -> None:
        self._flush()
        self._out.close()

    def _flush(self) -> None:
        held, self._held, self._records = self._held, [], 0
        if not held:
            return
        plan = self._plan(held)
        out = self._out
        if plan is None:  # the chunk as without the fast path: alone in a file, so tshark sees just it
            out.close()
            out.preamble = bytearray(self._preamble_at_start)
            for frame, data in held:
                if frame:
                    out.record(data, frame)
                else:
                    out.other(data)
            out.close()
            out.preamble = self.preamble
            return
        add = self.events.add
        for frame, item in plan:
            if frame < 0:
                add(-frame, *item)
            elif frame:
                out.record(item, frame)
            else:
                out.other(item)

    def _plan(self, held: list[tuple[int, bytes]]) -> list | None:
        """Each held item's fate in order: (frame, record) for tshark, (0, block) copied, (-frame, event
        fields) decided here; None when the chunk has a record not read here."""
        conversations: dict[bytes, list] = {}
        plan: list = []
        for frame, data in held:
            if not frame:
                plan.append((0, data))
                continue
            read = self._read(data)
            if read is DIRTY:
                return None
            if read is IRRELEVANT:
                continue
            ts, seg, name = read
            keep, http, tls = decide(conversations, seg, data)
            if keep:
                src, dst, sport, dport, flags, seq, ack, payload, hatype, ifindex, _, _ = seg
                plan.append((-frame, (ts, src, dst, sport, dport, flags, seq, ack, (name, hatype, ifindex), payload,
                                      http, tls)))
        return plan

    def _read(self, data: bytes):
        """(ts, segment, interface name) of a held record, or IRRELEVANT/DIRTY."""
        if self.pcap is not None:
            return read_pcap_record(data, self.pcap, self._record_header)
        if len(data) < 28:
            return DIRTY
        btype, _, iface_id, high, low, caplen, wirelen = self._epb.unpack_from(data)  # EPB's first 28 bytes
        if btype != 6:
            return DIRTY  # a Simple Packet Block has no time stamp; the obsolete Packet Block: not read here
        iface = self._ifaces[iface_id] if iface_id < len(self._ifaces) else None
        if iface is None or iface.units is None or iface.name is None:
            return DIRTY
        seg = _segment(data, 28, caplen, wirelen, iface.link)
        if isinstance(seg, int):
            return seg
        ts = high << 32 | low
        units = iface.units
        secs = ts // units
        if secs >= 1 << 63:
            # tshark 4.0 keeps the seconds in a signed 64-bit time_t: in whole-second units (if_tsresol 0) a time
            # stamp of 2^63 or more shows as negative seconds (2^64 - 1 as -1.0), checked against tshark itself
            secs -= 1 << 64
        return epoch(secs, ts % units * (1_000_000_000 // units)), seg, iface.name


def read_pcap_record(data: bytes, pcap: PcapHeader, record_header: struct.Struct):
    """(ts, segment as _segment gives it, "") of a pcap record (its 16-byte header, then the frame) of a file
    headed ``pcap`` (``record_header``: Struct("IIII") in its byte order), or IRRELEVANT/DIRTY."""
    secs, frac, caplen, wirelen = record_header.unpack_from(data)
    if frac >= (1_000_000_000 if pcap.nanoseconds else 1_000_000):
        return DIRTY
    seg = _segment(data, 16, caplen, wirelen, pcap.link_type)
    if isinstance(seg, int):
        return seg
    return epoch(secs, frac if pcap.nanoseconds else frac * 1000), seg, ""


def fast_prepass(path: str, into: str, per_chunk: int, stop: threading.Event | None = None) -> FastPrepass | None:
    """prepass.prepass with the fast path: the records left for tshark in chunk files in ``into`` (``per_chunk``
    at most each), the events decided here in frame order. None when the pre-pass does not follow the file."""
    sinks: list[FastSink] = []

    def output(into: str, ext: str, per_chunk: int) -> FastSink:
        sinks.append(FastSink(into, ext, per_chunk))
        return sinks[-1]

    result = prepass(path, into, per_chunk, stop, output)
    return None if result is None else FastPrepass(result, sinks[0].events)
