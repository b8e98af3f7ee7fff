"""Several capture files through one tshark: the pre-pass's kept records of every file, merged in capture-time
order into one pcap stream on a pipe, copied as the pre-pass gives them (byte for byte, an HTTP/1 start cut after
its header block) under one file header.

Read one after the other in chunks, two files cost a tshark start a chunk (~0.2 s, 30 of them at 1M packets),
and the time merge held a chunk of one file while the other waited for the one tshark. Here one thread runs the
pre-pass of every file (prepass.kept_records), merges their kept records by time (ties by the order the files
were given, as sources/merge.py orders events) and writes them into tshark's stdin, and one tshark reads the
whole stream while the pipeline parses what it prints: the two run at once, and no chunk is written to disk.
(Each pass in a thread of its own cost more CPU than it saved: the threads took turns holding the GIL.)
With each record the merger notes its file and frame, so every line maps back to its file's frame number.

Only plain pcap files that agree on byte order, time unit and link type can share a stream (one file header);
the rest are read as before (sources/read_plan.py). A record longer than tshark reads ends its file there, with a
problem that says so (tshark alone stops there too). Source: the pcap format (draft-ietf-opsawg-pcap).
"""

from __future__ import annotations

import asyncio
import heapq
import os
import struct
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.pcap_header import HEADER_LEN, RECORD_HEADER_LEN, PcapHeader, pcap_header

from . import prepass
from .fast_events import epoch
from .fastpath import fastpath_wanted
from .http1 import parse_http_start
from .interleave_fast import DRAIN, FastReader, RealStream, kept_segments, merge_fast
from .pyshark_adapter import FieldsPipeCapture, tshark_complaint, tshark_version
from .tshark import (FIELD_ARGS, FILE_PREFILTER, FLAGS, MAX_NAMED, TSHARK_ARGS, ReadResult, Undissectable,
                     packet_from_fields)

_WRITE = 1 << 18  # bytes the merger writes into tshark's pipe at a time
_READ = 1 << 18  # bytes each file's pass reads at a time (two files at once: their copies add up)
# Records a tshark reads before the next one takes over: tshark keeps ~100 bytes a frame it has read, so one
# tshark for a whole 1M-packet capture's 366k kept records peaked ~35 MB above one that started fresh every
# SESSION_RECORDS (bench/RESULTS.md); a start costs ~0.2 s.
SESSION_RECORDS = 60_000
# A new tshark knows nothing of the connections in flight, and PREFILTER's challenge-ACK test needs the SYN that
# came before (tcp.completeness): it first reads again the last REPLAY_RECORDS records the last one read, whose
# lines are dropped (their file index is REPLAY).
REPLAY_RECORDS = 2_000
REPLAY = 255


def interleavable(paths: Sequence[str]) -> bytes | None:
    """The file header of one stream that can hold every file of ``paths``, or None: two or more plain pcap
    files (not gzip, not pcapng) of one byte order, time unit and link type the pre-pass walks, each with a
    record header at least. The header of the largest snapshot length is the stream's."""
    heads: list[PcapHeader] = []
    for path in paths:
        try:
            with open(path, "rb") as fh:
                head = fh.read(HEADER_LEN + RECORD_HEADER_LEN)
        except OSError:
            return None
        header = pcap_header(head)
        if len(head) < HEADER_LEN + RECORD_HEADER_LEN or header is None:
            return None
        heads.append(header)
    if not 2 <= len(heads) < REPLAY or len({(h.order, h.nanoseconds, h.network) for h in heads}) != 1:
        return None
    if heads[0].network >> 16 or heads[0].link_type not in prepass.LINKS:
        return None
    return max(heads, key=lambda h: h.snaplen).raw


def _time_key(order: str, nanoseconds: bool) -> Callable[[memoryview], float]:
    """A record's place in the time merge, from its header: the order tshark's times give (frame.time_epoch as a
    float, what the time merge compares): exact in microseconds; nanoseconds as the float they read as."""
    ts = struct.Struct(order + "II").unpack_from
    if not nanoseconds:
        def key(data) -> float:
            sec, frac = ts(data, 0)
            return sec * 1_000_000 + frac
        return key

    def key_ns(data) -> float:
        sec, frac = ts(data, 0)
        # a damaged fraction (a second or more) reads as its text does, digits run on
        return epoch(sec, frac) if frac < 1_000_000_000 else float(f"{sec}.{frac:09d}")
    return key_ns


class _Ledger:
    """(file index, frame) of each record in the stream, by its place; what tshark has passed is dropped."""

    def __init__(self) -> None:
        self.files = bytearray()
        self.frames = array("I")
        self.base = 0
        self.lock = threading.Lock()

    def add(self, files: bytes, frames: array) -> None:
        with self.lock:
            self.files += files
            self.frames += frames

    def at(self, index: int) -> tuple[int, int]:
        with self.lock:
            at = index - self.base
            where = self.files[at], self.frames[at]
            if at > 1 << 16:  # a memmove of what is left, at most what tshark has not read yet: small
                del self.files[:at]
                del self.frames[:at]
                self.base += at
            return where


async def read_interleaved(paths: Sequence[str], sources: Sequence[str], ifaces: Sequence[str],
                           forced: Sequence[bool], header: bytes, on_event: Callable[[PacketEvent], None],
                           make_event: Callable = PacketEvent, flags: Sequence = FLAGS,
                           http_start: Callable[[bytes], object] = parse_http_start) -> list[ReadResult]:
    """Read capture files ``paths`` (headed as ``interleavable`` said: ``header``) through one tshark, in
    capture-time order, into ``on_event``; each file's events carry its ``sources``/``ifaces`` entry
    (``forced``: on every packet). -> a ReadResult per file, ``frames_read`` its whole records. Raises OSError
    when a file cannot be read. The fast path's events are what ``make_event`` makes of PacketEvent's arguments
    (the flags as ``flags[bits]``, the HTTP/1 start as ``http_start`` makes it of the header block's bytes;
    sources/reader_process.py packs them for another process); tshark's are PacketEvents."""
    head = pcap_header(header)
    if head is None:
        raise ValueError("not a pcap file header")
    stop = threading.Event()
    passes: list = [None] * len(paths)
    ledger = _Ledger()
    loop = asyncio.get_running_loop()
    sessions: asyncio.Queue = asyncio.Queue()  # (read_fd, records before it) of each tshark's pipe; None: done
    errors: list[BaseException] = []
    damaged: list[str | None] = [None] * len(paths)
    key = _time_key(head.order, head.nanoseconds)
    fast = fastpath_wanted()

    def kept(i: int) -> Iterator[tuple]:
        """File ``i``'s kept records as (time key, i, frame, record), its pass run by whoever takes them."""
        try:
            with open(paths[i], "rb") as fh:
                own = pcap_header(fh.read(HEADER_LEN))  # interleavable() read it: only a file changed since is None
                if own is None:
                    pass
                elif fast:  # each record read once, for its verdict and its event
                    passes[i] = yield from kept_segments(
                        fh, own, stop, lambda data, frame, seen: (key(data), i, frame, data, seen), _READ)
                else:
                    passes[i] = yield from prepass.kept_records(
                        fh, own, stop, lambda data, frame: (key(data), i, frame, bytes(data)), _READ)
        except prepass.Stopped:
            pass
        except prepass.Damaged as e:  # what came before it is in the stream: the file ends there
            frame, caplen = e.args
            damaged[i] = (f"frame {frame + 1} claims {caplen} bytes, more than tshark reads ({prepass.MAX_FRAME}): "
                          f"the capture is damaged there; analysed up to frame {frame}")
        except GeneratorExit:  # the merger stopped early: no error of this file's
            raise
        except BaseException as e:  # handed to the caller
            errors.append(e)
            stop.set()

    fast_queue: deque = deque()
    real = RealStream(header, ledger, lambda item: loop.call_soon_threadsafe(sessions.put_nowait, item), REPLAY,
                      SESSION_RECORDS)

    def merge_with_fast_path() -> None:
        try:
            merge_fast(heapq.merge(*map(kept, range(len(paths)))), head, real, fast_queue, stop,
                       lambda place: loop.call_soon_threadsafe(sessions.put_nowait, (DRAIN, place)),
                       SESSION_RECORDS, REPLAY_RECORDS, http_start)
        except OSError:  # tshark went away: its end says why
            stop.set()
        finally:
            if real.fd >= 0:  # stopped: the reader hands on what came before
                real.ends.append(real.written)
                os.close(real.fd)
                real.fd = -1
            loop.call_soon_threadsafe(sessions.put_nowait, None)

    def merge() -> None:
        out, files, frames = bytearray(), bytearray(), array("I")
        write_fd, written, in_session = -1, 0, 0
        recent: deque[bytes] = deque(maxlen=min(REPLAY_RECORDS, SESSION_RECORDS))
        try:
            for _, index, frame, data in heapq.merge(*map(kept, range(len(paths)))):
                if write_fd < 0 or in_session >= SESSION_RECORDS:
                    if write_fd >= 0:
                        _flush(write_fd, out, files, frames)
                        os.close(write_fd)
                    read_fd, write_fd = os.pipe()
                    loop.call_soon_threadsafe(sessions.put_nowait, (read_fd, written))
                    os.write(write_fd, header)
                    in_session = 0
                    for old in recent:  # the new tshark's TCP state, from what the last one read last
                        files.append(REPLAY)
                        frames.append(0)
                        out += old
                        written += 1  # not counted in the session: it holds SESSION_RECORDS new ones
                recent.append(data)
                files.append(index)
                frames.append(frame)
                out += data
                written += 1
                in_session += 1
                if len(out) >= _WRITE:
                    _flush(write_fd, out, files, frames)
                if stop.is_set():
                    return
            if write_fd >= 0:
                _flush(write_fd, out, files, frames)
        except OSError:  # tshark went away: its end says why
            stop.set()
        finally:
            if write_fd >= 0:
                os.close(write_fd)
            loop.call_soon_threadsafe(sessions.put_nowait, None)

    def _flush(write_fd: int, out: bytearray, files: bytearray, frames: array) -> None:
        ledger.add(bytes(files), frames)  # before tshark can read them
        data = bytes(out)
        del out[:], files[:], frames[:]
        while data:
            data = data[os.write(write_fd, data):]

    threads = [threading.Thread(target=merge_with_fast_path if fast else merge, name="interleave", daemon=True)]
    packets = [0] * len(paths)
    last = [0] * len(paths)
    bad = [0] * len(paths)
    named: list[list[int]] = [[] for _ in paths]
    base = 0  # records in the stream before the current tshark's first
    reader = FastReader(fast_queue, sources, ifaces, forced, on_event, packets, last, make_event, flags)

    def handle(batch: bytes) -> None:
        for line in batch.decode("latin-1").split("\n"):
            if not line or line[0] in "|=":
                continue
            cut = line.find("\t")
            number = line if cut < 0 else line[:cut]
            if not number.isdigit():
                continue
            place = base + int(number) - 1
            if fast:
                reader.upto(place)  # the fast path's events before this record, in the stream's order
            i, frame = ledger.at(place)
            if i == REPLAY:
                continue
            try:
                ev = packet_from_fields(line, sources[i], ifaces[i], forced[i], frame=frame)
            except Undissectable as e:
                bad[i] += 1
                if len(named[i]) < MAX_NAMED:
                    named[i].append(e.frame)
                continue
            if ev is not None:
                packets[i] += 1
                last[i] = ev.frame
                on_event(ev)

    error = None
    read_fd = -1
    for t in threads:
        t.start()
    ended = 0  # tsharks that have ended (fast path: real.ends)
    asked = False  # tshark's version
    try:
        while (session := await sessions.get()) is not None:
            if session[0] == DRAIN:
                reader.upto(session[1])
                continue
            read_fd, base = session
            if not asked:
                # `tshark -v` once (pyshark's cache), off the loop, before the first tshark reads: ~0.2 s and ~160
                # MB of RSS (its dissector tables), as much as the rest of analyze; a read the fast path makes
                # alone asks nothing of tshark, as read_plan's fast path of one file does not
                await asyncio.to_thread(tshark_version, None)
                asked = True
            capture = FieldsPipeCapture(read_fd, output_args=FIELD_ARGS, display_filter=FILE_PREFILTER,
                                         custom_parameters=list(TSHARK_ARGS), eventloop=loop)
            await capture.packets_from_tshark(handle, close_tshark=True)
            os.close(read_fd)
            read_fd = -1
            complaint = await tshark_complaint(capture)  # always: it drains tshark's stderr
            error = error or complaint
            if fast:
                reader.upto(real.ends[ended] if ended < len(real.ends) else float("inf"))
                ended += 1
        reader.upto(float("inf"))
    finally:
        stop.set()
        if read_fd >= 0:
            os.close(read_fd)  # a merger blocked on the full pipe gets EPIPE
        while not sessions.empty():  # pipes the merger opened that no tshark read
            left = sessions.get_nowait()
            if left is not None and left[0] != DRAIN:
                os.close(left[0])
        for t in threads:
            await asyncio.to_thread(t.join)
    if errors:
        raise errors[0]
    results = []
    for i, p in enumerate(passes):  # p: (whole records, kept records, cut short) as prepass.kept_records gives
        records = p[0] if p is not None else None
        why = damaged[i] or (error if p is not None else "no whole record in the file")
        results.append(ReadResult(packets[i], last[i], bool(p and p[2]), why, records, None, bad[i],
                                  tuple(named[i])))
    return results
