"""bench/gen.py's h2c mix (issue 34): HTTP/2 with prior knowledge on both legs, many streams a connection.

Every frame is made by the ``h2`` library's connection state machines (RFC 9113 framing, HPACK from ``hpack``
with its dynamic table), one pair per leg: the client and Envoy on eth0, Envoy and the app on lo. A connection
opens with the client preface and SETTINGS each way (Envoy's 256 MiB stream and connection windows, its
default ``initial_stream_window_size``/``initial_connection_window_size``, announced with a WINDOW_UPDATE),
then carries batches of concurrent streams (GETs, some POSTs with a JSON body), each relayed on lo as it comes
and answered in the order the app finishes them. Some connections end with GOAWAY (Envoy draining the
downstream; Envoy closing its upstream), the rest with a plain FIN. Header values come from ``gen_http.Content``
(the same requests and responses as the HTTP/1.1 mixes, names lowercased as HTTP/2 requires).
"""

from __future__ import annotations

import math

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.settings import SettingCodes, Settings

from gen_plan import APP_PORTS, Plan
from gen_tcp import Session

ENVOY_WINDOW = 268_435_456  # Envoy's default initial stream and connection windows (256 MiB)
GO_CLIENT_WINDOW, GO_CLIENT_CONN_WINDOW = 4 << 20, 1 << 30  # Go's http2 Transport
DEFAULT_WINDOW = 65_535
_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection"}


def _side(client: bool, settings: dict, conn_window: int) -> H2Connection:
    c = H2Connection(H2Configuration(client_side=client, header_encoding=None, validate_inbound_headers=False,
                                     validate_outbound_headers=False, normalize_outbound_headers=False))
    c.local_settings = Settings(client=client, initial_values=settings)
    c.initiate_connection()
    if conn_window > DEFAULT_WINDOW:
        c.increment_flow_control_window(conn_window - DEFAULT_WINDOW)
    return c


class Pipe:
    """One HTTP/2 connection's two ends; what one end writes is read by the other at once (so SETTINGS ACKs
    and HPACK state follow the bytes on the wire)."""

    def __init__(self, client: H2Connection, server: H2Connection) -> None:
        self.c, self.s = client, server

    def from_client(self) -> bytes:
        data = self.c.data_to_send()
        if data:
            self.s.receive_data(data)
        return data

    def from_server(self) -> bytes:
        data = self.s.data_to_send()
        if data:
            self.c.receive_data(data)
        return data


def envoy_downstream() -> Pipe:
    client = _side(True, {SettingCodes.ENABLE_PUSH: 0, SettingCodes.INITIAL_WINDOW_SIZE: GO_CLIENT_WINDOW,
                          SettingCodes.MAX_HEADER_LIST_SIZE: 10 << 20}, GO_CLIENT_CONN_WINDOW)
    envoy = _side(False, {SettingCodes.MAX_CONCURRENT_STREAMS: 2_147_483_647,
                          SettingCodes.INITIAL_WINDOW_SIZE: ENVOY_WINDOW}, ENVOY_WINDOW)
    return Pipe(client, envoy)


def envoy_upstream() -> Pipe:
    envoy = _side(True, {SettingCodes.ENABLE_PUSH: 0, SettingCodes.MAX_CONCURRENT_STREAMS: 2_147_483_647,
                         SettingCodes.INITIAL_WINDOW_SIZE: ENVOY_WINDOW}, ENVOY_WINDOW)
    app = _side(False, {SettingCodes.MAX_CONCURRENT_STREAMS: 250, SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20,
                        SettingCodes.MAX_HEADER_LIST_SIZE: 1_048_896}, 1 << 30)  # a Go server's
    return Pipe(envoy, app)


def request_headers(http1: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """An HTTP/1.1 request's head as HTTP/2 header fields (pseudo-headers first) and its body."""
    head, _, body = http1.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    method, path, _ = lines[0].split(b" ", 2)
    fields = [(b":method", method), (b":scheme", b"http"), (b":path", path)]
    rest = []
    for line in lines[1:]:
        name, _, value = line.partition(b": ")
        name = name.lower()
        if name == b"host":
            fields.append((b":authority", value))
        elif name.decode() not in _HOP:
            rest.append((name, value))
    return fields + rest, body


def response_headers(http1: bytes) -> list[tuple[bytes, bytes]]:
    lines = http1.rstrip(b"\r\n").split(b"\r\n")
    fields = [(b":status", lines[0].split(b" ", 2)[1])]
    for line in lines[1:]:
        name, _, value = line.partition(b": ")
        if name.lower().decode() not in _HOP:
            fields.append((name.lower(), value))
    return fields


def _segs(data: bytes, seg: int) -> list[bytes]:
    return [data[i:i + seg] for i in range(0, len(data), seg)]


class H2Plan(Plan):
    """Background sessions of HTTP/2 cleartext connections with many streams each."""

    MIX = "h2c"

    def background(self, t0: int) -> Session:
        return self.h2c(t0)

    def small(self, t0: int) -> Session:
        return self.h2c(t0, streams=1 + self.rng.randrange(8))

    def h2c(self, t0: int, streams: int | None = None) -> Session:
        r = self.rng
        sess = Session()
        v6 = r.random() < 0.08
        port = APP_PORTS[r.random() < 0.25]
        eth, lo, client, up_src = self._legs(sess, t0, v6, port)
        if streams is None:
            streams = min(600, 4 + int(r.lognormvariate(math.log(40), 0.8)))
        t = eth.handshake(t0, 12 + r.randrange(30))
        down, up = envoy_downstream(), envoy_upstream()
        t += 5 + r.randrange(20)
        eth.send(t, True, down.from_client())  # preface, SETTINGS, WINDOW_UPDATE
        t += 20 + r.randrange(40)
        eth.send(t, False, down.from_server())  # Envoy's SETTINGS, WINDOW_UPDATE, the client's SETTINGS ACK
        connected = False
        sid, done = 1, 0
        t_eth_s = t_lo_s = t  # the last packet each server side wrote (kept in time order)
        while done < streams:
            t = max(t, t_eth_s, t_lo_s) + (50 + r.randrange(300) if done == 0 else
                                           self._think(500, 8_000, 400_000))
            batch = []
            for _ in range(min(streams - done, 1 + int(r.random() ** 2 * 8))):
                d_req, u_req = self.content.request(port, client, close=r.random() < 0.15)
                fields, body = request_headers(d_req)
                down.c.send_headers(sid, fields, end_stream=not body)
                if body:
                    down.c.send_data(sid, body, end_stream=True)
                batch.append((sid, u_req))
                sid += 2
            t = eth.stream(t, True, _segs(down.from_client(), eth.seg), 3, r, 15 + r.randrange(30))
            t_up = t + 30 + r.randrange(120)
            if not connected:
                t_up = lo.handshake(t_up, 8 + r.randrange(12)) + 5 + r.randrange(20)
                lo.send(t_up, True, up.from_client())
                t_up += 10 + r.randrange(20)
                lo.send(t_up, False, up.from_server())
                t_up += 5 + r.randrange(10)
                connected = True
            for s, u_req in batch:
                fields, body = request_headers(u_req)
                up.c.send_headers(s, fields, end_stream=not body)
                if body:
                    up.c.send_data(s, body, end_stream=True)
            t_up = lo.stream(t_up, True, _segs(up.from_client(), lo.seg), 3, r, 10 + r.randrange(20))
            finish = sorted((t_up + self._app_time(), s) for s, _ in batch)
            for t_app, s in finish:
                status = 404 if r.random() < 0.03 else 200
                size = int(min(12_000, 60 + r.lognormvariate(math.log(700), 0.9)))
                body = self.content.json_body(size) if status == 200 else b'{"error":"not found"}'
                app_head, envoy_head = self.content.response(t_app, status, body,
                                                             service_ms=max(1, (t_app - t_up) // 1000))
                up.s.send_headers(s, response_headers(app_head))
                up.s.send_data(s, body, end_stream=True)
                t_lo_s = lo.stream(max(t_app, t_lo_s + 1), False, _segs(up.from_server(), lo.seg), 3, r,
                                   12 + r.randrange(20))
                down.s.send_headers(s, response_headers(envoy_head))
                down.s.send_data(s, body, end_stream=True)
                t_eth_s = eth.stream(max(t_lo_s + 30 + r.randrange(100), t_eth_s + 1), False,
                                     _segs(down.from_server(), eth.seg), 12, r, eth.rtt + r.randrange(40))
                done += 1
        t = max(t, t_eth_s, t_lo_s) + self._think(500, 8_000, 200_000)
        if r.random() < 0.5:  # Envoy drains the downstream connection: GOAWAY, then its FIN
            down.s.close_connection(last_stream_id=sid - 2)
            eth.send(t, False, down.from_server())
            t_end = eth.close(t + eth.rtt + 5_000 + r.randrange(20_000), False, r, r.random() < 0.3, eth.rtt)
        else:  # the client closes its idle connection
            t_end = eth.close(t, True, r, r.random() < 0.3, 20 + r.randrange(60))
        t_end += 80 + r.randrange(400)
        if r.random() < 0.5:  # Envoy closes its upstream connection with a GOAWAY first
            up.c.close_connection()
            lo.send(t_end, True, up.from_client())
            t_end += 20 + r.randrange(40)
        lo.close(t_end, True, r, r.random() < 0.3, 10 + r.randrange(30))
        sess.done()
        self.ports.release(client, eth.cport, sess.end)
        self.ports.release(up_src, lo.cport, sess.end)
        return sess
