"""The fast path in one tshark stream of several files (sources/interleave_fast.py): with MESHDOCTOR_FASTPATH=0 and
=1 the same events in the same order, and the same read counts, for every pair of lab captures in tests/data
(a pod's lo and eth0), also with sessions of a few records (a new tshark, its replay) and with a record the fast
path does not read (the rest of its session as without it)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from kubectl_meshdoctor.sources import interleave
from tests.sources.fast_captures import A, F, S, segment, write_pcap

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")

DATA = Path(__file__).resolve().parent.parent / "data"


def _pairs() -> list[tuple[str, ...]]:
    """Each pod's captures that can share one stream: ``X/lo.pcap`` with ``X/eth0.pcap``, ``P-lo.pcap`` with
    ``P-eth0.pcap``."""
    found = []
    for lo in sorted(DATA.rglob("*lo.pcap")):
        eth0 = lo.with_name(lo.name[:-len("lo.pcap")] + "eth0.pcap")
        paths = [str(p) for p in (lo, eth0) if p.exists()]
        if len(paths) == 2 and interleave.interleavable(paths) is not None:
            found.append(tuple(str(Path(p).relative_to(DATA)) for p in paths))
    return found


PAIRS = _pairs()


def stream(paths: list[str], fast: bool, monkeypatch):
    monkeypatch.setenv("MESHDOCTOR_FASTPATH", "1" if fast else "0")
    header = interleave.interleavable(paths)
    assert header is not None
    events: list = []
    results = asyncio.run(interleave.read_interleaved(paths, paths, ["lo", "eth0"], [False, False], header,
                                                      events.append))
    return events, results


def same(paths: list[str], monkeypatch) -> list:
    without, r0 = stream(paths, False, monkeypatch)
    with_, r1 = stream(paths, True, monkeypatch)
    assert with_ == without
    assert r1 == r0
    return with_


def test_there_are_pairs():
    assert len(PAIRS) >= 10


@pytest.mark.parametrize("pair", PAIRS)
def test_every_pair_gives_the_same_events(monkeypatch, pair):
    same([str(DATA / p) for p in pair], monkeypatch)


@pytest.mark.parametrize("records, replay", [(40, 10), (97, 60)])
def test_short_sessions_and_their_replays_give_the_same_events(monkeypatch, records, replay):
    monkeypatch.setattr(interleave, "SESSION_RECORDS", records)
    monkeypatch.setattr(interleave, "REPLAY_RECORDS", replay)
    events = same([str(DATA / "lab-collision3m-lo.pcap"), str(DATA / "lab-collision3m-eth0.pcap")], monkeypatch)
    assert len(events) > 500


def test_a_record_not_read_here_sends_the_rest_of_its_session_to_tshark(tmp_path, monkeypatch):
    monkeypatch.setattr(interleave, "SESSION_RECORDS", 12)
    monkeypatch.setattr(interleave, "REPLAY_RECORDS", 5)
    segs = [segment("198.18.0.1", 41000 + i // 4, "198.18.0.2", 5000, f, 100 + i, 1) for i, f in
            enumerate([S, S | A, A, F | A] * 10)]
    frag = bytearray(segs[17])
    frag[6] |= 0x20  # more fragments: tshark reassembles, the fast path does not read it
    segs[17] = bytes(frag)
    write_pcap(tmp_path / "a-lo.pcap", segs)
    write_pcap(tmp_path / "a-eth0.pcap", [segment("198.18.0.3", 42000 + i // 4, "198.18.0.2", 5000, f, 7, 1)
                                          for i, f in enumerate([S, A, A, F | A, A] * 6)])
    same([str(tmp_path / "a-lo.pcap"), str(tmp_path / "a-eth0.pcap")], monkeypatch)
