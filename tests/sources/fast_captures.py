"""Small hand-built captures for the fast path's tests (sources/fastpath.py): TCP segments over IPv4 or IPv6 in
pcap (microsecond or nanosecond time stamps; raw IP, Ethernet or Linux cooked links) or pcapng (an interface
block with a name and a time-stamp resolution). Checksums are left 0: tshark does not check them by default.
Formats: draft-ietf-opsawg-pcap, draft-ietf-opsawg-pcapng, RFC 791, RFC 8200, RFC 9293 section 3.1."""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

F, S, R, P, A = 0x01, 0x02, 0x04, 0x08, 0x10
RAW, ETHERNET, SLL = 101, 1, 113


def segment(src: str, sport: int, dst: str, dport: int, flags: int, seq: int, ack: int, data: bytes = b"",
            options: bytes = b"") -> bytes:
    """An IPv4 or IPv6 datagram (by ``src``'s family) carrying one TCP segment, its header 20 bytes and
    ``options`` (a multiple of 4 bytes)."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, (5 + len(options) // 4) << 4, flags, 65535, 0, 0)
    tcp += options + data
    s, d = ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed
    if len(s) == 4:
        return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, 6, 0, s, d) + tcp
    return struct.pack("!IHBB16s16s", 6 << 28, len(tcp), 6, 64, s, d) + tcp


def framed(datagram: bytes, link: int, hatype: int = 772) -> bytes:
    """``datagram`` with ``link``'s header: none (RAW), Ethernet, or Linux cooked (SLL) of ``hatype``."""
    etype = 0x0800 if datagram[0] >> 4 == 4 else 0x86DD
    if link == ETHERNET:
        return b"\x02" * 6 + b"\x04" * 6 + etype.to_bytes(2, "big") + datagram
    if link == SLL:
        return struct.pack("!HHH8sH", 0, hatype, 6, b"\x02" * 8, etype) + datagram
    return datagram


def write_pcap(path: Path, frames: list[bytes], link: int = RAW, nanoseconds: bool = False,
               times: list[tuple[int, int]] | None = None) -> None:
    """A pcap file of ``frames`` (already framed for ``link``), at ``times`` ((seconds, fraction) each), else
    one a millisecond."""
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B23C4D if nanoseconds else 0xA1B2C3D4, 2, 4, 0, 0, 65535, link))
        for i, frame in enumerate(frames):
            sec, frac = times[i] if times else (1_700_000_000, i * (1_000_000 if nanoseconds else 1000))
            fh.write(struct.pack("<IIII", sec, frac, len(frame), len(frame)) + frame)


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def _block(btype: int, body: bytes) -> bytes:
    return struct.pack("<II", btype, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


def write_pcapng(path: Path, frames: list[bytes], link: int = RAW, name: str | None = "eth0", resol: int = 6,
                 stamps: list[int] | None = None) -> None:
    """A pcapng file: a section, one interface (``name``, if_tsresol 10^-``resol``), and an Enhanced Packet
    Block for each of ``frames`` at ``stamps`` (in the interface's units), else one a millisecond."""
    options = (_option(2, name.encode()) if name is not None else b"") + _option(9, bytes([resol])) + _option(0, b"")
    with open(path, "wb") as fh:
        fh.write(_block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)))
        fh.write(_block(1, struct.pack("<HHI", link, 0, 65535) + options))
        for i, frame in enumerate(frames):
            stamp = stamps[i] if stamps else 1_700_000_000 * 10 ** resol + i * 10 ** max(resol - 3, 0)
            body = struct.pack("<IIIII", 0, stamp >> 32, stamp & 0xFFFFFFFF, len(frame), len(frame))
            fh.write(_block(6, body + frame + b"\0" * (-len(frame) % 4)))
