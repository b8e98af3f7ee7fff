"""`analyze` tells each file's kind by its content, whatever its name: captures (also gzipped, as tshark reads
them), the sidecar's access log (TEXT, JSON, `kubectl logs --timestamps`, whole istio-proxy container logs) and
admin dumps (/stats, /clusters). Log lines and counters join the packets as in `watch`."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubectl_meshdoctor.sources.files import ENVOY_LOG, CAPTURE, CLUSTERS, STATS, InputError, input_kind

from ..plugins.test_access_log_classes import CLASSES, text

DATA = Path(__file__).resolve().parent.parent / "data"
ENVOY_DATA = Path(__file__).resolve().parent.parent / "envoy" / "data"
PILOT_AGENT = ("2026-12-01T09:59:58.101882Z\tinfo\tFIPS is not enabled\n"
               "2026-12-01T09:59:58.102340Z\tinfo\tEnvoy proxy is ready\n")

tshark = pytest.mark.skipif(shutil.which("tshark") is None, reason="captures are read through tshark")


def analyze(*files: str) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *files, "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout else {}), proc.stderr


def test_kinds_are_told_by_content_not_by_name(tmp_path):
    cases = {
        "a.log": (DATA / "lab-collision-eth0.pcap").read_bytes(),  # a capture named .log
        "b.pcap": (ENVOY_DATA / "istio_access_log.txt").read_bytes(),  # an access log named .pcap
        "c.txt": gzip.compress((DATA / "lab-collision-lo.pcap").read_bytes()),
        "d": (PILOT_AGENT + text(CLASSES["upstream-timeout"][0]) + "\n").encode(),
        "e": b"2026-12-01T10:00:03.262814507Z " + text(CLASSES["upstream-timeout"][0]).encode() + b"\n",
        "f": (ENVOY_DATA / "stats_sample.txt").read_bytes(),
        "g": (ENVOY_DATA / "clusters.txt").read_bytes(),
        "h": (ENVOY_DATA / "clusters.json").read_bytes(),
        "i": PILOT_AGENT.encode(),  # an istio-proxy log with no access-log line (yet)
    }
    for name, body in cases.items():
        (tmp_path / name).write_bytes(body)
    kinds = {name: input_kind(str(tmp_path / name)) for name in cases}
    assert kinds == {"a.log": CAPTURE, "b.pcap": ENVOY_LOG, "c.txt": CAPTURE, "d": ENVOY_LOG, "e": ENVOY_LOG,
                     "f": STATS, "g": CLUSTERS, "h": CLUSTERS, "i": ENVOY_LOG}


@pytest.mark.parametrize("body", [b"", b"hello\nworld\n", b"\x00\x01binary", b"{\"not\": \"envoy\"}\n"])
def test_a_file_of_no_known_kind_is_one_line_and_exit_2(tmp_path, body):
    f = tmp_path / "notes"
    f.write_bytes(body)
    with pytest.raises(InputError, match="not a capture"):
        input_kind(str(f))
    code, _, err = analyze(str(f))
    assert code == 2 and err.count("\n") == 1
    if not body:  # an empty file is called empty (analyze says so before asking what kind it is)
        assert err == f"kubectl meshdoctor: error: {f}: empty (0 bytes): nothing to read\n"
        return
    assert err == (f"kubectl meshdoctor: error: {f}: not a capture (pcap, pcapng), an Envoy log or an admin dump "
                   f"(/stats, /clusters); an access log of the mesh's own format reads with --log-format\n")


def test_an_access_log_alone_gives_findings_named_by_file_and_line(tmp_path):
    log = tmp_path / "istio-proxy.log"
    ut = text(CLASSES["upstream-timeout"][0])
    log.write_text(PILOT_AGENT + ut + "\n")
    code, report, err = analyze(str(log))
    assert code == 1, err
    (f,) = report["findings"]
    assert f["detector"] == "upstream-timeout" and f["access_log"] == [ut]
    # The line is quoted once (access_log); the evidence says what it is.
    assert f["evidence"] == [{"source": str(log), "iface": "", "frame": 3, "ts": f["evidence"][0]["ts"],
                              "what": "access log: 504 UT response_timeout", "src": "", "dst": "", "flags": "",
                              "payload_len": 0, "kind": "access-log"}]
    assert f["stands_on"] == ["access-log"]
    assert report["source"] == {"kind": "files", "files": [str(log)], "kinds": {str(log): "envoy-log"}}
    assert report["envoy"]["access_log_lines"] == 1


def test_a_log_with_nothing_of_envoys_says_so_and_never_exits_0(tmp_path):
    log = tmp_path / "istio-proxy.log"
    log.write_text(PILOT_AGENT)
    code, report, _ = analyze(str(log))
    assert code == 2 and report["findings"] == []  # nothing was read: no script may take it for "all is well"
    (p,) = report["problems"]
    assert p["where"] == str(log) and "no access-log line" in p["what"] and "Envoy's own log" in p["what"]


def test_a_file_of_no_known_kind_beside_one_with_the_answer_does_not_hide_it(tmp_path):
    nginx = tmp_path / "nginx.log"
    nginx.write_text('10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] "GET / HTTP/1.1" 502 157 "-" "curl/8.5.0"\n')
    js = tmp_path / "stats.json"
    js.write_text('{"stats": [{"name": "cluster.a.upstream_rq_total", "value": 1}]}\n')
    log = tmp_path / "istio-proxy.log"
    log.write_text(PILOT_AGENT + text(CLASSES["upstream-timeout"][0]) + "\n")
    code, report, _ = analyze(str(nginx), str(js), str(log), str(tmp_path / "missing.log"))
    assert code == 1, report["problems"]
    assert [f["detector"] for f in report["findings"]] == ["upstream-timeout"]
    where = {p["where"] for p in report["problems"]}
    assert {str(nginx), str(js), str(tmp_path / "missing.log")} <= where


def test_no_readable_input_at_all_is_one_line_and_exit_2(tmp_path):
    nginx = tmp_path / "nginx.log"
    nginx.write_text("not an envoy line\n")
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(nginx),
                           str(tmp_path / "gone.log")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert "none of the 2 inputs can be read" in line and str(nginx) in line and "Traceback" not in line


def test_stats_dumps_give_the_counters_that_moved(tmp_path):
    before = (ENVOY_DATA / "stats_sample.txt").read_text()
    after = before.replace("cluster.inbound|5000||;.upstream_cx_connect_fail: 0",
                           "cluster.inbound|5000||;.upstream_cx_connect_fail: 7")
    assert after != before
    (tmp_path / "before").write_text(before)
    (tmp_path / "after").write_text(after)
    _, two, _ = analyze(str(tmp_path / "before"), str(tmp_path / "after"))
    assert two["envoy"]["counters_moved"] == {"inbound|5000||": {"upstream_cx_connect_fail": 7}}
    assert two["envoy"]["counters_since"] == "first dump"
    _, one, _ = analyze(str(tmp_path / "after"))
    moved = one["envoy"]["counters_moved"]["inbound|5000||"]
    assert moved["upstream_cx_connect_fail"] == 7 and "max_host_weight" not in moved  # failures, not gauges
    assert one["envoy"]["counters_since"] == "Envoy's start"


def test_a_clusters_dump_names_the_hosts_envoy_will_not_route_to():
    _, report, _ = analyze(str(ENVOY_DATA / "clusters.json"))
    clusters = report["envoy"]["clusters"]
    assert clusters and all(set(c) == {"hosts", "unhealthy"} for c in clusters.values())
    assert any(c["unhealthy"] for c in clusters.values())


@tshark
def test_a_gzipped_capture_reads_as_the_capture_does(tmp_path):
    gz = tmp_path / "eth0.pcap.gz"
    gz.write_bytes(gzip.compress((DATA / "lab-collision-eth0.pcap").read_bytes()))
    _, plain, _ = analyze(f"{DATA / 'lab-collision-eth0.pcap'}:eth0")
    _, zipped, _ = analyze(f"{gz}:eth0")
    assert [(f["detector"], [e["frame"] for e in f["evidence"]]) for f in zipped["findings"]] == \
           [(f["detector"], [e["frame"] for e in f["evidence"]]) for f in plain["findings"]]
    assert zipped["source"]["kind"] == "pcap"


def test_the_same_file_spelt_twice_is_read_once(tmp_path, monkeypatch):
    log = tmp_path / "proxy.log"
    log.write_text(text(CLASSES["upstream-timeout"][0]) + "\n")
    monkeypatch.chdir(tmp_path)
    code, report, _ = analyze("proxy.log", str(log), f"{log}:eth0")
    assert code == 1 and report["envoy"]["access_log_lines"] == 1 and len(report["findings"]) == 1
    assert [p["what"] for p in report["problems"]] == []  # the first spelling had no interface


@tshark
def test_the_same_capture_under_two_names_is_read_once(tmp_path):
    """The same frames read twice invented a syn-timeout (each SYN seen again); now identical bytes are read
    once, and a problem names the copy left out (issue 16)."""
    eth0, lo = DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap"
    copies = [tmp_path / "copy-eth0.pcap", tmp_path / "again-lo.pcap"]
    for original, copy in zip((eth0, lo), copies):
        shutil.copyfile(original, copy)
    code, single, _ = analyze(str(eth0), str(lo))
    assert code == 1 and single["findings"] and single["problems"] == []
    code, doubled, err = analyze(str(eth0), str(lo), *map(str, copies))
    assert code == 1, err
    assert doubled["findings"] == single["findings"]
    assert "syn-timeout" not in {f["detector"] for f in doubled["findings"]}
    assert doubled["stats"]["packets"] == single["stats"]["packets"]
    assert doubled["problems"] == [{"where": str(copies[0]), "what": f"the same bytes as {eth0}: read once"},
                                   {"where": str(copies[1]), "what": f"the same bytes as {lo}: read once"}]
    code, spelt, _ = analyze(str(eth0), f"{eth0}:eth1")  # one file under two interfaces
    assert code == 1 and spelt["findings"] == analyze(str(eth0))[1]["findings"]
    assert [p["what"] for p in spelt["problems"]] == ["given again with interface eth1: read once, on interface eth0"]


@pytest.mark.parametrize("apart", ["0", "1"])
def test_the_same_capture_in_other_forms_is_counted_once(tmp_path, monkeypatch, apart):
    """Not only identical bytes: the capture as pcapng (tests/data's own conversion), gzipped, or cut short
    gives the same findings as the capture alone, and a problem says the copy's packets were counted once; the
    cut copy shares the capture's stream, read in this process or in a child (sources/reader_process.py)."""
    monkeypatch.setenv("MESHDOCTOR_PREPASS", "1")  # small files too: the capture and its cut copy share a stream
    monkeypatch.setenv("MESHDOCTOR_READER_PROCESS", apart)
    eth0 = DATA / "lab-collision-eth0.pcap"
    gz = tmp_path / "again.pcap.gz"
    gz.write_bytes(gzip.compress(eth0.read_bytes()))
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(eth0.read_bytes()[:-100])
    code, single, _ = analyze(str(eth0))
    for other in (DATA / "unnamed-iface-eth0.pcapng", gz, cut):
        code, doubled, err = analyze(str(eth0), f"{other}:eth0")
        assert code == 1, err
        assert doubled["findings"] == single["findings"], other
        assert doubled["stats"]["packets"] == single["stats"]["packets"]
        said = f"also in {eth0} (the same capture in another form?): counted once"
        assert any(p["where"] == str(other) and p["what"].endswith(said) for p in doubled["problems"])


def test_a_cut_short_gzipped_log_is_read_up_to_the_cut(tmp_path):
    body = "\n".join(text(CLASSES["upstream-timeout"][0]) for _ in range(30_000)) + "\n"
    whole = gzip.compress(body.encode())
    cut = tmp_path / "proxy.log.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    code, report, err = analyze(str(cut))
    assert code == 1, err
    (p,) = [p for p in report["problems"] if p["where"] == str(cut)]
    assert "cut short after line" in p["what"] and 0 < report["envoy"]["access_log_lines"] < 30_000


def test_a_json_stats_dump_says_what_to_save_instead(tmp_path):
    f = tmp_path / "stats.json"
    f.write_text('{"stats": [{"name": "cluster.inbound|5000||.upstream_cx_total", "value": 3}]}')
    code, _, err = analyze(str(f))
    assert code == 2 and "a /stats dump in JSON" in err and err.count("\n") == 1


@tshark
def test_a_capture_with_no_frame_is_nothing_read(tmp_path):
    """A pcap header alone (tcpdump stopped before its first packet) is no evidence: a problem naming it, and
    exit 2 when nothing else was read."""
    empty = tmp_path / "lo.pcap"
    empty.write_bytes((DATA / "lab-collision-lo.pcap").read_bytes()[:24])
    code, report, _ = analyze(str(empty))
    assert code == 2 and report["findings"] == []
    assert [p["where"] for p in report["problems"]] == [str(empty)] and "no frame" in report["problems"][0]["what"]


def test_a_gz_whose_data_is_not_deflate_is_one_line(tmp_path):
    bad = tmp_path / "proxy.log.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + bytes(range(256)) * 4)
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(bad)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert str(bad) in line and "cannot read" in line


SNMP = """Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos
Ip: 1 64 849786 0 0 0 0
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab
Tcp: 1 200 120000 -1 2511 1256 8 90 4
"""


@pytest.mark.parametrize("body", [SNMP, "Name: value\nFoo: 12\nBar: x\n", "Subject: hello\nFrom: a@b.c\n",
                                  "key.with.dots: some text\nother.key: 3 apples\n"])
def test_name_value_text_of_other_programs_is_no_stats_dump(tmp_path, body):
    """Issue 29: `Name: value` text (/proc/net/snmp, a mail header) was taken for a /stats dump: no findings,
    exit 0. It is no input of ours: one line, exit 2."""
    f = tmp_path / "counters.txt"
    f.write_text(body)
    code, report, err = analyze(str(f))
    assert code == 2 and report == {} and err.strip().count("\n") == 0
    assert "not a capture (pcap, pcapng), an Envoy log or an admin dump" in err


def test_a_stats_dump_without_per_cluster_counters_says_they_are_hidden(tmp_path):
    """Issue 29: Istio's default stats inclusion list keeps the cluster.inbound|/outbound| counters out of
    /stats; a dump without them cannot show their failures, and says so."""
    f = tmp_path / "stats.txt"
    f.write_text("cluster.xds-grpc.upstream_cx_total: 3\ncluster_manager.active_clusters: 12\n"
                 "server.uptime: 3600\nlistener.0.0.0.0_15006.downstream_cx_total: 40\n")
    code, report, err = analyze(str(f))
    assert code == 0, err
    assert any("no per-cluster counter" in p["what"] and "proxyStatsMatcher" in p["what"]
               for p in report["problems"]), report["problems"]


def test_a_pcap_header_then_zeros_is_no_capture(tmp_path):
    """Issue 29: a pcap header followed by megabytes of zeros reads as hundreds of thousands of empty records:
    no traffic in any, so nothing was read (exit 2), and the problem says what the file is."""
    f = tmp_path / "capture.pcap"
    f.write_bytes((DATA / "lab-collision-lo.pcap").read_bytes()[:24] + b"\0" * (2 << 20))
    code, report, err = analyze(str(f))
    assert code == 2, err
    (p,) = report["problems"]
    assert p["what"].endswith("frames, every one empty (no byte captured): not a capture of traffic (damaged, or "
                              "no pcap after its header)"), p


def test_findings_past_the_kept_ones_are_said_not_lost_silently(tmp_path):
    """A log with more failing requests than the pipeline keeps (MAX_FINDINGS): the report says how many more
    there were. (It took minutes before: every kept finding was matched against every kept line, and each
    request decided against every finding.)"""
    from kubectl_meshdoctor.core.pipeline import MAX_FINDINGS

    f = tmp_path / "access.log"
    f.write_text("\n".join(text(CLASSES["upstream-timeout"][0]) for _ in range(MAX_FINDINGS + 50)) + "\n")
    code, report, err = analyze(str(f))
    assert code == 1, err
    assert len(report["findings"]) == MAX_FINDINGS
    (p,) = [p for p in report["problems"] if p["where"] == "findings"]
    assert p["what"].startswith(f"50 more findings than the {MAX_FINDINGS} kept")


@pytest.mark.parametrize("name, cut", [("lab-collision-lo.pcap", 63), ("lab-collision-lo.pcap", 85),
                                       ("unnamed-iface-eth0.pcapng", 79)])
def test_a_capture_cut_before_its_first_frame_is_nothing_read(tmp_path, name, cut):
    """Found by bench/fuzz (seed 5): a pcap cut inside its first record, or a pcapng cut inside its first blocks
    (which tshark then reads as one frame of a "mime" file), exited 0 with "no findings"."""
    f = tmp_path / name
    f.write_bytes((DATA / name).read_bytes()[:cut])
    code, report, err = analyze(str(f))
    assert code == 2, (err, report.get("problems"))
    assert report["stats"]["packets"] == 0 and report["problems"], report


def test_a_huge_line_of_dots_is_told_from_a_stats_dump_at_once(tmp_path):
    """Found by bench/fuzz (seed 5): telling a /stats dump by a regex that had to find the dot in a name of
    megabytes backtracked over every split of it (93 s for one 3 MiB line)."""
    f = tmp_path / "stats.txt"
    f.write_text("cluster.inbound|5000||.upstream_cx_total: 3\n" + "gnp.exe" * (1 << 16) + "\nserver.uptime: 3\n")
    code, report, err = analyze_with_deadline(str(f))
    assert code in (0, 2) and "internal error" not in err


def analyze_with_deadline(*files: str) -> tuple[int, dict, str]:
    """analyze with a deadline of 60 s (the test fails when it is not met)."""
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *files, "-o", "json"],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout else {}), proc.stderr


def test_a_capture_cut_short_says_how_many_frames_were_read(tmp_path):
    """tshark stops at a cut without counting what it read: the whole frames before the cut were read, and the
    report says so (bench/fuzz found a cut capture of one non-TCP frame reported as nothing read, exit 0)."""
    import struct
    data = (DATA / "lab-collision-eth0.pcap").read_bytes()
    first = 24 + 16 + struct.unpack("<I", data[24 + 8:24 + 12])[0]
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[:first + 20])  # frame 1 whole, frame 2's record header and a few bytes
    code, report, _ = analyze(str(cut))
    assert report["stats"]["frames_read"] == {str(cut): 1}
    (problem,) = report["problems"]
    assert problem["cut_after_frame"] == 1
