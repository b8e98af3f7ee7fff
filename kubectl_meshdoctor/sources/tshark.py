"""pcap/pcapng bytes -> tshark (run by pyshark) -> PacketEvents.

One reader per byte stream: a capture file opened read-only, or the read end of a pipe that a live tcpdump
stream is written into. Both go through ``tshark -r -`` so files and live captures share one code path.

Speed (bench/RESULTS.md): pyshark's own packet objects cost about 4x ``tshark -T fields`` (PYSHARK_NOTES.md), so
pyshark runs tshark and reads its stdout as it always does, but tshark writes only the fields the detectors read
(``-T fields``) and pyshark's output-parser hook hands them to us in batches of whole lines: no pyshark packet
object is built on the hot path. A display filter (PREFILTER) yields only the packets a detector can act on;
a display filter keeps the frame numbers of the user's file, unlike a BPF re-write.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from kubectl_meshdoctor.core.events import HttpStart, PacketEvent, TcpFlags, TlsStart

from .http1 import START_PREFIXES, parse_http_start
from .tls_records import RECORD_PREFIXES, TLS_BYTES_READ, parse_tls_start, starts_tls_record
from .pyshark_adapter import FieldsPipeCapture, tshark_complaint, tshark_version

# Column order of tshark's output; packet_from_fields() unpacks in this order.
FIELDS = ("frame.number", "frame.time_epoch", "frame.interface_name", "sll.hatype", "sll.ifindex",
          "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "tcp.srcport", "tcp.dstport", "tcp.flags",
          "tcp.seq_raw", "tcp.ack_raw", "tcp.len", "tcp.payload")
FIELD_ARGS = ("-n", "-T", "fields", *(a for f in FIELDS for a in ("-e", f)))  # tshark's output, in FIELDS' order


def _hex(prefix: bytes) -> str:
    return ":".join(f"{b:02x}" for b in prefix)


# The packets a detector can conclude anything from: connection set-up and tear-down (SYN, FIN, RST), the start
# of an HTTP/1 message (framing on lo; the request in a stale keep-alive race), the TLS records an mTLS hop shows
# without keys (a handshake or alert record, TLS 1.3's 19-byte encrypted alert: tls_records.RECORD_PREFIXES; a
# few a connection, never its application data), and pure ACKs of three kinds, by what tshark saw of the
# conversation before it (tcp.completeness: 1 SYN, 2 SYN-ACK, 4 ACK, 8 data, 16 FIN, 32 RST; tshark 4.0 in one
# pass shows the bits of the conversation's earlier packets): on a conversation whose SYN was seen but no SYN-ACK,
# a challenge ACK (RFC 5961 section 4); on a conversation that saw a FIN or RST and never a SYN, the ACK of a
# socket that outlived its connection (an RST too: one tshark reading lo and eth0 in one stream,
# sources/interleave.py, files the un-NATed FIN and the pod's RST on eth0 under the same address pair). The
# second is the reply half of a NATed connection on lo: conntrack restores the original destination as the
# source of the sidecar's packets, so tshark files them apart from the app's SYN to 127.0.0.1:15001 and sees no
# SYN there; a FIN-WAIT-2 socket answering a new SYN with the old connection's ACK is
# one (tuple-collision's outbound variant, tests/data/lab-outbound-stale-lo.pcap frames 8 and 24). It costs the
# ACKs that follow a FIN on such conversations: the last ACK of each teardown, a few a connection. tshark counts
# nothing of a conversation's first frame but a SYN, and every later frame with a flag adds a bit; so a pure ACK
# is kept too while the conversation shows none (completeness 0): the first two frames of a conversation whose
# SYN was not seen. That is the same stale ACK when the capture (or a new tshark, -M, sources/interleave.py)
# began after the old connection's FIN: its conversation starts with it.
# Full-size segments and the ACKs of established transfers, most of a busy pod's packets, are not yielded.
# Live, ``frame.number == 1`` also yields the first frame of every -M session, so a restart of the numbering is
# always seen (PREFILTER). A file has no sessions (FILE_PREFILTER): its frame 1 counts only as any other frame
# does, so one tshark reading several files or chunks in a row reports what one tshark a file does.
FILE_PREFILTER = ("tcp && (tcp.flags & 0x07 || (tcp.len > 0 && ("  # tshark 4.0: no byte strings in sets
             + " || ".join([f"tcp.payload[0:4] == {_hex(s)}" for s in START_PREFIXES]
                           + [f"tcp.payload[0:{len(s)}] == {_hex(s)}" for s in RECORD_PREFIXES])
             + ")) || (tcp.len == 0 && (tcp.completeness & 0x01) && !(tcp.completeness & 0x02))"
             " || (tcp.len == 0 && (tcp.completeness & 0x30) && !(tcp.completeness & 0x01))"
             " || (tcp.len == 0 && tcp.completeness == 0))"
             # A TCP packet tshark could not dissect to its flags (a header length under 20, a frame captured
             # short): yielded so that it is counted as undissectable and named, never silently dropped.
             " || ((ip.proto == 6 || ipv6.nxt == 6) && !tcp.flags)")
PREFILTER = "frame.number == 1 || " + FILE_PREFILTER  # && binds tighter than ||
ALL_TCP = "frame.number == 1 || tcp"

# A live stream never ends, so tshark resets its session state every SESSION_PACKETS packets (-M); it then
# numbers frames from 1 again and the shared dissector adds the packets of earlier sessions back. Files are read without
# -M: with these settings tshark keeps ~30 bytes a frame, while each reset leaks ~8-10 MB (measured with tshark
# 4.0 on a 630k-frame file: 178 MB without -M, 229 MB at -M 100000, 512 MB at -M 20000; bench/RESULTS.md).
SESSION_PACKETS = 1_000_000
TSHARK_ARGS = [
    "-o", "tcp.analyze_sequence_numbers:FALSE",
    "-o", "tcp.calculate_timestamps:FALSE",
    "-o", "tcp.desegment_tcp_streams:FALSE",
    "--disable-protocol", "http",  # we parse HTTP/1 start lines from tcp.payload ourselves, wire case intact
    # Every TCP port decodes as plain data: no port dissector or the ~80 TCP heuristic dissectors (HTTP's ports
    # were theirs once http is off) look at any payload. Output unchanged; tshark 10-25% faster on bench/gen
    # traffic for ~8 MB of decode-as table (bench/RESULTS.md). tcp.payload is the TCP dissector's own field.
    "-d", "tcp.port==1-65535,data",
    "-E", "occurrence=f",  # the outer header of a tunnel, as the rest of the pipeline expects
    # One io,stat interval over the whole input, printed after the last packet: how many frames tshark read in
    # all, filtered or not (the display filter hides them from us, not from its taps).
    "-z", "io,stat,0",
]


@dataclass(frozen=True, slots=True)
class ReadResult:
    """How a byte stream ended. ``cut_after_frame`` is set when the capture ended mid-packet (tcpdump killed):
    the last frame tshark read whole. ``error`` is tshark's last complaint, if any; ``killed_by`` the signal that
    ended tshark, if one did."""

    packets: int
    last_frame: int
    cut_short: bool
    error: str | None
    frames_read: int | None = None  # every frame tshark read, yielded or not (None if it did not say)
    killed_by: int | None = None
    # TCP frames tshark could dissect only in part: how many, and the numbers of the first MAX_NAMED of them.
    undissectable: int = 0
    undissectable_frames: tuple[int, ...] = ()
    # Live only: frames whose payload was read from tshark's line alone, its first bytes (sources/tshark_columns.py)
    payload_cut: int = 0


MAX_NAMED = 10  # undissectable frames named by number in a report; the rest are counted
# A TcpFlags for each value of the six flag bits, built once: constructing an IntFlag per packet is slow. The one
# table every reader of packets here uses (fast_events, interleave_fast, event_columns).
FLAGS = tuple(TcpFlags(v) for v in range(64))
IO_STAT_ROW = re.compile(r"\|\s*[\d.]+\s*<>\s*(?:[\d.]+|Dur)\s*\|\s*(\d+)\s*\|")
ARPHRD_LOOPBACK = "772"  # Linux hardware type of lo, in Linux cooked (SLL, SLL2) headers


def iface_of(name: str, hatype: str, ifindex: str, default_iface: str) -> str:
    """The interface a packet was captured on: the pcapng interface name, else from a Linux cooked header
    (``tcpdump -i any``, ksniff): lo by its hardware type (772) or interface index 1 (lo is always index 1 in
    a network namespace), any other device of a pod being its ``eth0``; else ``default_iface``."""
    if name and name not in ("any", "unknown"):  # tshark says "unknown" for an interface block without a name
        return name
    if hatype or ifindex:
        return "lo" if hatype == ARPHRD_LOOPBACK or ifindex == "1" else "eth0"
    return default_iface


class Undissectable(ValueError):
    """A TCP frame tshark could dissect only in part (a header length under 20 bytes, a frame captured shorter
    than its TCP header, as ``tcpdump -s 40`` makes): ``frame`` is its number in the stream."""

    def __init__(self, frame: int) -> None:
        super().__init__(f"frame {frame}: TCP that tshark could not dissect")
        self.frame = frame


def _frame(number: int, frame_map: Sequence[int] | None) -> int:
    """The user's frame number of the stream's frame ``number``: through ``frame_map`` when the stream holds
    only some of the file's records (sources/prepass.py), its item ``number - 1``."""
    if frame_map is None or not 0 < number <= len(frame_map):
        return number
    return frame_map[number - 1]


def packet_from_fields(line: str, source: str, default_iface: str, force_iface: bool = False,
                       frame_offset: int = 0, frame_map: Sequence[int] | None = None,
                       frame: int | None = None) -> PacketEvent | None:
    """One line of tshark ``-T fields`` output (FIELDS, tab-separated) as a PacketEvent; None for TCP that is
    not over IPv4/IPv6. ``force_iface`` puts every packet on ``default_iface`` (the user said ``FILE:IFACE``);
    ``frame_offset`` is added to tshark's frame number (the frames of earlier -M sessions), and the sum is then
    looked up in ``frame_map`` if one is given (see _frame). ``frame``, when given, is the event's frame number,
    whatever tshark's is (a stream of several files' records, which its reader maps back itself).

    Raises Undissectable for a TCP frame whose fields tshark left empty or unreadable."""
    try:
        return _packet(line, source, default_iface, force_iface, frame_offset, frame_map, frame)
    except (ValueError, IndexError):
        if frame is not None:
            raise Undissectable(frame) from None
        number = line.split("\t", 1)[0]
        raise Undissectable(_frame(int(number) + frame_offset, frame_map)
                            if number.isascii() and number.isdigit() else 0) from None


def counted_event(stream, line: str, frame: int) -> PacketEvent | None:
    """A live stream's tshark line as its PacketEvent at ``frame``, counted in ``stream`` (anything with
    ``source``, ``iface``, ``packets``, ``last_frame``, ``undissectable`` and ``undissectable_frames``, the
    first MAX_NAMED of them named); None for a line that is no packet event, or a frame tshark could not
    dissect (counted as such)."""
    try:
        ev = packet_from_fields(line, stream.source, stream.iface, force_iface=True, frame=frame)
    except Undissectable as e:
        stream.undissectable += 1
        if len(stream.undissectable_frames) < MAX_NAMED:
            stream.undissectable_frames.append(e.frame)
        return None
    if ev is not None:
        stream.packets += 1
        stream.last_frame = frame
    return ev


_HEADER_END = "0d0a0d0a"  # CRLF CRLF in tshark's hex (tshark 4 writes bytes fields without separators)


def _header_block(payload: str) -> bytes:
    """The bytes of tshark's hex ``payload`` up to its first CRLF CRLF at a byte boundary (the parser reads no
    further), or all of them."""
    if payload[2:3] == ":":  # tshark 3 separated the bytes with colons
        payload = payload.replace(":", "")
    end = payload.find(_HEADER_END)
    while end > 0 and end & 1:  # inside a byte: 0xX0 0xD0 0xA0 0xD0 0xAY read as hex text
        end = payload.find(_HEADER_END, end + 1)
    return bytes.fromhex(payload if end < 0 else payload[:end + 8])


def tcp_ends(sport: str, src: str, dst: str, src6: str, dst6: str) -> tuple[str, str] | None:
    """A TCP packet's (source, destination) from tshark's tcp.srcport, ip.src, ip.dst, ipv6.src and ipv6.dst:
    IPv4's, else IPv6's; None for no TCP (a session's first frame, yielded for its number) or neither address.
    Interned: a pod talks with few addresses, so one string each, not two new ones a packet (memory while the
    time merge holds events back)."""
    if not sport:
        return None
    if not src:
        if not src6:
            return None
        src, dst = src6, dst6
    return sys.intern(src), sys.intern(dst)


def _packet(line: str, source: str, default_iface: str, force_iface: bool, frame_offset: int,
            frame_map: Sequence[int] | None, frame: int | None) -> PacketEvent | None:
    (number, ts, name, hatype, ifindex, src, dst, src6, dst6, sport, dport, flags, seq, ack, length,
     payload) = line.split("\t")
    ends = tcp_ends(sport, src, dst, src6, dst6)
    if ends is None:
        return None
    src, dst = ends
    payload_len = int(length) if length else 0
    http: HttpStart | None = None
    tls: TlsStart | None = None
    if payload_len and payload:
        if payload[2:3] == ":":  # tshark 3 separated the bytes with colons
            payload = payload.replace(":", "")
        if starts_tls_record(payload):  # a few records a connection (hellos, alerts): whole, never app data
            tls = parse_tls_start(bytes.fromhex(payload[:2 * TLS_BYTES_READ]))
        else:
            http = parse_http_start(_header_block(payload))  # the body is never read: not converted either
    if frame is None:
        frame = int(number) + frame_offset if frame_map is None else _frame(int(number) + frame_offset, frame_map)
    # Positional, in PacketEvent's field order: cheaper than thirteen keywords, once a packet.
    return PacketEvent(float(ts), default_iface if force_iface else iface_of(name, hatype, ifindex, default_iface),
                       source, frame, src, int(sport), dst, int(dport), FLAGS[int(flags, 16) & 0x3F], int(seq),
                       int(ack), payload_len, http, tls)


async def read_stream(fd: int, source: str, iface: str, on_event: Callable[[PacketEvent], None],
                      force_iface: bool = False, prefilter: bool = True,
                      gate: Callable[[], Awaitable[None]] | None = None, frame_offset: int = 0,
                      frame_map: Sequence[int] | None = None) -> ReadResult:
    """Read pcap/pcapng bytes from ``fd`` until EOF, calling ``on_event`` for each TCP packet in order.

    ``fd`` is owned (closed) by this call. ``source`` names the stream in evidence (a file name or
    ``pod/iface``); ``iface`` is used when the capture does not name the interface itself, or always with
    ``force_iface``. A live stream goes through live/dissect.py instead (one tshark for every stream).
    ``prefilter``: only the packets FILE_PREFILTER keeps (the detectors' findings are the same; counts are of those).
    ``gate`` is awaited before each read of tshark's output (back-pressure from merge_by_time).
    ``frame_offset`` is added to every frame number (a chunk of a larger file: the frames before it);
    ``frame_map`` then maps it to the user's (the stream holds some of the file's records: sources/prepass.py).
    Raises pyshark's TSharkCrashException when tshark dies for another reason than the end of its input.
    """
    await asyncio.to_thread(tshark_version, None)  # `tshark -v` once, off the event loop (a screen may run there)
    args = list(TSHARK_ARGS)
    # Our running loop, given: without one, pyshark installs a new SafeChildWatcher for every capture, and a
    # tshark started under the previous watcher is then reaped by nobody ("Unknown child process pid N, will
    # report returncode 255" when chunks are read one after another).
    capture = FieldsPipeCapture(fd, output_args=FIELD_ARGS, display_filter=FILE_PREFILTER if prefilter else ALL_TCP,
                                 custom_parameters=args, gate=gate,
                                 eventloop=asyncio.get_running_loop())
    count = 0
    last = 0
    frames_read: int | None = None
    undissectable: list[int] = []
    skipped = 0

    def handle(batch: bytes) -> None:
        nonlocal count, last, frames_read, skipped
        for line in batch.decode("latin-1").split("\n"):
            if not line:
                continue
            if line[0] in "|=":  # the io,stat table after the last packet
                m = IO_STAT_ROW.match(line)
                if m:
                    frames_read = int(m.group(1))
                continue
            try:
                ev = packet_from_fields(line, source, iface, force_iface, frame_offset, frame_map)
            except Undissectable as e:  # counted and named, never the end of the run
                skipped += 1
                if len(undissectable) < MAX_NAMED:
                    undissectable.append(e.frame)
                continue
            if ev is not None:
                count += 1
                last = ev.frame
                on_event(ev)

    try:
        await capture.packets_from_tshark(handle, close_tshark=True)
    finally:
        error = await tshark_complaint(capture)
        try:
            os.close(fd)  # PipeCapture.close() would also close it, but it runs its own event loop
        except OSError:
            pass
    killed_by = None
    if capture.exit_status is not None and capture.exit_status < 0:  # the OOM killer, a kill -9: say so
        killed_by = -capture.exit_status
        error = f"killed by signal {killed_by} after frame {last}; the rest of {source} was not analysed"
    cut = bool(error and "cut short" in error)
    return ReadResult(count, last, cut, error, frames_read, killed_by, skipped, tuple(undissectable))


async def read_file(path: str, source: str, iface: str, on_event: Callable[[PacketEvent], None],
                    force_iface: bool = False, prefilter: bool = True,
                    gate: Callable[[], Awaitable[None]] | None = None, frame_offset: int = 0,
                    frame_map: Sequence[int] | None = None) -> ReadResult:
    """``read_stream`` over a capture file. Raises OSError when it cannot be opened."""
    return await read_stream(os.open(path, os.O_RDONLY), source, iface, on_event, force_iface,
                             prefilter=prefilter, gate=gate, frame_offset=frame_offset, frame_map=frame_map)
