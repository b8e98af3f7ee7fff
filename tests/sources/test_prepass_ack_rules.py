"""The pre-pass keeps every pure ACK PREFILTER's tcp.completeness tests keep (sources/prepass.py), checked
against tshark itself: random flag sequences on two conversations (the two halves of a connection NATed on lo,
as conntrack's REDIRECT shows them) give the same yielded lines from the kept records as from the whole file."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.sources import prepass, tshark

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")

F, S, R, P, A = 0x01, 0x02, 0x04, 0x08, 0x10
APP = ("198.18.0.1", 41030, "127.0.0.1", 15001)  # the app's SYN after nat OUTPUT's REDIRECT
REPLY = ("198.18.0.2", 5000, "198.18.0.1", 41030)  # the sidecar's answers, their source restored by conntrack
FLAGS = [S, S | A, A, A | P, F | A, R, R | A]


def _segment(src: str, sport: int, dst: str, dport: int, flags: int, seq: int, ack: int, data: bytes) -> bytes:
    """An IPv4 datagram with a 20-byte TCP header (RFC 791, RFC 9293 section 3.1); checksums left 0 (tshark
    does not check them by default)."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0) + data
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, 6, 0,
                       bytes(map(int, src.split("."))), bytes(map(int, dst.split(".")))) + tcp


def write_pcap(path: Path, segments: list[bytes]) -> None:
    """A pcap file (LINKTYPE_RAW, 101: the datagram is the record) of ``segments``, one a millisecond."""
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101))
        for i, seg in enumerate(segments):
            fh.write(struct.pack("<IIII", 1000, i * 1000, len(seg), len(seg)) + seg)


def _yielded_frames(path: Path) -> list[str]:
    cmd = ["tshark", "-r", str(path), "-n", "-T", "fields", "-Y", tshark.FILE_PREFILTER, "-e", "frame.number",
           "-e", "tcp.flags", "-e", "tcp.seq_raw"]
    cmd += [a for a in tshark.TSHARK_ARGS if a not in ("-z", "io,stat,0")]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()


def _same_with_the_pass(tmp_path: Path, packets: list[tuple[bool, int, int, int]]) -> list[int]:
    """Asserts tshark yields the same lines from the pass's kept records as from the whole file; returns the
    yielded frame numbers. ``packets``: (on the reply half?, flags, seq, ack) each, a 5-byte payload on P."""
    segs = [_segment(*(REPLY if reply else APP), flags, seq, ack, b"hello" if flags & P else b"")
            for reply, flags, seq, ack in packets]
    whole = tmp_path / "whole.pcap"
    write_pcap(whole, segs)
    kept = prepass.prepass(str(whole), str(tmp_path), 10**9)
    assert kept is not None and kept.records == len(segs)
    lines = [f"{chunk.frames[int(n) - 1]}\t{rest}" for chunk in kept.chunks
             for n, rest in (line.split("\t", 1) for line in _yielded_frames(Path(chunk.path)))]
    expected = _yielded_frames(whole)
    assert lines == expected
    return [int(line.split("\t", 1)[0]) for line in expected]


def test_the_stale_sockets_ack_is_yielded_with_and_without_the_pass(tmp_path):
    """tests/data/lab-outbound-stale-lo.pcap's shape: the old connection's reply half saw a SYN-ACK, data and a
    FIN, never a SYN; the new SYN's answer on it is a pure ACK (frame 8), kept. The reply half's ACK right after
    its SYN-ACK (frame 3) is kept too (tshark shows no bit yet: the SYN-ACK was the conversation's first frame);
    its ACK after data (frame 5) is not."""
    frames = _same_with_the_pass(tmp_path, [
        (False, S, 100, 0), (True, S | A, 900, 101), (True, A, 901, 161), (True, A | P, 901, 161),
        (True, A, 906, 161), (True, F | A, 906, 161), (False, S, 5000, 0), (True, A, 907, 162)])
    assert 8 in frames and 3 in frames and 5 not in frames


def test_a_conversation_first_seen_at_the_stale_ack_keeps_it(tmp_path):
    """The capture began after the old connection's FIN: the stale ACK is the first frame of its conversation,
    which shows no completeness bit; the one after it (a second stale ACK, frame 5) neither, the third does."""
    frames = _same_with_the_pass(tmp_path, [(False, S, 5000, 0), (True, A, 907, 162), (False, R, 162, 0),
                                            (False, S, 5000, 0), (True, A, 907, 162), (True, A, 907, 162)])
    assert 2 in frames and 5 in frames and 6 not in frames


def test_a_first_fin_is_not_counted_so_the_conversations_first_record_is_kept(tmp_path):
    """A capture that starts mid-connection: tshark 4.0 counts nothing of a conversation's first frame but a
    SYN, so the FIN after two ACKs is counted and the ACK after it kept; the pass must keep the first ACK too,
    or the FIN would be first in what tshark reads, uncounted, and the last ACK dropped."""
    frames = _same_with_the_pass(tmp_path, [(False, A | P, 100, 900),  # frame 1, which the pass always keeps
                                            (True, A, 7, 5), (True, A, 7, 5), (True, F | A, 7, 5), (True, A, 8, 5)])
    assert 5 in frames


def test_an_ack_after_a_fin_on_a_conversation_with_its_syn_is_not_yielded(tmp_path):
    """The teardown of a connection whose handshake was captured costs nothing: tshark's SYN bit is set."""
    frames = _same_with_the_pass(tmp_path, [(False, S, 100, 0), (False, S | A, 900, 101), (False, A, 101, 901),
                                            (False, F | A, 101, 901), (False, A, 901, 102)])
    assert 5 not in frames



def test_a_syn_again_on_a_closed_conversation_that_began_without_one_keeps_its_acks(tmp_path):
    """Hypothesis found it: the conversation begins with a SYN-ACK (no SYN bit) and is closed; a SYN with the
    flow's base seq is no new connection to tshark, so the FIN bit stays and the last pure ACK is yielded. The
    pass had taken every SYN for a new connection and dropped it."""
    frames = _same_with_the_pass(tmp_path, [(True, S | A, 100, 0), (True, F | A, 100, 0), (True, S, 100, 0),
                                            (True, S | A, 100, 0), (True, A, 100, 0)])
    assert 5 in frames

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(FLAGS), st.sampled_from([100, 101, 5000]),
                          st.sampled_from([0, 101, 901])), min_size=1, max_size=14))
def test_random_flag_sequences_yield_the_same_with_the_pass(tmp_path, packets):
    _same_with_the_pass(tmp_path, packets)
