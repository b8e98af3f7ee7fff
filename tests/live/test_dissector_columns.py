"""The live dissector reads tshark's summary columns and each payload from its record (sources/tshark_columns.py):
it must give the events that ``tshark -T fields`` gives of the same records, on every pcap in tests/data, with a
trailer after every frame's IP datagram, and with every frame captured short."""

from __future__ import annotations

import asyncio
import shutil
import struct
import subprocess
import threading
from pathlib import Path

import dpkt
import pytest

from kubectl_meshdoctor.core.findings import payload_cut_problem
from kubectl_meshdoctor.live.dissect import SharedDissector
from kubectl_meshdoctor.pcap_header import pcap_header
from kubectl_meshdoctor.sources.tshark import (FIELD_ARGS, PREFILTER, SESSION_PACKETS, TSHARK_ARGS, Undissectable,
                                               packet_from_fields)
from kubectl_meshdoctor.sources.tshark_columns import record_payload

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="runs tshark")

DATA = Path(__file__).resolve().parent.parent / "data"
ETHERNET = 1


def split(data: bytes) -> tuple[bytes, list[bytes]]:
    """A pcap file -> its header and its records."""
    order = pcap_header(data).order
    out, off = [], 24
    while off + 16 <= len(data):
        caplen = struct.unpack_from(order + "I", data, off + 8)[0]
        out.append(data[off:off + 16 + caplen])
        off += 16 + caplen
    return data[:24], out


def with_trailer(record: bytes, trailer: bytes) -> bytes:
    """``record`` with ``trailer`` after its frame (an Ethernet FCS, or padding), both lengths grown."""
    caplen, wirelen = struct.unpack_from("<II", record, 8)
    return (record[:8] + struct.pack("<II", caplen + len(trailer), wirelen + len(trailer)) + record[16:]
            + trailer)


def cut_short(record: bytes, keep: int) -> bytes:
    """``record`` as captured with a snapshot length of ``keep`` bytes (its wire length unchanged)."""
    caplen, wirelen = struct.unpack_from("<II", record, 8)
    caplen = min(caplen, keep)
    return record[:8] + struct.pack("<II", caplen, wirelen) + record[16:16 + caplen]


def through_dissector(header: bytes, streams: list[list[bytes]]) -> tuple[list[list], list]:
    """Each list of records as one stream of a SharedDissector: every stream joins first, then each is written
    whole in turn by one thread, so the pipe holds the streams one after another -> (events, results)."""
    got: list[list] = [[] for _ in streams]

    async def main():
        d = SharedDissector()
        live = [d.stream(f"pod{i}/lo", "lo", events.append) for i, events in enumerate(got)]

        def write() -> None:
            for s in live:
                s.wrote(header)
            for s, recs in zip(live, streams):
                for at in range(0, len(recs), 50):  # in pieces, as a pump hands them on
                    s.wrote(b"".join(recs[at:at + 50]))
            for s in live:
                s.ended()

        t = threading.Thread(target=write)
        t.start()
        results = await asyncio.wait_for(asyncio.gather(*(s.result for s in live)), 120)
        await d.close()
        t.join(5)
        assert len({id(s.group) for s in live}) == 1
        return results

    return got, asyncio.run(main())


def by_fields(header: bytes, streams: list[list[bytes]], tmp: Path) -> tuple[list[list], list[list[int]]]:
    """What ``tshark -T fields`` (sources/tshark.py's FIELD_ARGS and packet_from_fields, the live display filter
    and options) makes of the same records one after another -> each stream's events and undissectable frames."""
    path = tmp / "all.pcap"
    path.write_bytes(header + b"".join(b"".join(recs) for recs in streams))
    lines = subprocess.run(["tshark", "-r", str(path), *FIELD_ARGS, "-Y", PREFILTER, *TSHARK_ARGS,
                            "-M", str(SESSION_PACKETS)], capture_output=True, check=True).stdout.decode("latin-1")
    starts = [0]
    for recs in streams:
        starts.append(starts[-1] + len(recs))
    events: list[list] = [[] for _ in streams]
    undissectable: list[list[int]] = [[] for _ in streams]
    for line in lines.split("\n"):
        if not line or line[0] in "|=":
            continue
        number = int(line.split("\t", 1)[0])
        i = max(k for k, s in enumerate(starts[:-1]) if s < number)
        try:
            ev = packet_from_fields(line, f"pod{i}/lo", "lo", force_iface=True, frame=number - starts[i])
        except Undissectable:
            undissectable[i].append(number - starts[i])
            continue
        if ev is not None:
            events[i].append(ev)
    return events, undissectable


def pcaps() -> tuple[bytes, list[list[bytes]]]:
    """Every pcap file in tests/data (pcapng is never a live stream) -> their one file header, their records."""
    header, streams = None, []
    for path in sorted(DATA.rglob("*.pcap")):
        data = path.read_bytes()
        if pcap_header(data) is None:
            continue
        head, recs = split(data)
        assert header in (None, head), path  # one header: one tshark reads them all, as a watch's streams
        header = head
        streams.append(recs)
    return header, streams


def test_every_capture_gives_the_events_tshark_fields_gives(tmp_path):
    header, streams = pcaps()
    assert len(streams) > 100 and pcap_header(header).link_type == ETHERNET
    got, results = through_dissector(header, streams)
    want, undissectable = by_fields(header, streams, tmp_path)
    assert sum(map(len, want)) > 5_000
    assert sum(e.http is not None for w in want for e in w) > 1_500
    assert sum(e.tls is not None for w in want for e in w) > 500
    for i, (events, expected, res, skipped) in enumerate(zip(got, want, results, undissectable)):
        assert events == expected, i
        assert res.undissectable == len(skipped) and res.payload_cut == 0, i


def test_a_trailer_after_every_frame_or_a_short_capture_changes_nothing(tmp_path):
    """Ethernet padding or an FCS after the IP datagram (so the payload does not end the frame), and frames
    captured short (the payload cut, or the headers): the payloads read from the records are still tshark's."""
    header, streams = pcaps()
    streams = [s for s in streams if len(s) > 20][:12]
    mutated = [[with_trailer(r, b"\x00\x00" + r[-2:]) for r in streams[0]],
               [with_trailer(r, b"\xaa" * 4) for r in streams[1]],
               *([cut_short(r, keep) for r in recs] for keep, recs in zip((40, 60, 80, 200), streams[2:6])),
               *streams[6:]]
    got, results = through_dissector(header, mutated)
    want, undissectable = by_fields(header, mutated, tmp_path)
    assert any(e.http is not None and not e.http.complete for e in want[4])  # payloads really cut
    assert sum(map(len, undissectable)) > 0  # and headers too
    for i, (events, expected, res, skipped) in enumerate(zip(got, want, results, undissectable)):
        assert events == expected, i
        assert res.undissectable == len(skipped) and res.payload_cut == 0, i


def _fragments(record: bytes) -> list[bytes]:
    """An Ethernet/IPv4 record as two IP fragments: the first with the TCP header and 8 bytes of payload, the
    second with the rest (RFC 791: offsets in 8-byte units, More Fragments on the first)."""
    eth = dpkt.ethernet.Ethernet(record[16:])
    ip = eth.data
    body = bytes(ip.data)
    cut = (ip.data.off * 4 + 8 + 7) // 8 * 8  # the TCP header and 8 to 15 bytes of payload
    out = []
    for off, part, more in ((0, body[:cut], 1), (cut // 8, body[cut:], 0)):
        frag = dpkt.ip.IP(src=ip.src, dst=ip.dst, p=ip.p, ttl=ip.ttl, id=0x4242, offset=off, mf=more,
                          data=part)
        frag.len = 20 + len(part)
        frame = bytes(dpkt.ethernet.Ethernet(src=eth.src, dst=eth.dst, type=eth.type, data=frag))
        out.append(record[:8] + struct.pack("<II", len(frame), len(frame)) + frame)
    return out


def test_a_segment_tshark_reassembles_from_ip_fragments_is_read_from_its_first_bytes_and_counted(tmp_path):
    header, recs = split((DATA / "lab-framing-mixed-lo.pcap").read_bytes())
    request = next(r for r in recs if b"GET /" in r and len(r) > 200)
    frags = _fragments(request)
    got, results = through_dissector(header, [frags])
    want, _ = by_fields(header, [frags], tmp_path)
    whole = want[0][-1]
    assert whole.http is not None and whole.http.complete  # tshark -T fields showed it whole
    ev = got[0][-1]
    assert ev.frame == whole.frame == 2 and ev.payload_len == whole.payload_len > 36
    assert ev.http is not None and ev.http.start_line == whole.http.start_line[:len(ev.http.start_line)]
    assert not ev.http.complete  # only the column's first bytes: a header block cut short, not a wrong one
    assert results[0].payload_cut == 1


def test_the_payload_is_found_behind_any_trailer_and_not_outside_its_record():
    header, recs = split((DATA / "lab-framing-mixed-lo.pcap").read_bytes())
    record = next(r for r in recs if b"GET /" in r)
    start = record.index(b"GET /")
    payload = record[start:]
    for trailer in (b"", b"\x00", payload[:40]):  # even a trailer that repeats the payload's first bytes
        padded = with_trailer(record, trailer)
        chunk = b"x" * 7 + padded + recs[0]
        assert record_payload(chunk, 7, 7 + len(padded), len(payload), payload[:36]) == payload
    # the first bytes shown are not in this record: not read from another one
    chunk = record + recs[0]
    assert record_payload(chunk, 0, len(record), len(payload), recs[0][60:96]) is None


def _ethernet(payload: bytes) -> bytes:
    """A plain Ethernet/IPv4/TCP frame (PSH+ACK) carrying ``payload``."""
    tcp = dpkt.tcp.TCP(sport=40000, dport=80, seq=1000, ack=2000, flags=0x18, data=payload)
    ip = dpkt.ip.IP(src=bytes((198, 18, 0, 1)), dst=bytes((198, 18, 0, 2)), p=6, data=tcp)
    return bytes(dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, data=ip))


def _record(frame: bytes, caplen: int | None = None, wirelen: int | None = None) -> bytes:
    caplen = len(frame) if caplen is None else caplen
    return struct.pack("<IIII", 1_700_000_000, 1, caplen, len(frame) if wirelen is None else wirelen) + frame[:caplen]


@pytest.mark.parametrize("records", [
    # an FCS after a payload whose first 36 bytes recur 4 bytes in (the trailer's length)
    pytest.param(lambda f: [_record(f + b"\xaa\xbb\xcc\xdd")], id="fcs-after-a-repeating-payload"),
    # captured 10 bytes into the payload, 80 trailer bytes on the wire, then the whole segment again
    pytest.param(lambda f: [_record(f + bytes(80), caplen=len(f) - 50), _record(f)], id="short-with-trailer"),
])
def test_a_trailer_never_moves_where_the_payload_is_read(records, tmp_path):
    """Found by a review: the payload was read from ``wirelen - tcp.len`` into the frame when the column's bytes
    matched there, a trailer's length too far on when the payload repeats itself, and past the record's end."""
    frames = records(_ethernet(b"GET " * 20 + b"/ HTTP/1.1\r\nHost: a\r\n\r\n"))
    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, ETHERNET)
    got, results = through_dissector(header, [frames])
    want, _ = by_fields(header, [frames], tmp_path)
    assert want[0] and any(e.http is not None for e in want[0])
    assert got[0] == want[0] and results[0].payload_cut == 0


def test_frames_read_from_their_first_bytes_are_a_problem_of_the_capture():
    one, many = payload_cut_problem("pod/x lo", 1), payload_cut_problem("pod/x lo", 3)
    assert one.line().startswith("pod/x lo: 1 frame's payload was read from the first 36 bytes")
    assert many.what.startswith("3 frames' payloads were read") and "captured that short" in many.what
