"""Which of a pod's interfaces a capture was taken on, told by its content: ``lo`` or ``eth0``.

The detectors act on a pod's ``lo`` (the sidecar and the app talking) and ``eth0`` (the pod and the network);
a file called ``caller.pcap`` says neither. Its first records do (``capture_role``), by the first sign that
holds, in this order:

- a pcapng Interface Description Block whose ``if_name`` option (code 2) is ``lo`` (draft-ietf-opsawg-pcapng
  section 4.2);
- the link layer: LINKTYPE_NULL (0) and LINKTYPE_LOOP (108) are loopback encapsulations; a Linux cooked header
  (LINKTYPE_LINUX_SLL 113, _SLL2 276) carries the device's ARPHRD type, 772 for the loopback device
  (linux/if_arp.h ARPHRD_LOOPBACK); Linux writes its loopback device as Ethernet with both MAC addresses zero
  (drivers/net/loopback.c hands the stack an all-zero header);
- the addresses: 127.0.0.0/8 (RFC 1122 section 3.2.1.3) and ::1 (RFC 4291 section 2.5.3) never leave a host,
  nor does a packet a pod sends to its own address (source and destination the same): such traffic is ``lo``.

Any record with such a sign makes the capture ``lo``; IP traffic without one anywhere in the sample is
``eth0``. A capture of no IP record in its sample (or one not read here) gives None: the caller keeps what it
had. Per-packet signs that tshark reads itself (a pcapng interface name, a cooked header) still decide each
packet (sources/tshark.py); this gives the file's default. Sources: the pcap format (draft-ietf-opsawg-pcap),
pcapng, tcpdump.org/linktypes.html, IPv4 (RFC 791), IPv6 (RFC 8200).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from kubectl_meshdoctor.pcap_header import HEADER_LEN, SECTION_HEADER_BLOCK, pcap_header, pcapng_order

from .prepass import ETHERNET, LOOP, NULL, RAW, RAW4, RAW6, SLL, SLL2

LO, ETH0 = "lo", "eth0"
SAMPLE_RECORDS = 2_000  # records looked at; a pod's lo shows 127.0.0.6 or 127.0.0.1 within its first connection
_ARPHRD_LOOPBACK = 772
_IF_NAME = 2  # pcapng IDB option code


def capture_role(head: bytes) -> str | None:
    """LO or ETH0 for the capture whose first bytes (decompressed, if it was gzip) are ``head``, or None when
    its sample holds no sign of either (no IP record, a link type not walked here, not a capture)."""
    seen_ip = False
    for n, (link, data, name) in enumerate(_records(head)):
        if n >= SAMPLE_RECORDS:
            break
        if name == LO:
            return LO
        role = _record_role(link, data)
        if role == LO:
            return LO
        seen_ip = seen_ip or role == ETH0
    return ETH0 if seen_ip else None


def _record_role(link: int, d: bytes) -> str | None:
    """LO, ETH0 (an IP packet of no loopback sign) or None (no IP, or not walked) for one frame ``d``."""
    if link in (NULL, LOOP):
        return LO
    if link == ETHERNET:
        if len(d) < 14:
            return None
        if not any(d[:12]):
            return LO
        etype, ip = struct.unpack_from("!H", d, 12)[0], 14
        if etype in (0x8100, 0x88A8) and len(d) >= 18:
            etype, ip = struct.unpack_from("!H", d, 16)[0], 18
        return _ip_role(d, ip) if etype in (0x0800, 0x86DD) else None
    if link in (SLL, SLL2):
        if len(d) < (16 if link == SLL else 20):
            return None
        hatype = struct.unpack_from("!H", d, 2 if link == SLL else 8)[0]
        return LO if hatype == _ARPHRD_LOOPBACK else _ip_role(d, 16 if link == SLL else 20)
    if link in (RAW, RAW4, RAW6):
        return _ip_role(d, 0)
    return None


def _ip_role(d: bytes, ip: int) -> str | None:
    if len(d) >= ip + 20 and d[ip] >> 4 == 4:
        src, dst = d[ip + 12:ip + 16], d[ip + 16:ip + 20]
        return LO if src[0] == 127 or dst[0] == 127 or src == dst else ETH0
    if len(d) >= ip + 40 and d[ip] >> 4 == 6:
        src, dst = d[ip + 8:ip + 24], d[ip + 24:ip + 40]
        loopback = bytes(15) + b"\x01"
        return LO if src == loopback or dst == loopback or src == dst else ETH0
    return None


def _records(head: bytes) -> Iterator[tuple[int, bytes, str | None]]:
    """(link type, frame bytes, the interface's pcapng name or None) of each whole record in ``head``."""
    header = pcap_header(head)
    if header is not None:
        if header.network >> 16:  # FCS bits: the frame's end is not its payload's; not walked
            return
        rec = struct.Struct(header.order + "8xI").unpack_from
        pos = HEADER_LEN
        while pos + 16 <= len(head):
            caplen = rec(head, pos)[0]
            end = pos + 16 + caplen
            if end > len(head):
                return
            yield header.link_type, head[pos + 16:end], None
            pos = end
        return
    order = pcapng_order(head) if head[:4] == SECTION_HEADER_BLOCK.to_bytes(4, "big") else None
    if order is None:
        return
    yield from _pcapng_records(head, order)


def _pcapng_records(head: bytes, order: str) -> Iterator[tuple[int, bytes, str | None]]:
    u16, u32 = struct.Struct(order + "H").unpack_from, struct.Struct(order + "I").unpack_from
    ifaces: list[tuple[int, str | None]] = []
    pos = 0
    while pos + 12 <= len(head):
        btype, blen = u32(head, pos)[0], u32(head, pos + 4)[0]
        if blen < 12 or blen % 4 or pos + blen > len(head):
            return
        if btype == SECTION_HEADER_BLOCK:
            ifaces = []  # a new section numbers its interfaces anew
        elif btype == 1 and blen >= 20:  # Interface Description Block
            ifaces.append((u16(head, pos + 8)[0], _if_name(head, pos + 16, pos + blen - 4, u16)))
        elif btype == 6 and blen >= 32:  # Enhanced Packet Block
            iface, caplen = u32(head, pos + 8)[0], u32(head, pos + 20)[0]
            if iface < len(ifaces) and pos + 28 + caplen <= pos + blen - 4:
                link, name = ifaces[iface]
                yield link, head[pos + 28:pos + 28 + caplen], name
        elif btype == 3 and blen >= 16 and ifaces:  # Simple Packet Block: interface 0
            link, name = ifaces[0]
            yield link, head[pos + 12:pos + blen - 4], name
        pos += blen


def _if_name(head: bytes, pos: int, end: int, u16) -> str | None:
    """The ``if_name`` option among an IDB's options from ``pos`` to ``end``."""
    while pos + 4 <= end:
        code, length = u16(head, pos)[0], u16(head, pos + 2)[0]
        if code == 0:
            return None
        if code == _IF_NAME:
            return head[pos + 4:pos + 4 + length].decode("utf-8", "replace").rstrip("\0") or None
        pos += 4 + length + (-length % 4)
    return None
