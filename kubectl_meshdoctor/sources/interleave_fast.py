"""The fast path (sources/fastpath.py) for several files in one tshark stream (sources/interleave.py).

Without it, the merger writes every kept record into tshark's pipe; every SESSION_RECORDS records a new tshark
takes over, first reading again the last REPLAY_RECORDS records (their lines dropped). Here the merger goes
through that same stream of sessions (the virtual stream) and, for each session, follows tshark's
tcp.completeness from a fresh state, the replayed records first, as tshark would (fastpath.shown_completeness):

- a record the fast path reads becomes an event here, when FILE_PREFILTER would keep it, queued with the place
  in the real stream (what tshark reads now) of the next record written there, so that the reader hands it on
  before that record's line: the order of the virtual stream. A record without TCP payload is decided by its
  conversation's tcp.completeness; one with payload by itself alone (fastpath.payload_event: its flags, its
  first captured bytes, its HTTP/1 or TLS start parsed as sources/tshark.py parses tshark's tcp.payload);
- a record the fast path does not read makes the rest of its session go to a tshark of its own, which first
  reads that session's replayed records and every record of it so far as replays: the state tshark had without
  the fast path.

So on a capture of plain Ethernet/IP/TCP no tshark starts at all: its ~160 MB of RSS before the first frame
(dissector tables) was most of issue 34's 250 MB. tshark is still what reads any session holding a record not
read here (fragments, tunnels, ICMP errors, options, damaged headers), and what the tests compare with.

The real stream starts a new tshark every SESSION_RECORDS records it holds, or when events wait beyond
FAST_PENDING (its end lets the reader hand them on, so the queue stays bounded).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.pcap_header import PcapHeader

from .fast_events import address_text
from .http1 import parse_http_start
from .tshark import FLAGS, iface_of
from .fastpath import DIRTY, IRRELEVANT, decide, read_pcap_record, shown_completeness
from .prepass import KEEP, SKIP, Conversations, PcapBlocks, classify, tcp_verdict

MAX_TEXTS = 65_536  # addresses kept printed (~150 bytes each), then the table starts again: a scan stays bounded
# Events queued for the reader at most (~200 bytes each, ~1 KB with an HTTP/1 start) before the merger waits.
# Queued events are the objects that outlive a young collection of Python's cyclic GC (a young collection every
# 50,000 allocations in both of analyze's processes: gc_tuning.GC_THRESHOLDS), and each collection walks all of
# them: at 50,000 the GC took 1.8 s of analyze's ~19 s on bench/gen's short mix, at 4,096 0.2 s (bench/RESULTS.md).
FAST_PENDING = 4096
_WRITE = 1 << 18
DRAIN = -1  # a session item that only hands on the events queued so far


class RealStream:
    """The records tshark reads: pipes, one a tshark, announced with ``announce(read_fd, records before it)``;
    each record's (file index, frame) noted in ``ledger`` before tshark can read it."""

    def __init__(self, header: bytes, ledger, announce: Callable[[tuple], None], replay: int,
                 session_records: int) -> None:
        self.header, self.ledger, self.announce = header, ledger, announce
        self.replay, self.session_records = replay, session_records
        self.fd = -1
        self.written = 0  # records in the real stream so far
        self.count = 0  # records of the current tshark
        self.ends: list[int] = []  # where each tshark's records end, in the order they were announced
        self.dirty = False  # the current tshark reads a session as without the fast path
        self._out, self._files, self._frames = bytearray(), bytearray(), array("I")

    def open(self, replays: list[bytes] = ()) -> None:
        self.close()
        read_fd, self.fd = os.pipe()
        self.announce((read_fd, self.written))
        os.write(self.fd, self.header)
        self.count = 0
        for old in replays:
            self._add(self.replay, 0, old)

    def write(self, index: int, frame: int, data: bytes) -> None:
        if self.fd < 0 or (self.count >= self.session_records and not self.dirty):
            self.open()
        self._add(index, frame, data)
        self.count += 1

    def _add(self, index: int, frame: int, data: bytes) -> None:
        self._files.append(index)
        self._frames.append(frame)
        self._out += data
        self.written += 1
        if len(self._out) >= _WRITE:
            self.flush()

    def flush(self) -> None:
        if self.fd < 0:
            return
        self.ledger.add(bytes(self._files), self._frames)
        data = bytes(self._out)
        del self._out[:], self._files[:], self._frames[:]
        while data:
            data = data[os.write(self.fd, data):]

    def close(self) -> None:
        if self.fd >= 0:
            self.flush()
            self.ends.append(self.written)
            os.close(self.fd)
            self.fd = -1
        self.dirty = False


def kept_segments(fh, head: PcapHeader, stop: threading.Event | None, make, block: int):
    """prepass.kept_records for the fast path: yields ``make(data, frame, seen)`` of each kept record, ``data``
    its bytes and ``seen`` what read_pcap_record reads of them, and returns what kept_records returns. Each
    record is read once: its verdict comes from that read (prepass.tcp_verdict) wherever it is a TCP segment read
    here, from prepass.classify elsewhere (the same verdict: classify walks the same headers first). Reading
    every record twice, once for the verdict and once for the event, was a tenth of analyze's CPU on bench/gen's
    short mix, whose records are nearly all kept."""
    link = head.link_type
    pack_lengths = struct.Struct(head.order + "II").pack
    record_header = struct.Struct(head.order + "IIII")
    conv = Conversations()
    kept = frame = 0
    blocks = PcapBlocks(fh, head, stop, block)
    for buf, records in blocks:
        for pos, caplen, wirelen in records:
            frame += 1
            data = buf[pos:pos + 16 + caplen]
            seen = read_pcap_record(data, head, record_header)
            if type(seen) is tuple:
                src, dst, sport, dport, flags, _, _, payload, _, _, start, _ = seen[1]
                a, b = src + sport.to_bytes(2, "big"), dst + dport.to_bytes(2, "big")
                verdict = tcp_verdict(conv, a + b if a <= b else b + a, flags, payload, data, start, 16 + caplen, 16)
            else:
                verdict = classify(buf, pos + 16, caplen, wirelen, link, conv)
            if verdict is KEEP or (frame == 1 and verdict is SKIP):
                kept += 1
                yield make(data, frame, seen)
            elif verdict:  # an HTTP/1 start cut after its header block, as kept_records cuts it
                kept += 1
                # its payload's captured bytes now end with the record (tcp_verdict cuts inside the payload)
                yield make(data[:8] + pack_lengths(verdict, wirelen) + data[16:16 + verdict], frame,
                           (seen[0], seen[1][:11] + (16 + verdict,), seen[2]))
    return blocks.kept(kept)


def merge_fast(records: Iterator[tuple], head: PcapHeader, real: RealStream, queue: deque, stop: threading.Event,
               drain: Callable[[int], None], session_records: int, replay_records: int,
               http_start: Callable[[bytes], object] = parse_http_start) -> None:
    """Write ``records`` ((key, file index, frame, record, what read_pcap_record reads of it) in the virtual
    stream's order, as kept_segments makes them) into ``real``, and
    queue the events decided here in ``queue`` as (place in the real stream, file index, frame, event fields).
    ``drain(place)`` asks the reader to hand on what is queued before ``place``."""
    record_header = struct.Struct(head.order + "IIII")
    recent: deque[bytes] = deque(maxlen=min(replay_records, session_records))
    in_session = session_records
    started = dirty = False
    conversations: dict[bytes, list] = {}
    replay: list[bytes] = []
    log: list[bytes] = []
    texts: dict[bytes, str] = {}  # address bytes -> as tshark prints them
    for _, index, frame, data, seen in records:
        if stop.is_set():
            return
        if in_session >= session_records:  # where merge() starts a new tshark
            if real.dirty:
                real.close()
            replay = list(recent) if started else []
            started, dirty, in_session = True, False, 0
            conversations, log = {}, []
            for old in replay:
                replayed = read_pcap_record(old, head, record_header)
                if replayed is DIRTY:
                    dirty = True
                    break
                if replayed is not IRRELEVANT:
                    _decide(conversations, replayed)
            if dirty:
                real.open(replay)
                real.dirty = True
        recent.append(data)
        in_session += 1
        if dirty:
            real.write(index, frame, data)
            continue
        if seen is DIRTY:  # the rest of this session as without the fast path
            dirty = True
            real.open(replay + log)
            real.dirty = True
            real.write(index, frame, data)
            continue
        log.append(data)
        if seen is IRRELEVANT:
            continue
        ts, seg, name = seen
        keep, http, tls = decide(conversations, seg, data, http_start)
        if keep:
            src, dst, sport, dport, flags, seq, ack, payload, hatype, ifindex, _, _ = seg
            # A pod talks with few addresses: each printed once, not twice an event (inet_ntop and intern).
            if len(texts) >= MAX_TEXTS:
                texts.clear()
            src_text = texts.get(src) or texts.setdefault(src, address_text(src))
            dst_text = texts.get(dst) or texts.setdefault(dst, address_text(dst))
            queue.append((real.written, index, frame, ts, src_text, dst_text, sport, dport, flags, seq, ack,
                          (name, hatype, ifindex), payload, http, tls))
            if len(queue) >= FAST_PENDING:
                _wait(real, queue, stop, drain)
    real.close()


def _decide(conversations: dict[bytes, list], seen) -> None:
    """A replayed record's change to tcp.completeness, as tshark reading it again makes it."""
    _, (src, dst, sport, dport, flags, seq, ack, payload, _, _, _, _), _ = seen
    shown_completeness(conversations, src, sport, dst, dport, flags, seq, ack, payload)


def _wait(real: RealStream, queue: deque, stop: threading.Event, drain: Callable[[int], None]) -> None:
    """Too many events queued: end the current tshark (the reader hands on what came before its end) and wait."""
    if real.fd >= 0 and not real.dirty:
        real.close()
    else:
        real.flush()
    drain(real.written)
    while len(queue) > FAST_PENDING // 2 and not stop.is_set():
        time.sleep(0.005)


class FastReader:
    """The reader's side: hands on the queued events before a place in the real stream, counting them per
    file in ``packets`` and ``last``."""

    def __init__(self, queue: deque, sources, ifaces, forced, on_event, packets: list[int], last: list[int],
                 make_event: Callable = PacketEvent, flags: Sequence = FLAGS):
        self.queue, self.on_event, self.packets, self.last = queue, on_event, packets, last
        self._make, self._flags = make_event, flags
        self._sources, self._ifaces, self._forced = sources, ifaces, forced
        self._where: dict[tuple, str] = {}

    def upto(self, place: float) -> None:
        q, make, flags_of = self.queue, self._make, self._flags
        while q and q[0][0] <= place:
            _, i, frame, ts, src, dst, sport, dport, flags, seq, ack, where, payload, http, tls = q.popleft()
            key = (i, where)
            iface = self._where.get(key)
            if iface is None:
                iface = self._where[key] = self._ifaces[i] if self._forced[i] else \
                    iface_of(*where, self._ifaces[i])
            self.on_event(make(ts, iface, self._sources[i], frame, src, sport, dst, dport, flags_of[flags], seq, ack,
                               payload, http, tls))
            self.packets[i] += 1
            self.last[i] = frame
