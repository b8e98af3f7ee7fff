"""The one reader of capture file headers: a pcap file header, and which of pcap or pcapng a file is.

Every place that must tell a capture by its first bytes (analyze's kind sniffing, the pre-pass, the interleaved
stream, the live dissector's record splitter, the evidence writer) asks here, so the magic numbers are read
in one place. Sources: the pcap format (draft-ietf-opsawg-pcap, section 4, "File Header": the magic number
0xA1B2C3D4 for microsecond and 0xA1B23C4D for nanosecond time stamps, written in the writer's byte order, the
snapshot length at offset 16, the link type and FCS bits at offset 20; each record then has a 16-byte header
with the captured length at offset 8) and the pcapng format (draft-ietf-opsawg-pcapng, section 4.1: the
Section Header Block's type 0x0A0D0D0A, then its byte-order magic 0x1A2B3C4D at offset 8).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER_LEN = 24  # a pcap file header
RECORD_HEADER_LEN = 16  # a pcap record header
SECTION_HEADER_BLOCK = 0x0A0D0D0A  # pcapng's block type that starts a section (a palindrome: either byte order)
PCAPNG_MAGIC = SECTION_HEADER_BLOCK.to_bytes(4, "big")
# The pcap magic as each byte order writes it -> (struct's byte order, nanosecond time stamps).
_PCAP_MAGICS = {b"\xa1\xb2\xc3\xd4": (">", False), b"\xa1\xb2\x3c\x4d": (">", True),
                b"\xd4\xc3\xb2\xa1": ("<", False), b"\x4d\x3c\xb2\xa1": ("<", True)}
_PCAPNG_ORDERS = {b"\x1a\x2b\x3c\x4d": ">", b"\x4d\x3c\x2b\x1a": "<"}


@dataclass(frozen=True, slots=True)
class PcapHeader:
    """A pcap file header: ``order`` is struct's byte order of the file ("<" or ">"), ``nanoseconds`` whether
    its time stamps' fraction counts nanoseconds (else microseconds), ``snaplen`` in bytes, ``network`` the link
    type with the FCS bits above it (``link_type`` the link type alone), ``raw`` the header's 24 bytes."""

    order: str
    nanoseconds: bool
    snaplen: int
    network: int
    raw: bytes

    @property
    def link_type(self) -> int:
        return self.network & 0xFFFF

    @property
    def u32(self) -> str:
        """struct's format of one of the file's 32-bit fields (a record's captured length, say)."""
        return self.order + "I"


def pcap_header(head: bytes) -> PcapHeader | None:
    """The pcap file header that ``head`` (a file's first bytes, at least 24) starts with, or None when it is
    no pcap header (pcapng, too short, another kind of file)."""
    found = _PCAP_MAGICS.get(bytes(head[:4]))
    if found is None or len(head) < HEADER_LEN:
        return None
    order, nanoseconds = found
    snaplen, network = struct.unpack_from(order + "II", head, 16)
    return PcapHeader(order, nanoseconds, snaplen, network, bytes(head[:HEADER_LEN]))


def is_pcap(head: bytes) -> bool:
    """Whether ``head`` starts with a pcap magic number (either byte order, either time unit)."""
    return bytes(head[:4]) in _PCAP_MAGICS


def is_pcapng(head: bytes) -> bool:
    """Whether ``head`` starts with a pcapng Section Header Block."""
    return bytes(head[:4]) == PCAPNG_MAGIC


def is_capture(head: bytes) -> bool:
    """Whether ``head`` starts as a pcap or pcapng file does."""
    return is_pcap(head) or is_pcapng(head)


def capture_suffix(head: bytes) -> str:
    """The file name suffix of a capture that starts with ``head``: ".pcapng" or ".pcap"."""
    return ".pcapng" if is_pcapng(head) else ".pcap"


def pcapng_order(head: bytes) -> str | None:
    """struct's byte order of a pcapng section whose Section Header Block starts ``head`` (by its byte-order
    magic), or None when it has none of the two."""
    return _PCAPNG_ORDERS.get(bytes(head[8:12]))
