"""The pod's TCP as bench/gen.py writes it: addresses, one connection's packets, ephemeral ports.

A ``Leg`` is one TCP connection on one interface and appends packet specs to its ``Session``, the packets of
the connection's two legs; ``Ports`` hands out client ports as Linux does, so background traffic never reuses a
four-tuple that is still open (which the tuple-collision detector would rightly flag).
"""

from __future__ import annotations

import random
import socket
import struct
from operator import itemgetter

POD4, POD6 = "198.18.1.2", "fd00:198:18::2"
SIDECAR4 = "127.0.0.6"  # Istio's inbound passthrough source address on lo
POD_MAC = bytes.fromhex("0a58c6120102")  # CNI-style MAC derived from the pod IP
GW_MAC = bytes.fromhex("0a58c6120101")  # the node side of the pod's veth: every routed client arrives from it
LO_MAC = bytes(6)
TIME_WAIT_US = 60_000_000
EPHEMERAL = (32768, 60999)

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
M32 = 0xFFFFFFFF
FILES = {"eth0": "eth0.pcap", "lo": "lo.pcap"}


class Session:
    """The packets of one connection (both legs), in creation order until ``done`` sorts them by time."""

    __slots__ = ("pkts", "end", "no")
    _count = 0

    def __init__(self) -> None:
        self.pkts: list[tuple] = []
        self.end = 0
        Session._count += 1
        self.no = Session._count  # breaks time ties between sessions the same way in every run

    def done(self) -> "Session":
        self.pkts.sort(key=itemgetter(0, 1))
        self.end = self.pkts[-1][0]
        return self


class Leg:
    """One TCP connection on one interface, with both ends' sequence numbers, IP ids and timestamp clocks.

    Times are integer microseconds since the epoch, as seen at the pod (where tcpdump runs). Every method
    appends a packet spec (time, order, leg, from_client, flags, seq, ack, win, options, payload, ip id, tag)
    to the session; ``tag`` names a planted failure's key packet so the writer can note its frame number.
    """

    __slots__ = ("sess", "iface", "v6", "cip", "sip", "cport", "sport", "cipb", "sipb", "cmac", "smac", "cttl",
                 "sttl", "cflow", "sflow", "cisn", "sisn", "cnxt", "snxt", "cid", "sid", "ctso", "stso", "rtt",
                 "mss", "seg", "cwin", "swin", "syn_win", "synack_win", "addr_sum")

    def __init__(self, sess: Session, iface: str, cip: str, cport: int, sip: str, sport: int,
                 rng: random.Random, rtt: int) -> None:
        self.sess, self.iface = sess, iface
        self.v6 = ":" in cip
        fam = socket.AF_INET6 if self.v6 else socket.AF_INET
        self.cip, self.sip, self.cport, self.sport = cip, sip, cport, sport
        self.cipb, self.sipb = socket.inet_pton(fam, cip), socket.inet_pton(fam, sip)
        self.addr_sum = (int.from_bytes(self.cipb, "big") + int.from_bytes(self.sipb, "big")) % 0xFFFF
        self.cisn, self.sisn = rng.getrandbits(32), rng.getrandbits(32)
        self.cnxt, self.snxt = self.cisn, self.sisn
        self.cid, self.sid = rng.getrandbits(16), rng.getrandbits(16)
        self.ctso, self.stso = rng.getrandbits(32), rng.getrandbits(32)  # per-connection TS offsets (Linux 4.10+)
        self.cflow, self.sflow = rng.getrandbits(20), rng.getrandbits(20)
        self.rtt = rtt
        if iface == "eth0":
            self.cmac, self.smac, self.cttl, self.sttl = GW_MAC, POD_MAC, 63, 64
            self.mss = 1440 if self.v6 else 1460
            self.syn_win = 64800 if self.v6 else 64240
            self.synack_win = 64800 if self.v6 else 65160
        else:
            self.cmac = self.smac = LO_MAC
            self.cttl = self.sttl = 64
            self.mss = 65476 if self.v6 else 65495
            self.syn_win = self.mss
            self.synack_win = self.mss - 12
        self.seg = self.mss - 12  # the timestamp option takes 12 bytes of every segment
        self.cwin, self.swin = rng.choice((501, 502, 502, 507, 510)), rng.choice((509, 510, 512, 512))

    @property
    def client(self) -> str:
        return endpoint(self.cip, self.cport)

    @property
    def server(self) -> str:
        return endpoint(self.sip, self.sport)

    def _ts_opt(self, t: int, fc: bool) -> bytes:
        # TSval: the sender's millisecond clock; TSecr: the peer's clock as last heard (one RTT ago).
        if fc:
            val, ecr = t // 1000 + self.ctso, (t - self.rtt) // 1000 + self.stso
        else:
            val, ecr = t // 1000 + self.stso, (t - self.rtt) // 1000 + self.ctso
        return struct.pack(">4sII", b"\x01\x01\x08\x0a", val & M32, ecr & M32)

    def _syn_opts(self, t: int, fc: bool, echo: int) -> bytes:
        val = t // 1000 + (self.ctso if fc else self.stso)
        return struct.pack(">BBHBBBBIIBBBB", 2, 4, self.mss, 4, 2, 8, 10, val & M32, echo & M32, 1, 3, 3, 7)

    def _add(self, t: int, fc: bool, flags: int, seq: int, ack: int, win: int, opts: bytes, payload: bytes,
             ipid: int, tag) -> None:
        pkts = self.sess.pkts
        pkts.append((t, len(pkts), self, fc, flags, seq & M32, ack & M32, win, opts, payload, ipid, tag))

    def _ipid(self, fc: bool) -> int:
        if fc:
            self.cid = (self.cid + 1) & 0xFFFF
            return self.cid
        self.sid = (self.sid + 1) & 0xFFFF
        return self.sid

    def syn(self, t: int, tag=None) -> None:
        """The client's SYN; call again with the same leg for a retransmission (same ISN, new TSval)."""
        self._add(t, True, SYN, self.cisn, 0, self.syn_win, self._syn_opts(t, True, 0), b"", self._ipid(True), tag)
        self.cnxt = (self.cisn + 1) & M32

    def synack(self, t: int, tag=None) -> None:
        echo = (t - self.rtt) // 1000 + self.ctso
        self._add(t, False, SYN | ACK, self.sisn, self.cnxt, self.synack_win, self._syn_opts(t, False, echo), b"",
                  0, tag)
        self.snxt = (self.sisn + 1) & M32

    def handshake(self, t: int, server_delay: int = 15) -> int:
        """SYN at ``t``; returns the time of the client's ACK."""
        self.syn(t)
        t += server_delay
        self.synack(t)
        t += self.rtt if self.iface == "eth0" else server_delay
        self.send(t, True)
        return t

    def send(self, t: int, fc: bool, payload: bytes = b"", flags: int | None = None, tag=None) -> None:
        """A segment from the client (``fc``) or the server carrying ``payload``; ACK (and PSH with data)
        unless ``flags`` says otherwise; FIN counts in the sequence space."""
        if flags is None:
            flags = ACK | PSH if payload else ACK
        if fc:
            seq, ack, win = self.cnxt, self.snxt, self.cwin
            self.cnxt = (seq + len(payload) + (flags & FIN)) & M32
        else:
            seq, ack, win = self.snxt, self.cnxt, self.swin
            self.snxt = (seq + len(payload) + (flags & FIN)) & M32
        self._add(t, fc, flags, seq, ack, win, self._ts_opt(t, fc), payload, self._ipid(fc), tag)

    def rst(self, t: int, fc: bool, seq: int, ack: int = 0, flags: int = RST, tag=None) -> None:
        """A reset as Linux sends it for a segment no socket wants: no options, window 0, IP id 0."""
        self._add(t, fc, flags, seq, ack, 0, b"", b"", 0, tag)

    def stream(self, t: int, fc: bool, chunks, pace: int, rng: random.Random, ack_after: int) -> int:
        """Send ``chunks`` as back-to-back segments ``pace`` us apart (PSH on the last, as Linux marks the end
        of a write); the receiver ACKs every second segment and the last one ``ack_after`` us after each
        arrives. Returns the time of the last packet."""
        last = t
        it = iter(chunks)
        chunk = next(it)
        n = 0
        while chunk is not None:
            nxt = next(it, None)
            n += 1
            self.send(t, fc, chunk, ACK if nxt is not None else ACK | PSH)
            last = max(last, t)
            if n % 2 == 0 or nxt is None:
                ta = t + ack_after + rng.randrange(8)
                self.send(ta, not fc)
                last = max(last, ta)
            t += pace + rng.randrange(4)
            chunk = nxt
        return last

    def close(self, t: int, fc: bool, rng: random.Random, four_way: bool, peer_delay: int) -> int:
        """A FIN from the client (``fc``) or server and the peer's answer: FIN+ACK at once (three packets) or an
        ACK, then its FIN (four). Returns the time of the last packet."""
        self.send(t, fc, flags=FIN | ACK)
        t += peer_delay
        if four_way:
            self.send(t, not fc)
            t += 40 + rng.randrange(200)
        self.send(t, not fc, flags=FIN | ACK)
        t += peer_delay
        self.send(t, fc)
        return t


def endpoint(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class Ports:
    """Ephemeral ports per source address as a Linux client picks them: a random start, then even ports upward
    (odd ones after a wrap), skipping any that an open connection (or its TIME_WAIT) still holds."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.busy: dict[tuple[str, int], int] = {}  # (ip, port) -> capture time (us) it is free again
        self.next: dict[str, int] = {}
        self.reserved: set[tuple[str, int]] = set()

    def take(self, ip: str, now: int) -> int:
        lo, hi = EPHEMERAL
        p = self.next.get(ip)
        if p is None:
            p = lo + 2 * self.rng.randrange((hi - lo) // 2)
        for _ in range(hi - lo + 1):
            p += 2 * (1 + (self.rng.random() < 0.3) * self.rng.randrange(4))
            if p > hi:  # wrap around, into the ports of the other parity (Linux tries even ports first)
                p = lo + 1 - (p & 1)
            key = (ip, p)
            if key not in self.reserved and self.busy.get(key, 0) <= now:
                self.next[ip] = p
                self.busy[key] = 1 << 62  # held until release()
                return p
        raise RuntimeError(f"no free ephemeral port on {ip}")

    def release(self, ip: str, port: int, end: int) -> None:
        self.busy[(ip, port)] = end + TIME_WAIT_US

    def reserve(self, ip: str) -> int:
        """A port only a planted failure uses (picked before the background starts)."""
        while True:
            p = EPHEMERAL[0] + self.rng.randrange(EPHEMERAL[1] - EPHEMERAL[0])
            if (ip, p) not in self.reserved:
                self.reserved.add((ip, p))
                return p
