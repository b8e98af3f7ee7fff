"""Several captures through one tshark (sources/interleave.py): the same report as each file read by a tshark of
its own, without the pre-pass, in every way the pair can differ: cut short, undissectable frames, a record
tshark refuses, another link type, tshark sessions restarting mid-stream; events in capture-time order."""

from __future__ import annotations

import asyncio
import shutil
import struct
from pathlib import Path

import pytest

from kubectl_meshdoctor.sources import interleave
from kubectl_meshdoctor.sources import read_plan as files
from kubectl_meshdoctor.sources.interleave import interleavable, read_interleaved
from tests.sources.test_prepass import DATA, PAIRS, run, same_report
from tests.sources.test_undissectable import bad_header_length, with_bad_frames

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")

ETH0, LO = DATA / "lab-collision3m-eth0.pcap", DATA / "lab-collision3m-lo.pcap"


def test_a_lab_pair_is_one_stream_and_a_pcapng_or_a_single_file_is_not():
    assert interleavable([str(ETH0), str(LO)]) == ETH0.read_bytes()[:24]
    assert interleavable([str(ETH0)]) is None
    assert interleavable([str(ETH0), str(DATA / "unnamed-iface-eth0.pcapng")]) is None


def test_events_come_in_capture_time_order_with_each_files_frames():
    got: list = []

    async def main():
        return await read_interleaved([str(ETH0), str(LO)], ["e", "l"], ["eth0", "lo"], [False, False],
                                      interleavable([str(ETH0), str(LO)]), got.append)

    results = asyncio.run(main())
    assert [e.ts for e in got] == sorted(e.ts for e in got)
    for path, source, iface, res in ((ETH0, "e", "eth0", results[0]), (LO, "l", "lo", results[1])):
        alone: list = []
        asyncio.run(files.read_file(str(path), source, iface, alone.append))
        assert [e for e in got if e.source == source] == alone  # frames, fields, interface: as a tshark alone
        assert res.packets == len(alone) and res.frames_read >= res.packets


@pytest.mark.parametrize("session", [500])
def test_tshark_sessions_restarting_mid_stream_keep_the_report(monkeypatch, session):
    monkeypatch.setattr(interleave, "SESSION_RECORDS", session)
    for pair in PAIRS[:3]:
        assert same_report([DATA / n for n in pair], monkeypatch).findings


def test_one_file_of_the_pair_cut_short(monkeypatch, tmp_path):
    cut = tmp_path / "eth0.pcap"
    cut.write_bytes(ETH0.read_bytes()[:-500])
    report = same_report([cut, LO], monkeypatch)
    (p,) = [p for p in report.problems if "cut short" in p.what]
    assert p.where == str(cut) and p.cut_after_frame


def test_undissectable_frames_in_one_file_of_the_pair(monkeypatch, tmp_path):
    bad = with_bad_frames(tmp_path, (1, 7, 13), bad_header_length)
    report = same_report([bad, DATA / "lab-collision-lo.pcap"], monkeypatch)
    assert any("3 TCP frames tshark could not dissect" in p.what for p in report.problems)


def test_a_record_too_big_for_tshark_ends_its_file_there_with_a_problem(monkeypatch, tmp_path):
    """tshark alone stops at a record longer than it reads, with its own complaint; through one stream the file
    ends there too, and the problem says where. The findings are the same."""
    big = tmp_path / "eth0.pcap"
    big.write_bytes(ETH0.read_bytes() + struct.pack("<IIII", 1, 0, 300_000, 300_000) + bytes(300_000))
    assert interleavable([str(big), str(LO)]) is not None
    without, with_ = run([big, LO], monkeypatch, False), run([big, LO], monkeypatch, True)
    assert with_.findings == without.findings and with_.stats.packets == without.stats.packets
    (p,) = [p for p in with_.problems if p.where == str(big)]
    # the lab's 2340 frames, then the bad record
    assert "frame 2341 claims 300000 bytes, more than tshark reads" in p.what and "up to frame 2340" in p.what


def test_another_link_type_leaves_the_pair_to_be_read_file_by_file(tmp_path):
    other = tmp_path / "lo.pcap"
    data = bytearray(LO.read_bytes())
    data[20:24] = (113).to_bytes(4, "little")  # Linux cooked: walked, but not the same header as eth0's
    other.write_bytes(bytes(data))
    assert interleavable([str(ETH0), str(other)]) is None
    assert interleavable([str(Path(ETH0)), str(Path(ETH0))]) is not None


def _same_findings(pair, monkeypatch):
    """analyze's report of ``pair`` read in one go and through the pre-pass's interleaved stream: the same
    findings, evidence frames, frames read and problems (returned: one read's report, the stream's). Not always
    the same pure ACKs: a new tshark shows a conversation from the middle (sources/tshark.py), so PREFILTER keeps
    the first frames of one it had seen whole, and a FIN older than the replay is not there for the next ACKs."""
    whole, streamed = run(pair, monkeypatch, False), run(pair, monkeypatch, True)
    assert streamed.findings == whole.findings
    assert [[(e.source, e.frame) for e in f.evidence] for f in streamed.findings] == \
        [[(e.source, e.frame) for e in f.evidence] for f in whole.findings]
    assert streamed.stats.frames_read == whole.stats.frames_read and streamed.problems == whole.problems
    return whole, streamed


@pytest.mark.parametrize("session", [5, 9, 13])
def test_a_new_tshark_every_few_records_keeps_the_report(monkeypatch, session):
    """A tshark every few records (each first reading again what the last one read last): the same findings as
    one read, the four-tuple collision included. (No cut here is known to fall between a SYN and its challenge
    ACK, so this does not show that the replay is needed; it shows it changes no finding.)"""
    monkeypatch.setattr(interleave, "SESSION_RECORDS", session)
    pair = [DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"]
    report, _ = _same_findings(pair, monkeypatch)
    assert any(f.detector == "tuple-collision" and f.severity == "error" for f in report.findings)


@pytest.mark.parametrize("session", [2, 3, 7])
def test_the_stale_sockets_ack_survives_a_new_tshark(monkeypatch, session):
    """The outbound variant's stale ACK answers a SYN long after its conversation's FIN: a new tshark between them
    shows that conversation from the FIN (its first frame, uncounted) or from the ACK on, completeness 0 at the
    ACK either way, and PREFILTER keeps it still (frames 8 and 24, in the same evidence). Its repeats to the SYNs
    sent again (frames 27-33) may be lost: the replay holds earlier repeats but not the FIN."""
    monkeypatch.setattr(interleave, "SESSION_RECORDS", session)
    pair = [DATA / "lab-outbound-stale-lo.pcap", DATA / "lab-outbound-stale-eth0.pcap"]
    report, _ = _same_findings(pair, monkeypatch)
    assert sorted(f.severity.value for f in report.findings if f.detector == "tuple-collision") == ["error",
                                                                                                    "warning"]
