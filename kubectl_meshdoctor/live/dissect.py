"""Many live capture streams, one dissector: every pod and interface of a watch shares one tshark.

A tshark holds ~160 MB (libwireshark's code and tables, whatever it reads), so one per stream put 100 of them,
~16 GB, on a laptop watching 50 pods. Every stream here is tcpdump's pcap (``-w -``), and the streams of a
watch have the same file header (Linux gives a pod's ``lo`` and ``eth0`` the Ethernet link type, and every
tcpdump the same snapshot length): so whole records of all of them, copied byte for byte and never re-encoded,
make one valid pcap stream under that header, and one tshark dissects it. A stream whose header differs (another
link type) gets a tshark of its own with its own header, in the same way.

Records go in as each stream's pump delivers them (a record is written only once whole), and with each one the
index of its stream, so tshark's frame number says which stream a line belongs to and which frame it is in that
stream: the n-th record of that pod/interface's tcpdump, the number its ``--write-pcap`` file and the spool have.
Every stream keeps its own frames, interface and pod. tshark writes summary columns, not ``-T fields`` (its CPU
6.2 -> 3.4 s on 300,313 live records: sources/tshark_columns.py), and a line's payload is read from its record,
held here until then. Source: the pcap format (draft-ietf-opsawg-pcap: a 24-byte
file header, 16-byte record headers with the captured length at offset 8).

dumpcap, which can read many pipes into one pcapng, was measured for this and dropped: it ends the capture as
soon as its last pipe ends, dropping what it still holds ("flushed"), and holds back records it has read until
its pipe is readable again (docs/DESIGN.md, the live path).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import sys
import termios
import threading
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.pcap_header import HEADER_LEN, RECORD_HEADER_LEN, pcap_header

from kubectl_meshdoctor.sources.prepass import MAX_FRAME
from kubectl_meshdoctor.sources.pipes import sized_pipe
from kubectl_meshdoctor.sources.pyshark_adapter import FieldsPipeCapture, tshark_complaint, tshark_version
from kubectl_meshdoctor.sources.tshark import PREFILTER, SESSION_PACKETS, TSHARK_ARGS, ReadResult
from kubectl_meshdoctor.sources.tshark_columns import COLUMN_ARGS, column_event

MAX_STREAMS = 255  # streams a tshark dissects: one byte of stream index a frame
PIPE_BYTES = 1 << 20  # the pipe into tshark holds this much (more batching when tshark lags)
# tshark's lines are read every OUTPUT_POLL_S while none wait, not as each comes (sources/pyshark_adapter.py
# PolledPipe): the capture pump hands records on every 20 ms (live/pump.py GATHER_S), so this adds at most as much.
OUTPUT_POLL_S = 0.02


class RecordSplitter:
    """A pcap byte stream fed piece by piece -> its file header and its whole records, in order. Raises
    ValueError for bytes that are not pcap."""

    def __init__(self) -> None:
        self.header: bytes | None = None
        self.records = 0  # whole records given so far
        self.error: str | None = None  # set at a record tshark would refuse: nothing more is given
        self._fmt = "<I"
        self._buf = b""  # bytes of a record (or of the header) not yet whole

    @property
    def pending(self) -> int:
        """Bytes held that are not a whole record yet (at the end of a stream: a record cut short)."""
        return len(self._buf)

    def feed(self, data: bytes) -> tuple[bytes, int, array]:
        """-> (the whole records completed by ``data``, joined; how many; where each starts in them). A record
        longer than tshark reads (262,144 bytes) would stop the tshark every stream shares: the stream ends
        before it (``error``)."""
        offsets = array("I")
        if self.error is not None:
            return b"", 0, offsets
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        if self.header is None:
            if n < HEADER_LEN:
                self._buf = buf
                return b"", 0, offsets
            header = pcap_header(buf[:HEADER_LEN])
            if header is None:
                raise ValueError("not a pcap stream")
            self._fmt, self.header, pos = header.u32, header.raw, HEADER_LEN
        start, count = pos, 0
        note = offsets.append
        while n - pos >= RECORD_HEADER_LEN:
            caplen = struct.unpack_from(self._fmt, buf, pos + 8)[0]
            if caplen > MAX_FRAME:
                self.error = (f"frame {self.records + count + 1} claims {caplen} bytes, more than tshark reads "
                              f"({MAX_FRAME}); the rest of the stream was not analysed")
                n = pos  # what follows is not read
                break
            end = pos + RECORD_HEADER_LEN + caplen
            if end > n:
                break
            note(pos - start)
            pos, count = end, count + 1
        self._buf = buf[pos:n] if self.error is None else b""
        self.records += count
        return (buf[start:pos] if count else b""), count, offsets


class _Ledger:
    """Which stream each frame of the dissected stream came from, each stream's own frame number, and the
    frame's pcap record (tshark's lines show only the first bytes of a payload: sources/tshark_columns.py).

    The writer appends one byte (the stream index) per record, and the records themselves, before tshark can
    read them; the reader asks for frames in increasing order, so what lies before the last asked frame is
    counted into each stream's total and dropped: memory is a byte per frame between two yielded ones, and the
    records written since the last yielded one. Those are what tshark has not read yet (its pipe: PIPE_BYTES)
    or has read and left out (its display filter: a few a connection on a live watch's lean capture), up to
    HELD_BYTES; past that the oldest go first (a line about one of those has its payload's first bytes only)."""

    PRUNE_AT = 1 << 20  # frames held before the oldest are counted and dropped
    HELD_BYTES = 64 << 20  # records held for lines not read yet

    def __init__(self, streams: int) -> None:
        self._ids = bytearray()
        self._base = 0  # global index (0-based) of _ids[0]
        self._counted = [0] * streams  # per stream: frames counted so far ...
        self._upto = [0] * streams  # ... among the global frames before this index
        # (global index of the first record, of the one after the last, the records joined, where each starts)
        self._held: deque[tuple[int, int, bytes, array]] = deque()
        self._held_bytes = 0
        self._written = 0  # records appended
        self._lock = threading.Lock()

    def append(self, ids: bytes, records: bytes, offsets: array) -> None:
        """Note ``ids`` (a stream index a record) and the records themselves (joined; ``offsets``: where each
        starts in ``records``)."""
        with self._lock:
            self._ids += ids
            first, self._written = self._written, self._written + len(ids)
            if len(offsets) == len(ids):
                self._held.append((first, self._written, records, offsets))
                self._held_bytes += len(records)
                while self._held_bytes > self.HELD_BYTES and len(self._held) > 1:
                    self._held_bytes -= len(self._held.popleft()[2])

    def frame(self, index: int) -> tuple[int, int, bytes | None, int, int] | None:
        """(stream, frame number in that stream, the records that hold its record or None, where it starts and
        ends in them) of global frame ``index`` (0-based), None if not written."""
        with self._lock:
            at = index - self._base
            if not 0 <= at < len(self._ids):
                return None
            s = self._ids[at]
            start = self._upto[s] - self._base
            self._counted[s] += self._ids.count(s, max(start, 0), at + 1)
            self._upto[s] = index + 1
            held = self._held
            while held and held[0][1] <= index:
                self._held_bytes -= len(held.popleft()[2])
            records, where, end = None, 0, 0
            if held and held[0][0] <= index:
                first, after, records, offsets = held[0]
                where = offsets[index - first]
                end = offsets[index - first + 1] if index + 1 < after else len(records)
            if at > self.PRUNE_AT:  # drop what no later question can need
                for t in range(len(self._counted)):
                    self._counted[t] += self._ids.count(t, max(self._upto[t] - self._base, 0), at)
                    self._upto[t] = max(self._upto[t], self._base + at)
                del self._ids[:at]
                self._base += at
            return s, self._counted[s], records, where, end


@dataclass(eq=False)
class Stream:
    """One pod interface's capture. ``source`` names it in evidence (``pod/iface``); ``on_event`` (called on the
    event loop) gets its packets in order, each with its frame number in this stream; ``result`` gets its
    ReadResult when its tshark is done (or the exception that ended that tshark).

    Its writer (a capture pump thread) calls ``wrote`` with every piece of the stream, then ``ended`` once."""

    source: str
    iface: str
    on_event: Callable[[PacketEvent], None]
    result: asyncio.Future
    dissector: "SharedDissector"
    splitter: RecordSplitter = field(default_factory=RecordSplitter)
    frames: int = 0  # whole records passed to tshark (the n-th is frame n of this stream)
    packets: int = 0
    last_frame: int = 0
    undissectable: int = 0
    undissectable_frames: list[int] = field(default_factory=list)
    payload_cut: int = 0  # frames whose payload was read from tshark's line alone (sources/tshark_columns.py)
    not_pcap: bool = False
    problem: str | None = None  # why the stream's bytes stopped being read before its end (its own, not tshark's)
    group: "_Group | None" = None
    index: int = -1  # in its group
    done: bool = False  # its writer has ended

    def wrote(self, data: bytes) -> None:
        """From the writer's thread: the next bytes of the stream. Never raises."""
        if self.not_pcap:
            return
        try:
            records, count, offsets = self.splitter.feed(data)
        except ValueError:
            self.not_pcap = True
            self.problem = "the capture stream is not pcap (tcpdump -w -): nothing of it was analysed"
            return
        if self.splitter.error is not None:
            self.problem = self.splitter.error
        if self.group is None and self.splitter.header is not None:
            self.dissector._join(self)
        if count and self.group is not None:
            self.group.write(self, records, count, offsets)

    def ended(self) -> None:
        """From the writer's thread: the stream is over (nothing more comes)."""
        self.dissector._ended(self)


class _Group:
    """One tshark and the streams of one pcap file header: records written into one pipe, each noted."""

    def __init__(self, header: bytes) -> None:
        self.header = header
        self.streams: list[Stream] = []
        self.ledger = _Ledger(MAX_STREAMS)
        self.lock = threading.Lock()
        self.read_fd, self.write_fd = sized_pipe(PIPE_BYTES)
        self.broken = False  # tshark went away: what comes is dropped (its end says why)
        self.closed = False
        self.task: asyncio.Task | None = None
        self._write(header)

    def full(self) -> bool:
        return len(self.streams) >= MAX_STREAMS

    def backlog(self) -> int:
        """Bytes written that tshark has not read yet (0 once its pipe is gone)."""
        buf = bytearray(4)
        try:
            fcntl.ioctl(self.read_fd, termios.FIONREAD, buf)
        except OSError:
            return 0
        return int.from_bytes(buf, sys.byteorder)

    def write(self, stream: Stream, records: bytes, count: int, offsets: array) -> None:
        with self.lock:  # the ledger's order is the pipe's order
            if self.broken or self.closed:
                return
            self.ledger.append(bytes((stream.index,)) * count, records, offsets)
            stream.frames += count
            self._write(records)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.write_fd, view):]  # blocks while tshark lags: back-pressure
        except OSError:
            self.broken = True

    def close_if_done(self) -> bool:
        """End tshark's input once every stream of the group has ended; True if it did now."""
        with self.lock:
            if self.closed or not all(s.done for s in self.streams):
                return False
            self.closed = True
            os.close(self.write_fd)
            return True


class _Lines:
    """tshark's summary lines (sources/tshark_columns.py) of the dissected stream -> each stream's PacketEvents,
    frames renumbered, payloads read from the records."""

    def __init__(self, streams: Sequence[Stream], ledger: _Ledger) -> None:
        self.streams, self.ledger = streams, ledger
        self.sessions = 0  # -M sessions before the current one
        self.seen_any = False

    def __call__(self, batch: bytes) -> None:
        for line in batch.decode("latin-1").split("\n"):
            if not line or line[0] in "|=":  # the io,stat table after the last packet
                continue
            cut = line.find("\t")
            number = line if cut < 0 else line[:cut]
            if not number.isdigit():
                continue
            if number == "1":
                self.sessions += self.seen_any
                self.seen_any = True
            where = self.ledger.frame(self.sessions * SESSION_PACKETS + int(number) - 1)
            if where is None:
                continue  # cannot be: the copier notes a block before tshark can read it
            s = self.streams[where[0]]
            ev = column_event(s, line, where[1], where[2], where[3], where[4])
            if ev is not None:
                s.on_event(ev)


class SharedDissector:
    """The streams of a watch, dissected together: one tshark for every stream whose pcap file header is the
    same (all of them, on Linux pods), started when the first of them has its header. A tshark's input ends
    once every stream in it has ended; a stream that starts after that gets a new one."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._groups: list[_Group] = []
        self._lock = threading.Lock()
        self.abandoned = False  # abandon() ended a tshark before its streams were read to their end

    def stream(self, source: str, iface: str, on_event: Callable[[PacketEvent], None]) -> Stream:
        """A new stream (on the event loop); hand its ``wrote`` and ``ended`` to its writer."""
        return Stream(source, iface, on_event, self._loop.create_future(), self)

    def _join(self, stream: Stream) -> None:
        """(writer's thread) ``stream``'s header has come: into the open group of that header, or a new one."""
        start = None
        with self._lock:
            for group in self._groups:
                with group.lock:
                    if (group.header == stream.splitter.header and not group.closed and not group.broken
                            and not group.full()):
                        stream.index = len(group.streams)
                        group.streams.append(stream)
                        stream.group = group
                        return
            start = _Group(stream.splitter.header)
            stream.index = 0
            start.streams.append(stream)
            stream.group = start
            self._groups.append(start)
        try:
            self._loop.call_soon_threadsafe(self._start, start)
        except RuntimeError:  # the event loop has closed: nothing will read it
            start.broken = True

    def _start(self, group: _Group) -> None:
        group.task = self._loop.create_task(_dissect(group))

    def _ended(self, stream: Stream) -> None:
        """(writer's thread) ``stream`` is over."""
        group = stream.group
        stream.done = True
        if group is not None:
            group.close_if_done()
        else:  # no header ever came (the capture failed, or it was not pcap): nothing to dissect
            try:
                self._loop.call_soon_threadsafe(_settle, stream.result,
                                                ReadResult(0, 0, False, stream.problem, None))
            except RuntimeError:  # the event loop has closed
                pass

    async def settle(self, streams: Sequence[Stream], grace_s: float) -> bool:
        """Wait until every stream in ``streams`` (each of them ended) has its result; False when a tshark they
        are in has read nothing for ``grace_s`` seconds while bytes waited for it (stalled: the caller
        abandons it). A tshark idle because other streams in it still run is waiting, not stalled."""
        loop = asyncio.get_running_loop()
        moved, last = loop.time(), None
        while True:
            pending = [s.result for s in streams if not s.result.done()]
            if not pending:
                return True
            groups = {id(s.group): s.group for s in streams if s.group is not None and not s.result.done()}
            backlog = sum(g.backlog() for g in groups.values())
            if backlog != last or (backlog == 0 and not all(g.closed for g in groups.values())):
                moved, last = loop.time(), backlog
            elif loop.time() - moved > grace_s:
                return False
            await asyncio.wait(pending, timeout=0.5)

    def abandon(self) -> None:
        """End every tshark now (one stalled); the results not yet set are cancelled."""
        for group in list(self._groups):
            if group.task is not None and not group.task.done():
                self.abandoned = True
                group.task.cancel()

    async def close(self) -> None:
        """Wait for every tshark to end (each ends when its streams have); their errors are in the results."""
        while True:
            tasks = [g.task for g in list(self._groups) if g.task is not None]
            pending = [t for t in tasks if not t.done()]
            if not pending:
                break
            await asyncio.wait(pending)
        for task in tasks:
            if not task.cancelled():
                task.exception()  # retrieved, so asyncio does not log it


def _settle(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


async def _dissect(group: _Group) -> None:
    """One tshark over ``group``'s pipe until its input ends; then every stream's result."""
    loop = asyncio.get_running_loop()
    capture = None
    try:
        await asyncio.to_thread(tshark_version, None)
        capture = FieldsPipeCapture(group.read_fd, output_args=COLUMN_ARGS, display_filter=PREFILTER,
                                     line_buffered=True, poll_s=OUTPUT_POLL_S,
                                     custom_parameters=list(TSHARK_ARGS) + ["-M", str(SESSION_PACKETS)],
                                     eventloop=loop)
        await capture.packets_from_tshark(_Lines(group.streams, group.ledger), close_tshark=True)
        error = await tshark_complaint(capture)
        killed_by = -capture.exit_status if capture.exit_status is not None and capture.exit_status < 0 else None
        for s in list(group.streams):
            why = s.problem or error
            if killed_by is not None:
                why = (f"killed by signal {killed_by} after frame {s.last_frame}; the rest of {s.source} was not "
                       f"analysed")
            _settle(s.result, ReadResult(s.packets, s.last_frame, bool(s.done and s.splitter.pending), why,
                                         None if killed_by or error else s.frames, killed_by, s.undissectable,
                                         tuple(s.undissectable_frames), s.payload_cut))
    except BaseException as exc:
        for s in list(group.streams):
            if not s.result.done():
                if isinstance(exc, asyncio.CancelledError):
                    s.result.cancel()
                else:
                    s.result.set_exception(exc)
        raise
    finally:
        # tshark is gone: its writers get EPIPE from now on, never a full pipe that nobody reads (one blocked on
        # it holds the group's lock until then).
        os.close(group.read_fd)
        with group.lock:
            group.broken = True
        if not group.closed:
            with group.lock:
                if not group.closed:
                    group.closed = True
                    os.close(group.write_fd)
