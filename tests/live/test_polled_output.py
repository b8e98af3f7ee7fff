"""The shared dissector reads its tshark's lines by polling (live/dissect.py OUTPUT_POLL_S): a packet into a
quiet stream still reaches the detectors at once, and streams and tsharks started and ended by the dozen, or
abandoned, leave no descriptor behind in the watch's event loop."""

from __future__ import annotations

import asyncio
import shutil
import struct
import threading
import time
from pathlib import Path

import pytest

from kubectl_meshdoctor.live.dissect import OUTPUT_POLL_S, SharedDissector
from kubectl_meshdoctor.sources import tshark

from ..sources.test_polled_pipe import open_fds
from .test_dissector import records

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="runs tshark")

DATA = Path(__file__).resolve().parent.parent / "data"
CAPTURE = DATA / "lab-collision-lo.pcap"
DEADLINE_S = 0.5  # "at once" for a person watching; 25 polls


def test_a_packet_into_a_quiet_stream_reaches_the_detectors_at_once():
    """Each packet the detectors get, written alone into a stream that was quiet before it, reaches on_event
    within DEADLINE_S of its record being written (tshark already running)."""
    parts = records(CAPTURE.read_bytes())
    yielded: list = []
    asyncio.run(tshark.read_file(str(CAPTURE), "a/lo", "lo", yielded.append, force_iface=True))
    wanted = {e.frame for e in yielded}
    assert 1 in wanted and len(wanted) >= 5

    async def main() -> dict[int, float]:
        d = SharedDissector()
        arrived: dict[int, float] = {}
        came = asyncio.Event()

        def on_event(ev) -> None:
            arrived[ev.frame] = time.monotonic()
            came.set()

        s = d.stream("a/lo", "lo", on_event)
        s.wrote(parts[0] + parts[1])  # tshark starts: its start-up is not what is measured
        await asyncio.wait_for(came.wait(), 60)
        took: dict[int, float] = {}
        for frame in range(2, len(parts)):
            # the stream quiet for several polls first: the reader is between polls, not reading
            await asyncio.sleep(OUTPUT_POLL_S * 5)
            came.clear()
            at = time.monotonic()
            await asyncio.to_thread(s.wrote, parts[frame])  # as a capture pump writes, from its thread
            if frame in wanted:
                try:
                    await asyncio.wait_for(came.wait(), DEADLINE_S)
                except asyncio.TimeoutError:
                    pass
                took[frame] = arrived.get(frame, float("inf")) - at
        s.ended()
        await asyncio.wait_for(s.result, 60)
        await d.close()
        return took

    took = asyncio.run(main())
    assert took and max(took.values()) < DEADLINE_S, took


def test_streams_and_tsharks_by_the_dozen_leave_no_descriptor_behind():
    """Rounds of streams of two link types (a tshark each), ended, then a round abandoned mid-stream, all in one
    event loop as a watch keeps it: the descriptors open after are those open before."""
    parts = records(CAPTURE.read_bytes())
    other = bytearray(parts[0])
    struct.pack_into("<I", other, 20, 101)  # LINKTYPE_RAW: a second group, with a tshark of its own

    async def round_of(n: int) -> int:
        d = SharedDissector()
        streams = [d.stream(f"p{i}/lo", "lo", [].append) for i in range(n)]

        def write(i: int) -> None:
            streams[i].wrote((bytes(other) if i % 2 else parts[0]) + b"".join(parts[1:]))
            streams[i].ended()

        await asyncio.gather(*(asyncio.to_thread(write, i) for i in range(n)))
        await asyncio.wait_for(asyncio.gather(*(s.result for s in streams)), 60)
        await d.close()
        return len({id(s.group) for s in streams})

    async def abandoned() -> bool:
        d = SharedDissector()
        s = d.stream("a/lo", "lo", [].append)
        s.wrote(parts[0])
        started = threading.Event()
        s.on_event = lambda ev: started.set()
        s.wrote(parts[1])
        await asyncio.to_thread(started.wait, 60)  # tshark is up and its output being read
        d.abandon()
        await d.close()
        s.ended()
        return d.abandoned and s.result.cancelled()

    async def main() -> tuple[dict[str, str], dict[str, str], list[int], bool]:
        before = open_fds()
        groups = [await round_of(4) for _ in range(6)]
        gone = await abandoned()
        await round_of(2)
        return before, open_fds(), groups, gone

    before, after, groups, gone = asyncio.run(main())
    assert all(g >= 2 for g in groups) and gone  # a stream joining after its group ended gets a new tshark
    assert {k: v for k, v in after.items() if k not in before} == {}
