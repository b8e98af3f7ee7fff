import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.sources.files import CaptureArg, iface_from_name
from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.sources.event_columns import row_of
from kubectl_meshdoctor.sources.merge import DUPLICATE_WINDOW_S, SeenOnce, merge_by_time

from ..helpers import S, Wire


def reader(events, pause_every=3):
    async def read(push, gate):
        for i, ev in enumerate(events):
            await gate()
            push(ev)
            if i % pause_every == 0:
                await asyncio.sleep(0)  # let the other reader run, as tshark output arrives in bursts
        return len(events)
    return read


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(0, 100, allow_nan=False), max_size=40), min_size=1, max_size=4),
       st.integers(1, 5))
def test_merged_output_is_time_ordered_and_complete(times_per_stream, pause_every):
    streams = []
    for n, times in enumerate(times_per_stream):
        w = Wire(iface=f"if{n}", t0=0.0)
        for t in sorted(times):
            w.t = t
            w.pkt("198.18.0.1:1", "198.18.0.2:2", S, dt=0.0)
        streams.append(w.events)
    out = []
    results = asyncio.run(merge_by_time([reader(s, pause_every) for s in streams], out.append))
    assert results == [len(s) for s in streams]
    assert [e.ts for e in out] == sorted(e.ts for s in streams for e in s)
    assert sorted(map(id, out)) == sorted(id(e) for s in streams for e in s)


def test_a_failing_reader_is_returned_and_the_rest_still_delivered():
    w = Wire()
    w.pkt("198.18.0.1:1", "198.18.0.2:2", S)

    async def broken(push, gate):
        raise RuntimeError("tshark crashed")

    out = []
    results = asyncio.run(merge_by_time([broken, reader(w.events)], out.append))
    assert isinstance(results[0], RuntimeError) and results[1] == 1 and len(out) == 1


def test_a_stream_that_runs_ahead_is_held_at_the_high_water_mark():
    """The stream whose times run ahead waits on its gate instead of being buffered whole."""
    ahead, behind = Wire(iface="lo", t0=100.0), Wire(iface="eth0", t0=0.0)
    for _ in range(500):
        ahead.pkt("198.18.0.1:1", "198.18.0.2:2", S, dt=0.001)
    for _ in range(50):
        behind.pkt("198.18.0.3:1", "198.18.0.2:2", S, dt=0.001)
    most = 0
    out: list = []

    async def slow(push, gate):
        for ev in behind.events:
            await gate()
            push(ev)
            await asyncio.sleep(0.001)  # tshark on the busier file is slower
        return len(behind.events)

    async def fast(push, gate):
        nonlocal most
        n = 0
        for ev in ahead.events:
            await gate()
            push(ev)
            n += 1
            most = max(most, n - len([e for e in out if e.iface == "lo"]))
            await asyncio.sleep(0)  # a turn for the slow reader after each line: the race is the test, not a wait
        return n

    results = asyncio.run(merge_by_time([fast, slow], out.append, high_water=20))
    assert results == [500, 50] and len(out) == 550
    assert most <= 20  # never more than the high-water mark of lo waiting, though lo was 100 s ahead
    assert [e.ts for e in out] == sorted(e.ts for e in out)


def test_interface_from_file_names_and_arguments():
    assert iface_from_name("lo.pcap") == "lo"
    assert iface_from_name("/tmp/reviews-v1-eth0.pcap") == "eth0"
    assert iface_from_name("capture.pcapng") == "capture"
    assert CaptureArg.parse("x.pcap:eth0") == CaptureArg("x.pcap", "eth0", explicit=True)
    assert CaptureArg.parse("lo.pcap") == CaptureArg("lo.pcap", "lo", explicit=False)


def test_pcapng_without_interface_names_falls_back_to_the_file_name():
    """editcap/mergecap write interface blocks without names; tshark calls them "unknown"."""
    import asyncio
    from pathlib import Path

    from kubectl_meshdoctor.sources.tshark import read_file

    path = Path(__file__).parent.parent / "data" / "unnamed-iface-eth0.pcapng"
    seen = set()
    asyncio.run(read_file(str(path), path.name, iface_from_name(str(path)), lambda ev: seen.add(ev.iface)))
    assert seen == {"eth0"}


class _ReferenceSeenOnce:
    """SeenOnce as its docstring states it, one fingerprint a packet (its first, plain form)."""

    def __init__(self) -> None:
        self.seen: dict[tuple, str] = {}
        self.order: list[tuple[float, tuple]] = []
        self.dropped: dict[tuple[str, str], int] = {}

    def __call__(self, ev) -> bool:
        while self.order and self.order[0][0] < ev.ts - DUPLICATE_WINDOW_S:
            self.seen.pop(self.order.pop(0)[1], None)
        fp = (round(ev.ts * 1e6), ev.frame, ev.src, ev.sport, ev.dst, ev.dport, ev.seq, ev.ack, ev.flags._value_,
              ev.payload_len)
        first = self.seen.get(fp)
        if first is None:
            self.seen[fp] = ev.source
            self.order.append((ev.ts, fp))
            return False
        if first == ev.source:
            return False
        self.dropped[(ev.source, first)] = self.dropped.get((ev.source, first), 0) + 1
        return True


# Packets crowded into few microseconds (times running back and forth, within the window and past it), frames and
# sequence numbers, from three sources: duplicates, packets sharing a microsecond but not a fingerprint, and
# fingerprints forgotten, then seen again.
_crowded = st.lists(st.tuples(st.sampled_from([0, 1, 2, 400_000, 1_100_000, 1_100_001, 2_300_000]),
                              st.integers(1, 2), st.integers(0, 1), st.sampled_from(["a.pcap", "b.pcap", "c.pcapng"])),
                    max_size=200)


@settings(max_examples=300, deadline=None)
@given(_crowded)
def test_seen_once_drops_what_one_fingerprint_a_packet_drops(steps):
    ours, by_rows, reference = SeenOnce(), SeenOnce(), _ReferenceSeenOnce()
    for us, frame, seq, source in steps:
        ev = PacketEvent(1_700_000_000 + us / 1e6, "eth0", source, frame, "198.18.0.1", 40000, "198.18.0.2", 80, S,
                         seq, 0)
        drop = reference(ev)
        assert ours(ev) == drop
        assert by_rows.row(row_of(ev)) == drop  # the form the reader process's child takes
    assert ours.dropped == reference.dropped == by_rows.dropped
