"""The record-level pre-pass (sources/prepass.py) gives tshark only records PREFILTER may keep, and analyze the
same report with it as without: the same findings, evidence frames, frames read and problems, on the lab's
captures, with undissectable frames and cut short; and it leaves no chunk behind."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.sources import prepass, tshark
from kubectl_meshdoctor.sources import read_plan as files
from kubectl_meshdoctor.sources.files import CaptureArg
from kubectl_meshdoctor.sources.http1 import START_PREFIXES
from tests.sources.test_undissectable import bad_header_length, captured_short, with_bad_frames

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")

DATA = Path(__file__).resolve().parent.parent / "data"
CAPTURES = sorted(p.name for p in DATA.iterdir() if p.suffix in (".pcap", ".pcapng"))
PAIRS = [("lab-collision-eth0.pcap", "lab-collision-lo.pcap"),
         ("lab-collision3m-eth0.pcap", "lab-collision3m-lo.pcap", "lab-collision3m-access.log"),
         ("lab-framing-mixed-eth0.pcap", "lab-framing-mixed-lo.pcap", "lab-framing-mixed-access.log"),
         ("unnamed-iface-eth0.pcapng",)]


def _yielded(path: Path | str) -> list[str]:
    """tshark's PREFILTER output lines for ``path``, as analyze runs it."""
    cmd = ["tshark", "-r", str(path), "-n", "-T", "fields", "-Y", tshark.FILE_PREFILTER]
    for f in tshark.FIELDS:
        cmd += ["-e", f]
    cmd += [a for a in tshark.TSHARK_ARGS if a not in ("-z", "io,stat,0")]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()


def _as_cut(line: str) -> str:
    """``line`` as the pre-pass's copy of a pcap record gives it: an HTTP/1 start's payload up to its header
    block's end (CRLF CRLF included), unless the segment has SYN, FIN or RST (kept whole)."""
    *fields, payload = line.split("\t")
    if bytes.fromhex(payload[:8]) not in START_PREFIXES or int(fields[tshark.FIELDS.index("tcp.flags")], 16) & 0x07:
        return line
    return "\t".join([*fields, payload[:len(tshark._header_block(payload)) * 2]])


@pytest.mark.parametrize("name", CAPTURES)
def test_tshark_yields_the_same_lines_from_the_kept_records(tmp_path, name):
    kept = prepass.prepass(str(DATA / name), str(tmp_path), 10**9)
    assert kept is not None and kept.records >= kept.kept and not kept.cut_short
    lines = []
    for chunk in kept.chunks:
        for line in _yielded(chunk.path):
            number, rest = line.split("\t", 1)
            lines.append(f"{chunk.frames[int(number) - 1]}\t{rest}")
    whole = _yielded(DATA / name)
    # pcap records of HTTP/1 starts are cut after their header block; pcapng ones are copied whole
    assert lines == ([_as_cut(line) for line in whole] if name.endswith(".pcap") else whole)
    if name.endswith(".pcap") and any(line != _as_cut(line) for line in whole):
        assert sum(map(len, lines)) < sum(map(len, whole))


def run(paths, monkeypatch, on: bool):
    monkeypatch.setenv("MESHDOCTOR_PREPASS", "1" if on else "0")
    return asyncio.run(analyze([CaptureArg.parse(str(p)) for p in paths], Pipeline.with_detectors()))


def same_report(paths, monkeypatch):
    """analyze's report of ``paths`` without and with the pre-pass: asserted equal; returns the first."""
    without, with_ = run(paths, monkeypatch, False), run(paths, monkeypatch, True)
    assert with_.findings == without.findings
    assert [[(e.source, e.frame) for e in f.evidence] for f in with_.findings] == \
        [[(e.source, e.frame) for e in f.evidence] for f in without.findings]
    assert with_.stats.frames_read == without.stats.frames_read
    assert with_.stats.packets == without.stats.packets
    assert with_.problems == without.problems
    return without


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p[0].rsplit("-", 1)[0])
def test_the_lab_captures_give_the_same_report_with_the_pre_pass(monkeypatch, pair):
    report = same_report([DATA / n for n in pair], monkeypatch)
    assert report.findings
    assert all(n > 0 for n in report.stats.frames_read.values())
    assert not list(DATA.glob(".meshdoctor-chunks-*"))


def test_frames_read_counts_the_users_file(monkeypatch, tmp_path):
    path = tmp_path / "eth0.pcap"
    shutil.copy(DATA / "lab-collision3m-eth0.pcap", path)
    report = run([path], monkeypatch, True)
    assert report.stats.frames_read == {str(path): 2340}
    assert not list(tmp_path.glob(".meshdoctor-chunks-*"))  # made beside the file, and gone


@pytest.mark.parametrize("bad", [bad_header_length, captured_short])
def test_undissectable_frames_give_the_same_report(monkeypatch, tmp_path, bad):
    """Every undissectable frame is named (PREFILTER yields them), with the pre-pass too, which keeps every frame
    it cannot parse."""
    report = same_report([with_bad_frames(tmp_path, (1, 7, 13), bad)], monkeypatch)
    (p,) = report.problems
    assert "3 TCP frames tshark could not dissect (frame 1, 8, 15:" in p.what


@pytest.mark.parametrize("name", ["lab-collision-eth0.pcap", "unnamed-iface-eth0.pcapng"])
@pytest.mark.parametrize("cut", [7, 500, 1500])
def test_a_file_cut_short_gives_the_same_report_up_to_the_cut(monkeypatch, tmp_path, name, cut):
    data = (DATA / name).read_bytes()
    path = tmp_path / ("eth0" + Path(name).suffix)
    path.write_bytes(data[:-cut])
    report = same_report([path], monkeypatch)
    (p,) = report.problems
    assert "cut short" in p.what and p.cut_after_frame


def test_chunks_of_kept_records_keep_each_frames_number(monkeypatch):
    """In chunks of 200 kept records, every packet analyze sees carries the frame number (and time) it has in the
    file read whole."""
    paths = [DATA / "lab-collision3m-eth0.pcap"]

    def events(on: bool) -> dict[int, float]:
        monkeypatch.setenv("MESHDOCTOR_PREPASS", "1" if on else "0")
        pipeline = Pipeline.with_detectors()
        seen: dict[int, float] = {}
        feed = pipeline.feed
        pipeline.feed = lambda ev: (seen.__setitem__(ev.frame, ev.ts), feed(ev))
        asyncio.run(analyze([CaptureArg.parse(str(p)) for p in paths], pipeline))
        return seen

    whole = events(False)
    monkeypatch.setattr(files, "CHUNK_PACKETS", 200)
    chunked = events(True)
    assert len(chunked) > 0.9 * len(whole)
    assert all(whole.get(frame) == ts for frame, ts in chunked.items() if frame in whole)
    assert sum(frame in whole for frame in chunked) > 0.9 * len(chunked)


def test_files_it_does_not_follow_are_read_as_without_it(monkeypatch, tmp_path):
    gz = tmp_path / "eth0.pcap.gz"
    gz.write_bytes(gzip.compress((DATA / "lab-collision-eth0.pcap").read_bytes()))
    assert prepass.prepass(str(gz), str(tmp_path), 100) is None
    other = tmp_path / "wifi-eth0.pcap"
    data = bytearray((DATA / "lab-collision-eth0.pcap").read_bytes())
    data[20:24] = (105).to_bytes(4, "little")  # IEEE 802.11: not walked
    other.write_bytes(bytes(data))
    assert prepass.prepass(str(other), str(tmp_path), 100) is None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("kept_")]
    same_report([gz], monkeypatch)


def test_a_frame_too_big_for_tshark_is_left_to_tshark(monkeypatch, tmp_path):
    """A record longer than tshark takes (262,144 bytes) stops tshark with its own error: the pass does not
    follow such a file, and the report is the one without it."""
    data = (DATA / "lab-collision-eth0.pcap").read_bytes()
    path = tmp_path / "eth0.pcap"
    path.write_bytes(data + struct.pack("<IIII", 1, 0, 300_000, 300_000) + bytes(300_000))
    assert prepass.prepass(str(path), str(tmp_path), 100) is None
    same_report([path], monkeypatch)


def test_a_second_pcapng_section_is_left_to_tshark(monkeypatch, tmp_path):
    data = (DATA / "unnamed-iface-eth0.pcapng").read_bytes()
    path = tmp_path / "eth0.pcapng"
    path.write_bytes(data + data)
    assert prepass.prepass(str(path), str(tmp_path), 100) is None
    same_report([path], monkeypatch)


def _records(data: bytes) -> list[bytes]:
    """The records of a little-endian pcap file, header included, in order."""
    out, pos = [], 24
    while pos + 16 <= len(data):
        end = pos + 16 + struct.unpack_from("<I", data, pos + 8)[0]
        out.append(data[pos:end])
        pos = end
    return out


def test_an_http_start_is_cut_after_its_header_block_and_the_rest_is_copied_whole(tmp_path):
    """Record level: a kept record is the original, or the original's first bytes up to an HTTP/1 start's CRLF
    CRLF with its captured length saying so and its original length kept."""
    original = (DATA / "lab-framing-mixed-lo.pcap").read_bytes()
    kept = prepass.prepass(str(DATA / "lab-framing-mixed-lo.pcap"), str(tmp_path), 10**9)
    records = _records(original)
    cut = 0
    for chunk in kept.chunks:
        data = Path(chunk.path).read_bytes()
        assert data[:24] == original[:24]
        for frame, rec in zip(chunk.frames, _records(data), strict=True):
            whole = records[frame - 1]
            if rec == whole:
                continue
            cut += 1
            caplen, wirelen = struct.unpack_from("<II", rec, 8)
            assert rec[:8] == whole[:8] and wirelen == struct.unpack_from("<I", whole, 12)[0]
            assert caplen == len(rec) - 16 < len(whole) - 16 and whole.startswith(rec[16:], 16)
            head = rec[16:]
            assert head.endswith(b"\r\n\r\n") and head.count(b"\r\n\r\n") == 1
            assert any(p in head for p in START_PREFIXES)
    # as many as tshark's lines of the whole file show HTTP/1 starts with bytes after their header block (75)
    assert cut == sum(line != _as_cut(line) for line in _yielded(DATA / "lab-framing-mixed-lo.pcap")) > 0
