"""bench/gen.py's plan: which connections the capture holds, when they start and what each one does.

One seeded random drives it all, in a fixed order (``Plan``'s docstring), so both writer processes of
``generate(jobs=2)`` build the same sessions and each keeps the packets of its own interface.
"""

from __future__ import annotations

import math
import random
from operator import itemgetter

from gen_http import Chunks, Content, body_block, segments
from gen_plants import Planting
from gen_tcp import POD4, POD6, SIDECAR4, Leg, Ports, Session

APP_PORTS = (8080, 9090)
EPOCH_US = 1_768_471_200_000_000  # 2026-01-15 10:00:00 UTC: capture time of the first session
MIN_DURATION_S = 12.0  # small captures are spread over this much capture time, so planted failures fit in
# How long each planted failure lasts (s): its three instances start spread over the capture less this much.
# In this order each kind's instances start a fifth of a third later than the previous kind's, so the
# collisions (eth0 only) come last: at 200k packets one lies beyond eth0's frame 100000, where a reader that
# renumbers frames (tshark -M resets its frame counter) would be caught.
PLANT_LENGTH_S = {"http-framing": 0.6, "stale-keepalive": 2.6, "upstream-refused": 0.2, "syn-timeout": 10.2,
                  "tuple-collision": 2.0}


class FastRandom(random.Random):
    """``random.Random`` with a cheaper ``randrange``/``choice``/``shuffle`` (int(random() * n): a bias of at most
    n / 2**53, nothing a capture shows): the stock ``_randbelow`` was a tenth of the generator's time."""

    def _randbelow(self, n: int) -> int:
        return int(self.random() * n)

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        if stop is None:
            return int(self.random() * start)
        return start + int(self.random() * (stop - start))


# --- the plan: background sessions and planted failures -------------------------------------------------------


class Plan(Planting):
    """Builds sessions. Everything random comes from one seeded ``random.Random`` in a fixed order, so a seed
    gives the same capture in every process that runs the plan.

    This is the ``keepalive`` mix; ``gen_mix`` subclasses it for the others (issue 34). The hooks ``seal``,
    ``hello``, ``_eth_download`` and ``MIN_FILL`` are where a mix changes what eth0 carries; here they draw
    nothing from the random, so the keepalive captures stay byte for byte what they were before the mixes."""

    MIX = "keepalive"
    HELLO_PACKETS = 0  # packets ``hello`` adds to every connection
    MIN_FILL = 24  # the fewest packets ``fill`` can make exactly (24 + HELLO_PACKETS)

    def __init__(self, seed: int, packets: int, rate: float) -> None:
        self.rng = FastRandom(seed)
        self.content = Content(self.rng)
        self.ports = Ports(self.rng)
        self.block = body_block(self.rng)
        self.chunks = Chunks(self.block)
        self.clients4 = [f"198.18.2.{i}" for i in range(1, 200)]
        self.clients6 = [f"fd00:198:18:2:{self.rng.getrandbits(16):x}:{self.rng.getrandbits(16):x}:"
                         f"{self.rng.getrandbits(16):x}:{self.rng.getrandbits(16):x}" for _ in range(48)]
        self.plant_clients4 = [f"198.18.2.{i}" for i in range(200, 255)]
        self.plant_clients6 = [f"fd00:198:18:2::f{i:03x}" for i in range(1, 16)]
        self.packets = packets
        self.duration_us = int(max(packets / rate, MIN_DURATION_S) * 1e6)
        self.rate = packets / (self.duration_us / 1e6)
        self.plants: list[dict] = []

    # hooks a mix overrides --------------------------------------------------------------------------------
    def seal(self, data: bytes) -> bytes:
        """What eth0 carries for ``data`` between the client and the sidecar: itself in plaintext."""
        return data

    def hello(self, eth: Leg, t: int) -> int:
        """Whatever the connection exchanges on eth0 after its TCP handshake (ending at ``t``) and before the
        first request; returns the time of its last packet. Nothing in plaintext."""
        return t

    def _eth_download(self, eth: Leg, envoy_head: bytes, n: int, offset: int):
        """Envoy's segments on eth0 of a download of ``n`` body bytes (``offset`` into the body block)."""
        return self.chunks.cut(envoy_head, n, eth.seg, offset)

    # helpers ------------------------------------------------------------------------------------------------
    def _rtt(self) -> int:
        return 80 + int(self.rng.lognormvariate(math.log(160), 0.5))

    def _think(self, lo: int, median: int, hi: int) -> int:
        return min(hi, lo + int(self.rng.lognormvariate(math.log(median), 1.0)))

    def _app_time(self) -> int:
        return min(250_000, 150 + int(self.rng.lognormvariate(math.log(1800), 1.0)))

    def _forward(self, eth: Leg, lo: Leg, t: int, down: bytes, up: bytes, connect: bool) -> int:
        """The client's request on eth0 at ``t`` and Envoy's copy on lo (after connecting the upstream leg
        first when ``connect``: Envoy opens it when the first request arrives). Returns the lo request's time."""
        r = self.rng
        eth.send(t, True, self.seal(down))
        t_up = t + 40 + r.randrange(160)
        if connect:
            t_up = lo.handshake(t_up, 8 + r.randrange(12)) + 5 + r.randrange(20)
        lo.send(t_up, True, up)
        return t_up

    def _exchange(self, eth: Leg, lo: Leg, t: int, down: bytes, up: bytes, status: int, body: bytes,
                  first: bool, force_acks: tuple[bool, bool] | None = None) -> int:
        """One request and its response on both legs, starting with the client's request on eth0 at ``t``;
        ``first`` connects the upstream leg. ``force_acks`` (server pure ACK on eth0, app pure ACK on lo) fixes
        the packet count; otherwise the kernels' quick-ACK on a fresh connection and the delayed ACK on a slow
        answer decide. Returns the time of the last packet."""
        r = self.rng
        t_up = self._forward(eth, lo, t, down, up, first)
        app = self._app_time()
        if force_acks is None:
            eth_ack = first or app > 40_000
            lo_ack = first or app > 40_000
        else:
            eth_ack, lo_ack = force_acks
        if eth_ack:
            eth.send(t + min(12 + r.randrange(30), app) if app <= 40_000 else t + 40_000, False)
        if lo_ack:
            lo.send(t_up + min(10 + r.randrange(20), app) if app <= 40_000 else t_up + 40_000, False)
        t_resp = t_up + app
        app_head, envoy_head = self.content.response(t_resp, status, body, service_ms=max(1, app // 1000))
        last = lo.stream(t_resp, False, segments(app_head + body, lo.seg), 3, r, 12 + r.randrange(20))
        t_down = t_resp + 30 + r.randrange(120)
        last = max(last, eth.stream(t_down, False, segments(self.seal(envoy_head + body), eth.seg), 12, r,
                                    eth.rtt + r.randrange(40)))
        return last

    def _legs(self, sess: Session, now: int, v6: bool, port: int, client: str | None = None,
              lo_port: int | None = None) -> tuple[Leg, Leg, str, str]:
        r = self.rng
        if client is None:
            client = r.choice(self.clients6 if v6 else self.clients4)
            cport = self.ports.take(client, now)
        else:
            cport = self.ports.reserve(client)
        eth = Leg(sess, "eth0", client, cport, POD6 if v6 else POD4, port, r, self._rtt())
        up_src = POD6 if v6 else SIDECAR4
        if lo_port is None:
            lo_port = self.ports.take(up_src, now)
        lo = Leg(sess, "lo", up_src, lo_port, POD6 if v6 else POD4, port, r, 30)
        return eth, lo, client, up_src

    # background ---------------------------------------------------------------------------------------------
    def keepalive(self, t0: int, requests: int | None = None, extras: list[bool] | None = None,
                  v6: bool | None = None, close: bool = False, bulk: bool = False) -> Session:
        """A client connection with ``requests`` GETs (a download when ``bulk``), each relayed on the sidecar's
        upstream connection on lo; the client closes, then the sidecar closes its upstream leg.
        ``extras`` (2 * requests + 2 booleans) fixes every optional packet, for an exact packet count."""
        r = self.rng
        sess = Session()
        if v6 is None:
            v6 = r.random() < (0.3 if close else 0.08)
        port = APP_PORTS[r.random() < 0.25]
        eth, lo, client, up_src = self._legs(sess, t0, v6, port)
        if requests is None:
            requests = 1 if close else (r.randrange(1, 3) if bulk else r.randrange(3, 9))
        t = self.hello(eth, eth.handshake(t0, 12 + r.randrange(30)))
        for i in range(requests):
            t += 20 + r.randrange(300) if i == 0 else self._think(2000, 60_000, 900_000)
            down, up = self.content.request(port, client, close)
            if bulk:
                n = int(min(2_500_000, 32_768 + r.lognormvariate(math.log(350_000), 0.8)))
                t = self._download(eth, lo, t, down, up, n, first=(i == 0))
                continue
            if extras is not None:
                acks = (extras[2 * i], extras[2 * i + 1])
                size = 80 + r.randrange(eth.seg - 400)  # one segment on eth0
            else:
                acks = None
                size = int(min(12_000, 60 + r.lognormvariate(math.log(700), 0.9)))
            status = 404 if r.random() < 0.03 else 200
            body = self.content.json_body(size) if status == 200 else b'{"error":"not found"}'
            t = self._exchange(eth, lo, t, down, up, status, body, first=(i == 0), force_acks=acks)
        four = [r.random() < 0.3, r.random() < 0.3] if extras is None else extras[-2:]
        if close:  # the client asked for Connection: close, so Envoy closes the downstream first
            t_end = eth.close(t + 30 + r.randrange(100), False, r, four[0], eth.rtt)
        else:
            t_end = eth.close(t + self._think(500, 8000, 200_000), True, r, four[0], 20 + r.randrange(60))
        t_end = max(t_end, lo.close(t_end + 80 + r.randrange(400), True, r, four[1], 10 + r.randrange(30)))
        sess.done()
        self.ports.release(client, eth.cport, sess.end)
        self.ports.release(up_src, lo.cport, sess.end)
        return sess

    def _download(self, eth: Leg, lo: Leg, t: int, down: bytes, up: bytes, n: int, first: bool) -> int:
        r = self.rng
        t_up = self._forward(eth, lo, t, down, up, first)
        if first:
            eth.send(t + 12 + r.randrange(20), False)
            lo.send(t_up + 10 + r.randrange(10), False)
        app = 300 + int(r.lognormvariate(math.log(2500), 0.7))
        t_resp = t_up + app
        ctype = r.choice(("application/octet-stream", "application/zip", "image/jpeg", "application/gzip"))
        app_head, envoy_head = self.content.response(t_resp, 200, b"", ctype, max(1, app // 1000))
        # The heads were built for an empty body; give them the real length.
        app_head = app_head.replace(b"Content-Length: 0", b"Content-Length: %d" % n)
        envoy_head = envoy_head.replace(b"content-length: 0", b"content-length: %d" % n)
        write = r.choice((4096, 8192, 16384))  # the app's write size (Go's 4 KB bufio, 8 KB servlet, 16 KB Netty)
        # Body offset such that the app's segments after the first start write-aligned in the block (Chunks).
        offset = (write * r.randrange(len(self.block) // write) + len(app_head)) % len(self.block)
        pace_eth = 11 + r.randrange(4)  # ~1 Gbit/s on eth0
        lo_pace = max(4, write // eth.seg * pace_eth // 2)  # the app fills Envoy's buffer faster than eth0 drains
        last = lo.stream(t_resp, False, self.chunks.cut(app_head, n, min(write, lo.seg), offset), lo_pace, r,
                         10 + r.randrange(15))
        t_down = t_resp + 40 + r.randrange(100)
        return max(last, eth.stream(t_down, False, self._eth_download(eth, envoy_head, n, offset), pace_eth,
                                    r, eth.rtt + r.randrange(60)))

    def background(self, t0: int) -> Session:
        # Tuned so that eth0 carries ~60-65% of the packets and downloads (full-size segments and their ACKs)
        # ~40% of them.
        x = self.rng.random()
        if x < 0.025:
            return self.keepalive(t0, bulk=True)
        if x < 0.475:
            return self.keepalive(t0, close=True)
        return self.keepalive(t0)

    def small(self, t0: int) -> Session:
        return self.keepalive(t0, close=self.rng.random() < 0.5)

    def fill(self, t0: int, count: int) -> Session:
        """A keep-alive connection of exactly ``count`` packets over both legs (``count`` >= 24): 12 + 6k for k
        single-segment exchanges, plus one for each optional ACK or four-way close picked (and HELLO_PACKETS)."""
        count -= self.HELLO_PACKETS
        k = max(2, math.ceil((count - 14) / 8))
        extra = count - (12 + 6 * k)
        assert 0 <= extra <= 2 * k + 2, (count, k)
        flags = [True] * extra + [False] * (2 * k + 2 - extra)
        self.rng.shuffle(flags)
        sess = self.keepalive(t0, requests=k, extras=flags, v6=False)
        assert len(sess.pkts) == count + self.HELLO_PACKETS, (len(sess.pkts), count)
        return sess

    # planted failures (gen_plants.Planting builds each) -----------------------------------------------------
    def planted(self) -> list[tuple[int, Session]]:
        """Three of each failure, interleaved and spread over the capture."""
        kinds = list(PLANT_LENGTH_S)
        out = []
        for k in range(15):
            kind, i = kinds[k % 5], k // 5
            window = max(1.0, self.duration_us / 1e6 - PLANT_LENGTH_S[kind]) * 1e6
            t0 = EPOCH_US + int(window * (i + (k % 5 + 0.5) / 5) / 3) + self.rng.randrange(100_000)
            if kind == "tuple-collision":
                s = self.plant_tuple_collision(t0, k, v6=(i == 2))
            elif kind == "http-framing":
                s = self.plant_http_framing(t0, k, i)
            elif kind == "stale-keepalive":
                s = self.plant_stale_keepalive(t0, k)
            elif kind == "upstream-refused":
                s = self.plant_upstream_refused(t0, k)
            else:
                s = self.plant_syn_timeout(t0, k, on_lo=(i == 1))
            out.append((s.pkts[0][0], s))
        return out


def sessions(plan: Plan):
    """Every session of the capture as (first packet time, session), in start order: the planted ones (built
    first, so their randomness does not depend on the background) and background sessions started at a pace
    that keeps the packet rate steady, until exactly ``plan.packets`` packets are planned."""
    planted = plan.planted()
    budget = plan.packets - sum(len(s.pkts) for _, s in planted)
    if budget < plan.MIN_FILL:
        raise ValueError(f"--packets must be at least {plan.packets - budget + plan.MIN_FILL} (the planted failures alone "
                         f"take {plan.packets - budget})")
    pending = sorted(planted, key=itemgetter(0))
    t = EPOCH_US
    rng = plan.rng
    while budget > 0:
        while pending and pending[0][0] <= t:
            yield pending.pop(0)
        s = plan.background(t) if budget > 5000 else plan.small(t)
        if budget - len(s.pkts) < plan.MIN_FILL:
            s = plan.fill(t, budget)
        budget -= len(s.pkts)
        yield s.pkts[0][0], s
        # Poisson arrivals weighted by size: the packet rate stays near plan.rate.
        t += max(1, int(len(s.pkts) / plan.rate * 1e6 * rng.expovariate(1.0)))
    yield from pending
