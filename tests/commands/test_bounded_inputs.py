"""Issue 29, items 4 and 5: any input in bounded memory, and no readable line lost. A gzip bomb (one access-log
line, then hundreds of MiB of zeros with no line end) is read under a data limit far below its size, its
line skipped and said; a dump is read up to MAX_DUMP, said; a gzipped log cut short, or with a wrong checksum,
has every line that decompresses analysed, and the problem names the real last line."""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import zlib

from kubectl_meshdoctor.sources import envoy_files

from ..plugins.test_access_log_classes import CLASSES, text

LIMIT = 400 << 20  # RLIMIT_DATA of the analysing process: the bomb's line alone is 600 MiB


def analyze_limited(*files: str) -> tuple[int, dict, str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (LIMIT, LIMIT))

    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *files, "-o", "json"],
                          capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout else {}), proc.stderr


def test_a_gzip_bomb_line_is_skipped_in_bounded_memory(tmp_path):
    line = text(CLASSES["upstream-timeout"][0])
    co = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    body = co.compress((line + "\n").encode())
    zeros = b"\0" * (1 << 20)
    for _ in range(600):
        body += co.compress(zeros)
    body += co.compress(b"\n") + co.flush() + gzip.compress((line + "\n").encode())  # a second member
    bomb = tmp_path / "istio-proxy.log.gz"
    bomb.write_bytes(body)
    code, report, err = analyze_limited(str(bomb))
    assert code == 1, err
    assert report["envoy"]["access_log_lines"] == 2
    assert any("1 line(s) longer than 1 MiB were skipped unread" in p["what"] and "line 2" in p["what"]
               for p in report["problems"]), report["problems"]


def test_a_dump_is_read_up_to_its_cap_and_says_so(tmp_path, monkeypatch):
    dump = tmp_path / "stats.txt"
    dump.write_text("".join(f"cluster.outbound|{i}||x.upstream_cx_connect_fail: {i}\n" for i in range(1, 2001))
                    + "server.uptime: 100\n")
    monkeypatch.setattr(envoy_files, "MAX_DUMP", 4096)
    counters, notes = envoy_files.read_counters([str(dump)], 0.0)
    assert any("larger than" in n and str(dump) in n for n in notes), notes
    assert 0 < len(counters.moved) < 2000  # what fits is read, whole lines only
    assert all(v == int(c.split("|")[1]) for c, s in counters.moved.items() for v in s.values())


def _lines_that_decompress(data: bytes) -> int:
    """What `zcat` shows of a cut gzip file: the complete lines of what decompresses."""
    return zlib.decompressobj(31).decompress(data).count(b"\n")


def test_a_cut_gzipped_log_loses_no_line_that_decompresses(tmp_path):
    body = "\n".join(text(CLASSES["upstream-timeout"][0]) for _ in range(9_000)) + "\n"
    whole = gzip.compress(body.encode())
    data = whole[: len(whole) * 97 // 100]
    cut = tmp_path / "proxy.log.gz"
    cut.write_bytes(data)
    readable = _lines_that_decompress(data)
    assert 5_000 < readable < 9_000
    code, report, err = analyze_limited(str(cut))
    assert code == 1, err
    assert report["envoy"]["access_log_lines"] >= readable - 1  # the line the cut went through is no line
    (p,) = report["problems"]
    assert f"cut short after line {report['envoy']['access_log_lines']}" in p["what"], p


def test_a_gzipped_log_with_a_wrong_checksum_is_read_whole_and_said(tmp_path):
    body = "\n".join(text(CLASSES["upstream-timeout"][0]) for _ in range(9_000)) + "\n"
    whole = bytearray(gzip.compress(body.encode()))
    whole[-8] ^= 0xFF  # the CRC32 of the trailer (RFC 1952 section 2.3)
    bad = tmp_path / "proxy.log.gz"
    bad.write_bytes(bytes(whole))
    code, report, err = analyze_limited(str(bad))
    assert code == 1, err
    assert report["envoy"]["access_log_lines"] == 9_000
    (p,) = report["problems"]
    assert "cut short after line 9000" in p["what"] and "CRC" in p["what"], p


def test_a_small_cut_or_damaged_gzip_log_is_read_not_refused(tmp_path):
    """Found by bench/fuzz: a gzip log smaller than what analyze sniffs to tell its kind (1 MiB) was refused
    whole when cut short or when its checksum was wrong, though `zcat` reads its lines."""
    body = "\n".join(text(CLASSES["upstream-timeout"][0]) for _ in range(60)) + "\n"
    whole = gzip.compress(body.encode())
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(whole[: len(whole) * 9 // 10])
    bad = bytearray(whole)
    bad[-8] ^= 0xFF
    damaged = tmp_path / "bad-crc.log.gz"
    damaged.write_bytes(bytes(bad))
    for path, lines in ((cut, _lines_that_decompress(cut.read_bytes())), (damaged, 60)):
        code, report, err = analyze_limited(str(path))
        assert code == 1, err
        assert report["envoy"]["access_log_lines"] >= lines - 1 > 0
        (p,) = report["problems"]
        assert f"cut short after line {report['envoy']['access_log_lines']}" in p["what"], p
