"""A record-level pre-pass over a capture file: the records PREFILTER (sources/tshark.py) may keep, copied into
chunk files (byte for byte but for an HTTP/1 start's body, below), with the original frame number of each, so
that tshark dissects only those.

tshark dissects every packet of a file before its display filter hides most of them; on bench/gen's traffic two
thirds of its work is for packets no detector acts on (bulk segments and their ACKs). This pass reads each
record's link, IP and TCP headers with ``struct`` and skips a record only when it is sure PREFILTER drops it:

- kept: frame 1; TCP with SYN, FIN or RST; TCP payload starting with an HTTP/1 start (http1.START_PREFIXES);
  a segment without payload on a conversation whose latest SYN was seen and no SYN-ACK after it, or that saw a
  FIN or RST after its latest SYN (or with no SYN at all): PREFILTER's ``tcp.completeness`` tests (a challenge
  ACK; a socket's ACK after its connection ended), tracked here per address/port pair in either direction. The
  second is kept wider than tshark keeps it (tshark drops it where the conversation saw a SYN before): "FIN or
  RST since the latest SYN" holds wherever tshark shows one of them without SYN, since tshark starts a new
  conversation at a SYN, and it needs no memory of the conversations that never ended; and every record of a
  conversation until it has had two with ACK, SYN, FIN or RST (tshark counts nothing of a first frame but a SYN, and keeps a
  pure ACK while it shows nothing: see Conversations);
- kept too, for tshark to decide as without the pass: anything not parsed here (not TCP, IP fragments, IPv6
  extension headers, link types or VLAN stacks not walked, headers cut by the snap length, lengths that do not
  add up, a TCP header length under 20 bytes);
- skipped: the rest (TCP segments with payload that is not an HTTP/1 start, segments without payload on
  conversations whose handshake was answered or never seen, with no FIN or RST since their latest SYN, and
  two flagged records before).

A file it cannot follow (gzip, a link type of no use, a pcapng section of its own, a block type it does not
know, a record length that cannot be) gives None: the caller reads the file as without the pass.

The kept records are copied with the original file header (pcap) or the original section header and interface
blocks (pcapng), so no packet is re-encoded. One exception, in pcap files: a segment that starts an HTTP/1
message is cut after its header block (CRLF CRLF, RFC 9112 section 2.1), its record's captured length set to
what is left and its original length kept: the parser (sources/http1.py) reads no further, TCP's length comes
from the IP header, and tshark's fields of the cut record are those of the whole one but for the body's bytes.

Sources: the pcap format (draft-ietf-opsawg-pcap), the pcapng format (draft-ietf-opsawg-pcapng: SHB, IDB, EPB,
SPB, the obsolete Packet Block, NRB, ISB, DSB), IPv4 (RFC 791), IPv6 (RFC 8200), TCP's header (RFC 9293
section 3.1), Linux cooked headers (LINKTYPE_LINUX_SLL, _SLL2), HTTP/1's message format (RFC 9112).
"""

from __future__ import annotations

import os
import struct
import threading
from array import array
from dataclasses import dataclass, field

from kubectl_meshdoctor.pcap_header import (
    HEADER_LEN,
    SECTION_HEADER_BLOCK,
    PcapHeader,
    is_pcapng,
    pcap_header,
    pcapng_order,
)

from .http1 import START_PREFIXES
from .tls_records import RECORD_PREFIXES

# Link types (tcpdump.org/linktypes.html) walked here; for each, how to find the IP header.
ETHERNET, NULL, RAW, LOOP, SLL, RAW4, RAW6, SLL2 = 1, 0, 101, 108, 113, 228, 229, 276
LINKS = frozenset((ETHERNET, NULL, RAW, LOOP, SLL, RAW4, RAW6, SLL2))
SLL_HATYPES = frozenset((1, 772, 65534))  # ARPHRD_ETHER, _LOOPBACK, _NONE (tun): the protocol is an EtherType
BSD_INET6 = frozenset((24, 28, 30))  # AF_INET6 of the BSDs, as DLT_NULL/LOOP captures carry it
_STARTS = frozenset(START_PREFIXES)
_MAX_BLOCK = 1 << 24  # a pcapng block this long is a damaged file
# tshark's largest frame for these link types (wiretap's WTAP_MAX_PACKET_SIZE_STANDARD): past it, it stops with
# an error of its own, which it must be left to give on the original file.
MAX_FRAME = 262_144
BLOCK = 1 << 20  # bytes read at a time (buffered reads: a memory map would count the whole file as RSS)
MAX_PENDING = 200_000  # conversations awaiting their SYN-ACK; past it every pure ACK is kept (safety first)
# Conversations with a FIN or RST since their latest SYN: one a closed connection that never reopened (a set entry is
# ~100 bytes: 20 MB at the bound); past it every pure ACK is kept (safety first).
MAX_CLOSED = 200_000
MAX_SEEN = 200_000  # conversations whose records are counted (~100 bytes each); past it a new one is kept whole

# Verdicts of classify.
KEEP, SKIP = True, False


@dataclass
class KeptChunk:
    """One file of kept records; ``frames`` the original (1-based) frame number of each of its records."""

    path: str
    frames: array = field(default_factory=lambda: array("I"))


@dataclass
class PrepassResult:
    chunks: list[KeptChunk]
    records: int  # whole records of the original file
    kept: int
    cut_short: bool  # the file ends inside a record, after ``records`` whole ones


class Conversations:
    """What the pass knows of each conversation (address/port pair, either direction): ``pending``, its latest
    SYN (no ACK) seen and no SYN-ACK after it; ``closed``, a FIN or RST since its latest SYN (or ever, with no SYN);
    ``flagged``, how many of its records gave tshark a tcp.completeness bit (counted to 2). A pure ACK on a
    conversation in neither of the first two, with two such records before it, is one PREFILTER drops: answered
    with its SYN seen and not closed since, or never opened nor closed, and showing some tcp.completeness bit.

    The count is there because tshark 4.0 gives a conversation's first frame a bit only when it is a SYN alone,
    and a later frame one only when it has ACK (ACK or data, SYN-ACK, FIN with ACK) or RST (shown_completeness
    in sources/fastpath.py): PREFILTER keeps a pure ACK while the bits are 0, and a skipped frame would move which
    frame is first. So every record of a conversation is kept until two of them gave a bit (for a conversation
    with its handshake, the SYN and SYN-ACK, kept anyway); later frames of both files then show a bit, and the
    ones skipped add only ACK and data bits, which no test of PREFILTER reads. A SYN-ACK then a SYN again, or a
    FIN without ACK, gives no bit: counting them had let a later data frame's bit go unseen (found by
    tests/sources/test_prepass_ack_rules.py's random sequences)."""

    def __init__(self) -> None:
        self.pending: set[bytes] = set()
        self.closed: set[bytes] = set()
        self.flagged: dict[bytes, int] = {}
        # Conversations whose first record was no SYN alone: tshark shows no SYN bit on them, so once closed their
        # pure ACKs stay yielded (PREFILTER's second test) until a SYN of another connection starts a new one,
        # which the pass cannot tell from a SYN of the same one (tshark compares its seq with the flow's base)
        self.midstream: set[bytes] = set()
        self.overflow = False

    def early(self, key: bytes, flags: int) -> bool:
        """Whether tshark may show this record's conversation with no completeness bit (fewer than two records
        that gave one before it), counting this one; past MAX_SEEN a conversation not counted always may."""
        seen = self.flagged.get(key)
        if seen is None:  # its first record: kept
            if len(self.flagged) >= MAX_SEEN:
                return True
            if flags & 0x12 == 0x02:
                self.flagged[key] = 1
            else:
                self.flagged[key] = 0
                self.midstream.add(key)
            return True
        if seen < 2 and flags & 0x14:
            self.flagged[key] = seen + 1
        return seen < 2

    def update(self, key: bytes, flags: int) -> None:
        """A SYN, FIN or RST record (kept): the handshake and close state it changes."""
        self.early(key, flags)
        if flags & 0x02 and not flags & 0x10:  # SYN alone: a (new) handshake starts, whatever came before
            if len(self.pending) >= MAX_PENDING:
                self.overflow = True
            self.pending.add(key)
            if key not in self.midstream:  # opened by a SYN: bit 1 set either way, the FIN bit no longer read
                self.closed.discard(key)
        elif (flags & 0x17) == 0x12:  # SYN-ACK and nothing else: the narrowest test, so we keep more
            self.pending.discard(key)
        if flags & 0x05:  # FIN or RST, whatever else is set (with a SYN too: we keep more)
            if len(self.closed) >= MAX_CLOSED:
                self.overflow = True
            self.closed.add(key)

    def want_ack(self, key: bytes) -> bool:
        """Whether PREFILTER may keep a pure ACK of this conversation."""
        return self.overflow or key in self.pending or key in self.closed


def classify(buf: bytes, o: int, caplen: int, wirelen: int, link: int, conv: Conversations) -> bool | int:
    """KEEP or SKIP the frame of ``caplen`` bytes at ``buf[o:]`` (``wirelen`` on the wire) of link type ``link``,
    or keep only its first N bytes (an int, less than ``caplen``: an HTTP/1 start up to its header block's end)."""
    end = o + caplen
    if link == ETHERNET:
        if caplen < 14:
            return KEEP
        etype = (buf[o + 12] << 8) | buf[o + 13]
        ip = o + 14
        if etype in (0x8100, 0x88A8):  # one VLAN tag, walked; a second one is kept
            if caplen < 18:
                return KEEP
            etype = (buf[o + 16] << 8) | buf[o + 17]
            ip = o + 18
    elif link == SLL or link == SLL2:
        if link == SLL:
            if caplen < 16:
                return KEEP
            hatype = (buf[o + 2] << 8) | buf[o + 3]
            etype = (buf[o + 14] << 8) | buf[o + 15]
            ip = o + 16
        else:
            if caplen < 20:
                return KEEP
            etype = (buf[o] << 8) | buf[o + 1]
            hatype = (buf[o + 8] << 8) | buf[o + 9]
            ip = o + 20
        if hatype not in SLL_HATYPES:
            return KEEP
    elif link == RAW or link == RAW4 or link == RAW6:
        if caplen < 1:
            return KEEP
        version = buf[o] >> 4
        etype = 0x0800 if version == 4 else 0x86DD if version == 6 else 0
        ip = o
    elif link == NULL or link == LOOP:
        if caplen < 4:
            return KEEP
        family = buf[o + 3] if buf[o] == 0 else buf[o]  # host byte order of the capturing machine: either
        if buf[o + 1] or buf[o + 2] or (buf[o] and buf[o + 3]):
            return KEEP
        etype = 0x0800 if family == 2 else 0x86DD if family in BSD_INET6 else 0
        ip = o + 4
    else:
        return KEEP
    wire_ip = wirelen - (ip - o)  # the IP datagram's bytes on the wire (a link trailer or padding may follow)
    if etype == 0x0800:
        if end - ip < 20 or buf[ip] >> 4 != 4:
            return KEEP
        ihl = (buf[ip] & 0x0F) * 4
        total = (buf[ip + 2] << 8) | buf[ip + 3]
        if ihl < 20 or buf[ip + 9] != 6 or ((buf[ip + 6] & 0x3F) | buf[ip + 7]) or total < ihl or total > wire_ip:
            return KEEP  # not TCP, a fragment (MF or an offset), or lengths that do not add up (TSO's 0)
        tcp = ip + ihl
        seg = total - ihl
        if end - tcp < 14:
            return KEEP
        a, b = buf[ip + 12:ip + 16] + buf[tcp:tcp + 2], buf[ip + 16:ip + 20] + buf[tcp + 2:tcp + 4]
    elif etype == 0x86DD:
        if end - ip < 40 or buf[ip] >> 4 != 6 or buf[ip + 6] != 6:
            return KEEP  # an extension header (not walked) or not TCP
        seg = (buf[ip + 4] << 8) | buf[ip + 5]
        if seg == 0 or seg > wire_ip - 40:
            return KEEP  # a jumbogram, or lengths that do not add up
        tcp = ip + 40
        if end - tcp < 14:
            return KEEP
        a, b = buf[ip + 8:ip + 24] + buf[tcp:tcp + 2], buf[ip + 24:ip + 40] + buf[tcp + 2:tcp + 4]
    else:
        return KEEP
    doff = (buf[tcp + 12] >> 4) * 4
    if doff < 20 or end - tcp < doff or seg < doff:
        return KEEP  # tshark reports these as undissectable: it must see them
    return tcp_verdict(conv, a + b if a <= b else b + a, buf[tcp + 13], seg - doff, buf, tcp + doff, end, o)


def tcp_verdict(conv: Conversations, key: bytes, flags: int, payload: int, buf: bytes, start: int, end: int,
                o: int) -> bool | int:
    """classify's verdict on a TCP segment read whole: ``key`` its conversation's (both address/port pairs,
    the lesser first), ``flags`` its header's, ``payload`` bytes of TCP payload, which start at ``buf[start]``;
    the frame starts at ``buf[o]`` and its captured bytes end at ``buf[end]``."""
    if flags & 0x07:  # FIN, SYN, RST
        conv.update(key, flags)
        return KEEP
    first = conv.early(key, flags)
    if payload:
        if payload < 4 or end - start < 4:
            return KEEP  # too little sent or captured to tell
        if buf[start:start + 4] not in _STARTS:
            # a TLS record read whole (a hello, an alert), or the 5 bytes of an encrypted alert's header
            return KEEP if first or buf[start:start + 5].startswith(RECORD_PREFIXES) else SKIP
        # The parser reads an HTTP/1 start up to its header block's end, never the body: the bytes after it
        # need not cross to tshark, nor tshark's hex of them back (an HTTP/1 start with its first body bytes in
        # one full-size segment was most of the stream's bytes on bench/gen's traffic).
        head_end = buf.find(b"\r\n\r\n", start, min(end, start + payload))
        return KEEP if head_end < 0 or head_end + 4 >= end else head_end + 4 - o
    return first or conv.want_ack(key)


class ChunkFiles:
    """The chunk files: each starts with ``preamble`` and holds at most ``per_chunk`` kept records."""

    def __init__(self, into: str, ext: str, per_chunk: int) -> None:
        self.into, self.ext, self.per_chunk = into, ext, per_chunk
        self.chunks: list[KeptChunk] = []
        self._fh = None
        self.preamble = bytearray()

    def record(self, data: bytes | memoryview, frame: int) -> None:
        if self._fh is None or len(self.chunks[-1].frames) >= self.per_chunk:
            self.close()
            path = os.path.join(self.into, f"kept_{len(self.chunks):05d}{self.ext}")
            self._fh = open(path, "wb", buffering=1 << 20)
            self._fh.write(self.preamble)
            self.chunks.append(KeptChunk(path))
        self._fh.write(data)
        self.chunks[-1].frames.append(frame)

    def other(self, data: bytes | memoryview) -> None:
        """A block that is not a frame (pcapng): into the current chunk, if any."""
        if self._fh is not None:
            self._fh.write(data)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class Damaged(Exception):
    """The file is not one this pass follows: read it without the pass."""


class Stopped(Exception):
    """``stop`` was set: the pass ends, and returns None as for a file it does not follow."""


def _refill(fh, buf: bytes, pos: int, stop: threading.Event | None, block: int = BLOCK) -> bytes | None:
    """What is left of ``buf`` from ``pos`` on, then the file's next block; None at the end of the file. Raises
    Stopped once ``stop`` is set (checked between blocks, as both readers did)."""
    if stop is not None and stop.is_set():
        raise Stopped
    more = fh.read(block)
    return buf[pos:] + more if more else None


def prepass(path: str, into: str, per_chunk: int, stop: threading.Event | None = None,
            output=None) -> PrepassResult | None:
    """Filter capture ``path`` into chunk files in directory ``into`` (``per_chunk`` kept records each). None when
    the file is not one this pass can follow (the caller then reads it whole). ``stop`` ends it early (None is
    returned then too); the chunk files it wrote are the caller's to remove (they are in ``into``). ``output``:
    what takes the kept records, made as ``output(into, ext, per_chunk)`` (ChunkFiles' interface; its
    ``close`` runs before the result is used; sources/fastpath.py's FastSink), else ChunkFiles."""
    make = output or ChunkFiles
    with open(path, "rb") as fh:
        head = fh.read(HEADER_LEN)
        out = None
        try:
            if is_pcapng(head):
                out = make(into, ".pcapng", per_chunk)
                return walk_pcapng(fh, head, out, stop)
            header = pcap_header(head)
            if header is not None:
                out = make(into, ".pcap", per_chunk)
                return walk_pcap(fh, header, out, stop)
            return None
        except (Damaged, Stopped):
            return None
        finally:
            if out is not None:
                out.close()


def walk_pcap(fh, header: PcapHeader, out, stop: threading.Event | None, block: int = BLOCK) -> PrepassResult | None:
    """The pass over a pcap file after its ``header``, each kept record to ``out`` (``record(data, frame)``, a
    ``preamble`` it starts every chunk with); ``block``: bytes read at a time. Raises Damaged at a record longer
    than tshark reads (its ``frame``: the whole records before it), Stopped once ``stop`` is set."""
    if header.network >> 16 or header.link_type not in LINKS:
        return None  # FCS bits set, or a link type this pass does not walk: nothing to gain
    out.preamble[:] = header.raw
    walk = kept_records(fh, header, stop, out.record, block)
    while True:
        try:
            next(walk)
        except StopIteration as done:
            return done.value and PrepassResult(out.chunks, *done.value)


def kept_records(fh, header: PcapHeader, stop: threading.Event | None, make, block: int = BLOCK):
    """The pass over a pcap file after its ``header`` (of a link type in LINKS, no FCS bits), as a generator: it
    yields ``make(data, frame)`` of each kept record (``data`` a view of the record, valid until the next item:
    copy what is kept), in file order, and returns (whole records, kept records, cut short), or None for a file
    with no whole record. Raises Damaged and Stopped as walk_pcap does.

    A pass taken this way runs in the thread that takes its records: on bench/gen's short mix, the passes of two
    files in threads of their own cost analyze ~3 s of CPU more than the same passes taken in turn by the thread
    that merges their records (three threads took turns holding the GIL; bench/RESULTS.md)."""
    link = header.link_type
    pack_lengths = struct.Struct(header.order + "II").pack
    conv = Conversations()
    verdict_of = classify  # a local for the loop
    kept = frame = 0
    blocks = PcapBlocks(fh, header, stop, block)
    for buf, records in blocks:
        view = memoryview(buf)
        for pos, caplen, wirelen in records:
            frame += 1
            verdict = verdict_of(buf, pos + 16, caplen, wirelen, link, conv)
            if verdict is KEEP or (frame == 1 and verdict is SKIP):
                kept += 1
                yield make(view[pos:pos + 16 + caplen], frame)
            elif verdict:  # its first bytes only: the record's captured length says so (its wire length stays)
                kept += 1
                yield make(buf[pos:pos + 8] + pack_lengths(verdict, wirelen) + buf[pos + 16:pos + 16 + verdict],
                           frame)
    return blocks.kept(kept)


class PcapBlocks:
    """The whole records of a pcap file after its ``header``, a block at a time: iterated, (block, [(offset of a
    record's header in it, captured length, original length), ...]); once exhausted, ``result`` is (whole
    records, cut short: the file ends inside a record), or None for a file with no whole record. Raises Damaged
    at a record longer than tshark reads (after the block's records before it), Stopped once ``stop`` is set
    (checked between blocks of ``block`` bytes). A block's records are found in one loop, then taken in
    another: a generator's step for each record cost the fast path's walk a tenth of its time."""

    def __init__(self, fh, header: PcapHeader, stop: threading.Event | None, block: int = BLOCK) -> None:
        self.result: tuple[int, bool] | None = None
        self._blocks = _pcap_blocks(fh, header, stop, block)

    def __iter__(self) -> PcapBlocks:
        return self

    def __next__(self) -> tuple[bytes, list[tuple[int, int, int]]]:
        try:
            return next(self._blocks)
        except StopIteration as done:
            self.result = done.value
            raise StopIteration from None

    def kept(self, kept: int) -> tuple[int, int, bool] | None:
        """(whole records, ``kept`` of them, cut short), or None for a file with no whole record."""
        return self.result and (self.result[0], kept, self.result[1])


def _pcap_blocks(fh, header: PcapHeader, stop: threading.Event | None, block: int):
    rec = struct.Struct(header.order + "8xII").unpack_from
    buf = fh.read(block)
    pos = frame = 0
    while True:
        n = len(buf)
        records = []
        while pos + 16 <= n:
            caplen, wirelen = rec(buf, pos)
            if caplen > MAX_FRAME:
                if records:
                    yield buf, records
                raise Damaged(frame, caplen)
            if pos + 16 + caplen > n:
                break
            frame += 1
            records.append((pos, caplen, wirelen))
            pos += 16 + caplen
        if records:
            yield buf, records
        nxt = _refill(fh, buf, pos, stop, block)
        if nxt is None:  # no whole record: nothing to save, and tshark says what it says of such a file
            return (frame, pos < n) if frame else None
        buf, pos = nxt, 0


_PACKET_BLOCKS = (2, 3, 6)  # Packet Block (obsolete), Simple Packet Block, Enhanced Packet Block: one frame each
_OTHER_BLOCKS = (4, 5, 0x0A)  # Name Resolution, Interface Statistics, Decryption Secrets: no frame


def walk_pcapng(fh, head: bytes, out: ChunkFiles, stop: threading.Event | None) -> PrepassResult | None:
    """The pass over a pcapng file whose first bytes are ``head``, each kept record to ``out`` (its interface
    blocks into ``out.preamble`` and ``out.other``); None for a file it does not follow. Raises Damaged, Stopped."""
    order = pcapng_order(head)
    if order is None:
        return None
    u32 = struct.Struct(order + "I").unpack_from
    u16 = struct.Struct(order + "H").unpack_from
    ends = struct.Struct(order + "II").unpack_from
    links: list[int] = []
    snaplens: list[int] = []
    conv = Conversations()
    buf = head + fh.read(BLOCK)
    pos = frame = kept = sections = 0
    while True:
        n = len(buf)
        while pos + 12 <= n:
            btype, blen = ends(buf, pos)
            if blen < 12 or blen % 4 or blen > _MAX_BLOCK:
                raise Damaged
            end = pos + blen
            if end > n:
                break
            if u32(buf, end - 4)[0] != blen:
                raise Damaged  # tshark stops at a block whose two lengths differ: let it, as without the pass
            if btype in _PACKET_BLOCKS:
                frame += 1
                if btype == 6 or btype == 2:
                    iface = (u32 if btype == 6 else u16)(buf, pos + 8)[0]
                    caplen, wirelen = ends(buf, pos + 20)
                    data = pos + 28
                else:
                    iface, wirelen, data = 0, u32(buf, pos + 8)[0], pos + 12
                    caplen = min(wirelen, blen - 16, snaplens[0] or wirelen) if snaplens else -1
                if iface >= len(links) or not 0 <= caplen <= MAX_FRAME or data + caplen > end - 4:
                    raise Damaged  # tshark complains of such a file: let it, as without the pass
                link = links[iface]
                if link not in LINKS or classify(buf, data, caplen, wirelen, link, conv) or frame == 1:
                    out.record(memoryview(buf)[pos:end], frame)
                    kept += 1
            elif btype == 1:  # Interface Description Block: every chunk needs it before its packets
                links.append(u16(buf, pos + 8)[0])
                snaplens.append(u32(buf, pos + 12)[0])
                out.preamble += buf[pos:end]
                out.other(memoryview(buf)[pos:end])
            elif btype == SECTION_HEADER_BLOCK:
                if sections:  # a second section (its own interfaces): not followed here
                    return None
                sections += 1
                if buf[pos + 16:pos + 24] != b"\xff" * 8:  # a section length would not hold for a chunk
                    return None
                out.preamble += buf[pos:end]
            elif btype in _OTHER_BLOCKS:
                out.other(memoryview(buf)[pos:end])
            else:
                return None  # a block type tshark might show as a frame (systemd journal, custom): not followed
            pos = end
        nxt = _refill(fh, buf, pos, stop)
        if nxt is None:  # no whole record: nothing to save, and tshark says what it says of such a file
            return PrepassResult(out.chunks, frame, kept, cut_short=pos < n) if frame else None
        buf, pos = nxt, 0
