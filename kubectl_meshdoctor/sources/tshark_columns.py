"""A live stream's tshark lines as summary columns, and each packet's payload read from the record itself.

``tshark -T fields`` builds every packet's whole protocol tree, labels included, and then walks all of it once a
packet, looking each item's name up in a hash of the wanted fields (tshark.c: ``-T fields`` sets print_details,
"Need full tree info"; print.c write_fields: proto_tree_children_foreach). tshark's summary lines with custom
columns (``-T tabs``, ``gui.column.format`` of ``%Cus:FIELD:1:U`` columns) need only the fields the columns and the
display filter name: the rest of the tree is never built. On a live capture of bench/live's load (300,313
records, tshark 4.0.17, the live arguments) that is 3.4-3.5 s of tshark's CPU against 6.2-6.4 s
(bench/RESULTS.md). The columns print what ``-T fields`` prints for the same fields and the same first
occurrence (checked on every capture in tests/data: tests/live/test_dissector.py), but a custom column of
bytes shows at most the first 36 of them, then an ellipsis (``…``). So tcp.payload's column is only the
payload's first bytes, and the payload itself is read from the record the live dissector wrote (it holds each
record until tshark's line for it, or a later one, has been read: live/dissect.py).

Where the payload lies in its record: a record holds the frame's first ``caplen`` bytes of ``wirelen``, and the
TCP payload of tcp.len bytes ends the frame on the wire unless a trailer follows it (Ethernet padding of a
short frame, an FCS). So it starts ``wirelen - tcp.len`` bytes into the frame, which the column's first bytes
confirm; when they do not (a trailer), it is the last place at or before that where they are; when they are
nowhere in the record (a TCP segment tshark reassembled from IP fragments, or a record no longer held), the
column's bytes are all that is read of it, as if the frame had been captured that short (``payload_cut``).
"""

from __future__ import annotations

import struct
import sys

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.pcap_header import RECORD_HEADER_LEN

from .fastpath import payload_event
from .tshark import FLAGS, MAX_NAMED

# Column order of tshark's summary lines; _packet unpacks in this order. The interface is the stream's own (a
# live stream is one pod interface), so none of the interface fields -T fields reads is asked for.
COLUMNS = ("frame.number", "frame.time_epoch", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "tcp.srcport",
           "tcp.dstport", "tcp.flags", "tcp.seq_raw", "tcp.ack_raw", "tcp.len", "tcp.payload")
# Occurrence 1: the first, as -E occurrence=f gives it (the outer header of a tunnel); U: unresolved values.
COLUMN_ARGS = ("-n", "-T", "tabs",
               "-o", "gui.column.format:" + ",".join(f'"{i}","%Cus:{f}:1:U"' for i, f in enumerate(COLUMNS)))
SHOWN_BYTES = 36  # of a bytes field in a custom column (tshark 4.0.17)
_ELLIPSIS = "\u2026".encode().decode("latin-1")  # how a column cut short ends, in the lines' latin-1 reading


def _prefix(column: str) -> bytes | None:
    """The payload bytes that tcp.payload's column shows (hex, maybe cut short with an ellipsis); None when it is
    not hex as tshark writes it."""
    try:
        return bytes.fromhex(column[:2 * SHOWN_BYTES])  # tshark 4.0: 36 bytes at most, then the ellipsis
    except ValueError:  # cut shorter than that, or tshark 3's colons between the bytes
        try:
            return bytes.fromhex(column.replace(_ELLIPSIS, "").replace(":", ""))
        except ValueError:
            return None


def record_payload(chunk: bytes, at: int, record_header: struct.Struct, tcp_len: int,
                   prefix: bytes | None) -> bytes | None:
    """The captured TCP payload of the pcap record at offset ``at`` of ``chunk`` (``record_header``: the file's
    ``caplen, wirelen`` at offset 8 of a record header), ``tcp_len`` bytes on the wire whose first captured bytes
    are ``prefix`` (None: not known, taken as found); None when they are not in the record."""
    caplen, wirelen = record_header.unpack_from(chunk, at + 8)
    first = at + RECORD_HEADER_LEN
    last = first + caplen
    start = first + wirelen - tcp_len
    if prefix is not None and (start < first or chunk[start:start + len(prefix)] != prefix):
        start = chunk.rfind(prefix, first, min(max(start, first) + len(prefix), last))
        if start < 0:
            return None
    return chunk[start:min(start + tcp_len, last)]


def column_event(stream, line: str, frame: int, chunk: bytes | None, at: int,
                 record_header: struct.Struct) -> PacketEvent | None:
    """A live stream's tshark line (COLUMNS, tab-separated) as its PacketEvent at ``frame``, counted in
    ``stream`` as sources/tshark.py's counted_event counts (``source``, ``iface``, ``packets``, ``last_frame``,
    ``undissectable``, ``undissectable_frames``; and ``payload_cut``, the frames whose payload was read from
    the column alone). ``chunk`` and ``at``: the frame's pcap record (None: not held). None for a line that is
    no packet event, or a frame tshark could not dissect (counted as such)."""
    try:
        ev = _packet(stream, line, frame, chunk, at, record_header)
    except (ValueError, IndexError):
        stream.undissectable += 1
        if len(stream.undissectable_frames) < MAX_NAMED:
            stream.undissectable_frames.append(frame)
        return None
    if ev is not None:
        stream.packets += 1
        stream.last_frame = frame
    return ev


def _packet(stream, line: str, frame: int, chunk: bytes | None, at: int,
            record_header: struct.Struct) -> PacketEvent | None:
    (_, ts, src, dst, src6, dst6, sport, dport, flags, seq, ack, length, shown) = line.split("\t")
    if not sport:
        return None  # a session's first frame, yielded for its number, is not TCP
    if not src:
        if not src6:
            return None
        src, dst = src6, dst6
    src, dst = sys.intern(src), sys.intern(dst)  # few addresses a pod: one string each (see tshark._packet)
    payload_len = int(length) if length else 0
    bits = int(flags, 16) & 0x3F
    http = tls = None
    if payload_len and shown:  # tshark shows no tcp.payload for an RST's data, nor parses it: neither do we
        prefix = _prefix(shown)
        payload = None if chunk is None else record_payload(chunk, at, record_header, payload_len, prefix)
        if payload is None:
            stream.payload_cut += 1
            payload = prefix or b""
        _, http, tls = payload_event(bits, payload)
    return PacketEvent(float(ts), stream.iface, stream.source, frame, src, int(sport), dst, int(dport), FLAGS[bits],
                       int(seq), int(ack), payload_len, http, tls)

