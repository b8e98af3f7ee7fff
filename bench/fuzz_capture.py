"""bench/fuzz's capture mutations (issue 15): the repository's real captures (tests/data: the lab's lo and eth0, a
pcapng), each with bits flipped, cut short, a pcap record header's lengths changed, a pcapng block length
changed, a TCP header length set below 20 (undissectable TCP), or records duplicated."""

from __future__ import annotations

import random
import struct

INPUTS = ("lab-collision-eth0.pcap", "lab-collision-lo.pcap", "unnamed-iface-eth0.pcapng")
PCAP_HEADER = 24
RECORD_HEADER = 16


def _records(data: bytes) -> list[tuple[int, int]]:
    """(offset, length) of each pcap record (header included) of a little-endian pcap."""
    out, off = [], PCAP_HEADER
    while off + RECORD_HEADER <= len(data):
        caplen = struct.unpack_from("<I", data, off + 8)[0]
        out.append((off, RECORD_HEADER + caplen))
        off += RECORD_HEADER + caplen
    return out


def mutate(data: bytes, pcapng: bool, rnd: random.Random) -> tuple[str, bytes]:
    """One mutation of capture ``data``: (its name, the new bytes)."""
    b = bytearray(data)
    kinds = ["flip", "truncate", "duplicate"] + (["block-length"] if pcapng else ["record-lengths", "tcp-offset"])
    kind = rnd.choice(kinds)
    if kind == "flip":
        for _ in range(rnd.randint(1, 16)):
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
    elif kind == "truncate":
        del b[rnd.randrange(1, len(b)):]
    elif kind == "duplicate":
        cut = rnd.randrange(PCAP_HEADER, len(b))
        b[cut:cut] = b[cut:cut + rnd.randint(1, 200)]
    elif kind == "block-length":  # pcapng: every block starts with its type, then its total length
        off = 0
        offsets = []
        while off + 8 <= len(b):
            offsets.append(off)
            length = struct.unpack_from("<I", b, off + 4)[0]
            if length < 12 or off + length > len(b):
                break
            off += length
        struct.pack_into("<I", b, rnd.choice(offsets) + 4, rnd.choice([0, 1, 12, 0xFFFFFFFF, rnd.getrandbits(32)]))
    elif kind == "record-lengths":
        off, _ = rnd.choice(_records(data))
        struct.pack_into("<II", b, off + 8, rnd.getrandbits(rnd.choice([4, 16, 32])),
                         rnd.getrandbits(rnd.choice([4, 16, 32])))
    else:  # tcp-offset: Ethernet (14) + IPv4 (20) + 12 is the TCP data offset byte
        off, _ = rnd.choice(_records(data))
        b[off + RECORD_HEADER + 14 + 20 + 12] = rnd.randrange(0, 5) << 4
    return kind, bytes(b)
