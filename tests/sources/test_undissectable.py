"""A TCP frame tshark can dissect only in part (a TCP header length under 20 bytes, or a frame captured
shorter than its TCP header, as `tcpdump -s 40` makes) is counted and named in the report's problems; it never
ends the run, wherever it stands: the first frame of a file, the first frame of a chunk, the middle."""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct
from pathlib import Path

import dpkt
import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.sources.files import CaptureArg

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")

DATA = Path(__file__).resolve().parent.parent / "data"


def _syn() -> bytes:
    tcp = dpkt.tcp.TCP(sport=40000, dport=5000, seq=1, flags=dpkt.tcp.TH_SYN)
    ip = dpkt.ip.IP(src=socket.inet_aton("198.18.1.1"), dst=socket.inet_aton("198.18.1.2"), p=6, data=tcp)
    ip.len = len(ip)
    return bytes(dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x02" * 6, type=dpkt.ethernet.ETH_TYPE_IP,
                                        data=ip))


def bad_header_length() -> tuple[bytes, int]:
    raw = bytearray(_syn())
    raw[14 + 20 + 12] = 4 << 4  # TCP data offset 4: a 16-byte header, which RFC 9293 does not allow
    return bytes(raw), len(raw)


def captured_short() -> tuple[bytes, int]:
    raw = _syn()
    return raw[:40], len(raw)  # 40 bytes kept of 54: the TCP header is cut after its ports


def with_bad_frames(tmp_path: Path, at: tuple[int, ...], bad) -> Path:
    """The lab's collision capture with a bad frame inserted before each 1-based position in ``at``."""
    reader = dpkt.pcap.Reader(open(DATA / "lab-collision-eth0.pcap", "rb"))
    frames = list(reader)
    out = tmp_path / "eth0.pcap"
    with open(out, "wb") as fh:
        writer = dpkt.pcap.Writer(fh, linktype=reader.datalink())
        for i, (ts, buf) in enumerate(frames, 1):
            if i in at:
                data, wire_len = bad()
                t = ts - 0.0001
                fh.write(struct.pack("IIII", int(t), int(round(t % 1 * 1e6)), len(data), wire_len) + data)
            writer.writepkt(buf, ts)
    return out


def run(path: Path):
    return asyncio.run(analyze([CaptureArg.parse(f"{path}:eth0")], Pipeline.with_detectors()))


@pytest.fixture(scope="module")
def whole():
    return run(DATA / "lab-collision-eth0.pcap")


def key(report):
    return sorted((f.detector, f.severity.value, f.flow.client, f.flow.server) for f in report.findings)


@pytest.mark.parametrize("bad", [bad_header_length, captured_short])
def test_an_undissectable_first_frame_leaves_the_other_findings(tmp_path, whole, bad):
    report = run(with_bad_frames(tmp_path, (1,), bad))
    assert key(report) == key(whole) and report.findings
    (p,) = report.problems
    assert p.where.endswith("eth0.pcap") and "1 TCP frame tshark could not dissect (frame 1:" in p.what


def test_an_undissectable_first_frame_of_a_chunk_leaves_the_other_findings(tmp_path, whole, monkeypatch):
    import kubectl_meshdoctor.sources.read_plan as files

    monkeypatch.setattr(files, "CHUNK_ABOVE_BYTES", 0)
    monkeypatch.setattr(files, "CHUNK_PACKETS", 7)
    # Bad frames inserted before original frames 1, 7 and 13 stand at file frames 1, 8 and 15: the first frames
    # of chunks 1, 2 and 3.
    report = run(with_bad_frames(tmp_path, (1, 7, 13), bad_header_length))
    assert key(report) == key(whole)
    (p,) = report.problems
    assert "3 TCP frames tshark could not dissect (frame 1, 8, 15:" in p.what


@pytest.mark.parametrize("bad", [bad_header_length, captured_short])
def test_undissectable_frames_mid_file_are_counted_not_dropped(tmp_path, whole, bad):
    """Not only a first frame: the display filter that hides the packets no detector reads once hid these too,
    so a broken frame mid-capture was neither analysed nor named (review of issue 15)."""
    report = run(with_bad_frames(tmp_path, (5, 12), bad))
    assert key(report) == key(whole)
    (p,) = report.problems
    assert "2 TCP frames tshark could not dissect (frame 5, 13:" in p.what


def test_a_capture_made_with_a_40_byte_snaplen_says_so(tmp_path):
    """``tcpdump -s 40``: every TCP header is cut. Nothing can be concluded, and the report must say why
    instead of an empty, clean-looking report."""
    reader = dpkt.pcap.Reader(open(DATA / "lab-collision-eth0.pcap", "rb"))
    out = tmp_path / "short.pcap"
    frames = list(reader)
    with open(out, "wb") as fh:
        dpkt.pcap.Writer(fh, linktype=reader.datalink(), snaplen=40)
        for ts, buf in frames:
            fh.write(struct.pack("IIII", int(ts), int(round(ts % 1 * 1e6)), 40, len(buf)) + buf[:40])
    report = run(out)
    (p,) = report.problems
    assert f"{len(frames)} TCP frames tshark could not dissect" in p.what
