"""bench/gen.py: the benchmark's captures are valid, deterministic, and hold exactly the planted failures.

Fast checks only (no timing): 20k-packet captures with two seeds. The analyze check reuses bench/run.py's
``check_findings``, the same one the benchmark applies to its large captures.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

dpkt = pytest.importorskip("dpkt", reason="bench extra not installed: pip install -e '.[bench]'")

ROOT = Path(__file__).resolve().parents[2]
PACKETS = 20_000
SEEDS = (1, 2)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


gen = _load("gen")
bench_run = _load("run")


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[int, Path]:
    out = {}
    for seed in SEEDS:
        d = tmp_path_factory.mktemp(f"seed{seed}")
        gen.generate(d, PACKETS, seed, jobs=1)
        out[seed] = d
    return out


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


@pytest.mark.parametrize("seed", SEEDS)
def test_files_are_classic_ethernet_pcaps_with_the_manifests_counts(captures, seed):
    d = captures[seed]
    m = _manifest(d)
    assert m["packets"] == PACKETS == sum(f["packets"] for f in m["files"].values())
    assert 0.5 < m["files"]["eth0.pcap"]["packets"] / PACKETS < 0.75  # about 60% eth0, 40% lo
    for name, info in m["files"].items():
        with open(d / name, "rb") as fh:
            reader = dpkt.pcap.Reader(fh)
            assert reader.datalink() == dpkt.pcap.DLT_EN10MB
            last = 0.0
            n = 0
            for ts, _ in reader:
                assert ts >= last  # time order, as tcpdump writes
                last, n = ts, n + 1
        assert n == info["packets"]
        if shutil.which("capinfos"):
            out = subprocess.run(["capinfos", "-M", "-c", "-T", "-r", str(d / name)], capture_output=True,
                                 text=True, check=True).stdout
            assert int(out.split()[-1]) == info["packets"]


def test_every_detector_has_three_planted_failures_with_key_frames_of_the_right_kind(captures):
    m = _manifest(captures[1])
    assert Counter(p["detector"] for p in m["planted"]) == {
        "tuple-collision": 3, "http-framing": 3, "stale-keepalive": 3, "upstream-refused": 3, "syn-timeout": 3}
    packets = {}
    for name in m["files"]:
        with open(captures[1] / name, "rb") as fh:
            packets[name] = [buf for _, buf in dpkt.pcap.Reader(fh)]
    S, A, R = dpkt.tcp.TH_SYN, dpkt.tcp.TH_ACK, dpkt.tcp.TH_RST
    expect = {"syn": S, "peer_syn": S, "last_retransmission": S, "challenge_ack": A, "rst": R}
    for p in m["planted"]:
        for role, frame in p["frames"].items():
            tcp = dpkt.ethernet.Ethernet(packets[p["file"]][frame - 1]).data.data
            if role in expect:
                assert tcp.flags & (S | A | R) in (expect[role], expect[role] | A), (p["id"], role)
            else:  # the app's response, the request after the FIN, the FIN
                assert tcp.data or tcp.flags & dpkt.tcp.TH_FIN, (p["id"], role)


def test_checksums_are_what_dpkt_computes(captures):
    """The generator hands dpkt its own (faster) checksums; dpkt recomputing them must agree."""
    d = captures[2]
    for name in ("eth0.pcap", "lo.pcap"):
        with open(d / name, "rb") as fh:
            for i, (_, buf) in enumerate(dpkt.pcap.Reader(fh)):
                if i % 7:
                    continue
                ip = dpkt.ethernet.Ethernet(buf).data
                got_tcp, got_ip = ip.data.sum, getattr(ip, "sum", None)
                ip.data.sum = 0
                if isinstance(ip, dpkt.ip.IP):
                    ip.sum = 0
                    bytes(ip)
                    assert ip.sum == got_ip or {ip.sum, got_ip} == {0, 0xFFFF}
                else:
                    bytes(ip)
                assert ip.data.sum == got_tcp or {ip.data.sum, got_tcp} == {0, 0xFFFF}


def test_same_seed_same_bytes_in_one_or_two_processes_and_another_seed_differs(captures, tmp_path):
    gen.generate(tmp_path / "again", PACKETS, 1, jobs=2)
    for name in ("eth0.pcap", "lo.pcap"):
        assert (tmp_path / "again" / name).read_bytes() == (captures[1] / name).read_bytes()
        assert (captures[2] / name).read_bytes() != (captures[1] / name).read_bytes()
    a, b = _manifest(tmp_path / "again"), _manifest(captures[1])
    a.pop("generate_s"), b.pop("generate_s")
    assert a == b


def test_too_few_packets_for_the_planted_failures_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least"):
        gen.generate(tmp_path, 100, 1)


def _analyze(d: Path) -> dict:
    exe = Path(sys.executable).with_name("kubectl-meshdoctor")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "kubectl_meshdoctor"]
    res = subprocess.run(cmd + ["analyze", "eth0.pcap", "lo.pcap", "-o", "json"], cwd=d, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1, res.stderr  # 1: error findings, which the planted failures are
    return json.loads(res.stdout)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="analyze reads captures through tshark")
@pytest.mark.parametrize("seed", SEEDS)
def test_analyze_finds_exactly_the_planted_failures(captures, seed):
    check = bench_run.check_findings(_analyze(captures[seed]), _manifest(captures[seed]))
    assert bench_run.check_problems(check) == []
    assert len(check["found"]) == 15


def test_check_findings_names_a_miss_a_stray_and_a_wrong_severity():
    planted = {"id": "syn-timeout-1", "detector": "syn-timeout", "file": "eth0.pcap", "iface": "eth0",
               "flow": {"client": "198.18.2.9:40000", "server": "198.18.1.2:8080"}, "severity": "error",
               "key_frames": [5, 9]}
    manifest = {"planted": [planted, dict(planted, id="syn-timeout-2", key_frames=[50, 90])]}
    ev = [{"source": "eth0.pcap", "iface": "eth0", "frame": f} for f in (5, 9)]
    report = {"findings": [
        {"detector": "syn-timeout", "severity": "warning", "flow": dict(planted["flow"], iface="eth0"),
         "evidence": ev},
        {"detector": "http-framing", "severity": "error", "flow": {"client": "a", "server": "b", "iface": "lo"},
         "evidence": []}]}
    check = bench_run.check_findings(report, manifest)
    assert [len(check[k]) for k in ("found", "missed", "unexpected", "wrong_severity")] == [1, 1, 1, 1]
    assert "syn-timeout-2" in check["missed"][0] and "http-framing" in check["unexpected"][0]
