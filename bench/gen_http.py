"""What bench/gen.py's connections carry: the client's, Envoy's and the app's HTTP/1.1, and download bodies.

Requests and responses are written as the client, Envoy (lowercased names, its x-envoy-* and x-b3-* headers)
and the app write them, so tshark and the detectors read the same text as on a real pod. Download bodies are
cleaned so that no segment starts like an HTTP message, which the HTTP detectors would take for one.
"""

from __future__ import annotations

import json
import random
from email.utils import formatdate

_HTTP_STARTS = (b"HTTP/1.", b"GET ", b"POST ", b"PUT ", b"DELETE ", b"HEAD ", b"OPTIONS ", b"PATCH ", b"CONNECT ",
                b"TRACE ")

_PATHS = ("/api/v1/products/{n}", "/api/v1/products/{n}/reviews", "/api/v1/ratings/{n}", "/api/v1/cart/{u}",
          "/api/v1/catalog?page={p}&size=20", "/api/v1/users/{u}/orders?limit=10", "/api/v1/inventory/{n}",
          "/api/v1/search?q=shoes&page={p}", "/productpage?u=normal", "/api/v1/recommendations/{u}")
_UAS = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
        "okhttp/4.12.0", "Go-http-client/1.1", "python-requests/2.31.0", "curl/8.5.0",
        "Apache-HttpClient/5.2.1 (Java/17.0.9)", "ReactorNetty/1.1.13", "axios/1.6.2")
_HOSTS = ("reviews.shop.svc.cluster.local:{port}", "reviews:{port}", "reviews.shop:{port}")
_WORDS = ("comfortable", "durable", "lightweight", "waterproof", "classic", "breathable", "running", "trail",
          "leather", "cushioned", "everyday", "premium", "recycled", "wide", "narrow", "sole", "lace", "grip")
_LOREM = " ".join(_WORDS * 40)
ENVOY_BODY = {
    502: "upstream connect error or disconnect/reset before headers. reset reason: protocol error",
    503: "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
    "refused": "upstream connect error or disconnect/reset before headers. reset reason: remote connection "
               "failure, transport failure reason: delayed connect error: 111",
    "timeout": "upstream connect error or disconnect/reset before headers. reset reason: connection timeout",
}
_REASONS = {200: "OK", 201: "Created", 404: "Not Found", 502: "Bad Gateway", 503: "Service Unavailable"}


class Content:
    """Requests and responses as the client, Envoy and the app write them (Envoy lowercases header names)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._date_s = -1
        self._date = ""

    def date(self, t: int) -> str:
        s = t // 1_000_000
        if s != self._date_s:
            self._date_s, self._date = s, formatdate(s, usegmt=True)
        return self._date

    def request(self, port: int, client_ip: str, close: bool = False) -> tuple[bytes, bytes]:
        """(what the client sends on eth0, what the sidecar forwards on lo)."""
        r = self.rng
        post = close and r.random() < 0.3
        if post:
            path = f"/api/v1/cart/{r.randrange(1, 99999)}/items"
            body = json.dumps({"sku": f"SKU-{r.randrange(10**6):06d}", "qty": r.randrange(1, 5)}).encode()
        else:
            path = r.choice(_PATHS).format(n=r.randrange(1, 99999), u=r.randrange(1, 999999), p=r.randrange(1, 40))
            body = b""
        host = r.choice(_HOSTS).format(port=port)
        ua = r.choice(_UAS)
        rid = "%08x-%04x-4%03x-%04x-%012x" % (r.getrandbits(32), r.getrandbits(16), r.getrandbits(12),
                                              0x8000 | r.getrandbits(14), r.getrandbits(48))
        trace, span = "%032x" % r.getrandbits(128), "%016x" % r.getrandbits(64)
        fields = [("Host", host), ("User-Agent", ua), ("Accept", "application/json"),
                  ("Accept-Encoding", "gzip, deflate"), ("X-Request-Id", rid),
                  ("Traceparent", f"00-{trace}-{span}-01")]
        if post:
            fields += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if close:
            fields.append(("Connection", "close"))
        method = "POST" if post else "GET"
        down = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "\r\n"
        up_fields = [(k.lower(), v) for k, v in fields if k != "Connection"]
        up_fields += [("x-forwarded-proto", "http"), ("x-envoy-attempt-count", "1"),
                      ("x-forwarded-for", client_ip), ("x-b3-traceid", trace[16:]),
                      ("x-b3-spanid", "%016x" % r.getrandbits(64)), ("x-b3-parentspanid", span),
                      ("x-b3-sampled", "0")]
        up = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in up_fields) + "\r\n"
        return down.encode() + body, up.encode() + body

    def json_body(self, n: int) -> bytes:
        r = self.rng
        head = '{"id":%d,"name":"%s %s","price":%d.%02d,"rating":%.1f,"description":"' % (
            r.randrange(1, 99999), r.choice(_WORDS), r.choice(_WORDS), r.randrange(5, 300), r.randrange(100),
            r.uniform(1, 5))
        fill = max(0, n - len(head) - 2)
        start = r.randrange(len(_LOREM) - fill) if fill < len(_LOREM) else 0
        text = (_LOREM * (1 + fill // len(_LOREM)))[start:start + fill]
        return (head + text + '"}').encode()

    def response(self, t: int, status: int, body: bytes, ctype: str = "application/json",
                 service_ms: int = 1) -> tuple[bytes, bytes]:
        """(the app's response head on lo, Envoy's on eth0); the body follows both."""
        reason = _REASONS.get(status, "OK")
        d = self.date(t)
        app = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
               f"Date: {d}\r\nCache-Control: no-store\r\n\r\n")
        envoy = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
                 f"date: {d}\r\ncache-control: no-store\r\nx-envoy-upstream-service-time: {service_ms}\r\n"
                 f"server: istio-envoy\r\n\r\n")
        return app.encode(), envoy.encode()

    def envoy_error(self, t: int, status: int, body: str) -> bytes:
        return (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-length: {len(body)}\r\ncontent-type: text/plain\r\n"
                f"date: {self.date(t)}\r\nserver: istio-envoy\r\n\r\n{body}").encode()


def body_block(rng: random.Random, size: int = 1 << 17) -> bytes:
    """Incompressible bytes for download bodies, cleaned so that no segment cut from anywhere in the (cyclic)
    block begins like an HTTP message."""
    block = bytearray(rng.randbytes(size))
    while True:
        doubled = bytes(block + block[:16])
        hit = min((i for s in _HTTP_STARTS if (i := doubled.find(s)) >= 0), default=-1)
        if hit < 0:
            return bytes(block)
        block[hit % size] ^= 0x80


class Chunks:
    """Download bodies: ``block`` (cyclic) from an offset, cut into segments after a response head.

    Big segments on lo would cost the writer a checksum each (~50 us for 16 KB), so bodies whose segments
    start on a ``seg``-aligned block offset reuse one bytes object per offset, and ``sums`` keeps its payload
    sum (see PcapOut.write) by object id; those objects live as long as the plan, so ids stay unique."""

    CACHE_MIN = 4096

    def __init__(self, block: bytes) -> None:
        self.block = block
        self.cache: dict[tuple[int, int], bytes] = {}
        self.sums: dict[int, int] = {}

    def cut(self, head: bytes, body_len: int, seg: int, offset: int):
        block = self.block
        first = head + _cyclic(block, offset, min(body_len, seg - len(head)))
        yield first[:seg]
        sent = len(first) - len(head)
        while sent < body_len:
            n = min(seg, body_len - sent)
            off = (offset + sent) % len(block)
            if n >= self.CACHE_MIN and n % 2 == 0 and off % n == 0:
                chunk = self.cache.get((off, n))
                if chunk is None:
                    chunk = self.cache[(off, n)] = _cyclic(block, off, n)
                    self.sums[id(chunk)] = int.from_bytes(chunk, "big") % 0xFFFF
                yield chunk
            else:
                yield _cyclic(block, off, n)
            sent += n


def _cyclic(block: bytes, off: int, n: int) -> bytes:
    size = len(block)
    off %= size
    if off + n <= size:
        return block[off:off + n]
    out = block[off:]
    while len(out) < n:
        out += block[:n - len(out)]
    return out


def segments(data: bytes, seg: int) -> list[bytes]:
    return [data[i:i + seg] for i in range(0, len(data), seg)]
