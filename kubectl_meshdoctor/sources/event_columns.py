"""PacketEvents packed by columns, to cross from one process to another (sources/reader_process.py).

A batch of events crosses as one ``marshal`` message: each number field as the bytes of a typed array (the
time, frame, ports, sequence and acknowledgment numbers, payload length and flags of every event), each string
(interface, source, addresses) as its number in a table both sides keep, and an HTTP/1 start as its header
block's bytes, parsed by the receiver (the reader process's choice), or, parsed already (tshark's events), as its
start line and its header fields' numbers in a second table. A string or (name, value) pair crosses once, with the first
message that uses it; both sides start their tables again past a bound, so a long read stays bounded.

Rebuilding an event from marshalled tuples cost the receiving process ~2.3 us an event (bench/RESULTS.md, an
earlier try), as much as its detectors' share of some events: columns are decoded by C loops
(``memoryview.cast(...).tolist()``), and the event itself is built from them with one ``zip``.

Header pairs a message may carry that must not outlive it (http1.reusable: credentials, ids new in every
request, long lines) are sent with each message that uses them and dropped by the receiver after it.
"""

from __future__ import annotations

import marshal
from array import array
from collections import deque
from collections.abc import Callable
from itertools import starmap
from operator import attrgetter

from kubectl_meshdoctor.core.events import HttpStart, PacketEvent, TlsStart

from .http1 import parse_http_start, reusable
from .tshark import FLAGS

MAX_TEXTS = 65_536  # strings both sides hold by number, then both start again
MAX_PAIRS = 16_384  # header pairs both sides hold by number, then both start again
_TLS_FIELDS = attrgetter("content_type", "version", "length", "handshake_type", "sni", "alpn", "selected_version",
                         "alert", "complete")


class Packer:
    """The sending side: ``add_row`` an event's fields, ``put`` a PacketEvent, and ``message`` the events so far
    as bytes (then none). An event is kept as the tuple of its
    fields until ``message`` turns the batch into columns with ``zip`` (a C loop: appending each field to its
    array as it came cost the reading process a tenth of its time)."""

    def __init__(self, max_texts: int = MAX_TEXTS, max_pairs: int = MAX_PAIRS) -> None:
        self._max_texts, self._max_pairs = max_texts, max_pairs
        self._rows: list[tuple] = []
        self._texts: dict[str, int] = {}
        self._pairs: dict[tuple[str, str], int] = {}
        self._pair_count = 0

    def __len__(self) -> int:
        return len(self._rows)

    def add_row(self, row: tuple) -> None:
        """PacketEvent's fields in its order, as a tuple: ts, iface, source, frame, src, sport, dst, dport, flags
        (the int of its six bits), seq, ack, payload_len, http, tls; ``http`` may be an HTTP/1 message's bytes up
        to its header block's end, which the receiver parses (http1.parse_http_start): parsed here, its header
        lines crossed as numbers that cost more to make than parsing them again there (its pairs' strings are
        shared by both ways, through the parser's cache of lines)."""
        self._rows.append(row)

    def put(self, ev: PacketEvent) -> None:
        self._rows.append(row_of(ev))

    def _names(self, column: tuple[str, ...], new: list[str]) -> list[int]:
        ids = list(map(self._texts.get, column))
        if None in ids:
            for k, i in enumerate(ids):
                if i is None:
                    text = column[k]
                    i = self._texts.get(text)
                    if i is None:
                        i = self._texts[text] = len(self._texts)
                        new.append(text)
                    ids[k] = i
        return ids

    def _pair(self, pair: tuple[str, str], new: list, once: list) -> int:
        i = self._pair_count
        self._pair_count += 1
        new.append(pair)
        if reusable(pair[0], len(pair[0]) + len(pair[1])):
            self._pairs[pair] = i
        else:
            once.append(i)
        return i

    def _header_ids(self, headers: tuple[tuple[str, str], ...], new: list, once: list) -> list[int]:
        ids = list(map(self._pairs.get, headers))
        if None in ids:  # a pair not sent yet (every request's id is one)
            for j, i in enumerate(ids):
                if i is None:
                    ids[j] = self._pair(headers[j], new, once)
        return ids

    def message(self) -> bytes:
        rows, self._rows = self._rows, []
        reset_texts = len(self._texts) >= self._max_texts
        if reset_texts:
            self._texts.clear()
        reset_pairs = self._pair_count >= self._max_pairs
        if reset_pairs:
            self._pairs.clear()
            self._pair_count = 0
        (ts, iface, source, frame, src, sport, dst, dport, flags, seq, ack, payload, http,
         tls) = zip(*rows) if rows else ((),) * 14
        new_texts: list[str] = []
        names = array("I")
        for column in (iface, source, src, dst):
            names.extend(self._names(column, new_texts))
        http_at, http_ids, http_counts = array("I"), array("I"), array("I")
        http_lines: list[str] = []
        http_rare: list[tuple] = []  # (event, raw lines, complete, raw owners) where not (), True, ()
        new_pairs: list[tuple[str, str]] = []
        once: list[int] = []
        header_ids = self._header_ids
        blocks_at, blocks = array("I"), []
        for k, h in enumerate(http):
            if h is None:
                continue
            if type(h) is bytes:  # a header block, parsed by the receiver (add_row)
                blocks_at.append(k)
                blocks.append(h)
                continue
            http_at.append(k)
            http_lines.append(h.start_line)
            ids = header_ids(h.headers, new_pairs, once)
            http_ids.extend(ids)
            http_counts.append(len(ids))
            if h.raw_header_lines or not h.complete or h.raw_owners:
                http_rare.append((k, h.raw_header_lines, h.complete, h.raw_owners))
        tls_at = [(k, _TLS_FIELDS(t)) for k, t in enumerate(tls) if t is not None]
        return marshal.dumps((
            reset_texts, new_texts, reset_pairs, new_pairs, once, array("d", ts).tobytes(),
            array("I", frame).tobytes(), array("I", seq).tobytes(), array("I", ack).tobytes(),
            array("H", sport).tobytes(), array("H", dport).tobytes(), array("I", payload).tobytes(),
            array("B", flags).tobytes(), names.tobytes(), http_at.tobytes(), http_lines, http_ids.tobytes(),
            http_counts.tobytes(), http_rare, blocks_at.tobytes(), blocks, tls_at))


def row_of(ev: PacketEvent) -> tuple:
    """A PacketEvent as the tuple of its fields that Packer.add_row takes (its flags an int)."""
    return (ev.ts, ev.iface, ev.source, ev.frame, ev.src, ev.sport, ev.dst, ev.dport, ev.flags._value_, ev.seq,
            ev.ack, ev.payload_len, ev.http, ev.tls)


def _column(data: bytes, code: str) -> list:
    return memoryview(data).cast(code).tolist() if data else []


class Unpacker:
    """The receiving side: ``take`` a message, each of its events to ``on_event`` in order."""

    def __init__(self, on_event: Callable[[PacketEvent], None]) -> None:
        self.on_event = on_event
        self._texts: list[str] = []
        self._pairs: list[tuple[str, str] | None] = []

    def take(self, body: bytes) -> int:
        """The events of one message, to ``on_event``; -> how many."""
        (reset_texts, new_texts, reset_pairs, new_pairs, once, ts, frame, seq, ack, sport, dport, payload, flags,
         names, http_at, http_lines, http_ids, http_counts, http_rare, blocks_at, blocks, tls) = marshal.loads(body)
        texts, pairs = self._texts, self._pairs
        if reset_texts:
            texts.clear()
        texts += new_texts
        if reset_pairs:
            pairs.clear()
        pairs += new_pairs
        frames = _column(frame, "I")
        n = len(frames)
        named = list(map(texts.__getitem__, _column(names, "I")))  # every interface, every source, src, dst
        https: list = [None] * n
        if http_lines:
            pair = pairs.__getitem__
            ids = _column(http_ids, "I")
            at = 0
            for k, line, count in zip(_column(http_at, "I"), http_lines, _column(http_counts, "I")):
                https[k] = HttpStart(line, tuple(map(pair, ids[at:at + count])))
                at += count
            for k, raw, complete, owners in http_rare:
                h = https[k]
                https[k] = HttpStart(h.start_line, h.headers, raw, complete, owners)
        for k, block in zip(_column(blocks_at, "I"), blocks):
            https[k] = parse_http_start(block)
        tlss: list = [None] * n
        for k, fields in tls:
            tlss[k] = TlsStart(*fields)
        events = starmap(PacketEvent, zip(
            _column(ts, "d"), named[:n], named[n:2 * n], frames, named[2 * n:3 * n], _column(sport, "H"),
            named[3 * n:], _column(dport, "H"), map(FLAGS.__getitem__, _column(flags, "B")), _column(seq, "I"),
            _column(ack, "I"), _column(payload, "I"), https, tlss))
        deque(map(self.on_event, events), maxlen=0)  # each event to on_event, in order, by C loops
        for i in once:  # not kept past the message (http1.reusable)
            pairs[i] = None
        return n
