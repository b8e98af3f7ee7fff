"""tshark run in the debug container (``watch --dissect pod``): its ``-T fields`` lines cross the exec stream.

The shared dissector (live/dissect.py) runs one tshark on the user's machine for every stream; here each
stream's tshark runs beside its tcpdump in the pod, so the dissection's CPU (~26-55 us a packet, measured in
bench/RESULTS.md) is spent on the pod's node, and only the lines of the packets a detector reads (PREFILTER)
leave it. The price is the pod's: a tshark holds ~160 MB, charged to the pod's memory cgroup, and no pcap bytes
reach this machine (no spool, no ``--write-pcap``).

A pump thread hands each piece of the stream to ``PodFieldStream.wrote``; whole lines are parsed there, into
PacketEvents, and handed to the event loop in one call a piece. The frame numbers are tshark's, which reads
tcpdump's records in order: the n-th record of that pod/interface's tcpdump is frame n, as in a local watch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.loop_handoff import LoopHandoff

from kubectl_meshdoctor.sources.tshark import (
    FIELD_ARGS,
    IO_STAT_ROW,
    PREFILTER,
    SESSION_PACKETS,
    TSHARK_ARGS,
    ReadResult,
    counted_event,
)

# Events handed to the event loop and not yet fed: past this the pump waits (and with it tcpdump, whose kernel
# buffer then counts drops), as a full pipe into a local tshark would make it.
MAX_PENDING = 20_000
_WAIT_S = 0.5  # how often a waiting pump looks whether the event loop is still there


def pod_tshark_args() -> list[str]:
    """tshark's arguments in the pod, less its input (``-r FILE``, which the capture script adds): the fields,
    filter and settings of a local watch's tshark, a line flushed a packet."""
    return [*FIELD_ARGS, "-l", "-Y", PREFILTER, *TSHARK_ARGS, "-M", str(SESSION_PACKETS)]


class PodFieldStream:
    """One pod interface's tshark lines -> PacketEvents for ``on_event`` (called on ``loop``), in order; ``result``
    gets the stream's ReadResult once its writer has called ``ended``. ``source`` names it in evidence
    (``pod/iface``)."""

    def __init__(self, source: str, iface: str, on_event: Callable[[PacketEvent], None],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.source, self.iface, self.on_event, self._loop = source, iface, on_event, loop
        self.result: asyncio.Future = loop.create_future()
        self.packets = 0
        self.last_frame = 0
        self.frames_read: int | None = None  # tshark's io,stat count at the end (every frame it read)
        self.undissectable = 0
        self.undissectable_frames: list[int] = []
        self._rest = b""  # a line not yet whole
        self._sessions = 0  # -M sessions before the current one
        self._seen_any = False
        self._handoff: LoopHandoff[PacketEvent] = LoopHandoff(loop, self._on, MAX_PENDING, _WAIT_S)

    def wrote(self, data: bytes) -> None:
        """From the writer's thread: the next bytes of tshark's output. Never raises."""
        buf = self._rest + data if self._rest else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._rest = buf
            return
        self._rest = buf[cut + 1:]
        events = self._parse(buf[:cut].decode("latin-1").split("\n"))
        if events:
            self._handoff.hand_on(events)

    def ended(self) -> None:
        """From the writer's thread: the stream is over. A last line without its newline was cut short."""
        result = ReadResult(self.packets, self.last_frame, bool(self._rest), None, self.frames_read, None,
                            self.undissectable, tuple(self.undissectable_frames))
        try:
            self._loop.call_soon_threadsafe(self._settle, result)
        except RuntimeError:  # the event loop has closed
            pass

    def _parse(self, lines: list[str]) -> list[PacketEvent]:
        events = []
        for line in lines:
            if not line:
                continue
            if line[0] in "|=":  # the io,stat table after the last packet
                m = IO_STAT_ROW.match(line)
                if m and not self._sessions:  # after a -M reset it may count only the last session
                    self.frames_read = int(m.group(1))
                continue
            cut = line.find("\t")
            number = line if cut < 0 else line[:cut]
            if not number.isdigit():
                continue
            if number == "1":  # PREFILTER yields every session's first frame: the numbering restarted
                self._sessions += self._seen_any
                self._seen_any = True
            ev = counted_event(self, line, self._sessions * SESSION_PACKETS + int(number))
            if ev is not None:
                events.append(ev)
        return events

    def _on(self, ev: PacketEvent) -> None:
        self.on_event(ev)

    def _settle(self, result: ReadResult) -> None:
        self._handoff.close()
        if not self.result.done():
            self.result.set_result(result)
