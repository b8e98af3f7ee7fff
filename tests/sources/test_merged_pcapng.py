"""A pod's lo and eth0 captures merged into one pcapng by the real `mergecap` (issue 31, item 6): every packet on
the interface it was captured on, whatever the file is called, as the two files read apart. Interface blocks
with an ``if_name`` (as dumpcap writes them: tshark names each packet's interface) and without one (mergecap of
tcpdump's pcap files: folded into one block by default, one block a file with ``-I none``), where the file's
content tells (sources/iface_role.py frame_roles) and the report says what was assumed. The inputs are the lab's
recordings; the named ones are editcap's pcapng of them with an if_name option added to their interface block
(pcapng, draft-ietf-opsawg-pcapng section 4.2: option code 2)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data"
pytestmark = pytest.mark.skipif(any(shutil.which(t) is None for t in ("tshark", "editcap", "mergecap")),
                                reason="mergecap makes the files, tshark reads them")


def named_pcapng(src: Path, out: Path, name: str) -> Path:
    """editcap's pcapng of ``src``, its interface blocks given ``if_name`` ``name``."""
    subprocess.run(["editcap", "-F", "pcapng", str(src), str(out)], check=True, capture_output=True)
    data = out.read_bytes()
    order = "<" if data[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
    blocks, pos = [], 0
    while pos < len(data):
        btype, blen = struct.unpack_from(order + "II", data, pos)
        body = data[pos + 8:pos + blen - 4]
        if btype == 1:
            options, opts = b"", body[8:]
            while len(opts) >= 4:
                code, length = struct.unpack_from(order + "HH", opts)
                if code == 0:
                    break
                options += opts[:4 + length + (-length % 4)]
                opts = opts[4 + length + (-length % 4):]
            value = name.encode()
            option = struct.pack(order + "HH", 2, len(value)) + value + bytes(-len(value) % 4)
            body = body[:8] + option + options + struct.pack(order + "HH", 0, 0)
            blen = len(body) + 12
        blocks.append(struct.pack(order + "II", btype, blen) + body + struct.pack(order + "I", blen))
        pos += struct.unpack_from(order + "I", data, pos + 4)[0]
    out.write_bytes(b"".join(blocks))
    return out


def analyze(*files: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *map(str, files), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def story(report: dict) -> tuple:
    """What two reads of the same packets must both say: packets by interface, and each finding's flow."""
    return ({k: v["packets"] for k, v in report["stats"]["interfaces"].items()},
            sorted((f["detector"], f["severity"], json.dumps(f["flow"])) for f in report["findings"]))


@pytest.mark.parametrize("recording", ["lab-collision", "lab-framing-mixed"])
@pytest.mark.parametrize("how", [["-I", "all"], ["-I", "none"]])
@pytest.mark.parametrize("names", ["named", "unnamed"])
def test_a_mergecap_of_lo_and_eth0_reads_as_the_two_files(tmp_path, recording, how, names):
    lo, eth0 = DATA / f"{recording}-lo.pcap", DATA / f"{recording}-eth0.pcap"
    reference = analyze(lo, eth0)
    assert set(reference["stats"]["interfaces"]) == {"lo", "eth0"}
    if names == "named":
        lo, eth0 = named_pcapng(lo, tmp_path / "a.pcapng", "lo"), named_pcapng(eth0, tmp_path / "b.pcapng", "eth0")
    merged = tmp_path / "lo.pcapng"  # a name that says lo: the interfaces inside say otherwise
    subprocess.run(["mergecap", *how, "-w", str(merged), str(lo), str(eth0)], check=True, capture_output=True)
    blocks = subprocess.run(["capinfos", "-I", str(merged)], capture_output=True, text=True).stdout
    report = analyze(merged)
    assert story(report) == story(reference)
    told = [p["what"] for p in report["problems"]]
    if names == "unnamed":
        assert len(told) == 1 and "without a name" in told[0] and "frames lo" in told[0], (told, blocks)
    else:
        assert told == []
    gz = tmp_path / "merged.pcapng.gz"
    subprocess.run(f"gzip -c {merged} > {gz}", shell=True, check=True)
    assert story(analyze(gz)) == story(reference)


def test_the_users_interface_wins_over_the_split(tmp_path):
    merged = tmp_path / "both.pcapng"
    subprocess.run(["mergecap", "-w", str(merged), str(DATA / "lab-collision-lo.pcap"),
                    str(DATA / "lab-collision-eth0.pcap")], check=True, capture_output=True)
    report = analyze(Path(f"{merged}:eth0"))
    assert set(report["stats"]["interfaces"]) == {"eth0"} and report["problems"] == []
