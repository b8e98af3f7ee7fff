"""bench/gen.py's planted failures: the sessions of each one the five detectors know, shaped like the real kernel's.

``Planting`` is the half of ``gen_plan.Plan`` that builds them; it uses the plan's random, ports, content and
its connection helpers (``_legs``, ``_exchange``, ``_app_time``), so every planted failure is made of the same
packets as the background around it. Each records itself in ``plants`` with the tags of its key packets,
which the writer turns into frame numbers for the manifest.
"""

from __future__ import annotations

from gen_http import ENVOY_BODY
from gen_tcp import ACK, FILES, FIN, POD6, RST, SIDECAR4, Leg, Session


class Planting:
    """The planted failures of a ``gen_plan.Plan`` (a mixin: ``Plan`` holds the state these methods use)."""

    def _plant(self, detector: str, iface: str, leg_client: str, leg_server: str, severity: str,
               key: dict[str, str], what: str) -> dict:
        p = {"id": f"{detector}-{sum(1 for x in self.plants if x['detector'] == detector) + 1}",
             "detector": detector, "file": FILES[iface], "iface": iface,
             "flow": {"client": leg_client, "server": leg_server}, "severity": severity,
             "what": what, "key": key}  # key: role -> tag; the writer turns tags into frame numbers
        self.plants.append(p)
        return p

    def _plant_legs(self, sess: Session, t0: int, no: int, port: int) -> tuple[Leg, Leg, str]:
        """The eth0 and lo legs of planted failure ``no`` (IPv4, its own client, a reserved sidecar port)."""
        eth, lo, client, _ = self._legs(sess, t0, False, port, client=self.plant_clients4[no],
                                        lo_port=self.ports.reserve(SIDECAR4))
        return eth, lo, client

    def _tag(self, plant_no: int, role: str) -> str:
        return f"p{plant_no}:{role}"

    def plant_tuple_collision(self, t0: int, no: int, v6: bool) -> Session:
        """eth0: client:p holds a connection to pod:8080; its SYN to pod:9090 meets the established socket
        (Istio REDIRECTs both ports to 15006): a challenge ACK carrying the 8080 connection's numbers, the
        client's RST, the SYN retransmitted ~1 s later and accepted; the client's RST also killed the 8080
        socket, so the next request there is reset (as in tests/data/lab-collision-eth0.pcap)."""
        r = self.rng
        sess = Session()
        client = (self.plant_clients6 if v6 else self.plant_clients4)[no]
        a, lo_a, _, up_src = self._legs(sess, t0, v6, 8080, client=client, lo_port=self.ports.reserve(
            POD6 if v6 else SIDECAR4))
        tg = lambda role: self._tag(no, role)  # noqa: E731
        a.syn(t0, tag=tg("peer_syn"))
        a.synack(t0 + 20)
        t = t0 + 20 + a.rtt
        a.send(t, True)
        t = self.hello(a, t) + 100 + r.randrange(300)
        for i in range(2):
            down, up = self.content.request(8080, client)
            t = self._exchange(a, lo_a, t, down, up, 200, self.content.json_body(300 + r.randrange(600)),
                               first=(i == 0)) + 150_000 + r.randrange(100_000)
        # The collision: a SYN from the same client ip:port to the other redirected port.
        b = Leg(sess, "eth0", client, a.cport, a.sip, 9090, r, a.rtt)
        lo_b = Leg(sess, "lo", up_src, self.ports.reserve(up_src), a.sip, 9090, r, 30)
        b.syn(t, tag=tg("syn"))
        t_ca = t + 40 + r.randrange(30)
        # RFC 5961 challenge ACK from the established socket: its own seq/ack, its timestamps, its IP id.
        b._add(t_ca, False, ACK, a.snxt, a.cnxt, a.swin, a._ts_opt(t_ca, False), b"", a._ipid(False),
               tg("challenge_ack"))
        b.rst(t_ca + b.rtt, True, a.cnxt)  # the client: an ACK for a SYN_SENT socket it does not accept
        t = t + 1_000_000 + r.randrange(20_000)
        b.syn(t)  # the retransmission; the client's in-window RST has killed the 8080 socket in the pod
        b.synack(t + 20)
        t += 20 + b.rtt
        b.send(t, True)
        t = self.hello(b, t) + 100 + r.randrange(300)
        down, up = self.content.request(9090, client)
        t = self._exchange(b, lo_b, t, down, up, 200, self.content.json_body(400), first=True)
        # The next request on the 8080 connection meets no socket: reset, as lab frame 30.
        t += 200_000 + r.randrange(100_000)
        down, _ = self.content.request(8080, client)
        a.send(t, True, self.seal(down))
        a.rst(t + 40 + r.randrange(20), False, a.snxt)
        t = b.close(t + 300 + r.randrange(300), True, r, False, 30)
        t = lo_b.close(t + 200, True, r, False, 20)
        lo_a.close(t + 200, True, r, False, 20)  # the sidecar drops its idle pooled upstream of the dead 8080 leg
        self._plant("tuple-collision", "eth0", b.client, b.server, "error",
                    {"syn": tg("syn"), "challenge_ack": tg("challenge_ack"), "peer_syn": tg("peer_syn")},
                    "SYN to pod:9090 from a client port holding a live connection to pod:8080, challenge ACK")
        return sess.done()

    def plant_http_framing(self, t0: int, no: int, kind: int) -> Session:
        """lo: the app answers with framing Envoy rejects; Envoy closes the upstream and answers 502 UPE."""
        r = self.rng
        sess = Session()
        eth, lo, client = self._plant_legs(sess, t0, no, 8080)
        tg = lambda role: self._tag(no, role)  # noqa: E731
        t = self.hello(eth, eth.handshake(t0, 20)) + 100 + r.randrange(300)
        down, up = self.content.request(8080, client)
        t = self._exchange(eth, lo, t, down, up, 200, self.content.json_body(500), first=True)
        t += 100_000 + r.randrange(200_000)
        body = self.content.json_body(200 + r.randrange(400))
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        d = self.content.date(t).encode()
        heads = [
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            b"Transfer-Encoding: Chunked\r\nDate: " + d + b"\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Transfer-Encoding: chunked\r\nDate: " % len(chunked) + d + b"\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"X-Regi\xc3\xb3n: eu-west-1\r\nDate: " % len(body) + d + b"\r\n\r\n",
        ]
        app_body = body if kind == 2 else chunked
        what = ("duplicate Transfer-Encoding (chunked, Chunked)", "Transfer-Encoding with Content-Length",
                "invalid byte in a header name")[kind]
        down, up = self.content.request(8080, client)
        eth.send(t, True, self.seal(down))
        t_up = t + 60 + r.randrange(100)
        lo.send(t_up, True, up)
        t_app = t_up + self._app_time()
        lo.send(t_app, False, heads[kind] + app_body, tag=tg("response"))
        # Envoy's codec rejects it: the upstream connection is closed, the caller gets 502 UPE.
        t_close = t_app + 40 + r.randrange(40)
        t_end = lo.close(t_close, True, r, False, 15)
        err = self.content.envoy_error(t_close, 502, ENVOY_BODY[502])
        eth.send(t_close + 30, False, self.seal(err))
        eth.send(t_close + 30 + eth.rtt, True)
        eth.close(max(t_end, t_close + 30 + eth.rtt) + 5_000 + r.randrange(20_000), True, r, False, 30)
        self._plant("http-framing", "lo", lo.client, lo.server, "error", {"response": tg("response")},
                    f"app response with {what}")
        return sess.done()

    def plant_stale_keepalive(self, t0: int, no: int) -> Session:
        """lo: the app closes an idle pooled connection (keep-alive timeout) just as Envoy writes the next
        request on it; the app's kernel resets; the caller gets 503 UC."""
        r = self.rng
        sess = Session()
        eth, lo, client = self._plant_legs(sess, t0, no, 8080)
        tg = lambda role: self._tag(no, role)  # noqa: E731
        t = self.hello(eth, eth.handshake(t0, 20)) + 100 + r.randrange(300)
        for i in range(2):
            down, up = self.content.request(8080, client)
            t = self._exchange(eth, lo, t, down, up, 200, self.content.json_body(300 + r.randrange(800)),
                               first=(i == 0)) + (50_000 + r.randrange(50_000) if i == 0 else 0)
        t_fin = t + 2_000_000 + r.randrange(1000)  # the app's 2 s keep-alive timeout
        lo.send(t_fin, False, flags=FIN | ACK, tag=tg("fin"))
        gap = 30 + r.randrange(400)  # Envoy has not read the FIN yet when it writes the next request
        t_up = t_fin + gap
        down, up = self.content.request(8080, client)
        eth.send(t_up - 60 - r.randrange(60), True, self.seal(down))
        lo.send(t_fin + min(gap - 5, 10 + r.randrange(10)), True)  # the sidecar's kernel ACKs the FIN at once
        lo.send(t_up, True, up, tag=tg("request"))
        t_rst = t_up + 10 + r.randrange(15)
        lo.rst(t_rst, False, lo.snxt, tag=tg("rst"))  # RST seq = the request's ack, no ACK flag (Linux)
        t = t_rst + 40 + r.randrange(80)
        eth.send(t, False, self.seal(self.content.envoy_error(t, 503, ENVOY_BODY[503])))
        eth.send(t + eth.rtt, True)
        eth.close(t + eth.rtt + 10_000 + r.randrange(30_000), True, r, False, 30)
        self._plant("stale-keepalive", "lo", lo.client, lo.server, "error",
                    {"fin": tg("fin"), "request": tg("request"), "rst": tg("rst")},
                    f"request {gap} us after the app's FIN on a pooled connection, answered by RST")
        return sess.done()

    def plant_upstream_refused(self, t0: int, no: int) -> Session:
        """lo: the sidecar's SYN to the app port meets no listener: RST; the caller gets 503 UF."""
        r = self.rng
        sess = Session()
        eth, lo, client = self._plant_legs(sess, t0, no, 9090)
        tg = lambda role: self._tag(no, role)  # noqa: E731
        t = self.hello(eth, eth.handshake(t0, 20))
        t += 100 + r.randrange(300)
        down, _ = self.content.request(9090, client)
        eth.send(t, True, self.seal(down))
        eth.send(t + 15, False)
        t_syn = t + 60 + r.randrange(60)
        lo.syn(t_syn, tag=tg("syn"))
        t_rst = t_syn + 8 + r.randrange(10)
        lo.rst(t_rst, False, 0, lo.cisn + 1, RST | ACK, tag=tg("rst"))
        t = t_rst + 50 + r.randrange(100)
        eth.send(t, False, self.seal(self.content.envoy_error(t, 503, ENVOY_BODY["refused"])))
        eth.send(t + eth.rtt, True)
        eth.close(t + eth.rtt + 5_000 + r.randrange(20_000), True, r, False, 30)
        self._plant("upstream-refused", "lo", lo.client, lo.server, "error",
                    {"syn": tg("syn"), "rst": tg("rst")}, "SYN to the app port on lo answered by RST")
        return sess.done()

    def plant_syn_timeout(self, t0: int, no: int, on_lo: bool) -> Session:
        """A SYN retransmitted at 1, 3 and 7 s (Linux's backoff) with no answer at all. On eth0 a client gives
        up; on lo it is the sidecar's connect to a stuck app, and Envoy's 10 s connect timeout answers the
        caller 503 UF."""
        r = self.rng
        sess = Session()
        eth, lo, client = self._plant_legs(sess, t0, no, 8080)
        tg = lambda role: self._tag(no, role)  # noqa: E731
        if on_lo:
            t = self.hello(eth, eth.handshake(t0, 20)) + 100 + r.randrange(300)
            down, _ = self.content.request(8080, client)
            eth.send(t, True, self.seal(down))
            eth.send(t + 15, False)
            leg, t_syn = lo, t + 60 + r.randrange(60)
        else:
            leg, t_syn = eth, t0
        leg.syn(t_syn, tag=tg("syn"))
        for i, at in enumerate((1, 3, 7)):
            leg.syn(t_syn + at * 1_000_000 + r.randrange(3000), tag=tg("last") if i == 2 else None)
        if on_lo:
            t = t_syn + 10_000_000
            eth.send(t, False, self.seal(self.content.envoy_error(t, 503, ENVOY_BODY["timeout"])))
            eth.send(t + eth.rtt, True)
            eth.close(t + eth.rtt + 5_000, True, r, False, 30)
        self._plant("syn-timeout", "lo" if on_lo else "eth0", leg.client, leg.server, "error",
                    {"syn": tg("syn"), "last_retransmission": tg("last")},
                    "SYN retransmitted at 1, 3 and 7 s without an answer")
        return sess.done()
