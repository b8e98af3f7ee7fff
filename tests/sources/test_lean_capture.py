"""The pod-side capture filter (LEAN_FILTER) and the reader's display filter (PREFILTER) keep every packet a
detector concludes from: the lab's recorded captures give the same findings whole, through tcpdump's lean BPF,
and with the reader not filtering at all."""

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.sources import tshark
from kubectl_meshdoctor.sources.capture_filter import lean_filter
from kubectl_meshdoctor.sources.files import CaptureArg

DATA = Path(__file__).parent.parent / "data"
pytestmark = pytest.mark.skipif(not shutil.which("tcpdump"), reason="needs tcpdump")


class _Reads(list):
    most = 0


def _chunk_everything(monkeypatch, packets: int | None) -> _Reads:
    """Split every file into chunks of ``packets`` (None: read whole); returns the list of read_file calls
    analyze makes from now on, with ``.most`` the most at once."""
    import kubectl_meshdoctor.sources.files as analyze_mod

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
    monkeypatch.setattr(tshark, "PREFILTER", tshark.ALL_TCP)
    report, unfiltered = _findings([DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"])
    assert unfiltered == filtered
    assert report.stats.packets == sum(report.stats.frames_read.values())  # every frame reached the pipeline


def test_frame_numbers_survive_tshark_session_resets(monkeypatch):
    """tshark -M numbers frames from 1 again after every reset; the reader adds earlier sessions back, so
    evidence frames stay the frame numbers of the user's file."""
    paths = [DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"]
    whole, _ = _findings(paths)
    monkeypatch.setattr(tshark, "TSHARK_ARGS", [*tshark.TSHARK_ARGS, "-M", "7"])
    monkeypatch.setattr(tshark, "SESSION_PACKETS", 7)
    reset, _ = _findings(paths)
    assert reset.problems == []  # tshark's "resetting session" notice is not a problem
    assert [[(e.source, e.frame) for e in f.evidence] for f in reset.findings] == \
        [[(e.source, e.frame) for e in f.evidence] for f in whole.findings]
    assert max(e.frame for f in whole.findings for e in f.evidence) > 7


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
    import kubectl_meshdoctor.sources.files as analyze_mod

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
    """A tshark killed by a signal (the OOM killer, kill -9) leaves the rest of its stream unread: read_stream
    says so instead of ending as if the capture had."""
    import psutil

    async def run():
        read_fd, write_fd = os.pipe()
        first = asyncio.Event()
        task = asyncio.create_task(tshark.read_stream(read_fd, "pod/lo", "lo", lambda ev: first.set(),
                                                      live=True))
        os.write(write_fd, (DATA / "lab-collision-lo.pcap").read_bytes())  # the pipe stays open: tshark waits
        await asyncio.wait_for(first.wait(), 30)
        (child,) = [p for p in psutil.Process().children() if p.name() == "tshark"]
        child.kill()
        result = await asyncio.wait_for(task, 30)
        os.close(write_fd)
        return result

    result = asyncio.run(run())
    assert result.error and "killed by signal 9" in result.error and "pod/lo" in result.error


@pytest.mark.parametrize("signals, phase, copies", [
    ((signal.SIGTERM,), "tshark", 6000),  # 18 MB: chunked, seconds of tshark
    ((signal.SIGINT, signal.SIGINT), "tshark", 6000),  # an impatient Ctrl-C, twice
    ((signal.SIGINT,), "editcap", 30000),  # 90 MB: editcap is still splitting when it comes
    ((signal.SIGINT, signal.SIGINT), "editcap", 30000),
])
def test_stopping_analyze_removes_its_chunks_and_processes(tmp_path, signals, phase, copies):
    """kill (SIGTERM) ends analyze as Ctrl-C does, and a second Ctrl-C does not cut the cleanup short: exit
    128+signal, no tshark or editcap left, no chunk files beside the input."""
    import psutil

    big = tmp_path / "lo.pcap"
    data = (DATA / "lab-collision-lo.pcap").read_bytes()
    with big.open("wb") as out:  # the lab's capture over and over
        out.write(data[:24] + data[24:] * copies)  # one pcap header, then the records again and again
    proc = subprocess.Popen([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(big), "-o", "json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def running(name: str) -> list:
        found = []
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.name() == name:
                    found.append(child)
            except psutil.NoSuchProcess:
                pass
        return found

    deadline = time.monotonic() + 60
    while not (running(phase) and any(tmp_path.glob(".meshdoctor-chunks-*/chunk_*"))):
        assert proc.poll() is None and time.monotonic() < deadline, f"no {phase} seen"
        assert phase != "editcap" or not running("tshark"), "editcap ended before it was seen"
        time.sleep(0.01)
    # Held mid-split (SIGSTOP), so the signal surely comes while editcap has chunks still to write, however busy
    # the machine. analyze must not wait for it: a SIGKILL ends a stopped process too, while the thread that once
    # ran editcap kept the process alive until editcap finished, and went on writing chunks.
    held = running("editcap") if phase == "editcap" else []
    for editcap in held:
        editcap.suspend()
    children = psutil.Process(proc.pid).children(recursive=True)
    try:
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.02)  # a person's second Ctrl-C comes later still; this one lands inside the cleanup
        _, err = proc.communicate(timeout=30)
    finally:
        for editcap in held:
            try:
                editcap.resume()
            except psutil.NoSuchProcess:
                pass
    # -SIGINT: a second Ctrl-C in the instant between removing the loop's handler and ignoring the signal
    assert proc.returncode in {128 + signals[0]} | ({-signals[-1]} if len(signals) > 1 else set()), err
    assert b"Traceback" not in err
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    assert not list(tmp_path.glob(".meshdoctor-chunks-*"))  # also once nothing it started can write there


def test_jobs_below_one_is_refused():
    with pytest.raises(ValueError):
        asyncio.run(analyze([CaptureArg.parse(str(DATA / "lab-collision-lo.pcap"))], Pipeline.with_detectors(),
                            jobs=0))
