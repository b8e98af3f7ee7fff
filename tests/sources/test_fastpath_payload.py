"""The fast path (sources/fastpath.py) against tshark 4.0 (MESHDOCTOR_FASTPATH=0, the reference): the same
PacketEvents (every field, the HTTP/1 and TLS starts) and read counts on small hand-built captures of what
payload_event and the record readers must get right: payloads with SYN, FIN, RST or URG, payloads of a few bytes
(prefixes of an HTTP/1 start or a TLS record header), frames captured short inside the payload, TCP options well
formed or not, pcapng interface options given twice and time stamps at the edges, DLT_NULL/LOOP families and raw
IPv4/IPv6 links holding either version, more interfaces than a short counts, two files in one stream."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.sources import fastpath
from tests.sources import fast_captures
from tests.sources.fast_captures import ETHERNET, RAW, SLL, A, F, P, R, S, framed, segment, write_pcap, write_pcapng
from tests.sources.test_fastpath import same_stream

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")

C = ("198.18.0.1", 41030, "198.18.0.2", 5000)
GET = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
ALERT = b"\x15\x03\x03\x00\x02\x02\x28"  # a plaintext fatal alert, handshake_failure (RFC 8446 section 6)


def write_cut_pcap(path: Path, frames: list[tuple[bytes, int]], link: int = RAW) -> None:
    """A pcap file of (captured bytes, length on the wire) records, one a millisecond."""
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, link))
        for i, (frame, wire) in enumerate(frames):
            fh.write(struct.pack("<IIII", 1_700_000_000, i * 1000, len(frame), wire) + frame)


def test_an_rst_with_data_has_no_start(tmp_path, monkeypatch):
    """tshark shows an RST's data as tcp.reset_cause, never as tcp.payload (packet-tcp.c, dissect_tcp: RFC 1122
    section 4.2.2.12's text), so an RST carrying an HTTP request's or a TLS alert's bytes has neither start."""
    segs = [segment(*C, flags, 1, 1, data) for flags in (R, R | A, R | P | A) for data in (GET, ALERT)]
    for link in (RAW, ETHERNET):
        path = tmp_path / f"rst-{link}.pcap"
        write_pcap(path, [framed(s, link) for s in segs], link)
        events = same_stream(path, monkeypatch)
        assert len(events) == len(segs) and all(e.payload_len for e in events)


def sll2(datagram: bytes, ifindex: int, hatype: int = 1) -> bytes:
    """``datagram`` behind a Linux cooked v2 header (LINKTYPE_LINUX_SLL2) of ``ifindex`` and ``hatype``."""
    etype = 0x0800 if datagram[0] >> 4 == 4 else 0x86DD
    return struct.pack("!HHIHBB8s", etype, 0, ifindex, hatype, 0, 6, b"\x02" * 8) + datagram


def test_more_interfaces_than_a_short_counts(tmp_path):
    """A file whose records name more than 65,536 interfaces (SLL2's index is 32 bits): every event still
    made by the pass, each on the interface tshark's fields give (ifindex 1 is lo, any other eth0)."""
    n = 65_540
    syn = segment(*C, S, 1, 0)
    path = tmp_path / "many-ifindex.pcap"
    write_pcap(path, [sll2(syn, i + 1) for i in range(n)], 276, False,
               [(1_700_000_000 + i // 1000, i % 1000) for i in range(n)])
    got = fastpath.fast_prepass(str(path), str(tmp_path), 100_000)
    assert got is not None and len(got.events) == n and not got.result.chunks
    ifaces = [e.iface for e in got.events.events("f", "dflt", False)]
    assert ifaces[0] == "lo" and ifaces[1:] == ["eth0"] * (n - 1)


@pytest.mark.parametrize("resol, stamp", [(0, 2**63 + 5), (0, 2**64 - 1), (0, 2**63 - 1), (7, 2**64 - 1)])
def test_pcapng_time_stamps_at_the_edges(tmp_path, monkeypatch, resol, stamp):
    """An Enhanced Packet Block's 64-bit time stamp in units of 10^-``resol`` s. In whole seconds (if_tsresol 0)
    tshark 4.0 takes one of 2^63 or more as a signed time_t: negative seconds (2^64 - 1 is -1.0)."""
    path = tmp_path / "edge.pcapng"
    write_pcapng(path, [segment(*C, S, 1, 0), segment(*C, A | P, 2, 1, GET)], RAW, "eth0", resol, [stamp, stamp])
    assert len(same_stream(path, monkeypatch)) == 2


@pytest.mark.parametrize("link, order", [(0, "<"), (0, ">"), (108, "<"), (108, ">")])
def test_null_and_loop_families_in_either_byte_order(tmp_path, monkeypatch, link, order):
    """DLT_NULL's family is in the capturing host's byte order, either is read; DLT_LOOP's is big-endian
    always (tshark's dissect_loop: tvb_get_ntohl), so a little-endian one there is no IP family to tshark."""
    segs = [segment(*C, S, 1, 0), segment("fd00::1", 41030, "fd00::2", 5000, A | P, 2, 1, GET)]
    path = tmp_path / "null.pcap"
    write_pcap(path, [struct.pack(order + "I", family) + s for family, s in zip((2, 30), segs)], link)
    same_stream(path, monkeypatch)


@pytest.mark.parametrize("link", [228, 229])
def test_raw_ipv4_and_ipv6_links_with_either_version(tmp_path, monkeypatch, link):
    """LINKTYPE_IPV4 (228) and LINKTYPE_IPV6 (229) records holding an IPv4 and an IPv6 datagram: tshark's IPv4
    dissector hands a version-6 header to IPv6, its IPv6 dissector reads a version-4 header as no TCP."""
    path = tmp_path / "raw.pcap"
    write_pcap(path, [segment(*C, S, 1, 0), segment("fd00::1", 41030, "fd00::2", 5000, A | P, 2, 1, GET)], link)
    same_stream(path, monkeypatch)


def _pcapng_with_options(path: Path, options: list[tuple[int, bytes]], datagrams: list[bytes]) -> None:
    """A pcapng file of raw IP ``datagrams`` on one interface with the (code, value) ``options``, a
    millisecond apart in the interface's units as if in microseconds."""
    block, option = fast_captures._block, fast_captures._option
    with open(path, "wb") as fh:
        fh.write(block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)))
        fh.write(block(1, struct.pack("<HHI", RAW, 0, 65535) + b"".join(option(*o) for o in options) + option(0, b"")))
        for i, data in enumerate(datagrams):
            stamp = 1_700_000_000_000_000 + i * 1000
            body = struct.pack("<IIIII", 0, stamp >> 32, stamp & 0xFFFFFFFF, len(data), len(data))
            fh.write(block(6, body + data + b"\0" * (-len(data) % 4)))


@pytest.mark.parametrize("options", [[(2, b"a"), (2, b"b")], [(9, b"\x03"), (9, b"\x06")],
                                     [(9, b"\x09"), (2, b"lo"), (9, b"\x03"), (2, b"eth0")],
                                     [(9, b"\x03\x00")], [(9, b""), (9, b"\x03")], [(2, b""), (2, b"b")]])
def test_an_interface_option_given_twice(tmp_path, monkeypatch, options):
    """An interface block holding if_name (2) or if_tsresol (9) twice: tshark 4.0 takes the first of each, but
    skips an if_tsresol whose value is not one byte long (RFC draft-ietf-opsawg-pcapng: it is one byte)."""
    path = tmp_path / "twice.pcapng"
    _pcapng_with_options(path, options, [segment(*C, S, 1, 0), segment(*C, A | P, 2, 1, GET)])
    assert len(same_stream(path, monkeypatch)) == 2



# TCP options (RFC 9293 section 3.2; SACK RFC 2018, time stamps RFC 7323, TFO RFC 7413, MD5 RFC 2385), well formed
# or not: tshark 4.0 stops dissecting a segment at an option of a bad length (a SACK of 3 bytes) and shows no
# tcp.payload, so its start is neither kept nor parsed.
OPTIONS = [b"\x02\x04\x05\xb4", b"\x01\x03\x03\x07", b"\x04\x02\x01\x01", b"\x01\x01\x08\x0a" + b"\0" * 8,
           b"\x01\x01\x05\x0a" + b"\0" * 8, b"\x05\x03\x00\x00", b"\x02\x0a\x05\xb4", b"\x08\x08" + b"\0" * 6,
           b"\x13\x12" + b"\0" * 16, b"\x22\x0a" + b"\0" * 8, b"\xfd\x06" + b"\0" * 4, b"\x00\x00\x00\x00",
           b"\x00\x05\x03\x00", b"\x1b\x08" + b"\0" * 6, b"\x02\x28\x00\x00", b"\x0f\x03\x00\x00"]


@pytest.mark.parametrize("flags", [A | P, S])
def test_tcp_options_well_formed_or_not(tmp_path, monkeypatch, flags):
    path = tmp_path / "options.pcap"
    write_pcap(path, [segment(*C, flags, 1, 1, GET, options=o) for o in OPTIONS], RAW, False,
               [(1_700_000_000 + i, 0) for i in range(len(OPTIONS))])
    events = same_stream(path, monkeypatch)
    assert any(e.http for e in events)

def test_two_files_interleaved_with_data_on_syn_fin_and_rst(tmp_path, monkeypatch):
    """The same segments with data read as one pod's two files in one tshark stream (sources/interleave.py):
    the merger's fast path (sources/interleave_fast.py) decides them with the same payload_event."""
    from tests.sources.test_fastpath_interleave import same

    segs = [segment(*t, flags, 1, 1, data) for data in (GET, ALERT, b"hello", b"HTTP/1.1 200 OK\r\n\r\n")
            for t in (C, ("fd00::1", 41030, "fd00::2", 5000)) for flags in (A | P, R, R | A, S, F | A)]
    write_pcap(tmp_path / "a-lo.pcap", segs, RAW, False, [(1_700_000_000 + i, 0) for i in range(len(segs))])
    write_pcap(tmp_path / "a-eth0.pcap", segs[::-1], RAW, False,
               [(1_700_000_000 + i, 500_000) for i in range(len(segs))])
    events = same([str(tmp_path / "a-lo.pcap"), str(tmp_path / "a-eth0.pcap")], monkeypatch)
    assert len(events) == 2 * (len(segs) - 2) and any  # "hello" with ACK|PSH only is not kept(e.http for e in events) and any(e.tls for e in events)


# Payloads the keep test and the parsers look at: HTTP/1 and TLS starts whole or cut anywhere (by the segment's
# end or by the snap length), a bare LF header end, TLS's 19-byte encrypted alert, SSLv2-looking bytes.
STARTS = [GET, b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n", b"POST /a HTTP/1.0\n\n", b"\x16\x03\x01\x00\x05hello", ALERT,
          b"\x17\x03\x03\x00\x13" + b"e" * 19, b"\x80\x2e\x01\x03\x01", b"\r\n\r\n"]
IPV6 = ("fd00::1", 41030, "fd00::2", 5000)


def _urgent(datagram: bytes, pointer: int) -> bytes:
    """``datagram`` with its TCP header's URG flag and urgent pointer set."""
    b = bytearray(datagram)
    l4 = (b[0] & 0x0F) * 4 if b[0] >> 4 == 4 else 40
    b[l4 + 13] |= 0x20
    b[l4 + 18:l4 + 20] = pointer.to_bytes(2, "big")
    return bytes(b)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.tuples(st.booleans(), st.booleans(), st.sampled_from([A | P, A, S, F | A, R, R | A, 0]),
                                  st.integers(0, len(STARTS) - 1), st.integers(0, 40), st.booleans(),
                                  st.integers(0, 12), st.booleans()), min_size=1, max_size=30),
       link=st.sampled_from([RAW, ETHERNET, SLL, 276]))
def test_random_payloads_give_the_same_events(tmp_path_factory, monkeypatch, records, link):
    frames = []
    for six, back, flags, start, keep, options, cut, urgent in records:
        t = IPV6 if six else C
        data = STARTS[start][:keep]
        seg = segment(*((t[2], t[3], t[0], t[1]) if back else t), flags, 7, 1, data,
                      b"\x01\x01\x08\x0a" + b"\0" * 8 if options else b"")
        seg = _urgent(seg, 3) if urgent else seg
        frame = sll2(seg, 2) if link == 276 else framed(seg, link, 772)
        frames.append((frame[:len(frame) - cut] if cut < len(data) else frame, len(frame)))
    path = tmp_path_factory.mktemp("payload") / "p.pcap"
    write_cut_pcap(path, frames, link)
    same_stream(path, monkeypatch)
