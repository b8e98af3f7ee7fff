"""A live stream's tshark lines as summary columns, and each packet's payload read from the record itself.

``tshark -T fields`` builds every packet's whole protocol tree, labels included, and then walks all of it once a
packet, looking each item's name up in a hash of the wanted fields (tshark.c: ``-T fields`` sets print_details,
"Need full tree info"; print.c write_fields: proto_tree_children_foreach). tshark's summary lines with custom
columns (``-T tabs``, ``gui.column.format`` of ``%Cus:FIELD:1:U`` columns) need only the fields the columns and the
display filter name: the rest of the tree is never built. On a live capture of bench/live's load (300,313
records, tshark 4.0.17, the live arguments) that is 3.4-3.5 s of tshark's CPU against 6.2-6.4 s
(bench/RESULTS.md). The columns print what ``-T fields`` prints for the same fields and the same first
occurrence (checked on every capture in tests/data: tests/live/test_dissector_columns.py), but a custom column of
bytes shows at most the first 36 of them, then an ellipsis (``…``). So tcp.payload's column is only the
payload's first bytes, and the payload itself is read from the record the live dissector wrote (it holds each
record until tshark's line for it, or a later one, has been read: live/dissect.py).

A payload of at most 36 bytes is all in its column. A longer one is read from its record: from where the
column's bytes first occur in it (record_payload says why not from the end of the frame), for tcp.len bytes or up
to the end of what was captured. When they are nowhere in the record (a TCP segment tshark reassembled from IP
fragments, or a record no longer held), the column's bytes are all that is read of it, as if the frame had been
captured that short (``payload_cut``).
"""

from __future__ import annotations

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.pcap_header import RECORD_HEADER_LEN

from .fastpath import payload_event
from .tshark import FLAGS, MAX_NAMED, tcp_ends

# Column order of tshark's summary lines; _packet unpacks in this order. The interface is the stream's own (a
# live stream is one pod interface), so none of the interface fields -T fields reads is asked for.
COLUMNS = ("frame.number", "frame.time_epoch", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "tcp.srcport",
           "tcp.dstport", "tcp.flags", "tcp.seq_raw", "tcp.ack_raw", "tcp.len", "tcp.payload")
# Occurrence 1: the first, as -E occurrence=f gives it (the outer header of a tunnel); U: unresolved values.
COLUMN_ARGS = ("-n", "-T", "tabs",
               "-o", "gui.column.format:" + ",".join(f'"{i}","%Cus:{f}:1:U"' for i, f in enumerate(COLUMNS)))
SHOWN_BYTES = 36  # of a bytes field in a custom column (tshark 4.0.17)
_ELLIPSIS = "\u2026".encode().decode("latin-1")  # how a column cut short ends, in the lines' latin-1 reading
_CUT_LEN = 2 * SHOWN_BYTES + len(_ELLIPSIS)


def _shown(column: str) -> tuple[bytes | None, bool]:
    """(the payload bytes tcp.payload's column shows, whether that is all of the captured payload: no ellipsis);
    (None, False) when it is not hex as tshark writes it."""
    n = len(column)
    try:
        if n <= 2 * SHOWN_BYTES:  # tshark 4.0: the whole payload, as hex
            return bytes.fromhex(column), True
        if n == _CUT_LEN and column.endswith(_ELLIPSIS):  # tshark 4.0: its first SHOWN_BYTES bytes
            return bytes.fromhex(column[:2 * SHOWN_BYTES]), False
    except ValueError:  # tshark 3's colons between the bytes
        pass
    whole = not column.endswith(_ELLIPSIS)
    try:
        return bytes.fromhex(column.replace(_ELLIPSIS, "").replace(":", "")), whole
    except ValueError:
        return None, False


def record_payload(chunk: bytes, at: int, end: int, tcp_len: int, prefix: bytes) -> bytes | None:
    """The captured TCP payload of the pcap record ``chunk[at:end]`` (its 16-byte record header, then the frame
    as captured), ``tcp_len`` bytes on the wire whose first captured bytes are ``prefix``; None when those are
    not in the record.

    It starts where ``prefix`` first occurs in the record. Not at ``wirelen - tcp_len`` into the frame, where it
    starts when the datagram ends the frame: a trailer after it (an FCS, padding) moves that point by its length,
    and a payload whose first bytes recur within that length (``GET GET GET ...``) would match there too. The
    headers before the payload never hold its first SHOWN_BYTES bytes (the column is only read from a record
    when it shows that many)."""
    start = chunk.find(prefix, at + RECORD_HEADER_LEN, end)
    if start < 0:
        return None
    return chunk[start:min(start + tcp_len, end)]


def column_event(stream, line: str, frame: int, chunk: bytes | None, at: int, end: int) -> PacketEvent | None:
    """A live stream's tshark line (COLUMNS, tab-separated) as its PacketEvent at ``frame``, counted in
    ``stream`` as sources/tshark.py's counted_event counts (``source``, ``iface``, ``packets``, ``last_frame``,
    ``undissectable``, ``undissectable_frames``; and ``payload_cut``, the frames whose payload was read from
    the column alone). ``chunk[at:end]``: the frame's pcap record (``chunk`` None: not held). None for a line that is
    no packet event, or a frame tshark could not dissect (counted as such)."""
    try:
        ev = _packet(stream, line, frame, chunk, at, end)
    except (ValueError, IndexError):
        stream.undissectable += 1
        if len(stream.undissectable_frames) < MAX_NAMED:
            stream.undissectable_frames.append(frame)
        return None
    if ev is not None:
        stream.packets += 1
        stream.last_frame = frame
    return ev


def _packet(stream, line: str, frame: int, chunk: bytes | None, at: int, end: int) -> PacketEvent | None:
    (_, ts, src, dst, src6, dst6, sport, dport, flags, seq, ack, length, shown) = line.split("\t")
    ends = tcp_ends(sport, src, dst, src6, dst6)
    if ends is None:
        return None
    src, dst = ends
    payload_len = int(length) if length else 0
    bits = int(flags, 16) & 0x3F
    http = tls = None
    if payload_len and shown:  # tshark shows no tcp.payload for an RST's data, nor parses it: neither do we
        payload, whole = _shown(shown)
        if not whole:  # only its first bytes: the rest is in the record
            found = None if chunk is None or not payload else record_payload(chunk, at, end, payload_len, payload)
            if found is None:
                stream.payload_cut += 1
            payload = found or payload or b""
        _, http, tls = payload_event(bits, payload)
    return PacketEvent(float(ts), stream.iface, stream.source, frame, src, int(sport), dst, int(dport), FLAGS[bits],
                       int(seq), int(ack), payload_len, http, tls)

