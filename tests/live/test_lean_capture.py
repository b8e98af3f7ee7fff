"""The pod-side capture filter (LEAN_FILTER) and the reader's display filter (PREFILTER) keep every packet a
detector concludes from: the lab's recorded captures give the same findings whole, through tcpdump's lean BPF,
and with the reader not filtering at all."""

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.live.pod_script import lean_filter
from kubectl_meshdoctor.sources import tshark
from kubectl_meshdoctor.sources.files import CaptureArg

DATA = Path(__file__).parent.parent / "data"
pytestmark = pytest.mark.skipif(not shutil.which("tcpdump"), reason="needs tcpdump")


class _Reads(list):
    most = 0


def _chunk_everything(monkeypatch, packets: int | None) -> _Reads:
    """Split every file into chunks of ``packets`` (None: read whole); returns the list of read_file calls
    analyze makes from now on, with ``.most`` the most at once."""
    import kubectl_meshdoctor.sources.read_plan as analyze_mod

    if packets:
        monkeypatch.setattr(analyze_mod, "CHUNK_ABOVE_BYTES", 0)
        monkeypatch.setattr(analyze_mod, "SHARED_CHUNK_ABOVE_BYTES", 0)
        monkeypatch.setattr(analyze_mod, "CHUNK_PACKETS", packets)
    reads, running = _Reads(), [0]
    read_file = analyze_mod.read_file

    async def counted(*args, **kwargs):
        reads.append(args[0])
        running[0] += 1
        reads.most = max(reads.most, running[0])
        try:
            return await read_file(*args, **kwargs)
        finally:
            running[0] -= 1

    monkeypatch.setattr(analyze_mod, "read_file", counted)
    return reads


def _findings(paths, monkeypatch=None):
    report = asyncio.run(analyze([CaptureArg.parse(str(p)) for p in paths], Pipeline.with_detectors()))
    return report, sorted((f.detector, f.severity.value, f.flow.client, f.flow.server, f.flow.iface,
                           tuple(e.what.split(" (")[0] for e in f.evidence)) for f in report.findings)


def test_lean_capture_gives_the_same_findings(tmp_path):
    lean = []
    for name, iface in (("lab-collision-eth0.pcap", "eth0"), ("lab-collision-lo.pcap", "lo")):
        out = tmp_path / name
        subprocess.run(["tcpdump", "-r", str(DATA / name), "-w", str(out), lean_filter(iface)], check=True,
                       capture_output=True)
        lean.append(out)
    full_report, full = _findings([DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"])
    lean_report, kept = _findings(lean)
    assert full and kept == full
    assert sum(lean_report.stats.frames_read.values()) < sum(full_report.stats.frames_read.values())


def test_reader_without_its_display_filter_finds_the_same(monkeypatch):
    _, filtered = _findings([DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"])
    monkeypatch.setattr(tshark, "FILE_PREFILTER", tshark.ALL_TCP)
    report, unfiltered = _findings([DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"])
    assert unfiltered == filtered
    assert report.stats.packets == sum(report.stats.frames_read.values())  # every frame reached the pipeline


def test_big_files_read_in_chunks_keep_the_file_frame_numbers(monkeypatch, tmp_path):
    """A file over the chunk threshold is split by editcap and read by one tshark per chunk: the same findings,
    the same evidence frames, every frame counted; a chunked file cut short is still reported as cut."""
    paths = [DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"]
    whole, _ = _findings(paths)
    reads = _chunk_everything(monkeypatch, 7)
    chunked, _ = _findings(paths)
    assert len(reads) > len(paths)
    assert [[(e.source, e.frame) for e in f.evidence] for f in chunked.findings] == \
        [[(e.source, e.frame) for e in f.evidence] for f in whole.findings]
    assert chunked.stats.frames_read == whole.stats.frames_read and chunked.problems == []
    assert not list(DATA.glob(".meshdoctor-chunks-*"))  # the chunks are gone

    data = (DATA / "lab-collision-eth0.pcap").read_bytes()
    cut = tmp_path / "eth0.pcap"
    cut.write_bytes(data[:-7])
    report, _ = _findings([cut])
    (problem,) = report.problems
    assert "cut short" in problem.what and problem.cut_after_frame == 32


@pytest.mark.parametrize("chunk_packets", [7, None])
def test_one_tshark_at_a_time_gives_the_same_events_in_time_order(monkeypatch, caplog, chunk_packets):
    """analyze's default runs one tshark at a time (memory: bench/RESULTS.md), reading the two files chunk by
    chunk in turn (or whole): the pipeline sees the same events, in capture-time order, as with one tshark per
    file; and no tshark is left for asyncio to report as an unknown child."""
    reads = _chunk_everything(monkeypatch, chunk_packets)
    paths = [DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"]
    seen, most = {}, {}
    for jobs in (1, 2):
        events = []
        pipeline = Pipeline.with_detectors()
        feed = pipeline.feed
        pipeline.feed = lambda ev, feed=feed, events=events: (events.append((ev.ts, ev.source, ev.frame)), feed(ev))
        reads.clear()
        with caplog.at_level("WARNING", logger="asyncio"):
            report = asyncio.run(analyze([CaptureArg.parse(str(p)) for p in paths], pipeline, jobs=jobs))
        seen[jobs], most[jobs] = events, reads.most
        assert report.findings and report.problems == []
        assert (len(reads) > len(paths)) == bool(chunk_packets)
    assert most == {1: 1, 2: 2}
    assert seen[1] == seen[2] and [e[0] for e in seen[1]] == sorted(e[0] for e in seen[1])
    assert {s for _, s, _ in seen[1]} == {str(p) for p in paths}
    assert not [r for r in caplog.records if "child process" in r.getMessage()]


def test_one_tshark_keeps_capture_time_order_with_a_small_merge_bound(monkeypatch):
    """Sharing one tshark, each file's chunk is held whole while the other file waits for the slot; analyze
    sizes the merge for that, so even a tiny default bound never releases events out of order (a file read
    whole while the other waited used to overflow it: 230k refused SYNs against a big eth0 capture)."""

    _chunk_everything(monkeypatch, 7)
    import kubectl_meshdoctor.commands.analyze as analyze_cmd

    monkeypatch.setattr(analyze_cmd, "MAX_BUFFERED", 3)
    monkeypatch.setattr(analyze_cmd, "HIGH_WATER", 2)
    events = []
    pipeline = Pipeline.with_detectors()
    feed = pipeline.feed
    pipeline.feed = lambda ev: (events.append(ev.ts), feed(ev))
    paths = [DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"]
    asyncio.run(analyze([CaptureArg.parse(str(p)) for p in paths], pipeline, jobs=1))
    assert len(events) > 14 and events == sorted(events)


def test_a_killed_tshark_is_a_problem_not_a_quiet_end():
    """A tshark killed by a signal (the OOM killer, kill -9) leaves the rest of its streams unread: the live
    path (the shared dissector) says so for each of them instead of ending as if the capture had."""
    import psutil

    from kubectl_meshdoctor.live.dissect import SharedDissector

    async def run():
        first = asyncio.Event()
        d = SharedDissector()
        stream = d.stream("pod/lo", "lo", lambda ev: first.set())
        stream.wrote((DATA / "lab-collision-lo.pcap").read_bytes())  # the stream stays open: tshark waits
        await asyncio.wait_for(first.wait(), 30)
        (child,) = [p for p in psutil.Process().children() if p.name() == "tshark"]
        child.kill()
        result = await asyncio.wait_for(stream.result, 30)
        stream.ended()
        await d.close()
        return result

    result = asyncio.run(run())
    assert result.error and "killed by signal 9" in result.error and "pod/lo" in result.error


def test_jobs_below_one_is_refused():
    with pytest.raises(ValueError):
        asyncio.run(analyze([CaptureArg.parse(str(DATA / "lab-collision-lo.pcap"))], Pipeline.with_detectors(),
                            jobs=0))


def test_lo_keeps_the_pure_acks_between_non_loopback_ends_only(tmp_path):
    """On lo the lean filter keeps a pure ACK only when neither end is in 127.0.0.0/8: the replies of the app's
    outbound connections, their source the original destination restored by conntrack (a caller sidecar's
    FIN-WAIT-2 socket answering a new SYN is one). The app's ACKs to 127.0.0.1:15001 and the inbound hop's from
    127.0.0.6 stay in the pod."""
    from tests.sources.test_prepass_ack_rules import A, APP, REPLY, S, _segment, write_pcap

    inbound = ("127.0.0.6", 40000, "198.18.0.1", 5000)
    acks = [_segment(*APP, A, 1, 2, b""), _segment(*REPLY, A, 3, 4, b""), _segment(*inbound, A, 5, 6, b""),
            _segment(*APP, S, 7, 0, b""), _segment(*REPLY, A, 8, 9, b"data")]
    whole, lean = tmp_path / "lo.pcap", tmp_path / "lean.pcap"
    write_pcap(whole, acks)
    subprocess.run(["tcpdump", "-r", str(whole), "-w", str(lean), lean_filter("lo")], check=True, capture_output=True)
    kept = subprocess.run(["tcpdump", "-r", str(lean), "-nn"], check=True, capture_output=True, text=True).stdout
    assert [line.split(" IP ", 1)[1].split(":")[0] for line in kept.splitlines()] == [
        "198.18.0.2.5000 > 198.18.0.1.41030", "198.18.0.1.41030 > 127.0.0.1.15001"]


def test_the_stale_sockets_ack_crosses_the_lean_filter_and_is_named(tmp_path):
    """tests/data/lab-outbound-stale-lo.pcap read through the lo lean filter again: the stale socket's ACKs
    (frames 8 and 24, from 198.18.1.2:5000, the original destination) cross it, and both outcomes are named."""
    out = tmp_path / "lo.pcap"
    subprocess.run(["tcpdump", "-r", str(DATA / "lab-outbound-stale-lo.pcap"), "-w", str(out), lean_filter("lo")],
                   check=True, capture_output=True)
    report, _ = _findings([out])
    assert sorted([(e.flags, e.frame) for e in f.evidence] for f in report.findings
                  if f.detector == "tuple-collision") == [[("S", 7), (".", 8), ("R", 9), ("S.", 11)],
                                                          [("S", 23), (".", 24), ("S", 26)]]
