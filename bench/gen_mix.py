"""bench/gen.py's traffic mixes (issue 34): the plans that change what the keepalive plan's connections carry.

- ``keepalive``: ``gen_plan.Plan`` itself (keep-alive HTTP/1.1, downloads, some one-request connections);
- ``short``: one HTTP/1.1 request a client connection (``Connection: close``), ~10 packets each on eth0, 3% ended
  by the client's RST instead of a FIN, ~64 open at once (a load generator with 64 connections against a
  saturated app: each request waits in the app's queue); the sidecar relays them on a pool of upstream
  connections on lo, as Envoy does (the client's ``Connection: close`` is hop-by-hop, Envoy's HTTP/1.1 pool
  keeps the upstream connection), so lo carries few SYNs and no TIME_WAIT pile-up;
- ``h2c``: HTTP/2 with prior knowledge on both legs, many streams a connection (``gen_h2``);
- ``mtls``: the caller's sidecar speaks Istio mTLS to this pod, so eth0 carries TLS 1.3 (``gen_tls``: the
  handshake, then application-data records) while lo carries the same plaintext HTTP/1.1 to the app.

Every mix keeps the same fifteen planted failures (``gen_plants``), built before the background from the same
seed; in the mtls mix their eth0 legs are TLS too (the hooks ``seal`` and ``hello``).
"""

from __future__ import annotations

import math

from gen_h2 import H2Plan
from gen_plan import APP_PORTS, Plan
from gen_tcp import ACK, POD4, POD6, RST, SIDECAR4, Leg, Session
from gen_tls import ALPN_HTTP, ALPN_MXC, CCS, client_hello, sealed, server_hello
from gen_tls import APPLICATION_DATA, record

MIXES = ("keepalive", "short", "h2c", "mtls")


class ShortPlan(Plan):
    """One request a client connection, ~64 connections open at once, 3% reset by the client."""

    MIX = "short"
    OPEN_AT_ONCE = 64
    RST_SHARE = 0.03  # of client connections the client ends with RST (SO_LINGER 0) instead of a FIN
    PACKETS_A_SESSION = 13.8  # packets a session over both legs (eth0 ~10.2, lo ~4 on the pool), for Little's law

    def __init__(self, seed: int, packets: int, rate: float) -> None:
        super().__init__(seed, packets, rate)
        # Little's law: open connections = arrivals/s x mean duration. Sessions arrive at rate / packets a
        # session; the app's queue makes up what the handshake, transfer and close (~3 ms) do not.
        arrivals = self.rate / self.PACKETS_A_SESSION
        self.queue_us = max(0, int(self.OPEN_AT_ONCE / arrivals * 1e6) - 3000)
        self.wait_us = 0
        self.pool: list[tuple[int, Leg]] = []  # the sidecar's idle upstream connections: (free from, leg)

    def _app_time(self) -> int:
        return super()._app_time() + self.wait_us

    def _upstream(self, sess: Session, t: int, v6: bool, port: int) -> tuple[Leg, bool]:
        """An idle pooled upstream connection to ``port`` (moved into ``sess``) or a new one."""
        for i, (free, leg) in enumerate(self.pool):
            if free < t and leg.sport == port and leg.v6 == v6:
                del self.pool[i]
                leg.sess = sess
                return leg, False
        up_src = POD6 if v6 else SIDECAR4
        return Leg(sess, "lo", up_src, self.ports.take(up_src, t), POD6 if v6 else POD4, port, self.rng, 30), True

    def short(self, t0: int) -> Session:
        r = self.rng
        sess = Session()
        v6 = r.random() < 0.1
        port = APP_PORTS[r.random() < 0.25]
        client = r.choice(self.clients6 if v6 else self.clients4)
        eth = Leg(sess, "eth0", client, self.ports.take(client, t0), POD6 if v6 else POD4, port, r, self._rtt())
        t = self.hello(eth, eth.handshake(t0, 12 + r.randrange(30))) + 20 + r.randrange(300)
        lo, new = self._upstream(sess, t, v6, port)
        down, up = self.content.request(port, client, close=True)
        status = 404 if r.random() < 0.03 else 200
        size = min(1100, 60 + int(r.lognormvariate(math.log(400), 0.6)))  # one segment on either leg
        body = self.content.json_body(size) if status == 200 else b'{"error":"not found"}'
        self.wait_us = int(self.queue_us * (0.7 + 0.6 * r.random()))
        t = self._exchange(eth, lo, t, down, up, status, body, first=new,
                           force_acks=(True, new or self.wait_us > 40_000))
        self.wait_us = 0
        if r.random() < self.RST_SHARE:
            # The client aborts once it has read the response (close() with SO_LINGER 0): RST with ACK from an
            # established socket (Linux tcp_send_active_reset), no FIN either way.
            t_end = t + 20 + r.randrange(200)
            eth.rst(t_end, True, eth.cnxt, eth.snxt, RST | ACK)
        else:  # Connection: close, so Envoy closes the downstream first
            t_end = eth.close(t + 30 + r.randrange(100), False, r, r.random() < 0.3, eth.rtt)
        self.pool.append((t, lo))
        sess.done()
        self.ports.release(client, eth.cport, max(t_end, sess.end))
        return sess

    def background(self, t0: int) -> Session:
        return self.short(t0)

    def small(self, t0: int) -> Session:
        return self.short(t0)


class MtlsPlan(Plan):
    """The keepalive plan's connections, with Istio mTLS on eth0: callers are sidecars, so connections are
    mostly pooled keep-alive ones; lo stays plaintext."""

    MIX = "mtls"
    HELLO_PACKETS = 6  # ClientHello; the server's flight in two segments and the ACK; the client's flight; ACK
    MIN_FILL = Plan.MIN_FILL + HELLO_PACKETS

    def _cipher(self, n: int) -> bytes:
        """``n`` bytes of ciphertext: a slice of the (incompressible, HTTP-start-free) body block."""
        block = self.block
        off = self.rng.randrange(len(block))
        out = block[off:off + n]
        while len(out) < n:
            out += block[:n - len(out)]
        return out

    def seal(self, data: bytes) -> bytes:
        return sealed(self._cipher, len(data))

    def hello(self, eth: Leg, t: int) -> int:
        r = self.rng
        sni = f"outbound_.{eth.sport}_._.reviews.shop.svc.cluster.local"
        ch, session = client_hello(r, sni, ALPN_MXC if r.random() < 0.25 else ALPN_HTTP)
        t += 5 + r.randrange(20)
        eth.send(t, True, ch)
        # The server's flight: ServerHello, CCS, then (encrypted) EncryptedExtensions, Certificate (the
        # workload's SPIFFE certificate and its chain), CertificateVerify, Finished: two segments.
        flight = server_hello(r, session) + CCS + record(APPLICATION_DATA, self._cipher(1600 + r.randrange(1000)))
        half = len(flight) // 2
        t = eth.stream(t + eth.rtt + 150 + r.randrange(300), False, [flight[:half], flight[half:]], 12, r,
                       eth.rtt + r.randrange(40))
        # The client's flight (its own certificate: mTLS), then the server's ACK.
        t += 100 + r.randrange(300)
        eth.send(t, True, CCS + record(APPLICATION_DATA, self._cipher(1100 + r.randrange(250))))
        t += 20 + r.randrange(40)
        eth.send(t, False)
        return t

    def _eth_download(self, eth: Leg, envoy_head: bytes, n: int, offset: int):
        data = self.seal(b"\0" * (len(envoy_head) + n))
        return [data[i:i + eth.seg] for i in range(0, len(data), eth.seg)]

    def background(self, t0: int) -> Session:
        x = self.rng.random()
        if x < 0.025:
            return self.keepalive(t0, bulk=True)
        if x < 0.15:
            return self.keepalive(t0, close=True)
        return self.keepalive(t0)


PLANS = {"keepalive": Plan, "short": ShortPlan, "h2c": H2Plan, "mtls": MtlsPlan}


def plan_for(mix: str, seed: int, packets: int, rate: float) -> Plan:
    """The plan of ``mix`` (one of MIXES); ValueError for another name."""
    try:
        cls = PLANS[mix]
    except KeyError:
        raise ValueError(f"unknown mix {mix!r}: one of {', '.join(MIXES)}") from None
    return cls(seed, packets, rate)
