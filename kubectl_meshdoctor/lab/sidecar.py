"""Sidecar stand-in: Envoy's virtualInbound listener as far as the kernel and the access log can tell.

Listens on 0.0.0.0:15006 (where ISTIO_IN_REDIRECT sends inbound TCP) and reads each downstream connection's
SO_ORIGINAL_DST. Upstream legs go to that address from 127.0.0.6 (Envoy's inbound passthrough bind address,
RETURNed by ISTIO_OUTPUT, so they cross `lo` un-REDIRECTed).

- HTTP ports (`--http-ports`, default 5000): HTTP/1.1 proxy with an upstream connection pool (keep-alive). It
  answers like Envoy: a response whose framing Envoy's HTTP/1 codec rejects makes it RESET the upstream
  connection (SO_LINGER 0) and reply `502` UPE; an upstream that closes or resets before the response
  started gives `503` UC; a failed connect gives `503` UF. Each with Envoy's local-reply body.
- Other ports: a plain TCP relay with half-close (Envoy's tcp_proxy).

Access-log lines (Istio's default TEXT format: one per HTTP request, one per TCP connection) go to stdout,
which the lab writes to state_dir/<pod>/istio-proxy.log: what `kubectl logs -c istio-proxy` serves.
Counters live in one SidecarStats (Envoy's stat names) for the admin API to serve.

Run in a pod namespace:  python -m kubectl_meshdoctor.lab.sidecar [--port 15006] [--source 127.0.0.6]
    [--http-ports 5000] [--upstream-fin-race] [--envoy-style 2025|2024|2022]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import os
import re
import socket
import struct
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Iterator, TextIO

from kubectl_meshdoctor.lab.netns import INBOUND_CAPTURE_PORT, INBOUND_PASSTHROUGH_SOURCE

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; at level SOL_IP, returns a struct sockaddr_in
_CHUNK = 65536  # bytes per read
_MAX_HEAD = 65536  # bytes of a request/response head (Envoy's default max_request_headers_kb is 60)
DEFAULT_HTTP_PORTS = (5000,)

# Envoy's router local-reply body for an upstream reset before the response started (router.cc).
_RESET_BODY = "upstream connect error or disconnect/reset before headers. reset reason: "
_PHRASES = {200: "OK", 400: "Bad Request", 502: "Bad Gateway", 503: "Service Unavailable"}
# Hop-by-hop fields Envoy's codec does not forward (RFC 9110 section 7.6.1).
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "upgrade", "transfer-encoding"}


def original_dst(sock: socket.socket) -> tuple[str, int]:
    """The (ip, port) the downstream dialled before REDIRECT rewrote it, from conntrack via SO_ORIGINAL_DST.

    Raises OSError when the connection was not NATed (e.g. someone dialled 15006 directly).
    """
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    return socket.inet_ntoa(raw[4:8]), port


def _addr(pair: tuple[str, int] | None) -> str:
    return "-" if pair is None else f"{pair[0]}:{pair[1]}"


def _log_time(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ---------------------------------------------------------------------------------------------------------
# Counters: Envoy's names, so the admin API (/stats, /clusters) can print them as Envoy does.


@dataclass
class HostStats:
    """Per-endpoint counters as `/clusters` prints them (`<cluster>::<ip:port>::<name>::<value>`)."""

    cx_active: int = 0
    cx_connect_fail: int = 0
    cx_total: int = 0
    rq_active: int = 0
    rq_error: int = 0
    rq_success: int = 0
    rq_timeout: int = 0
    rq_total: int = 0


@dataclass
class ClusterStats:
    """`cluster.<name>.*` counters and gauges of one inbound cluster (`inbound|<port>||`)."""

    upstream_cx_total: int = 0
    upstream_cx_http1_total: int = 0
    upstream_cx_active: int = 0  # gauge
    upstream_cx_connect_fail: int = 0
    upstream_cx_connect_timeout: int = 0
    upstream_cx_destroy: int = 0
    upstream_cx_destroy_local: int = 0
    upstream_cx_destroy_remote: int = 0
    upstream_cx_destroy_with_active_rq: int = 0
    upstream_cx_destroy_local_with_active_rq: int = 0
    upstream_cx_destroy_remote_with_active_rq: int = 0
    upstream_cx_protocol_error: int = 0
    upstream_cx_rx_bytes_total: int = 0
    upstream_cx_tx_bytes_total: int = 0
    upstream_rq_total: int = 0
    upstream_rq_active: int = 0  # gauge
    upstream_rq_completed: int = 0
    upstream_rq_pending_total: int = 0
    upstream_rq_pending_active: int = 0  # gauge
    upstream_rq_pending_failure_eject: int = 0
    upstream_rq_rx_reset: int = 0
    upstream_rq_tx_reset: int = 0
    upstream_rq_code: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # upstream_rq_<code>
    hosts: dict[str, HostStats] = field(default_factory=dict)  # "ip:port" -> counters

    def host(self, address: str) -> HostStats:
        return self.hosts.setdefault(address, HostStats())


@dataclass
class SidecarStats:
    """Everything the stand-in counted. One instance per sidecar process; mutated on the event loop only."""

    listener: str = f"0.0.0.0_{INBOUND_CAPTURE_PORT}"
    downstream_cx_total: int = 0
    downstream_cx_active: int = 0  # gauge
    downstream_rq_total: int = 0
    downstream_rq_code: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    clusters: dict[str, ClusterStats] = field(default_factory=dict)  # "inbound|5000||" -> counters

    def cluster(self, name: str) -> ClusterStats:
        return self.clusters.setdefault(name, ClusterStats())

    def flat(self) -> Iterator[tuple[str, int]]:
        """(Envoy stat name, value) pairs, e.g. ("cluster.inbound|5000||.upstream_cx_total", 3)."""
        http = f"http.inbound_{self.listener}"
        yield f"{http}.downstream_cx_total", self.downstream_cx_total
        yield f"{http}.downstream_cx_active", self.downstream_cx_active
        yield f"{http}.downstream_rq_total", self.downstream_rq_total
        for code, n in sorted(self.downstream_rq_code.items()):
            yield f"{http}.downstream_rq_{code}", n
        for name, c in sorted(self.clusters.items()):
            for f in fields(c):
                value = getattr(c, f.name)
                if isinstance(value, int):
                    yield f"cluster.{name}.{f.name}", value
            for code, n in sorted(c.upstream_rq_code.items()):
                yield f"cluster.{name}.upstream_rq_{code}", n
            for klass in sorted({code // 100 for code in c.upstream_rq_code}):
                yield f"cluster.{name}.upstream_rq_{klass}xx", sum(
                    n for code, n in c.upstream_rq_code.items() if code // 100 == klass)


# ---------------------------------------------------------------------------------------------------------
# Envoy's renderings of upstream failures (../shared/reference/envoy/response_flags.md section 2).

ENVOY_STYLES = ("2025", "2024", "2022")  # Envoy >= 1.33 | 2024 builds | 2022 - early 2023 builds


@dataclass(frozen=True)
class UpstreamFailure:
    """An upstream reset before the response started, as the router reports it."""

    flag: str  # UF, UC, UPE
    status: int  # downstream status of the local reply
    reason: str  # Http::Utility::resetReasonToString text, e.g. "connection termination"
    transport: str | None = None  # transport failure reason text, e.g. "delayed connect error: 111"
    separator: str = "|"  # between reason and transport in the details token (was ',' before 2025)

    @property
    def body(self) -> bytes:
        text = _RESET_BODY + self.reason
        if self.transport:
            text += f", transport failure reason: {self.transport}"
        return text.encode()

    @property
    def details(self) -> str:
        token = self.reason.replace(" ", "_")
        if self.transport:
            token += self.separator + self.transport.replace(" ", "_")
        return f"upstream_reset_before_response_started{{{token}}}"

    @property
    def transport_field(self) -> str:
        return self.transport.replace(" ", "_") if self.transport else "-"


PROTOCOL_ERROR = UpstreamFailure("UPE", 502, "protocol error")
CONNECTION_TERMINATION = UpstreamFailure("UC", 503, "connection termination")


def connect_failure(exc: BaseException, style: str = "2025") -> UpstreamFailure:
    """The UF failure Envoy of `style` reports for a failed upstream connect."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return UpstreamFailure("UF", 503, "connection timeout")
    errno = getattr(exc, "errno", None) or 0
    if style == "2025":
        return UpstreamFailure("UF", 503, "remote connection failure",
                               f"delayed connect error: {os.strerror(errno)}", "|")
    reason = "remote connection failure" if style == "2024" else "connection failure"
    return UpstreamFailure("UF", 503, reason, f"delayed connect error: {errno}", ",")


# ---------------------------------------------------------------------------------------------------------
# HTTP/1.1 message heads and framing: strict, as Envoy's codec (RFC 9112 sections 5 and 6).

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_STATUS_LINE = re.compile(rb"HTTP/(\d)\.(\d) (\d{3})(?: (.*))?")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\S+) HTTP/(\d)\.(\d)")


class FramingError(Exception):
    """A message Envoy's HTTP/1 codec rejects (invalid field line, or framing it cannot determine)."""


@dataclass(frozen=True)
class Head:
    """A parsed request or response head. Field names keep their wire case; values are trimmed."""

    start: tuple[str, str, str]  # (method, target, version) or (version, status, reason)
    fields: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        lname = name.lower()
        return [v for k, v in self.fields if k.lower() == lname]

    def first(self, name: str) -> str | None:
        found = self.values(name)
        return found[0] if found else None

    def tokens(self, name: str) -> list[str]:
        """All comma-separated list members of a field, lowercased, across repeated field lines."""
        return [t.strip().lower() for v in self.values(name) for t in v.split(",") if t.strip()]


def _parse_fields(lines: list[bytes]) -> tuple[tuple[str, str], ...]:
    out = []
    for line in lines:
        name, sep, value = line.partition(b":")
        # RFC 9112 5.1: no whitespace between field name and colon. A proxy MAY strip it from a response;
        # Envoy's codec instead fails the header token, so `X-Bad : 1` is a protocol error here too.
        # Obsolete line folding (a line starting with SP/HTAB) fails the same check.
        if not sep or not _TOKEN.fullmatch(name):
            raise FramingError(f"invalid header field line {line[:60]!r}")
        out.append((name.decode("ascii"), value.strip(b" \t").decode("latin-1")))
    return tuple(out)


def parse_response_head(head: bytes) -> Head:
    """Parse a response head ending in CRLFCRLF; raises FramingError."""
    lines = head[: -4 if head.endswith(b"\r\n\r\n") else None].split(b"\r\n")
    match = _STATUS_LINE.fullmatch(lines[0])
    if not match:
        raise FramingError(f"invalid status line {lines[0][:60]!r}")
    major, minor, status, reason = match.groups()
    version = f"HTTP/{major.decode()}.{minor.decode()}"
    return Head((version, status.decode(), (reason or b"").decode("latin-1")), _parse_fields(lines[1:]))


def parse_request_head(head: bytes) -> Head:
    """Parse a request head ending in CRLFCRLF; raises FramingError."""
    lines = head[:-4].split(b"\r\n")
    match = _REQUEST_LINE.fullmatch(lines[0])
    if not match:
        raise FramingError(f"invalid request line {lines[0][:60]!r}")
    method, target, major, minor = (g.decode("latin-1") for g in match.groups())
    return Head((method, target, f"HTTP/{major}.{minor}"), _parse_fields(lines[1:]))


def body_framing(head: Head, *, response_to: str | None = None) -> tuple[str, int]:
    """("none"|"length"|"chunked"|"close", length) of a message body; raises FramingError.

    `response_to` is the request method when `head` is a response. Checks, per RFC 9112 section 6.3 and what
    Envoy's HTTP/1 codec (codec_impl.cc onHeadersCompleteBase, and its parser) rejects:
    - Transfer-Encoding with Content-Length: RFC "ought to be handled as an error"; Envoy (without
      allow_chunked_length) fails with "both 'Content-Length' and 'Transfer-Encoding' are set".
    - Transfer-Encoding other than exactly one `chunked`: Envoy implements no other transfer coding and fails
      with "unsupported transfer encoding". That covers two TE fields `chunked` + `Chunked` (combined:
      chunked applied twice, which RFC 9112 7.1 forbids) and `chunked, gzip`. NOTE: for a RESPONSE whose
      final coding is not chunked, RFC 9112 6.3 rule 4 says "read until close" (not an error); Envoy is
      stricter than the RFC here, and the stand-in follows Envoy.
    - Content-Length values that differ (rule 5): "the message framing is invalid"; a proxy MUST close the
      upstream connection and answer 502. Repeated identical values are accepted (RFC 9110 8.6).
    """
    status = int(head.start[1]) if response_to is not None else 0
    transfer = head.tokens("transfer-encoding")
    lengths = head.tokens("content-length")
    if head.values("transfer-encoding"):
        if lengths:
            raise FramingError("both Content-Length and Transfer-Encoding are set")
        if transfer != ["chunked"]:
            raise FramingError(f"unsupported transfer encoding {', '.join(head.values('transfer-encoding'))!r}")
    if len(set(lengths)) > 1 or any(not v.isdigit() for v in lengths):
        raise FramingError(f"invalid Content-Length {', '.join(head.values('content-length'))!r}")
    if response_to is not None and (response_to == "HEAD" or status in (204, 304) or 100 <= status < 200):
        return "none", 0
    if transfer:
        return "chunked", 0
    if lengths:
        return "length", int(lengths[0])
    return ("close", 0) if response_to is not None else ("none", 0)


async def read_body(reader: asyncio.StreamReader, kind: str, length: int) -> bytes:
    """The body bytes as on the wire (chunked framing kept). Raises FramingError on a bad chunk,
    asyncio.IncompleteReadError / ConnectionError when the peer goes away."""
    if kind == "none":
        return b""
    if kind == "length":
        return await reader.readexactly(length)
    if kind == "close":
        return await reader.read(-1)
    raw = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        raw += line
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise FramingError(f"invalid chunk size line {line[:40]!r}") from None
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                raw += trailer
            raw += b"\r\n"
            return bytes(raw)
        chunk = await reader.readexactly(size + 2)
        if not chunk.endswith(b"\r\n"):
            raise FramingError("chunk data not followed by CRLF")
        raw += chunk


def dechunk(raw: bytes) -> bytes:
    """The payload of a complete, valid chunked body (as read_body returns it)."""
    out, pos = bytearray(), 0
    while True:
        end = raw.index(b"\r\n", pos)
        size = int(raw[pos:end].split(b";", 1)[0], 16)
        if size == 0:
            return bytes(out)
        out += raw[end + 2: end + 2 + size]
        pos = end + 2 + size + 2


# ---------------------------------------------------------------------------------------------------------
# Access log


@dataclass(frozen=True)
class ConnectionRecord:
    """One downstream TCP connection as the access log reports it (tcp_proxy: no HTTP fields)."""

    start: float  # seconds since epoch
    downstream_remote: tuple[str, int]
    downstream_local: tuple[str, int] | None  # the original destination
    upstream_local: tuple[str, int] | None
    bytes_received: int  # from downstream
    bytes_sent: int  # to downstream
    duration_ms: int
    response_flags: str  # "-" or Envoy flags, e.g. "UF"
    failure_reason: str  # "-" or the upstream transport failure reason

    def access_log_line(self) -> str:
        """Istio's default TEXT access-log format, TCP rendering ("- - -", status 0)."""
        cluster = f"inbound|{self.downstream_local[1]}||" if self.downstream_local else "-"
        return (
            f'[{_log_time(self.start)}] "- - -" 0 {self.response_flags} - - "{self.failure_reason}" '
            f"{self.bytes_received} {self.bytes_sent} {self.duration_ms} - "
            f'"-" "-" "-" "-" "{_addr(self.downstream_local)}" {cluster} '
            f"{_addr(self.upstream_local)} {_addr(self.downstream_local)} {_addr(self.downstream_remote)} - -"
        )


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request on an inbound HTTP port as the access log reports it."""

    start: float
    method: str
    path: str
    protocol: str
    status: int  # 0 when nothing was sent downstream
    flags: str  # "-" or e.g. "UC"
    details: str  # RESPONSE_CODE_DETAILS, e.g. "via_upstream"
    transport_failure: str  # "-" or e.g. "delayed_connect_error:_Connection_refused"
    bytes_received: int  # request body bytes
    bytes_sent: int  # response body bytes
    duration_ms: int
    upstream_service_ms: int | None
    forwarded_for: str | None
    user_agent: str | None
    request_id: str
    authority: str | None
    upstream_host: tuple[str, int]
    upstream_local: tuple[str, int] | None
    downstream_local: tuple[str, int]
    downstream_remote: tuple[str, int]

    def access_log_line(self) -> str:
        """Istio's default TEXT access-log format (EnvoyTextLogFormat, Istio >= 1.24), inbound rendering."""

        def q(value: str | None) -> str:
            return f'"{value or "-"}"'

        service = "-" if self.upstream_service_ms is None else str(self.upstream_service_ms)
        return (
            f'[{_log_time(self.start)}] "{self.method} {self.path} {self.protocol}" {self.status} {self.flags} '
            f'{self.details} - "{self.transport_failure}" {self.bytes_received} {self.bytes_sent} '
            f"{self.duration_ms} {service} {q(self.forwarded_for)} {q(self.user_agent)} {q(self.request_id)} "
            f"{q(self.authority)} {q(_addr(self.upstream_host))} inbound|{self.downstream_local[1]}|| "
            f"{_addr(self.upstream_local)} {_addr(self.downstream_local)} {_addr(self.downstream_remote)} - default"
        )


# ---------------------------------------------------------------------------------------------------------
# Upstream connections


class UpstreamConnector:
    """Opens upstream connections to the app, bound to the inbound passthrough source address."""

    def __init__(self, source_ip: str = INBOUND_PASSTHROUGH_SOURCE, connect_timeout: float = 10.0) -> None:
        self._source_ip = source_ip
        self._connect_timeout = connect_timeout  # seconds; Envoy's default cluster connect_timeout

    async def connect(self, dst: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to dst from source_ip; raises OSError (refused, timeout as TimeoutError)."""
        return await asyncio.wait_for(
            asyncio.open_connection(dst[0], dst[1], local_addr=(self._source_ip, 0), limit=_MAX_HEAD),
            self._connect_timeout,
        )


@dataclass(eq=False)
class UpstreamConnection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    dst: tuple[str, int]
    local: tuple[str, int]
    watcher: asyncio.Task[None] | None = None  # reads an idle connection to notice the app's FIN

    def reset(self) -> None:
        """Close with SO_LINGER {1, 0}: the kernel sends RST instead of FIN (Envoy's reset on codec errors)."""
        sock = self.writer.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


class UpstreamPool:
    """HTTP/1 upstream connections per original destination, reused after a complete keep-alive response.

    Envoy notices an idle upstream's FIN as soon as it arrives (its event loop reads every connection) and
    destroys the connection; the stale keep-alive race is the FIN arriving after the request was assigned to
    that connection. `fin_race=True` makes that window deterministic: idle connections are not read at all
    (reading paused), so a connection the app closed while idle is still reused, and the request goes out on
    it: the app's kernel answers with RST and the request fails with UC, every time.
    """

    def __init__(self, connector: UpstreamConnector, stats: SidecarStats, *, fin_race: bool = False) -> None:
        self._connector = connector
        self._stats = stats
        self._fin_race = fin_race
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = defaultdict(list)

    def _cluster(self, dst: tuple[str, int]) -> ClusterStats:
        return self._stats.cluster(f"inbound|{dst[1]}||")

    async def acquire(self, dst: tuple[str, int]) -> UpstreamConnection:
        """An idle pooled connection to dst (most recently used first) or a new one; raises OSError/Timeout."""
        idle = self._idle[dst]
        while idle:
            conn = idle.pop()
            if conn.watcher is not None:
                conn.watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await conn.watcher
                conn.watcher = None
            if not self._fin_race and (conn.reader.at_eof() or conn.writer.is_closing()):
                self.destroy(conn, remote=True)
                continue
            return conn
        cluster, host = self._cluster(dst), self._cluster(dst).host(_addr(dst))
        cluster.upstream_rq_pending_total += 1
        cluster.upstream_rq_pending_active += 1
        cluster.upstream_cx_total += 1
        cluster.upstream_cx_http1_total += 1
        host.cx_total += 1
        try:
            reader, writer = await self._connector.connect(dst)
        except (OSError, asyncio.TimeoutError) as exc:
            cluster.upstream_cx_connect_fail += 1
            if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                cluster.upstream_cx_connect_timeout += 1
            cluster.upstream_rq_pending_failure_eject += 1
            host.cx_connect_fail += 1
            raise
        finally:
            cluster.upstream_rq_pending_active -= 1
        cluster.upstream_cx_active += 1
        host.cx_active += 1
        return UpstreamConnection(reader, writer, dst, writer.get_extra_info("sockname")[:2])

    def release(self, conn: UpstreamConnection) -> None:
        """Put a connection whose exchange completed back into the pool."""
        if self._fin_race:
            conn.writer.transport.pause_reading()
        else:
            conn.watcher = asyncio.get_running_loop().create_task(self._watch_idle(conn))
        self._idle[conn.dst].append(conn)

    def resume(self, conn: UpstreamConnection) -> None:
        """Read the connection again (after the request went out on it)."""
        if self._fin_race and not conn.writer.is_closing():
            conn.writer.transport.resume_reading()

    async def _watch_idle(self, conn: UpstreamConnection) -> None:
        try:
            await conn.reader.read(1)  # b"" = the app's FIN; bytes on an idle HTTP/1 connection are an error too
        except (ConnectionError, OSError):
            pass
        if conn in self._idle[conn.dst]:
            self._idle[conn.dst].remove(conn)
        conn.watcher = None
        self.destroy(conn, remote=True)

    def destroy(self, conn: UpstreamConnection, *, remote: bool = False, reset: bool = False,
                active_rq: bool = False) -> None:
        """Close a connection for good: FIN, or RST when `reset`; count who ended it."""
        cluster, host = self._cluster(conn.dst), self._cluster(conn.dst).host(_addr(conn.dst))
        cluster.upstream_cx_active -= 1
        host.cx_active -= 1
        cluster.upstream_cx_destroy += 1
        if remote:
            cluster.upstream_cx_destroy_remote += 1
        else:
            cluster.upstream_cx_destroy_local += 1
        if active_rq:
            cluster.upstream_cx_destroy_with_active_rq += 1
            if remote:
                cluster.upstream_cx_destroy_remote_with_active_rq += 1
            else:
                cluster.upstream_cx_destroy_local_with_active_rq += 1
        if reset:
            conn.reset()
        else:
            conn.writer.close()


# ---------------------------------------------------------------------------------------------------------
# The listener


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, bool]:
    """Copy until EOF, then half-close the other side. Returns (bytes copied, ended cleanly)."""
    total = 0
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
            total += len(data)
        if not writer.is_closing() and writer.can_write_eof():
            writer.write_eof()
        return total, True
    except (ConnectionError, OSError):
        return total, False


def local_reply(status: int, body: bytes, *, close: bool = False) -> bytes:
    """Envoy's local reply as its HTTP/1 codec writes it (lowercase field names)."""
    head = (
        f"HTTP/1.1 {status} {_PHRASES.get(status, '')}\r\n"
        f"content-length: {len(body)}\r\ncontent-type: text/plain\r\n"
        f"date: {email.utils.formatdate(usegmt=True)}\r\nserver: istio-envoy\r\n"
        + ("connection: close\r\n" if close else "") + "\r\n"
    )
    return head.encode("latin-1") + body


@dataclass
class _Exchange:
    """What the proxy learned about one request, for the access log."""

    status: int = 0
    flags: str = "-"
    details: str = "-"
    transport_failure: str = "-"
    bytes_sent: int = 0
    upstream_service_ms: int | None = None
    upstream_local: tuple[str, int] | None = None


class InboundSidecar:
    """The 15006 listener: accept downstream, proxy HTTP ports through the pool, relay the rest as TCP."""

    def __init__(
        self,
        upstream: UpstreamConnector,
        host: str = "0.0.0.0",
        port: int = INBOUND_CAPTURE_PORT,
        access_log: TextIO = sys.stdout,
        *,
        http_ports: tuple[int, ...] = DEFAULT_HTTP_PORTS,
        fin_race: bool = False,
        envoy_style: str = "2025",
        stats: SidecarStats | None = None,
    ) -> None:
        self.stats = stats if stats is not None else SidecarStats(listener=f"{host}_{port}")
        self._upstream = upstream
        self._pool = UpstreamPool(upstream, self.stats, fin_race=fin_race)
        self._host = host
        self._port = port
        self._access_log = access_log
        self._http_ports = set(http_ports)
        self._style = envoy_style

    async def serve_forever(self) -> None:
        """Listen until cancelled; raises OSError when the port cannot be bound."""
        server = await asyncio.start_server(self._handle, self._host, self._port, reuse_address=True,
                                            limit=_MAX_HEAD)
        async with server:
            await server.serve_forever()

    def _log(self, line: str) -> None:
        print(line, file=self._access_log, flush=True)

    async def _handle(self, down_reader: asyncio.StreamReader, down_writer: asyncio.StreamWriter) -> None:
        self.stats.downstream_cx_total += 1
        self.stats.downstream_cx_active += 1
        try:
            try:
                orig = original_dst(down_writer.get_extra_info("socket"))
            except OSError:
                orig = None
            if orig is not None and orig[1] in self._http_ports:
                await self._serve_http(down_reader, down_writer, orig)
            else:
                await self._serve_tcp(down_reader, down_writer, orig)
        finally:
            self.stats.downstream_cx_active -= 1

    # --- HTTP ---

    async def _serve_http(self, down_reader: asyncio.StreamReader, down_writer: asyncio.StreamWriter,
                          orig: tuple[str, int]) -> None:
        remote = down_writer.get_extra_info("peername")[:2]
        try:
            while True:
                try:
                    raw_head = await down_reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError):
                    return  # downstream closed (or reset) between requests
                start = time.time()
                try:
                    request = parse_request_head(raw_head)
                    kind, length = body_framing(request)
                    body = await read_body(down_reader, kind, length)
                except FramingError:
                    # Downstream protocol error: Envoy answers 400 and closes (DPE, http1.codec_error).
                    down_writer.write(local_reply(400, b"Bad Request", close=True))
                    await down_writer.drain()
                    self._log(RequestRecord(
                        start, "-", "-", "-", 400, "DPE", "http1.codec_error", "-", 0, 11,
                        int((time.time() - start) * 1000), None, None, None, "-", None, orig, None, orig, remote,
                    ).access_log_line())
                    return
                close = "close" in request.tokens("connection") or request.start[2] == "HTTP/1.0"
                request_id = request.first("x-request-id") or str(uuid.uuid4())
                response, ex = await self._proxy(request, body, orig, request_id, close=close)
                self.stats.downstream_rq_total += 1
                self.stats.downstream_rq_code[ex.status] += 1
                down_writer.write(response)
                await down_writer.drain()
                self._log(RequestRecord(
                    start=start, method=request.start[0], path=request.start[1], protocol=request.start[2],
                    status=ex.status, flags=ex.flags, details=ex.details, transport_failure=ex.transport_failure,
                    bytes_received=len(body), bytes_sent=ex.bytes_sent,
                    duration_ms=int((time.time() - start) * 1000), upstream_service_ms=ex.upstream_service_ms,
                    forwarded_for=request.first("x-forwarded-for"), user_agent=request.first("user-agent"),
                    request_id=request_id, authority=request.first("host"), upstream_host=orig,
                    upstream_local=ex.upstream_local, downstream_local=orig, downstream_remote=remote,
                ).access_log_line())
                if close:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            down_writer.close()

    async def _proxy(self, request: Head, body: bytes, orig: tuple[str, int], request_id: str, *,
                     close: bool) -> tuple[bytes, _Exchange]:
        """Send the request upstream and return (downstream response bytes, what happened)."""
        cluster = self.stats.cluster(f"inbound|{orig[1]}||")
        host = cluster.host(_addr(orig))
        ex = _Exchange()

        def fail(failure: UpstreamFailure) -> tuple[bytes, _Exchange]:
            ex.status, ex.flags, ex.details = failure.status, failure.flag, failure.details
            ex.transport_failure = failure.transport_field
            ex.bytes_sent = len(failure.body)
            host.rq_error += 1
            cluster.upstream_rq_code[failure.status] += 1
            return local_reply(failure.status, failure.body, close=close), ex

        try:
            conn = await self._pool.acquire(orig)
        except (OSError, asyncio.TimeoutError) as exc:
            return fail(connect_failure(exc, self._style))
        ex.upstream_local = conn.local
        cluster.upstream_rq_total += 1
        cluster.upstream_rq_active += 1
        host.rq_total += 1
        host.rq_active += 1
        sent_at = time.monotonic()
        try:
            outgoing = _upstream_request(request, body, request_id)
            conn.writer.write(outgoing)  # written before reading resumes: the stale-FIN race, see UpstreamPool
            cluster.upstream_cx_tx_bytes_total += len(outgoing)
            self._pool.resume(conn)
            try:
                await conn.writer.drain()
                raw_head = await conn.reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                # FIN or RST before any response byte: connection termination (UC).
                cluster.upstream_rq_rx_reset += 1
                self._pool.destroy(conn, remote=True, active_rq=True)
                return fail(CONNECTION_TERMINATION)
            try:
                head = parse_response_head(raw_head)
                kind, length = body_framing(head, response_to=request.start[0])
                resp_body = await read_body(conn.reader, kind, length)
            except (FramingError, asyncio.LimitOverrunError):
                # Envoy's codec error on the upstream: reset the connection, 502 UPE.
                cluster.upstream_cx_protocol_error += 1
                self._pool.destroy(conn, reset=True, active_rq=True)
                return fail(PROTOCOL_ERROR)
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                cluster.upstream_rq_rx_reset += 1
                self._pool.destroy(conn, remote=True, active_rq=True)
                return fail(CONNECTION_TERMINATION)
            cluster.upstream_cx_rx_bytes_total += len(raw_head) + len(resp_body)
            status = int(head.start[1])
            ex.status, ex.details = status, "via_upstream"
            ex.upstream_service_ms = int((time.monotonic() - sent_at) * 1000)
            cluster.upstream_rq_completed += 1
            cluster.upstream_rq_code[status] += 1
            if status >= 500:
                host.rq_error += 1
            else:
                host.rq_success += 1
            reusable = kind != "close" and head.start[0] == "HTTP/1.1" and "close" not in head.tokens("connection")
            if reusable:
                self._pool.release(conn)
            else:
                self._pool.destroy(conn, remote=kind == "close")
            out_head, payload = _downstream_response(head, kind, resp_body, ex.upstream_service_ms, close=close)
            ex.bytes_sent = len(payload)
            return out_head + resp_body, ex
        finally:
            cluster.upstream_rq_active -= 1
            host.rq_active -= 1

    # --- TCP ---

    async def _serve_tcp(self, down_reader: asyncio.StreamReader, down_writer: asyncio.StreamWriter,
                         orig: tuple[str, int] | None) -> None:
        start = time.time()
        remote = down_writer.get_extra_info("peername")[:2]
        flags, reason = "-", "-"
        upstream_local: tuple[str, int] | None = None
        received = sent = 0
        cluster = self.stats.cluster(f"inbound|{orig[1]}||") if orig else None
        try:
            if orig is None:
                raise ConnectionRefusedError(111, "not redirected")
            if cluster is not None:
                cluster.upstream_cx_total += 1
                cluster.host(_addr(orig)).cx_total += 1
            up_reader, up_writer = await self._upstream.connect(orig)
        except (OSError, asyncio.TimeoutError) as exc:
            # Envoy's TCP proxy closes the downstream when the upstream connect fails (UF).
            failure = connect_failure(exc, self._style)
            flags, reason = "UF", failure.transport_field
            if cluster is not None and orig is not None:
                cluster.upstream_cx_connect_fail += 1
                cluster.host(_addr(orig)).cx_connect_fail += 1
        else:
            assert cluster is not None and orig is not None
            cluster.upstream_cx_active += 1
            upstream_local = up_writer.get_extra_info("sockname")[:2]
            # A reset on either leg aborts both; which side reset is not a TCP-proxy flag in Envoy either.
            (received, _), (sent, _) = await asyncio.gather(
                _relay_then_abort_on_error(down_reader, up_writer, down_writer),
                _relay_then_abort_on_error(up_reader, down_writer, up_writer),
            )
            up_writer.close()
            cluster.upstream_cx_active -= 1
            cluster.upstream_cx_destroy += 1
            cluster.upstream_cx_rx_bytes_total += sent
            cluster.upstream_cx_tx_bytes_total += received
        finally:
            down_writer.close()
        self._log(ConnectionRecord(
            start=start, downstream_remote=remote, downstream_local=orig, upstream_local=upstream_local,
            bytes_received=received, bytes_sent=sent, duration_ms=int((time.time() - start) * 1000),
            response_flags=flags, failure_reason=reason,
        ).access_log_line())


def _upstream_request(request: Head, body: bytes, request_id: str) -> bytes:
    method, target, version = request.start
    lines = [f"{method} {target} {version}"]
    lines += [f"{k}: {v}" for k, v in request.fields
              if k.lower() not in _HOP_BY_HOP - {"transfer-encoding"} and k.lower() != "x-request-id"]
    lines += ["x-forwarded-proto: http", f"x-request-id: {request_id}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _downstream_response(head: Head, kind: str, body: bytes, service_ms: int, *, close: bool) -> tuple[bytes, bytes]:
    """(response head bytes, payload) for the downstream; the body is forwarded as read (chunks kept)."""
    version, status, reason = head.start
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k.lower()}: {v}" for k, v in head.fields if k.lower() not in _HOP_BY_HOP | {"server"}]
    if kind == "chunked":
        lines.append("transfer-encoding: chunked")
    elif kind == "close":
        lines.append(f"content-length: {len(body)}")  # Envoy re-frames a close-delimited body
    lines += [f"x-envoy-upstream-service-time: {service_ms}", "server: istio-envoy"]
    if close:
        lines.append("connection: close")
    payload = dechunk(body) if kind == "chunked" else body
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), payload


async def _relay_then_abort_on_error(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reader_owner: asyncio.StreamWriter
) -> tuple[int, bool]:
    """Relay one direction; on a reset, abort both legs (as Envoy does) so the other direction ends too."""
    total, ok = await _pipe(reader, writer)
    if not ok:
        writer.transport.abort()
        reader_owner.transport.abort()
    return total, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubectl_meshdoctor.lab.sidecar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=INBOUND_CAPTURE_PORT)
    parser.add_argument("--source", default=INBOUND_PASSTHROUGH_SOURCE, help="upstream bind address")
    parser.add_argument("--connect-timeout", type=float, default=10.0, help="seconds")
    parser.add_argument("--http-ports", default=",".join(map(str, DEFAULT_HTTP_PORTS)),
                        help="comma-separated original-destination ports proxied as HTTP/1 (others: TCP relay)")
    parser.add_argument("--upstream-fin-race", action="store_true",
                        help="do not read idle pooled upstream connections (reuse them after the app's FIN)")
    parser.add_argument("--envoy-style", choices=ENVOY_STYLES, default="2025",
                        help="which Envoy generation's UF rendering to write (response_flags.md section 2)")
    args = parser.parse_args(argv)
    http_ports = tuple(int(p) for p in args.http_ports.split(",") if p.strip())
    sidecar = InboundSidecar(UpstreamConnector(args.source, args.connect_timeout), args.host, args.port,
                             http_ports=http_ports, fin_race=args.upstream_fin_race, envoy_style=args.envoy_style)
    try:
        asyncio.run(sidecar.serve_forever())
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"sidecar: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
