"""A capture whose name says no interface is a pod's lo or eth0 by its content (sources/iface_role.py), so the
detectors that act on lo and eth0 act on it; a name that says it wins. Real lab recordings, renamed, converted
by editcap, gzipped; the Linux cooked one rebuilt from a real lo frame as `tcpdump -i any` writes it."""

from __future__ import annotations

import gzip
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kubectl_meshdoctor.pcap_header import pcap_header
from kubectl_meshdoctor.sources.files import CaptureArg, with_role
from kubectl_meshdoctor.sources.iface_role import ETH0, LO, capture_role

DATA = Path(__file__).resolve().parent.parent / "data"
pytestmark = pytest.mark.skipif(shutil.which("tshark") is None or shutil.which("editcap") is None,
                                reason="captures are read through tshark; editcap converts them")


def _role(path: Path) -> str:
    return with_role(CaptureArg.parse(str(path))).iface


def test_lo_and_eth0_are_told_by_content_in_pcap_pcapng_and_gzip(tmp_path):
    for name, src in (("a.pcap", "lab-framing-mixed-lo.pcap"), ("b.pcap", "lab-framing-mixed-eth0.pcap")):
        shutil.copy(DATA / src, tmp_path / name)
        subprocess.run(["editcap", "-F", "pcapng", str(tmp_path / name), str(tmp_path / (name + "ng"))], check=True)
        (tmp_path / (name + ".gz")).write_bytes(gzip.compress((DATA / src).read_bytes()))
    assert [_role(tmp_path / n) for n in ("a.pcap", "a.pcapng", "a.pcap.gz")] == [LO, LO, LO]
    assert [_role(tmp_path / n) for n in ("b.pcap", "b.pcapng", "b.pcap.gz")] == [ETH0, ETH0, ETH0]


def test_a_name_that_says_the_interface_wins_over_content(tmp_path):
    shutil.copy(DATA / "lab-framing-mixed-lo.pcap", tmp_path / "eth0.pcap")
    assert _role(tmp_path / "eth0.pcap") == "eth0"
    assert CaptureArg.parse(f"{tmp_path / 'eth0.pcap'}:caller/lo").iface == "lo"


def _cooked(src: str, hatype: int) -> bytes:
    """A pcap of LINKTYPE_LINUX_SLL holding ``src``'s first frame with a cooked header of ARPHRD ``hatype``
    instead of its Ethernet header, as tcpdump -i any writes it."""
    raw = (DATA / src).read_bytes()
    order = pcap_header(raw).order
    ts, caplen = struct.unpack_from(order + "Q", raw, 24)[0], struct.unpack_from(order + "I", raw, 32)[0]
    frame = struct.pack("!HHH8sH", 0, hatype, 6, bytes(8), 0x0800) + raw[24 + 16 + 14:24 + 16 + caplen]
    return (raw[:20] + struct.pack(order + "I", 113)
            + struct.pack(order + "QII", ts, len(frame), len(frame)) + frame)


def test_a_linux_cooked_header_says_lo_by_its_hardware_type(tmp_path):
    assert capture_role(_cooked("lab-collision-lo.pcap", 772)) == LO
    assert capture_role(_cooked("lab-collision-eth0.pcap", 1)) == ETH0
    assert capture_role(_cooked("lab-collision-eth0.pcap", 772)) == LO  # the link says so, whatever the addresses
    (tmp_path / "x.pcap").write_bytes(_cooked("lab-collision-eth0.pcap", 772))
    out = subprocess.run(["tshark", "-r", str(tmp_path / "x.pcap"), "-T", "fields", "-e", "sll.hatype",
                          "-e", "ip.dst"], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["772", "198.18.1.2"]  # tshark reads the record as built


def test_no_ip_record_tells_nothing():
    assert capture_role(b"") is None
    raw = (DATA / "lab-collision-lo.pcap").read_bytes()
    assert capture_role(raw[:24]) is None  # a header alone


def test_a_capture_named_arbitrarily_gets_its_lo_and_eth0_detectors(tmp_path):
    shutil.copy(DATA / "lab-framing-mixed-lo.pcap", tmp_path / "caller.pcap")
    shutil.copy(DATA / "lab-collision-eth0.pcap", tmp_path / "server.pcap")
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(tmp_path / "caller.pcap"),
                           str(tmp_path / "server.pcap"), "-o", "json"], capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    assert set(report["stats"]["interfaces"]) == {"lo", "eth0"}
    detectors = {f["detector"] for f in report["findings"]}
    assert {"http-framing", "tuple-collision"} <= detectors  # lo's framing, eth0's collision
