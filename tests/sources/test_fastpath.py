"""The pre-pass's fast path (sources/fastpath.py) gives the detectors the same stream as tshark gives without it:
with the pre-pass forced on, MESHDOCTOR_FASTPATH=0 and =1 give the same PacketEvents (every field, in the same
order) and the same read counts on every capture in tests/data, the same findings from analyze, and the same on
hypothesis's small captures of SYN/ACK/FIN/RST sequences on a few four-tuples (port reuse, IPv4 and IPv6, pcap
in micro- and nanoseconds, pcapng, three link types, chunks of a few records)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.sources import fastpath, prepass, read_plan
from kubectl_meshdoctor.sources.files import CaptureArg
from tests.sources.test_undissectable import bad_header_length, captured_short, with_bad_frames
from tests.sources.fast_captures import (ETHERNET, RAW, SLL, A, F, P, R, S, framed, segment, write_pcap,
                                         write_pcapng)

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")

DATA = Path(__file__).resolve().parent.parent / "data"
CAPTURES = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.suffix in (".pcap", ".pcapng"))


def stream(path: Path, fast: bool, monkeypatch, arg: str | None = None):
    """(events, ReadResult) of capture ``path`` read as analyze reads one file, the pre-pass forced on."""
    monkeypatch.setenv("MESHDOCTOR_PREPASS", "1")
    monkeypatch.setenv("MESHDOCTOR_FASTPATH", "1" if fast else "0")
    events: list = []

    async def gate() -> None:
        pass

    async def go():
        return await read_plan.read_capture(CaptureArg.parse(arg or str(path)), asyncio.Semaphore(1), False,
                                            events.append, gate)

    return events, asyncio.run(go())


def same_stream(path: Path, monkeypatch, arg: str | None = None) -> list:
    without, r0 = stream(path, False, monkeypatch, arg)
    with_, r1 = stream(path, True, monkeypatch, arg)
    assert with_ == without
    assert r1 == r0
    return with_


@pytest.mark.parametrize("name", CAPTURES)
def test_every_capture_gives_the_same_events(monkeypatch, name):
    same_stream(DATA / name, monkeypatch)


# The detectors are a function of the event stream (and the pod's context, the same both ways): with every
# capture's events and read counts the same above, their findings are too. analyze itself is run both ways on the
# single-pod lab recordings and on each mesh scenario's server eth0 (every failure class recorded with real Envoy;
# bench/gen's traffic in tests/bench/test_fastpath_gen.py), so the whole path is checked without reading all the
# files twice more (CI's time).
WITH_FINDINGS = sorted(name for name in CAPTURES if "/" not in name
                       or (name.startswith("envoy-1.40-mesh/") and name.endswith("server/eth0.pcap")))


def test_the_captures_with_findings_are_there():
    assert len(WITH_FINDINGS) >= 30, WITH_FINDINGS


@pytest.mark.parametrize("name", WITH_FINDINGS)
def test_the_captures_with_findings_give_the_same_findings(monkeypatch, name):
    reports = []
    for fast in ("0", "1"):
        monkeypatch.setenv("MESHDOCTOR_PREPASS", "1")
        monkeypatch.setenv("MESHDOCTOR_FASTPATH", fast)
        reports.append(asyncio.run(analyze([CaptureArg.parse(str(DATA / name))], Pipeline.with_detectors())))
    without, with_ = reports
    assert with_.findings == without.findings  # detector, severity, evidence (frames, flows, ts), fixes
    assert with_.stats == without.stats
    assert with_.problems == without.problems


def test_the_fast_path_decides_most_records_of_the_lab_captures(tmp_path):
    """It does work: on a lab capture most yielded events are made by the pass, not tshark."""
    got = fastpath.fast_prepass(str(DATA / "lab-collision3m-eth0.pcap"), str(tmp_path), 12_000)
    assert got is not None
    assert len(got.events) > got.result.kept - len(got.events)


def test_a_chunk_holding_a_record_not_read_here_goes_whole_to_tshark(tmp_path, monkeypatch):
    """An IP fragment (tshark reassembles) in a chunk: that chunk's records all go to tshark, as before, and
    the chunks around it are still decided by the pass."""
    segs = [segment("198.18.0.1", 41000 + i // 4, "198.18.0.2", 5000, f, 100, 0) for i, f in
            enumerate([S, S | A, A, F | A] * 6)]
    frag = bytearray(segs[9])
    frag[6] |= 0x20  # more fragments
    segs[9] = bytes(frag)
    (tmp_path / "fast").mkdir()
    (tmp_path / "plain").mkdir()
    path = tmp_path / "frag.pcap"
    write_pcap(path, segs)
    monkeypatch.setattr(read_plan, "PREPASS_CHUNK_PACKETS", 8)
    got = fastpath.fast_prepass(str(path), str(tmp_path / "fast"), 8)
    before = prepass.prepass(str(path), str(tmp_path / "plain"), 8)
    assert got is not None and before is not None and len(before.chunks) == 3
    # no record has payload: tshark gets the fragment's chunk alone, the same records as without the fast path
    assert [c.frames.tolist() for c in got.result.chunks] == [c.frames.tolist() for c in before.chunks
                                                              if 10 in c.frames]
    assert len(same_stream(path, monkeypatch)) > 8


def test_addresses_are_printed_as_tshark_prints_them(tmp_path, monkeypatch):
    """IPv6 addresses as tshark writes them: compressed (RFC 5952), IPv4-mapped and -compatible with a quad."""
    pairs = [("fd00::1", "fd00:0:0:1::2"), ("::ffff:198.18.0.1", "::198.18.0.2"), ("1:0:0:1:0:0:0:1", "::1"),
             ("2001:db8:0:0:1:0:0:1", "fe80::1:0:0:0"), ("198.18.0.1", "198.19.255.255")]
    segs = [segment(s, 1000 + i, d, 80, S, i, 0) for i, (s, d) in enumerate(pairs)]
    path = tmp_path / "addresses.pcap"
    write_pcap(path, segs)
    events = same_stream(path, monkeypatch)
    assert len(events) == len(pairs)


FLAGS = [S, S, S, S | A, A, A, A | P, F | A, F, R, R | A, S | P, S | R]  # SYNs often: port reuse
TUPLES = [("198.18.0.1", 41030, "198.18.0.2", 5000), ("198.18.0.2", 5000, "198.18.0.1", 41030),
          ("198.18.0.1", 41031, "198.18.0.2", 5000), ("fd00::1", 41030, "fd00::2", 5000),
          ("fd00::2", 5000, "fd00::1", 41030)]
PAYLOADS = [b"hello", b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\n", b"\x16\x03\x01\x00\x05hello"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(packets=st.lists(st.tuples(st.sampled_from([0, 0, 1, 1, 2, 3, 4]), st.sampled_from(FLAGS),
                                  st.sampled_from([0, 100, 101, 5000, 2**32 - 1]), st.sampled_from([0, 1, 101, 901]),
                                  st.integers(0, len(PAYLOADS) - 1)), min_size=1, max_size=24),
       form=st.sampled_from(["raw", "ethernet", "sll-lo", "sll-eth", "nanoseconds", "pcapng-6", "pcapng-9",
                             "pcapng-3-unnamed"]),
       per_chunk=st.sampled_from([3, 7, 12_000]))
def test_random_flag_sequences_give_the_same_events(tmp_path_factory, monkeypatch, packets, form, per_chunk):
    tmp = tmp_path_factory.mktemp("fast")
    segs = [segment(*TUPLES[t], flags, seq, ack, PAYLOADS[p] if flags & P else b"")
            for t, flags, seq, ack, p in packets]
    link = {"ethernet": ETHERNET, "sll-lo": SLL, "sll-eth": SLL}.get(form, RAW)
    frames = [framed(s, link, 772 if form == "sll-lo" else 1) for s in segs]
    if form.startswith("pcapng"):
        path = tmp / "c.pcapng"
        resol = int(form.split("-")[1])
        write_pcapng(path, frames, link, None if form.endswith("unnamed") else "lo", resol,
                     [1_700_000_000 * 10 ** resol + i * 7 ** i % 10 ** resol for i in range(len(frames))])
    else:
        path = tmp / "c.pcap"
        nano = form == "nanoseconds"
        write_pcap(path, frames, link, nano, [(1_700_000_000 + i, (i * 123_457) % (10 ** (9 if nano else 6)))
                                              for i in range(len(frames))])
    monkeypatch.setattr(read_plan, "PREPASS_CHUNK_PACKETS", per_chunk)
    same_stream(path, monkeypatch)
    same_stream(path, monkeypatch, f"{path}:eth1")  # the interface the user gives


C, SV = TUPLES[0], TUPLES[1]  # one four-tuple, client's and server's direction
HARD = {
    # a client port reused after a FIN handshake: tshark (sequence analysis off) keeps one conversation
    "syn-after-fin": [(C, S, 100, 0), (SV, S | A, 900, 101), (C, A, 101, 901), (C, F | A, 101, 901),
                      (SV, F | A, 901, 102), (C, A, 102, 902), (C, S, 7000, 0), (SV, A, 902, 102),
                      (SV, S | A, 4000, 7001), (C, A, 7001, 4001)],
    "syn-after-rst": [(C, S, 100, 0), (SV, S | A, 900, 101), (C, R, 101, 0), (C, S, 5000, 0), (SV, A, 901, 101),
                      (C, A, 5001, 0)],
    "first-fin-not-counted": [(C, F | A, 100, 900), (SV, A, 900, 101), (SV, A, 900, 101), (C, A, 101, 900),
                              (SV, F | A, 900, 101), (C, A, 101, 901)],
    "retransmitted-syn": [(C, S, 100, 0), (C, S, 100, 0), (SV, A, 900, 101), (SV, S | A, 900, 101),
                          (C, A, 101, 901), (SV, A, 901, 101)],
    # a flow's base: its first seq (seq - 1 for no SYN), or the other flow's first ACK - 1
    "base-from-a-first-ack": [(C, A, 500, 900), (C, S, 499, 0), (C, A, 500, 900), (C, S, 500, 0), (C, A, 500, 900)],
    "base-from-the-other-flows-ack": [(SV, S | A, 900, 101), (C, S, 100, 0), (C, A, 101, 901), (C, S, 300, 0),
                                      (SV, A, 901, 301)],
    "an-rst-without-ack-sets-no-base": [(SV, R, 900, 101), (C, S, 100, 0), (C, A, 101, 0), (C, S, 300, 0),
                                        (SV, A, 1, 301)],
    "a-syn-ack-of-another-seq-moves-the-base": [(C, S, 100, 0), (SV, S | A, 900, 101), (SV, S | A, 950, 101),
                                                (C, A, 101, 951), (SV, S, 950, 0), (C, A, 101, 951),
                                                (SV, S, 900, 0), (C, A, 101, 901)],
    "a-first-fin-without-ack": [(C, F, 100, 0), (C, S, 50, 0), (SV, A, 1, 51), (C, F, 100, 0), (C, A, 51, 0)],
    "challenge-ack": [(C, S, 100, 0), (SV, S | A, 900, 101), (C, A, 101, 901), (C, S, 8000, 0), (SV, A, 901, 101),
                      (C, R, 101, 0), (C, S, 8000, 0), (SV, S | A, 300, 8001)],
}


@pytest.mark.parametrize("case", sorted(HARD))
def test_port_reuse_and_first_frames_give_the_same_events(tmp_path, monkeypatch, case):
    path = tmp_path / f"{case}.pcap"
    write_pcap(path, [segment(*t, flags, seq, ack) for t, flags, seq, ack in HARD[case]])
    events = same_stream(path, monkeypatch)
    assert any(not e.flags & 0x07 for e in events)  # some pure ACK was kept, by tshark's completeness


@pytest.mark.parametrize("bad", [bad_header_length, captured_short])
@pytest.mark.parametrize("at", [(1,), (5, 30)])
def test_undissectable_frames_are_counted_the_same(tmp_path, monkeypatch, bad, at):
    """A TCP frame tshark cannot dissect is left to tshark, with its chunk: counted and named the same."""
    path = with_bad_frames(tmp_path, at, bad)
    monkeypatch.setattr(read_plan, "PREPASS_CHUNK_PACKETS", 10)
    same_stream(path, monkeypatch)
    _, result = stream(path, True, monkeypatch)
    assert result.undissectable == len(at) and len(result.undissectable_frames) == len(at)


def test_a_multipath_tcp_option_leaves_its_chunk_to_tshark(tmp_path, monkeypatch):
    """MPTCP (RFC 8684) options: tshark's analysis of them is not followed here, so their chunk is tshark's."""
    mp_capable = bytes([30, 4, 0x01, 0x81])
    segs = [segment(*C, S, 100, 0, options=b"\x01\x01" + b"\x01\x01" + mp_capable), segment(*SV, S | A, 900, 101),
            segment(*C, A, 101, 901), segment(*C, F | A, 101, 901), segment(*SV, A, 901, 102)]
    path = tmp_path / "mptcp.pcap"
    write_pcap(path, segs)
    got = fastpath.fast_prepass(str(path), str(tmp_path), 12_000)
    assert got is not None and len(got.events) == 0
    same_stream(path, monkeypatch)
