"""The shared dissector (sources/dissector.py): many streams through one tshark keep every stream's frames,
interface and pod apart, exactly as one tshark per stream reads them."""

from __future__ import annotations

import asyncio
import random
import shutil
import struct
import threading
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.live.dissect import RecordSplitter, SharedDissector, Stream, _Ledger
from kubectl_meshdoctor.sources import tshark

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="runs tshark")

DATA = Path(__file__).resolve().parent.parent / "data"
# (pod, iface, capture): two pods of two interfaces each, and a fifth stream of the first pod's lo again.
STREAMS = [("collision", "lo", "lab-collision-lo.pcap"), ("collision", "eth0", "lab-collision-eth0.pcap"),
           ("framing", "lo", "lab-framing-mixed-lo.pcap"), ("framing", "eth0", "lab-framing-mixed-eth0.pcap"),
           ("again", "lo", "lab-collision-lo.pcap")]


def alone(name: str, source: str, iface: str) -> list:
    """The events one tshark of its own reads from ``name``: what the shared dissector must give."""
    events = []
    asyncio.run(tshark.read_file(str(DATA / name), source, iface, events.append, force_iface=True))
    return events


def records(data: bytes) -> list[bytes]:
    """A pcap file's header and records, each as bytes."""
    out, off = [data[:24]], 24
    while off + 16 <= len(data):
        caplen = struct.unpack_from("<I", data, off + 8)[0]
        out.append(data[off:off + 16 + caplen])
        off += 16 + caplen
    return out


def writer(stream: Stream, parts: list[bytes], seed: int, cut_at: int | None = None,
           started: threading.Barrier | None = None) -> threading.Thread:
    """A thread that writes ``parts`` into ``stream`` as a capture pump does, in random slices with random
    pauses (the streams of several pods interleave as they come), then ends it; ``cut_at`` ends it that many
    bytes early (mid-record). ``started``: met once the header is written, so that every stream is live before
    any ends (a watch's streams run for its whole length; a short one here could end its group first, and a
    busy machine made that happen)."""
    data = b"".join(parts)
    if cut_at is not None:
        data = data[:len(data) - cut_at]
    rnd = random.Random(seed)

    def run() -> None:
        pos = 0
        try:
            while pos < len(data):
                n = rnd.choice((1, 7, 60, 500, 4096))
                if started is not None and pos < len(parts[0]) <= pos + n:
                    n = len(parts[0]) - pos
                stream.wrote(data[pos:pos + n])
                pos += n
                if started is not None and pos == len(parts[0]):
                    started.wait(30)
                if rnd.random() < 0.05:
                    threading.Event().wait(0.002)
        finally:
            stream.ended()

    return threading.Thread(target=run, daemon=True)


def shared(specs, cut: dict[int, int] | None = None, seed: int = 1) -> tuple[list[Stream], list[list]]:
    """Every spec's capture through one SharedDissector, written by a thread each -> (streams, events)."""
    got: list[list] = [[] for _ in specs]

    async def main() -> list[Stream]:
        d = SharedDissector()
        streams = [d.stream(f"{pod}/{iface}", iface, events.append)
                   for (pod, iface, _), events in zip(specs, got)]
        started = threading.Barrier(len(specs))
        threads = [writer(s, records((DATA / name).read_bytes()), seed + i, (cut or {}).get(i), started)
                   for i, (s, (_, _, name)) in enumerate(zip(streams, specs))]
        for t in threads:
            t.start()
        await asyncio.wait_for(asyncio.gather(*(s.result for s in streams)), 60)
        await d.close()
        for t in threads:
            t.join(5)
        return streams

    return asyncio.run(main()), got


@pytest.mark.parametrize("seed", [1, 2])
def test_every_stream_keeps_its_frames_interface_and_pod(seed):
    streams, got = shared(STREAMS, seed=seed)
    for (pod, iface, name), stream, events in zip(STREAMS, streams, got):
        want = alone(name, f"{pod}/{iface}", iface)
        assert want, name
        assert events == want, stream.source  # same frames, fields, interface and pod, in the same order
        res = stream.result.result()
        assert res.error is None and res.killed_by is None
        assert res.packets == len(want) and res.last_frame == want[-1].frame
        # every record of the file reached tshark as this stream's
        assert res.frames_read == len(records((DATA / name).read_bytes())) - 1


def test_frame_numbers_survive_tshark_session_resets(monkeypatch):
    """A live tshark resets its session every SESSION_PACKETS frames (-M) and numbers frames from 1 again; the
    dissector adds the earlier sessions back, so each stream's frames are still its own capture's."""
    from kubectl_meshdoctor.live import dissect as dissector

    monkeypatch.setattr(dissector, "SESSION_PACKETS", 7)
    specs = STREAMS[:2]
    streams, got = shared(specs)
    total = sum(len(records((DATA / name).read_bytes())) - 1 for _, _, name in specs)
    assert total > 3 * 7  # several resets
    for (pod, iface, name), stream, events in zip(specs, streams, got):
        want = alone(name, f"{pod}/{iface}", iface)
        by_frame = {e.frame: e for e in events}
        # Every packet one tshark of its own yields, with the same frame number; PREFILTER also yields the
        # first frame of every session (it is how a new session is noticed), at most one a session.
        assert [by_frame.get(w.frame) for w in want] == want, stream.source
        assert len(events) - len(want) <= total // 7 + 1
        assert stream.result.result().error is None  # tshark's "resetting session" notice is no problem


def test_a_stream_cut_mid_record_ends_alone_and_the_others_go_on():
    specs = STREAMS[:3]
    streams, got = shared(specs, cut={1: 10})
    for i, ((pod, iface, name), events) in enumerate(zip(specs, got)):
        want = alone(name, f"{pod}/{iface}", iface)
        if i == 1:  # the last record is cut: every whole one before it is read
            assert events == [e for e in want if e.frame < len(records((DATA / name).read_bytes())) - 1]
        else:
            assert events == want


def test_one_tshark_reads_every_stream_of_one_header():
    """The five streams share one tshark: the dissector started one group."""
    streams, _ = shared(STREAMS)
    assert len({id(s.group) for s in streams}) == 1


def test_a_stream_that_is_not_pcap_is_left_out_and_the_others_are_read():
    async def main():
        d = SharedDissector()
        good, bad = d.stream("a/lo", "lo", [].append), d.stream("b/lo", "lo", print)
        bad.wrote(b"this is not pcap at all, not even close")
        bad.ended()
        t = writer(good, records((DATA / "lab-collision-lo.pcap").read_bytes()), 1)
        t.start()
        res_bad, res_good = await asyncio.wait_for(asyncio.gather(bad.result, good.result), 60)
        await d.close()
        t.join(5)
        return res_bad, res_good

    res_bad, res_good = asyncio.run(main())
    assert res_bad.packets == 0 and res_bad.frames_read is None
    assert res_good.frames_read == len(records((DATA / "lab-collision-lo.pcap").read_bytes())) - 1


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 3), max_size=300), pick=st.data(), prune=st.sampled_from([0, 5, 1 << 20]))
def test_the_ledger_numbers_each_streams_frames_as_counted(ids, pick, prune):
    ledger = _Ledger(4)
    ledger.PRUNE_AT = prune
    asked = sorted(pick.draw(st.sets(st.integers(0, max(len(ids) - 1, 0)))) if ids else [])
    cut = pick.draw(st.integers(0, len(ids)))
    # record i is its index as 4 bytes after a record header: where the ledger says it is, it must be
    recs = [bytes(16) + i.to_bytes(4, "big") for i in range(len(ids))]
    for lo, hi in ((0, cut), (cut, len(ids))):
        ledger.append(bytes(ids[lo:hi]), b"".join(recs[lo:hi]), array("I", range(0, 20 * (hi - lo), 20)))
    for index in asked:
        s = ids[index]
        stream, frame, held, at, end = ledger.frame(index)
        assert (stream, frame) == (s, ids[:index + 1].count(s))
        assert held[at:end] == recs[index]
    assert ledger.frame(len(ids)) is None


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30), held=st.integers(1, 400), pick=st.data())
def test_the_ledger_lets_the_oldest_records_go_past_its_bound_and_drops_what_was_read(sizes, held, pick):
    """Records are held up to HELD_BYTES (the newest block always): a frame whose block went has none, and
    what lies before an asked frame is let go."""
    ledger = _Ledger(1)
    ledger.HELD_BYTES = held
    blocks, first = [], 0
    for n in sizes:  # a block of n records of 20 bytes each
        ledger.append(bytes(n), bytes(20 * n), array("I", range(0, 20 * n, 20)))
        blocks.append((first, first + n))
        first += n
    # the blocks the bound keeps: the newest ones whose sum stays within it, and always the newest
    kept, total = set(), 0
    for lo, hi in reversed(blocks):
        total += 20 * (hi - lo)
        if kept and total > held:
            break
        kept.add(lo)
    for index in sorted(pick.draw(st.sets(st.integers(0, first - 1)))):
        lo = max(b for b, _ in blocks if b <= index)
        _, frame, records, _, _ = ledger.frame(index)
        assert frame == index + 1
        assert (records is not None) == (lo in kept)
    assert ledger._held_bytes == sum(len(r) for _, _, r, _ in ledger._held) <= max(held, 20 * sizes[-1])


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, 3000), max_size=8))
def test_the_record_splitter_gives_whole_records_however_the_bytes_come(cuts):
    data = (DATA / "lab-collision-lo.pcap").read_bytes()
    parts = records(data)
    for trim in (0, 5):  # the whole file; cut mid-record
        body = data[:len(data) - trim]
        splitter = RecordSplitter()
        out, count, at = b"", 0, 0
        for c in sorted(set(cuts)) + [len(body)]:
            got, n, offsets = splitter.feed(body[at:max(at, c)])
            # each offset starts one record, and the records it starts are the whole
            assert len(offsets) == n
            assert b"".join(got[o:e] for o, e in zip(offsets, list(offsets[1:]) + [len(got)])) == got
            assert all(struct.unpack_from("<I", got, o + 8)[0] + 16 == e - o
                       for o, e in zip(offsets, list(offsets[1:]) + [len(got)]))
            out, count, at = out + got, count + n, max(at, c)
        whole = parts[1:] if not trim else parts[1:-1]
        assert splitter.header == parts[0] and out == b"".join(whole) and count == len(whole)
        assert splitter.pending == (len(parts[-1]) - trim if trim else 0)


def test_the_record_splitter_refuses_what_is_not_pcap():
    with pytest.raises(ValueError):
        RecordSplitter().feed(b"\x0a\x0d\x0d\x0a" + bytes(40))


def test_a_stream_that_ends_early_is_not_taken_for_a_stall_while_the_others_go_on():
    """A pod's capture ends (its pod deleted, its --duration over) while another's goes on in the same tshark:
    settle() waits past its grace without calling that a stall (tshark reads all it is given), and returns
    True once the other stream ends, with every frame of the first read."""
    data = records((DATA / "lab-collision-lo.pcap").read_bytes())

    async def main():
        d = SharedDissector()
        a, b = d.stream("a/lo", "lo", [].append), d.stream("b/lo", "lo", [].append)
        b.wrote(b"".join(data[:3]))  # b's capture goes on
        t = writer(a, data, 1)
        t.start()
        await asyncio.to_thread(t.join, 10)
        settling = asyncio.ensure_future(d.settle([a], grace_s=1.0))
        done, _ = await asyncio.wait([settling], timeout=3.0)  # three times the grace
        assert not done, "an idle tshark taken for a stalled one"
        b.ended()
        assert await asyncio.wait_for(settling, 30) is True
        await d.close()
        return a.result.result()

    res = asyncio.run(main())
    assert res.error is None and res.frames_read == len(data) - 1


def test_a_record_tshark_refuses_ends_its_stream_alone():
    """One stream's record longer than tshark reads would stop the tshark every stream shares: that stream ends
    before it, with a problem that says so, and the others are read to their end."""
    async def main():
        d = SharedDissector()
        good, bad = d.stream("a/lo", "lo", [].append), d.stream("b/lo", "lo", [].append)
        data = records((DATA / "lab-collision-lo.pcap").read_bytes())
        bad.wrote(data[0] + data[1] + struct.pack("<IIII", 1, 0, 300_000, 300_000) + bytes(300_000) + data[2])
        bad.ended()
        t = writer(good, data, 1)
        t.start()
        results = await asyncio.wait_for(asyncio.gather(good.result, bad.result), 60)
        await d.close()
        t.join(5)
        return results

    res_good, res_bad = asyncio.run(main())
    assert res_good.error is None and res_good.frames_read == len(records((DATA / "lab-collision-lo.pcap")
                                                                           .read_bytes())) - 1
    assert "frame 2 claims 300000 bytes, more than tshark reads" in res_bad.error
    assert res_bad.frames_read == 1
