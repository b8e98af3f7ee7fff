"""pcap/pcapng bytes -> tshark (through pyshark, EK mode) -> PacketEvents.

One reader per byte stream: a capture file opened read-only, or the read end of a pipe that a live tcpdump
stream is written into. Both go through ``tshark -r -`` so files and live captures share one code path.
Measured (PYSHARK_NOTES.md): EK is the fastest mode pyshark can parse; a display filter keeps the frame numbers
of the user's file, unlike a BPF re-write; ``-M`` bounds tshark's own session memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from pyshark.capture.pipe_capture import PipeCapture

from ..events import HttpStart, PacketEvent, TcpFlags
from .http1 import parse_http_start

# What the detectors read: TCP only. Analyses they never read are switched off to save tshark time.
DISPLAY_FILTER = "tcp"
TSHARK_ARGS = [
    "-M", "100000",  # reset tshark's session state every 100k packets: flat memory on endless captures
    "-o", "tcp.analyze_sequence_numbers:FALSE",
    "-o", "tcp.calculate_timestamps:FALSE",
    "-o", "tcp.desegment_tcp_streams:FALSE",
    "--disable-protocol", "http",  # we parse HTTP/1 start lines from tcp.payload ourselves, wire case intact
]


class _EkPipeCapture(PipeCapture):
    """PipeCapture in EK output mode: pyshark offers ``use_ek`` only on other capture classes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._use_ek = True

    def close(self) -> None:
        # packets_from_tshark already ended tshark and read_stream closes the fd once. The inherited close()
        # (also run from __del__) would start an event loop, which fails inside ours, and close the fd number
        # again, by then possibly another stream's.
        pass


@dataclass(frozen=True, slots=True)
class ReadResult:
    """How a byte stream ended. ``cut_after_frame`` is set when the capture ended mid-packet (tcpdump killed):
    the last frame tshark read whole. ``error`` is tshark's last complaint, if any."""

    packets: int
    last_frame: int
    cut_short: bool
    error: str | None


def _flags(hexstr: str) -> TcpFlags:
    return TcpFlags(int(hexstr, 16) & 0x3F)


ARPHRD_LOOPBACK = "772"  # Linux hardware type of lo, in Linux cooked (SLL, SLL2) headers


def _iface_of(layers, frame: dict, default_iface: str) -> str:
    """The interface a packet was captured on: the pcapng interface name, else from a Linux cooked header
    (``tcpdump -i any``, ksniff): lo by its hardware type (772) or interface index 1 (lo is always index 1 in
    a network namespace), any other device of a pod being its ``eth0``; else ``default_iface``."""
    name = frame.get("frame_frame_interface_name")
    if name and name not in ("any", "unknown"):  # tshark says "unknown" for an interface block without a name
        return name
    sll = getattr(layers, "sll", None)
    if sll is not None:
        d = sll._fields_dict
        if d.get("sll_sll_hatype") == ARPHRD_LOOPBACK or d.get("sll_sll_ifindex") == "1":
            return "lo"
        return "eth0"
    return default_iface


def packet_to_event(layers, source: str, default_iface: str, force_iface: bool = False) -> PacketEvent | None:
    """Normalize one pyshark EK packet; None for packets without TCP over IPv4/IPv6.

    ``force_iface`` puts every packet on ``default_iface`` (the user said ``FILE:IFACE``)."""
    # pyshark's public get_field() walks prefixes and casts per call; the raw EK dict is the same data, cheaper.
    frame = layers.frame_info._fields_dict
    try:
        tcp = layers.tcp._fields_dict
    except AttributeError:
        return None
    ip_layer = getattr(layers, "ip", None)
    if ip_layer is not None:
        ipd = ip_layer._fields_dict
        src, dst = ipd["ip_ip_src"], ipd["ip_ip_dst"]
    else:
        ipv6 = getattr(layers, "ipv6", None)
        if ipv6 is None:
            return None
        ipd = ipv6._fields_dict
        src, dst = ipd["ipv6_ipv6_src"], ipd["ipv6_ipv6_dst"]
    iface = default_iface if force_iface else _iface_of(layers, frame, default_iface)
    payload_len = int(tcp.get("tcp_tcp_len", 0))
    http: HttpStart | None = None
    if payload_len:
        payload_hex = tcp.get("tcp_tcp_payload")
        if isinstance(payload_hex, str):
            http = parse_http_start(bytes.fromhex(payload_hex.replace(":", "")))
    return PacketEvent(
        ts=float(frame["frame_frame_time_epoch"]),
        iface=iface,
        source=source,
        frame=int(frame["frame_frame_number"]),
        src=src,
        sport=int(tcp["tcp_tcp_srcport"]),
        dst=dst,
        dport=int(tcp["tcp_tcp_dstport"]),
        flags=_flags(tcp["tcp_tcp_flags"]),
        seq=int(tcp["tcp_tcp_seq_raw"]),
        ack=int(tcp["tcp_tcp_ack_raw"]),
        payload_len=payload_len,
        http=http,
    )


async def read_stream(fd: int, source: str, iface: str, on_event: Callable[[PacketEvent], None],
                      force_iface: bool = False) -> ReadResult:
    """Read pcap/pcapng bytes from ``fd`` until EOF, calling ``on_event`` for each TCP packet in order.

    ``fd`` is owned (closed) by this call. ``source`` names the stream in evidence (a file name or
    ``pod/iface``); ``iface`` is used when the capture does not name the interface itself, or always with
    ``force_iface``.
    Raises pyshark's TSharkCrashException when tshark dies for another reason than the end of its input.
    """
    capture = _EkPipeCapture(fd, display_filter=DISPLAY_FILTER, custom_parameters=list(TSHARK_ARGS))
    count = 0
    last = 0

    def handle(pkt) -> None:
        nonlocal count, last
        ev = packet_to_event(pkt, source, iface, force_iface)
        if ev is not None:
            count += 1
            last = ev.frame
            on_event(ev)

    try:
        await capture.packets_from_tshark(handle, close_tshark=True)
    finally:
        # tshark's stderr is drained by a pyshark task; its last line says why tshark stopped early.
        for task in list(getattr(capture, "_stderr_handling_tasks", [])):
            try:
                await task
            except Exception:  # the task ends with the process; its errors are not ours to raise
                pass
        error = getattr(capture, "_last_error_line", None)
        try:
            os.close(fd)  # PipeCapture.close() would also close it, but it runs its own event loop
        except OSError:
            pass
    cut = bool(error and "cut short" in error)
    return ReadResult(count, last, cut, error if error and "Running as user" not in error else None)


async def read_file(path: str, source: str, iface: str, on_event: Callable[[PacketEvent], None],
                    force_iface: bool = False) -> ReadResult:
    """``read_stream`` over a capture file. Raises OSError when it cannot be opened."""
    return await read_stream(os.open(path, os.O_RDONLY), source, iface, on_event, force_iface)
