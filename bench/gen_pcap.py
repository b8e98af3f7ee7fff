"""One of bench/gen.py's pcap files: packet specs turned into Ethernet frames by dpkt, and key frames noted.

This is where the generator spent most of its time, hence the checksums computed here (``PcapOut``'s
docstring) and the payload sums ``gen_http.Chunks`` keeps for shared body segments.
"""

from __future__ import annotations

from pathlib import Path

import dpkt

from gen_http import Chunks

SNAPLEN = 262144


class PcapOut:
    """One pcap file written with dpkt's Writer, every packet built and serialized by dpkt's Ethernet, IP/IP6
    and TCP classes. We hand dpkt the two checksums (``_checksums``) because its own pure-Python
    ``in_cksum`` was half the run time; ``tests/bench`` checks them against dpkt's and tshark's."""

    def __init__(self, path: Path, payload_sums: dict[int, int]) -> None:
        self.payload_sums = payload_sums  # id(payload) -> its words' sum mod 0xffff, for shared body segments
        self.fh = open(path, "wb", buffering=1 << 20)
        self.writer = dpkt.pcap.Writer(self.fh, snaplen=SNAPLEN, linktype=dpkt.pcap.DLT_EN10MB)
        self.frames = 0
        self.marks: dict[str, int] = {}
        self.tcp = dpkt.tcp.TCP(urp=0)
        self.ip4 = dpkt.ip.IP(p=dpkt.ip.IP_PROTO_TCP, df=1, data=self.tcp)
        self.ip6 = dpkt.ip6.IP6(nxt=dpkt.ip.IP_PROTO_TCP, data=self.tcp)
        self.eth = dpkt.ethernet.Ethernet()

    def write(self, spec: tuple) -> None:
        t, _, leg, fc, flags, seq, ack, win, opts, payload, ipid, tag = spec
        tcp, eth = self.tcp, self.eth
        if fc:
            sport, dport, src, dst = leg.cport, leg.sport, leg.cipb, leg.sipb
            eth.src, eth.dst, ttl = leg.cmac, leg.smac, leg.cttl
        else:
            sport, dport, src, dst = leg.sport, leg.cport, leg.sipb, leg.cipb
            eth.src, eth.dst, ttl = leg.smac, leg.cmac, leg.sttl
        off_flags = (5 + (len(opts) >> 2)) << 12 | flags
        tcp_len = 20 + len(opts) + len(payload)
        tcp.sport, tcp.dport, tcp.seq, tcp.ack, tcp._off_flags, tcp.win = sport, dport, seq, ack, off_flags, win
        tcp.opts, tcp.data = opts, payload
        # TCP checksum (RFC 9293 3.1): one's-complement sum of the pseudo-header, header and payload words.
        # A sum of 16-bit words is congruent to the big-endian integer of the bytes modulo 0xffff.
        addr = leg.addr_sum
        psum = self.payload_sums.get(id(payload)) if len(payload) >= Chunks.CACHE_MIN else None
        if psum is None:
            psum = int.from_bytes(payload, "big") << (8 * (len(payload) & 1))  # odd length: pad a zero byte
        words = (addr + 6 + tcp_len + sport + dport + (seq >> 16) + (seq & 0xFFFF) + (ack >> 16) + (ack & 0xFFFF)
                 + off_flags + win + int.from_bytes(opts, "big") + psum)
        tcp.sum = _complement(words)
        if leg.v6:
            ip = self.ip6
            ip.src, ip.dst, ip.hlim, ip.plen = src, dst, ttl, tcp_len
            ip._v_fc_flow = 0x60000000 | (leg.cflow if fc else leg.sflow)
            eth.type = dpkt.ethernet.ETH_TYPE_IP6
        else:
            ip = self.ip4
            total = 20 + tcp_len
            ip.src, ip.dst, ip.ttl, ip.id, ip.len = src, dst, ttl, ipid, total
            # IPv4 header checksum (RFC 791) over version/IHL/TOS, length, id, DF, TTL/protocol and addresses.
            ip.sum = _complement(0x4500 + total + ipid + 0x4000 + (ttl << 8 | 6) + addr)
            eth.type = dpkt.ethernet.ETH_TYPE_IP
        eth.data = ip
        self.writer.writepkt_time(bytes(eth), t / 1e6)
        self.frames += 1
        if tag is not None:
            self.marks[tag] = self.frames

    def close(self) -> None:
        self.writer.close()


def _complement(words: int) -> int:
    """The Internet checksum of data whose 16-bit words add up to ``words`` (never 0, which dpkt would take
    for "compute it": 0x0000 and 0xffff are the same one's-complement zero)."""
    s = words % 0xFFFF
    return 0xFFFF - s if s else 0xFFFF
