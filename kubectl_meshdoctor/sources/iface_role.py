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


# A pcapng that holds a pod's lo and eth0 in interface blocks without names: `mergecap lo.pcap eth0.pcap`
# (pcap files carry no interface name, so neither do the IDBs mergecap makes of them). With its default
# `-I all` mergecap folds the two equal IDBs (same link type, same snap length) into one; with `-I none` it
# keeps one a file. Per packet tshark then knows no interface (it says "unknown"), and the file's default
# (capture_role: any lo sign makes it lo) put every eth0 packet on lo. frame_roles tells each frame's role.
_ROLE_CODES = {None: 0, LO: 1, ETH0: 2}
ROLES = (None, LO, ETH0)  # FrameRoles.codes' values, by index


class FrameRoles:
    """Each frame's role of a capture whose interfaces say none (``codes[n - 1]`` for frame n: an index into
    ROLES), and what was assumed, in one line (``told``)."""

    __slots__ = ("codes", "told")

    def __init__(self, codes: bytearray, told: str) -> None:
        self.codes = codes
        self.told = told

    def role(self, frame: int) -> str | None:
        """LO, ETH0, or None (a frame of no sign, or past the end)."""
        return ROLES[self.codes[frame - 1]] if 0 < frame <= len(self.codes) else None


def is_mixed(head: bytes) -> bool:
    """Whether the sample in ``head`` holds both lo and eth0 traffic on interfaces that say no name and carry
    no per-packet device (not a Linux cooked header, which tshark reads itself): its frames need
    frame_roles, not one role for the file."""
    seen: set[str] = set()
    for n, (link, data, name) in enumerate(_records(head)):
        if n >= SAMPLE_RECORDS or name is not None or link in (SLL, SLL2):
            return False
        role = _record_role(link, data)
        if role is not None:
            seen.add(role)
    return len(seen) == 2


def frame_roles(fh) -> FrameRoles | None:
    """The role of every frame of the capture ``fh`` (a binary file object at its start: the decompressed
    stream of a gzipped one) whose interfaces are named nowhere; None when it is not walked here (pcap with
    FCS bits, no capture, a named interface). Several interface blocks (mergecap -I none): each block's role is
    lo when any of its frames bears a loopback sign (capture_role's signs), else eth0, and every frame of it has
    that role. One block (mergecap's default -I all folds lo and eth0 into one): each frame by its own signs.
    Reads the whole stream once, a record at a time."""
    first = fh.read(HEADER_LEN)
    header = pcap_header(first)
    codes = bytearray()
    if header is not None:
        if header.network >> 16:
            return None
        rec = struct.Struct(header.order + "8xI").unpack
        while len(hdr := fh.read(16)) == 16:
            data = fh.read(rec(hdr)[0])
            codes.append(_ROLE_CODES[_record_role(header.link_type, data)])
        return FrameRoles(codes, _told(codes, 1))
    if first[:4] != SECTION_HEADER_BLOCK.to_bytes(4, "big"):
        return None
    return _pcapng_roles(fh, first)


def _pcapng_roles(fh, first: bytes) -> FrameRoles | None:
    order = pcapng_order(first)
    if order is None:
        return None
    u16, u32 = struct.Struct(order + "H").unpack_from, struct.Struct(order + "I").unpack_from
    links: list[int] = []  # the current section's interfaces' link types
    base = 0  # interface numbers go on over sections in tshark's frame.interface_id; here a section's own
    idb_of = []  # each frame's interface, across sections
    codes = bytearray()
    pending = first[8:]
    blen = u32(first, 4)[0]
    btype = SECTION_HEADER_BLOCK
    while True:
        if blen < 12 or blen % 4 or blen - 8 < len(pending):
            break
        body = pending + fh.read(blen - 8 - len(pending))
        if len(body) < blen - 8:
            break
        if btype == SECTION_HEADER_BLOCK:
            base += len(links)
            links = []
        elif btype == 1 and blen >= 20:
            if _if_name(body, 8, blen - 12, u16) is not None:
                return None  # named: tshark gives each packet its interface's name
            links.append(u16(body, 0)[0])
        elif btype in (2, 6) and blen >= 32:  # (obsolete) Packet Block, Enhanced Packet Block
            iface = u16(body, 0)[0] if btype == 2 else u32(body, 0)[0]
            caplen = u32(body, 12)[0]
            link = links[iface] if iface < len(links) else -1
            codes.append(_ROLE_CODES[_record_role(link, body[20:20 + caplen])])
            idb_of.append(base + iface)
        elif btype == 3 and links:  # Simple Packet Block: interface 0
            codes.append(_ROLE_CODES[_record_role(links[0], body[4:blen - 12])])
            idb_of.append(base)
        head = fh.read(8)
        if len(head) < 8:
            break
        btype, blen = u32(head, 0)[0], u32(head, 4)[0]
        pending = b""
    interfaces = sorted(set(idb_of))
    if len(interfaces) > 1:
        lo = {i for i, c in zip(idb_of, codes) if c == _ROLE_CODES[LO]}
        ip = {i for i, c in zip(idb_of, codes) if c}
        role = {i: _ROLE_CODES[LO] if i in lo else _ROLE_CODES[ETH0] if i in ip else 0 for i in interfaces}
        codes = bytearray(role[i] for i in idb_of)
    return FrameRoles(codes, _told(codes, len(interfaces)))


def _told(codes: bytearray, interfaces: int) -> str:
    lo, eth0 = codes.count(_ROLE_CODES[LO]), codes.count(_ROLE_CODES[ETH0])
    how = (f"{interfaces} interfaces without a name (mergecap -I none of pcap files?): each one lo when a frame "
           f"of it bears a loopback sign, else eth0" if interfaces > 1 else
           "lo and eth0 in one interface without a name (mergecap of pcap files?): each frame by its own signs")
    return f"{how} (loopback link, zero MACs, 127.0.0.0/8, ::1, to itself): {lo} frames lo, {eth0} eth0"
