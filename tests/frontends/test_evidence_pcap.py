"""Saving a finding's evidence: a pcapng with named interfaces that analyze reads back to the same finding."""

import asyncio
import subprocess
from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.frontends.evidence_pcap import SaveError, save_evidence
from kubectl_meshdoctor.sources.files import CaptureArg

DATA = Path(__file__).parent.parent / "data"
ARGS = [CaptureArg.parse(str(DATA / "lab-collision-eth0.pcap")), CaptureArg.parse(str(DATA / "lab-collision-lo.pcap"))]


@pytest.fixture(scope="module")
def collision():
    (f,) = [f for f in asyncio.run(analyze(ARGS, Pipeline.with_detectors())).findings if f.detector == "tuple-collision"]
    return f


def test_saved_pcapng_reads_back_to_the_same_finding(collision, tmp_path):
    out = tmp_path / "evidence.pcapng"
    saved = save_evidence(collision, {a.path: a.path for a in ARGS}, str(out))
    assert out.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"
    names = subprocess.run(["tshark", "-r", str(out), "-T", "fields", "-e", "frame.interface_name"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert set(names) == {"eth0"} and len(names) == saved.packets
    (again,) = asyncio.run(analyze([CaptureArg.parse(str(out))], Pipeline.with_detectors())).findings
    assert (again.detector, again.severity, again.flow, again.envoy_flags) == \
        (collision.detector, collision.severity, collision.flow, collision.envoy_flags)
    assert [e.what.split(" (")[0] for e in again.evidence] == [e.what.split(" (")[0] for e in collision.evidence]
    # Every evidence frame of the original is among the copied ones.
    assert {e.frame for e in collision.evidence} <= set(saved.frames[str(DATA / "lab-collision-eth0.pcap")])


def test_an_existing_file_is_not_overwritten_unless_asked(collision, tmp_path):
    out = tmp_path / "kept.pcapng"
    out.write_bytes(b"mine")
    with pytest.raises(SaveError, match="exists"):
        save_evidence(collision, {a.path: a.path for a in ARGS}, str(out))
    assert out.read_bytes() == b"mine"
    save_evidence(collision, {a.path: a.path for a in ARGS}, str(out), overwrite=True)
    assert out.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"


def test_no_capture_file_for_the_source_is_one_clear_error(collision, tmp_path):
    with pytest.raises(SaveError, match="no capture file"):
        save_evidence(collision, {}, str(tmp_path / "x.pcapng"))
    assert not (tmp_path / "x.pcapng").exists()


def test_saved_packets_are_the_owners_alone_whatever_the_umask(collision, tmp_path):
    """The packets keep the traffic's headers unredacted (cookies, tokens), as --write-pcap's copies do: 0600,
    also when replacing a file that was readable by others, and under a permissive umask."""
    import os
    import stat

    sources = {a.path: a.path for a in ARGS}
    old = os.umask(0o000)
    try:
        fresh = tmp_path / "fresh.pcapng"
        save_evidence(collision, sources, str(fresh))
        replaced = tmp_path / "replaced.pcapng"
        replaced.write_bytes(b"old")
        replaced.chmod(0o644)
        save_evidence(collision, sources, str(replaced), overwrite=True)
    finally:
        os.umask(old)
    for path in (fresh, replaced):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert not list(tmp_path.glob("*.part"))


def test_a_link_where_the_packets_go_is_not_written_through(collision, tmp_path):
    """Overwriting replaces a file of ours, never what a planted link points at (the TUI may run as root)."""
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    link = tmp_path / "evidence.pcapng"
    link.symlink_to(target)
    with pytest.raises(SaveError, match="symbolic link"):
        save_evidence(collision, {a.path: a.path for a in ARGS}, str(link), overwrite=True)
    assert target.read_bytes() == b"keep me" and link.is_symlink()
    part = tmp_path / "other.pcapng.part"  # a link planted where the partial file goes: refused, and named
    part.symlink_to(target)
    with pytest.raises(SaveError, match=f"cannot write {part}: it is a symbolic link"):
        save_evidence(collision, {a.path: a.path for a in ARGS}, str(tmp_path / "other.pcapng"))
    assert target.read_bytes() == b"keep me" and not (tmp_path / "other.pcapng").exists()
