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
which the lab writes to state_dir/<pod>/istio-proxy.log: what `kubectl logs -c istio-proxy` serves. Envoy-style
application log lines (EnvoyLog) go to the same stream, interleaved, but only for loggers whose level lets them
through: with Istio's defaults (warning, misc: error) there are none; `POST /logging?connection=debug` on the
admin API turns the `connection` logger's debug lines on, and so on for `http`, `pool`, `router`, `client`,
`conn_handler` and `filter`.
Counters live in one SidecarStats (Envoy's stat names); the admin API (admin.py, 127.0.0.1:15000, same event
loop, so the counters are live) serves them as /clusters and /stats, and the log levels as /logging.

Run in a pod namespace:  python -m kubectl_meshdoctor.lab.sidecar [--port 15006] [--source 127.0.0.6]
    [--http-ports 5000] [--app-ports 5000,5002] [--pod-ip IP] [--pod-name N --pod-namespace NS]
    [--upstream-fin-race] [--envoy-style 2025|2024|2022] [--log-format istio|envoy] [--admin-port 15000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import itertools
import os
import random
import re
import socket
import struct
import sys
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Iterator, TextIO

from kubectl_meshdoctor.lab.netns import INBOUND_CAPTURE_PORT, INBOUND_PASSTHROUGH_SOURCE

if TYPE_CHECKING:
    from kubectl_meshdoctor.lab.admin import AdminServer

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
# Counters: Envoy's names, so the admin API (admin.py: /stats, /clusters) can print them as Envoy does.

HISTOGRAM_SAMPLES = 4096  # recorded values kept per histogram (Envoy keeps a bounded log-linear histogram)

# Fields of the dataclasses below that are gauges (not zeroed by /reset_counters, not "used" merely by being 0).
GAUGES = frozenset({
    "cx_active", "rq_active", "upstream_cx_active", "upstream_rq_active", "upstream_rq_pending_active",
    "downstream_cx_active", "downstream_cx_http1_active", "downstream_rq_active",
})


def _histogram() -> deque[float]:
    return deque(maxlen=HISTOGRAM_SAMPLES)


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
    # Histograms (milliseconds): upstream_rq_time, upstream_cx_connect_ms, upstream_cx_length_ms.
    histograms: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(_histogram))

    def host(self, address: str) -> HostStats:
        return self.hosts.setdefault(address, HostStats())


@dataclass
class HttpListenerStats:
    """`http.<stat_prefix>.*` of the HTTP connection manager of one inbound port (`inbound_0.0.0.0_5000`)."""

    downstream_cx_total: int = 0
    downstream_cx_active: int = 0  # gauge
    downstream_cx_http1_total: int = 0
    downstream_cx_http1_active: int = 0  # gauge
    downstream_cx_destroy: int = 0
    downstream_cx_destroy_local: int = 0
    downstream_cx_destroy_remote: int = 0
    downstream_cx_protocol_error: int = 0
    downstream_rq_total: int = 0
    downstream_rq_http1_total: int = 0
    downstream_rq_active: int = 0  # gauge
    downstream_rq_completed: int = 0
    rq_total: int = 0
    downstream_rq_code: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    histograms: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(_histogram))


@dataclass
class TcpProxyStats:
    """`tcp.<stat_prefix>.*` of the tcp_proxy of one inbound TCP port (stat prefix: the cluster name)."""

    downstream_cx_total: int = 0
    downstream_cx_rx_bytes_total: int = 0
    downstream_cx_tx_bytes_total: int = 0
    downstream_cx_no_route: int = 0
    upstream_flush_total: int = 0


@dataclass
class SidecarStats:
    """Everything the stand-in counted. One instance per sidecar process; mutated on the event loop only."""

    listener: str = f"0.0.0.0_{INBOUND_CAPTURE_PORT}"
    downstream_cx_total: int = 0
    downstream_cx_active: int = 0  # gauge
    downstream_rq_total: int = 0
    downstream_rq_code: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    clusters: dict[str, ClusterStats] = field(default_factory=dict)  # "inbound|5000||" -> counters
    http: dict[int, HttpListenerStats] = field(default_factory=dict)  # inbound HTTP port -> HCM stats
    tcp: dict[int, TcpProxyStats] = field(default_factory=dict)  # inbound TCP port -> tcp_proxy stats
    started: float = field(default_factory=time.time)  # seconds since epoch (server.uptime)

    def cluster(self, name: str) -> ClusterStats:
        return self.clusters.setdefault(name, ClusterStats())

    def http_listener(self, port: int) -> HttpListenerStats:
        return self.http.setdefault(port, HttpListenerStats())

    def tcp_proxy(self, port: int) -> TcpProxyStats:
        return self.tcp.setdefault(port, TcpProxyStats())

    def declare(self, pod_ip: str | None, ports: tuple[int, ...], http_ports: tuple[int, ...]) -> None:
        """Create what Envoy has from config before any traffic: one `inbound|<port>||` cluster per app port
        (with the endpoint pod_ip:port when pod_ip is known) and the HCM / tcp_proxy stats of each port."""
        for port in ports:
            cluster = self.cluster(f"inbound|{port}||")
            if pod_ip:
                cluster.host(f"{pod_ip}:{port}")
            if port in http_ports:
                self.http_listener(port)
            else:
                self.tcp_proxy(port)

    def flat(self, delimiter: str = "") -> Iterator[tuple[str, int]]:
        """(Envoy stat name, value) pairs of every counter and gauge the stand-in keeps, e.g.
        ("cluster.inbound|5000||.upstream_cx_total", 3). `delimiter` is what Istio >= 1.23 appends to stat
        prefixes (";": "cluster.inbound|5000||;.upstream_cx_total")."""
        listener = f"listener.{self.listener}"
        yield f"{listener}.downstream_cx_total", self.downstream_cx_total
        yield f"{listener}.downstream_cx_active", self.downstream_cx_active
        for port, h in sorted(self.http.items()):
            prefix = f"http.inbound_0.0.0.0_{port}{delimiter}"
            yield from _int_fields(prefix, h)
            for klass in range(1, 6):  # the HCM's fixed downstream_rq_<N>xx counters
                yield f"{prefix}.downstream_rq_{klass}xx", sum(
                    n for code, n in h.downstream_rq_code.items() if code // 100 == klass)
        for port, t in sorted(self.tcp.items()):
            yield from _int_fields(f"tcp.inbound|{port}||{delimiter}", t)
        for name, c in sorted(self.clusters.items()):
            prefix = f"cluster.{name}{delimiter}"
            yield from _int_fields(prefix, c)
            for code, n in sorted(c.upstream_rq_code.items()):
                yield f"{prefix}.upstream_rq_{code}", n
            for klass in sorted({code // 100 for code in c.upstream_rq_code}):
                yield f"{prefix}.upstream_rq_{klass}xx", sum(
                    n for code, n in c.upstream_rq_code.items() if code // 100 == klass)

    def histograms(self, delimiter: str = "") -> Iterator[tuple[str, deque[float]]]:
        """(Envoy histogram name, recorded values in ms) pairs."""
        for port, h in sorted(self.http.items()):
            for name, values in sorted(h.histograms.items()):
                yield f"http.inbound_0.0.0.0_{port}{delimiter}.{name}", values
        for cname, c in sorted(self.clusters.items()):
            for name, values in sorted(c.histograms.items()):
                yield f"cluster.{cname}{delimiter}.{name}", values

    def reset_counters(self) -> None:
        """Zero every counter, keep gauges and histograms (Envoy's POST /reset_counters)."""
        objects: list[object] = [self, *self.http.values(), *self.tcp.values()]
        for c in self.clusters.values():
            objects += [c, *c.hosts.values()]
        for obj in objects:
            for f in fields(obj):  # type: ignore[arg-type]
                value = getattr(obj, f.name)
                if isinstance(value, int) and f.name not in GAUGES and not isinstance(value, bool):
                    setattr(obj, f.name, 0)
                elif f.name.endswith("_code"):
                    value.clear()


def _int_fields(prefix: str, obj: object) -> Iterator[tuple[str, int]]:
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if isinstance(value, int):
            yield f"{prefix}.{f.name}", value


# ---------------------------------------------------------------------------------------------------------
# Envoy's application log (spdlog), next to the access log in the istio-proxy container log.
#
# STAND-IN: the message texts are modelled on real Envoy debug lines (connection_impl.cc, conn_pool_base.cc,
# codec_client.cc, router.cc, conn_manager_impl.cc, filter_manager.cc); the file:line values are plausible for an
# Envoy 1.33 tree, not copied from one. Only what this stand-in actually did is logged, and only when the
# logger's level (changed through the admin API's /logging) lets the line through, as spdlog does.

# Envoy's ALL_LOGGER_IDS of a recent build, in enum order (what /logging lists).
LOGGERS: tuple[str, ...] = (
    "admin", "alternate_protocols_cache", "aws", "assert", "backtrace", "basic_auth", "cache_filter", "client",
    "config", "connection", "conn_handler", "decompression", "dns", "dubbo", "envoy_bug", "ext_authz", "ext_proc",
    "rocketmq", "file", "filter", "forward_proxy", "geolocation", "grpc", "happy_eyeballs", "hc",
    "health_checker", "http", "http2", "hystrix", "init", "io", "jwt", "kafka", "key_value_store", "lua", "main",
    "matcher", "misc", "mongo", "multi_connection", "oauth2", "quic", "quic_stream", "pool", "rate_limit_quota",
    "rbac", "rds", "redis", "router", "runtime", "stats", "secret", "tap", "testing", "thrift", "tracing",
    "upstream", "udp", "wasm", "websocket", "golang",
)
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")  # spdlog's level names, in order
LOG_FORMATS = ("istio", "envoy")
# What `--log-format` the sidecar runs with: Istio's pilot-agent passes ISTIO_LOG_FORMAT (pkg/envoy/proxy.go);
# ENVOY_LOG_FORMAT is Envoy's own default.
ISTIO_LOG_FORMAT = "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"
ENVOY_LOG_FORMAT = "[%Y-%m-%d %T.%e][%t][%l][%n] [%g:%#] %v"
WORKER_THREAD = 21  # %t of log lines written by the (one) worker
MAIN_THREAD = 14  # %t of log lines written by the main thread (admin)


def istio_default_levels() -> dict[str, str]:
    """Istio's sidecar defaults: `-l warning --component-log-level misc:error`."""
    return {name: "error" if name == "misc" else "warning" for name in LOGGERS}


# (logger, source file, line) of each message this stand-in writes.
_CONN = "source/common/network/connection_impl.cc"
_POOL = "source/common/conn_pool/conn_pool_base.cc"
_CODEC = "source/common/http/codec_client.cc"
_HCM = "source/common/http/conn_manager_impl.cc"
_ROUTER = "source/common/router/router.cc"
AT_NEW_CONNECTION = ("conn_handler", "source/common/listener_manager/active_stream_listener_base.cc", 69)
AT_CLOSING = ("connection", _CONN, 146)
AT_CLOSING_SOCKET = ("connection", _CONN, 250)
AT_REMOTE_CLOSE = ("connection", _CONN, 714)
AT_READ_ERROR = ("connection", "source/common/network/raw_buffer_socket.cc", 25)
AT_CONNECTING_TO = ("connection", _CONN, 1017)
AT_IN_PROGRESS = ("connection", _CONN, 1031)
AT_CONNECTED = ("connection", _CONN, 746)
AT_DELAYED_CONNECT_ERROR = ("connection", _CONN, 740)
AT_QUEUEING = ("pool", _POOL, 291)
AT_TRYING = ("pool", _POOL, 301)
AT_CREATING_CONNECTION = ("pool", _POOL, 145)
AT_EXISTING = ("pool", _POOL, 265)
AT_ATTACHING = ("pool", _POOL, 215)
AT_CREATING_STREAM = ("pool", "source/common/http/conn_pool_base.cc", 54)
AT_CLIENT_DISCONNECTED = ("pool", _POOL, 495)
AT_CONNECT_TIMEOUT = ("pool", _POOL, 532)
AT_CLIENT_CONNECTING = ("client", _CODEC, 57)
AT_CLIENT_CONNECTED = ("client", _CODEC, 88)
AT_CLIENT_DISCONNECT = ("client", _CODEC, 107)
AT_RESPONSE_COMPLETE = ("client", _CODEC, 155)
AT_DISPATCH_ERROR_UPSTREAM = ("client", _CODEC, 168)
AT_NEW_STREAM = ("http", _HCM, 393)
AT_REQUEST_HEADERS = ("http", _HCM, 1183)
AT_DISPATCH_ERROR = ("http", _HCM, 496)
AT_ENCODING_HEADERS = ("http", _HCM, 1863)
AT_LOCAL_REPLY = ("http", "source/common/http/filter_manager.cc", 1084)
AT_CLUSTER_MATCH = ("router", _ROUTER, 514)
AT_DECODING_HEADERS = ("router", _ROUTER, 739)
AT_POOL_READY = ("router", "source/common/router/upstream_request.cc", 581)
AT_UPSTREAM_HEADERS = ("router", "source/common/router/upstream_request.cc", 262)
AT_UPSTREAM_RESET = ("router", _ROUTER, 1335)
AT_TCP_CREATING = ("filter", "source/common/tcp_proxy/tcp_proxy.cc", 879)


def header_dump(pairs: list[tuple[str, str]]) -> str:
    """Envoy's multi-line header dump (`'name', 'value'` per line), as in "request headers complete"."""
    return "\n".join(f"'{k}', '{v}'" for k, v in pairs)


class EnvoyLog:
    """The istio-proxy container's output: Envoy's application log lines (filtered by logger level, in the
    sidecar's --log-format) and the access-log lines, interleaved in the order they happen.

    `levels` is the live logger -> level map the admin API's /logging reads and changes. Envoy writes
    application logs to stderr and the access log to /dev/stdout; both end up in the same container log, so
    here both go to one stream, flushed line by line.
    """

    def __init__(self, out: TextIO | None = None, *, log_format: str = "istio", style: str = "2025",
                 levels: dict[str, str] | None = None) -> None:
        if log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {LOG_FORMATS}")
        self.out = out
        self.log_format = log_format
        self.style = style
        self.levels = dict(levels) if levels is not None else istio_default_levels()

    @property
    def format_string(self) -> str:
        return ISTIO_LOG_FORMAT if self.log_format == "istio" else ENVOY_LOG_FORMAT

    def enabled(self, logger: str, level: str = "debug") -> bool:
        """True when a `level` line of `logger` would be written (spdlog's should_log)."""
        current = self.levels.get(logger, "off")
        return level != "off" and LOG_LEVELS.index(level) >= LOG_LEVELS.index(current)

    def write(self, line: str) -> None:
        """Write one line as is (access-log lines)."""
        print(line, file=self.out if self.out is not None else sys.stdout, flush=True)

    def log(self, level: str, where: tuple[str, str, int], message: str, *, cid: int | None = None,
            sid: int | None = None, thread: int = WORKER_THREAD) -> None:
        """Write an application log line if `where`'s logger lets `level` through. `cid`/`sid` are the
        connection and stream ids (ENVOY_CONN_LOG / ENVOY_STREAM_LOG)."""
        logger, path, line = where
        if not self.enabled(logger, level):
            return
        self.write(self.render(time.time(), level, logger, path, line, self._tags(cid, sid) + message, thread))

    def debug(self, where: tuple[str, str, int], message: str, **kw: int | None) -> None:
        self.log("debug", where, message, **kw)  # type: ignore[arg-type]

    def trace(self, where: tuple[str, str, int], message: str, **kw: int | None) -> None:
        self.log("trace", where, message, **kw)  # type: ignore[arg-type]

    def _tags(self, cid: int | None, sid: int | None) -> str:
        if cid is None:
            return ""
        if self.style == "2022":  # before Envoy's tagged connection/stream logs
            return f"[C{cid}]" + (f"[S{sid}]" if sid is not None else "") + " "
        tags = f'"ConnectionId":"{cid}"' + (f',"StreamId":"{sid}"' if sid is not None else "")
        return f"[Tags: {tags}] "

    def render(self, t: float, level: str, logger: str, path: str, line: int, message: str, thread: int) -> str:
        stamp = datetime.fromtimestamp(t, tz=timezone.utc)
        if self.log_format == "istio":
            # Istio's proxy is built with Envoy as an external Bazel repository: %g has that prefix.
            return (f"{stamp.strftime('%Y-%m-%dT%H:%M:%S.%f')}Z\t{level}\tenvoy {logger} external/envoy/{path}:{line}"
                    f"\t{message}\tthread={thread}")
        return (f"[{stamp.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}][{thread}][{level}][{logger}] [{path}:{line}] "
                f"{message}")


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
    cid: int = 0  # Envoy's connection id ([C<n>] in the application log)
    opened: float = field(default_factory=time.monotonic)

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

    def __init__(self, connector: UpstreamConnector, stats: SidecarStats, *, fin_race: bool = False,
                 log: EnvoyLog | None = None, ids: Iterator[int] | None = None, envoy_style: str = "2025") -> None:
        self._connector = connector
        self._stats = stats
        self._fin_race = fin_race
        self._log = log if log is not None else EnvoyLog()
        self._ids = ids if ids is not None else itertools.count(1)
        self._style = envoy_style
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
                self._log.debug(AT_REMOTE_CLOSE, "remote close", cid=conn.cid)
                self.destroy(conn, remote=True)
                continue
            self._log.debug(AT_EXISTING, "using existing fully connected connection", cid=conn.cid)
            self._log.debug(AT_CREATING_STREAM, "creating stream", cid=conn.cid)
            return conn
        cluster, host = self._cluster(dst), self._cluster(dst).host(_addr(dst))
        log = self._log
        log.debug(AT_QUEUEING, f"queueing stream due to no available connections (ready=0 busy={host.cx_active} "
                               f"connecting=0)")
        log.debug(AT_TRYING, "trying to create new connection")
        log.debug(AT_CREATING_CONNECTION, "creating a new connection (connecting=0)")
        cid = next(self._ids)
        log.debug(AT_CLIENT_CONNECTING, "connecting", cid=cid)
        log.debug(AT_CONNECTING_TO, f"connecting to {_addr(dst)}", cid=cid)
        log.debug(AT_IN_PROGRESS, "connection in progress", cid=cid)
        cluster.upstream_rq_pending_total += 1
        cluster.upstream_rq_pending_active += 1
        cluster.upstream_cx_total += 1
        cluster.upstream_cx_http1_total += 1
        host.cx_total += 1
        started = time.monotonic()
        try:
            reader, writer = await self._connector.connect(dst)
        except (OSError, asyncio.TimeoutError) as exc:
            cluster.upstream_cx_connect_fail += 1
            failure = connect_failure(exc, self._style)
            if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                cluster.upstream_cx_connect_timeout += 1
                log.debug(AT_CONNECT_TIMEOUT, "connect timeout", cid=cid)
            else:
                log.debug(AT_DELAYED_CONNECT_ERROR, f"delayed connect error: {getattr(exc, 'errno', 0) or 0}",
                          cid=cid)
            log.debug(AT_CLOSING_SOCKET, "closing socket: 0", cid=cid)
            log.debug(AT_CLIENT_DISCONNECT, "disconnect. resetting 0 pending requests", cid=cid)
            log.debug(AT_CLIENT_DISCONNECTED, f"client disconnected, failure reason: {failure.transport or ''}",
                      cid=cid)
            cluster.upstream_rq_pending_failure_eject += 1
            host.cx_connect_fail += 1
            raise
        finally:
            cluster.upstream_rq_pending_active -= 1
        cluster.histograms["upstream_cx_connect_ms"].append((time.monotonic() - started) * 1000)
        log.debug(AT_CONNECTED, "connected", cid=cid)
        log.debug(AT_CLIENT_CONNECTED, "connected", cid=cid)
        log.debug(AT_ATTACHING, "attaching to next stream", cid=cid)
        log.debug(AT_CREATING_STREAM, "creating stream", cid=cid)
        cluster.upstream_cx_active += 1
        host.cx_active += 1
        return UpstreamConnection(reader, writer, dst, writer.get_extra_info("sockname")[:2], cid=cid)

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
            self._log.debug(AT_REMOTE_CLOSE, "remote close", cid=conn.cid)
        except (ConnectionError, OSError) as exc:
            self._log.trace(AT_READ_ERROR, f"read error: {exc.strerror or exc}", cid=conn.cid)
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
        cluster.histograms["upstream_cx_length_ms"].append((time.monotonic() - conn.opened) * 1000)
        if remote:
            cluster.upstream_cx_destroy_remote += 1
        else:
            cluster.upstream_cx_destroy_local += 1
            self._log.debug(AT_CLOSING, "closing data_to_write=0 type=1", cid=conn.cid)
        if active_rq:
            cluster.upstream_cx_destroy_with_active_rq += 1
            if remote:
                cluster.upstream_cx_destroy_remote_with_active_rq += 1
            else:
                cluster.upstream_cx_destroy_local_with_active_rq += 1
        self._log.debug(AT_CLOSING_SOCKET, f"closing socket: {0 if remote else 1}", cid=conn.cid)
        self._log.debug(AT_CLIENT_DISCONNECT, f"disconnect. resetting {int(active_rq)} pending requests",
                        cid=conn.cid)
        self._log.debug(AT_CLIENT_DISCONNECTED, "client disconnected, failure reason: ", cid=conn.cid)
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
        log: EnvoyLog | None = None,
    ) -> None:
        self.stats = stats if stats is not None else SidecarStats(listener=f"{host}_{port}")
        # Application log and access log share the container's output (see EnvoyLog).
        self.log = log if log is not None else EnvoyLog(access_log, style=envoy_style)
        self._ids = itertools.count(1)  # Envoy numbers downstream and upstream connections from one counter
        self._upstream = upstream
        self._pool = UpstreamPool(upstream, self.stats, fin_race=fin_race, log=self.log, ids=self._ids,
                                  envoy_style=envoy_style)
        self._host = host
        self._port = port
        self._http_ports = set(http_ports)
        self._style = envoy_style

    @property
    def envoy_style(self) -> str:
        return self._style

    async def serve_forever(self) -> None:
        """Listen until cancelled; raises OSError when the port cannot be bound."""
        server = await self.start()
        async with server:
            await server.serve_forever()

    async def start(self) -> asyncio.AbstractServer:
        """Bind and start accepting; raises OSError when the port cannot be bound."""
        return await asyncio.start_server(self._handle, self._host, self._port, reuse_address=True,
                                          limit=_MAX_HEAD)

    def _log(self, line: str) -> None:
        self.log.write(line)

    async def _handle(self, down_reader: asyncio.StreamReader, down_writer: asyncio.StreamWriter) -> None:
        self.stats.downstream_cx_total += 1
        self.stats.downstream_cx_active += 1
        cid = next(self._ids)
        peer = down_writer.get_extra_info("peername")
        self.log.debug(AT_NEW_CONNECTION, f"new connection from {peer[0]}:{peer[1]}", cid=cid)
        try:
            try:
                orig = original_dst(down_writer.get_extra_info("socket"))
            except OSError:
                orig = None
            if orig is not None and orig[1] in self._http_ports:
                await self._serve_http(down_reader, down_writer, orig, cid=cid)
            else:
                await self._serve_tcp(down_reader, down_writer, orig, cid=cid)
        finally:
            self.stats.downstream_cx_active -= 1

    # --- HTTP ---

    async def _serve_http(self, down_reader: asyncio.StreamReader, down_writer: asyncio.StreamWriter,
                          orig: tuple[str, int], *, cid: int = 0) -> None:
        remote = down_writer.get_extra_info("peername")[:2]
        hcm = self.stats.http_listener(orig[1])
        hcm.downstream_cx_total += 1
        hcm.downstream_cx_http1_total += 1
        hcm.downstream_cx_active += 1
        hcm.downstream_cx_http1_active += 1
        log = self.log
        closed_by = "remote"
        try:
            while True:
                try:
                    raw_head = await down_reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError) as exc:
                    if isinstance(exc, (ConnectionError, OSError)):
                        log.trace(AT_READ_ERROR, f"read error: {getattr(exc, 'strerror', None) or exc}", cid=cid)
                    else:
                        log.debug(AT_REMOTE_CLOSE, "remote close", cid=cid)
                    return  # downstream closed (or reset) between requests
                start = time.time()
                sid = random.getrandbits(64)
                log.debug(AT_NEW_STREAM, "new stream", cid=cid, sid=sid)
                try:
                    request = parse_request_head(raw_head)
                    kind, length = body_framing(request)
                    body = await read_body(down_reader, kind, length)
                except FramingError as exc:
                    # Downstream protocol error: Envoy answers 400 and closes (DPE, http1.codec_error).
                    hcm.downstream_cx_protocol_error += 1
                    hcm.downstream_rq_code[400] += 1
                    log.debug(AT_DISPATCH_ERROR, f"dispatch error: http/1.1 protocol error: {exc}", cid=cid)
                    down_writer.write(local_reply(400, b"Bad Request", close=True))
                    await down_writer.drain()
                    self._log(RequestRecord(
                        start, "-", "-", "-", 400, "DPE", "http1.codec_error", "-", 0, 11,
                        int((time.time() - start) * 1000), None, None, None, "-", None, orig, None, orig, remote,
                    ).access_log_line())
                    closed_by = "local"
                    return
                close = "close" in request.tokens("connection") or request.start[2] == "HTTP/1.0"
                request_id = request.first("x-request-id") or str(uuid.uuid4())
                if log.enabled("http"):
                    method, target, _ = request.start
                    pseudo = [(":authority", request.first("host") or ""), (":path", target), (":method", method)]
                    rest = [(k.lower(), v) for k, v in request.fields if k.lower() != "host"]
                    log.debug(AT_REQUEST_HEADERS, f"request headers complete (end_stream={str(not body).lower()}):\n"
                                                  + header_dump(pseudo + rest), cid=cid, sid=sid)
                hcm.downstream_rq_total += 1
                hcm.downstream_rq_http1_total += 1
                hcm.rq_total += 1
                hcm.downstream_rq_active += 1
                try:
                    response, ex = await self._proxy(request, body, orig, request_id, close=close, cid=cid, sid=sid)
                finally:
                    hcm.downstream_rq_active -= 1
                self.stats.downstream_rq_total += 1
                self.stats.downstream_rq_code[ex.status] += 1
                hcm.downstream_rq_code[ex.status] += 1
                hcm.downstream_rq_completed += 1
                if log.enabled("http"):
                    log.debug(AT_ENCODING_HEADERS, "encoding headers via codec (end_stream=false):\n"
                                                   + header_dump(_response_fields(response)), cid=cid, sid=sid)
                down_writer.write(response)
                await down_writer.drain()
                duration_ms = int((time.time() - start) * 1000)
                hcm.histograms["downstream_rq_time"].append(float(duration_ms))
                self._log(RequestRecord(
                    start=start, method=request.start[0], path=request.start[1], protocol=request.start[2],
                    status=ex.status, flags=ex.flags, details=ex.details, transport_failure=ex.transport_failure,
                    bytes_received=len(body), bytes_sent=ex.bytes_sent,
                    duration_ms=duration_ms, upstream_service_ms=ex.upstream_service_ms,
                    forwarded_for=request.first("x-forwarded-for"), user_agent=request.first("user-agent"),
                    request_id=request_id, authority=request.first("host"), upstream_host=orig,
                    upstream_local=ex.upstream_local, downstream_local=orig, downstream_remote=remote,
                ).access_log_line())
                if close:
                    closed_by = "local"
                    return
        except (ConnectionError, OSError):
            return
        finally:
            hcm.downstream_cx_active -= 1
            hcm.downstream_cx_http1_active -= 1
            hcm.downstream_cx_destroy += 1
            if closed_by == "local":
                hcm.downstream_cx_destroy_local += 1
                log.debug(AT_CLOSING, "closing data_to_write=0 type=2", cid=cid)
                log.debug(AT_CLOSING_SOCKET, "closing socket: 1", cid=cid)
            else:
                hcm.downstream_cx_destroy_remote += 1
                log.debug(AT_CLOSING_SOCKET, "closing socket: 0", cid=cid)
            down_writer.close()

    async def _proxy(self, request: Head, body: bytes, orig: tuple[str, int], request_id: str, *,
                     close: bool, cid: int = 0, sid: int = 0) -> tuple[bytes, _Exchange]:
        """Send the request upstream and return (downstream response bytes, what happened).

        `cid`/`sid` are the downstream connection and stream ids, for the application log.
        """
        cluster_name = f"inbound|{orig[1]}||"
        cluster = self.stats.cluster(cluster_name)
        host = cluster.host(_addr(orig))
        ex = _Exchange()
        log = self.log
        log.debug(AT_CLUSTER_MATCH, f"cluster '{cluster_name}' match for URL '{request.start[1]}'", cid=cid, sid=sid)
        outgoing = _upstream_request(request, body, request_id)
        if log.enabled("router"):
            method, target, _ = request.start
            pseudo = [(":authority", request.first("host") or ""), (":path", target), (":method", method)]
            rest = [(k.lower(), v) for k, v in _request_fields(outgoing) if k.lower() != "host"]
            log.debug(AT_DECODING_HEADERS, "router decoding headers:\n" + header_dump(pseudo + rest), cid=cid, sid=sid)

        def fail(failure: UpstreamFailure) -> tuple[bytes, _Exchange]:
            ex.status, ex.flags, ex.details = failure.status, failure.flag, failure.details
            ex.transport_failure = failure.transport_field
            ex.bytes_sent = len(failure.body)
            host.rq_error += 1
            cluster.upstream_rq_code[failure.status] += 1
            log.debug(AT_UPSTREAM_RESET, f"upstream reset: reset reason: {failure.reason}, transport failure reason: "
                                         f"{failure.transport or ''}", cid=cid, sid=sid)
            log.debug(AT_LOCAL_REPLY, f"Sending local reply with details {failure.details}", cid=cid, sid=sid)
            return local_reply(failure.status, failure.body, close=close), ex

        try:
            conn = await self._pool.acquire(orig)
        except (OSError, asyncio.TimeoutError) as exc:
            return fail(connect_failure(exc, self._style))
        log.debug(AT_POOL_READY, "pool ready", cid=cid, sid=sid)
        ex.upstream_local = conn.local
        cluster.upstream_rq_total += 1
        cluster.upstream_rq_active += 1
        host.rq_total += 1
        host.rq_active += 1
        sent_at = time.monotonic()
        try:
            conn.writer.write(outgoing)  # written before reading resumes: the stale-FIN race, see UpstreamPool
            cluster.upstream_cx_tx_bytes_total += len(outgoing)
            self._pool.resume(conn)
            try:
                await conn.writer.drain()
                raw_head = await conn.reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
                # FIN or RST before any response byte: connection termination (UC).
                _log_remote_end(log, conn.cid, exc)
                cluster.upstream_rq_rx_reset += 1
                self._pool.destroy(conn, remote=True, active_rq=True)
                return fail(CONNECTION_TERMINATION)
            try:
                head = parse_response_head(raw_head)
                kind, length = body_framing(head, response_to=request.start[0])
                resp_body = await read_body(conn.reader, kind, length)
            except (FramingError, asyncio.LimitOverrunError) as exc:
                # Envoy's codec error on the upstream: reset the connection, 502 UPE.
                log.debug(AT_DISPATCH_ERROR_UPSTREAM,
                          f"Error dispatching received data: http/1.1 protocol error: {exc}", cid=conn.cid)
                cluster.upstream_cx_protocol_error += 1
                self._pool.destroy(conn, reset=True, active_rq=True)
                return fail(PROTOCOL_ERROR)
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
                _log_remote_end(log, conn.cid, exc)
                cluster.upstream_rq_rx_reset += 1
                self._pool.destroy(conn, remote=True, active_rq=True)
                return fail(CONNECTION_TERMINATION)
            cluster.upstream_cx_rx_bytes_total += len(raw_head) + len(resp_body)
            status = int(head.start[1])
            log.debug(AT_UPSTREAM_HEADERS, f"upstream headers complete: end_stream={str(not resp_body).lower()}",
                      cid=cid, sid=sid)
            log.debug(AT_RESPONSE_COMPLETE, "response complete", cid=conn.cid)
            ex.status, ex.details = status, "via_upstream"
            ex.upstream_service_ms = int((time.monotonic() - sent_at) * 1000)
            cluster.histograms["upstream_rq_time"].append((time.monotonic() - sent_at) * 1000)
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
                if kind == "close":
                    log.debug(AT_REMOTE_CLOSE, "remote close", cid=conn.cid)
                self._pool.destroy(conn, remote=kind == "close")
            out_head, payload = _downstream_response(head, kind, resp_body, ex.upstream_service_ms, close=close)
            ex.bytes_sent = len(payload)
            return out_head + resp_body, ex
        finally:
            cluster.upstream_rq_active -= 1
            host.rq_active -= 1

    # --- TCP ---

    async def _serve_tcp(self, down_reader: asyncio.StreamReader, down_writer: asyncio.StreamWriter,
                         orig: tuple[str, int] | None, *, cid: int = 0) -> None:
        start = time.time()
        remote = down_writer.get_extra_info("peername")[:2]
        flags, reason = "-", "-"
        upstream_local: tuple[str, int] | None = None
        received = sent = 0
        cluster = self.stats.cluster(f"inbound|{orig[1]}||") if orig else None
        proxy = self.stats.tcp_proxy(orig[1]) if orig else None
        log = self.log
        up_cid = next(self._ids)
        try:
            if orig is None:
                raise ConnectionRefusedError(111, "not redirected")
            log.debug(AT_TCP_CREATING, f"Creating connection to cluster inbound|{orig[1]}||", cid=cid)
            log.debug(AT_CONNECTING_TO, f"connecting to {_addr(orig)}", cid=up_cid)
            log.debug(AT_IN_PROGRESS, "connection in progress", cid=up_cid)
            if cluster is not None and proxy is not None:
                proxy.downstream_cx_total += 1
                cluster.upstream_cx_total += 1
                cluster.host(_addr(orig)).cx_total += 1
            connect_started = time.monotonic()
            up_reader, up_writer = await self._upstream.connect(orig)
        except (OSError, asyncio.TimeoutError) as exc:
            # Envoy's TCP proxy closes the downstream when the upstream connect fails (UF).
            failure = connect_failure(exc, self._style)
            flags, reason = "UF", failure.transport_field
            if cluster is not None and orig is not None:
                log.debug(AT_DELAYED_CONNECT_ERROR, f"delayed connect error: {getattr(exc, 'errno', 0) or 0}",
                          cid=up_cid)
                log.debug(AT_CLOSING_SOCKET, "closing socket: 0", cid=up_cid)
                cluster.upstream_cx_connect_fail += 1
                cluster.host(_addr(orig)).cx_connect_fail += 1
        else:
            assert cluster is not None and orig is not None and proxy is not None
            cluster.histograms["upstream_cx_connect_ms"].append((time.monotonic() - connect_started) * 1000)
            log.debug(AT_CONNECTED, "connected", cid=up_cid)
            cluster.upstream_cx_active += 1
            cluster.host(_addr(orig)).cx_active += 1
            upstream_local = up_writer.get_extra_info("sockname")[:2]
            # A reset on either leg aborts both; which side reset is not a TCP-proxy flag in Envoy either.
            (received, _), (sent, _) = await asyncio.gather(
                _relay_then_abort_on_error(down_reader, up_writer, down_writer),
                _relay_then_abort_on_error(up_reader, down_writer, up_writer),
            )
            up_writer.close()
            log.debug(AT_CLOSING_SOCKET, "closing socket: 1", cid=up_cid)
            cluster.upstream_cx_active -= 1
            cluster.host(_addr(orig)).cx_active -= 1
            cluster.upstream_cx_destroy += 1
            cluster.upstream_cx_rx_bytes_total += sent
            cluster.upstream_cx_tx_bytes_total += received
            cluster.histograms["upstream_cx_length_ms"].append((time.time() - start) * 1000)
            proxy.downstream_cx_rx_bytes_total += received
            proxy.downstream_cx_tx_bytes_total += sent
        finally:
            log.debug(AT_CLOSING_SOCKET, "closing socket: 0", cid=cid)
            down_writer.close()
        self._log(ConnectionRecord(
            start=start, downstream_remote=remote, downstream_local=orig, upstream_local=upstream_local,
            bytes_received=received, bytes_sent=sent, duration_ms=int((time.time() - start) * 1000),
            response_flags=flags, failure_reason=reason,
        ).access_log_line())


def _log_remote_end(log: EnvoyLog, cid: int, exc: BaseException) -> None:
    """How Envoy's connection logger reports an upstream FIN (remote close) or RST (a read error, at trace)."""
    if isinstance(exc, asyncio.IncompleteReadError):
        log.debug(AT_REMOTE_CLOSE, "remote close", cid=cid)
    else:
        log.trace(AT_READ_ERROR, f"read error: {getattr(exc, 'strerror', None) or exc}", cid=cid)


def _fields_of(raw: bytes) -> list[tuple[str, str]]:
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    return [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in head[1:])]


def _request_fields(raw: bytes) -> list[tuple[str, str]]:
    return _fields_of(raw)


def _response_fields(raw: bytes) -> list[tuple[str, str]]:
    """(':status', code) and the fields of a response head, for the "encoding headers" dump."""
    status = raw.split(b"\r\n", 1)[0].split(b" ")[1].decode("latin-1")
    return [(":status", status), *_fields_of(raw)]


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


def pod_ipv4() -> str | None:
    """The first non-loopback IPv4 address of this network namespace (the pod IP), or None."""
    import psutil

    for name, addrs in sorted(psutil.net_if_addrs().items()):
        for addr in addrs:
            if addr.family == socket.AF_INET and not addr.address.startswith("127.") and name != "lo":
                return addr.address
    return None


async def serve(sidecar: InboundSidecar, admin: "AdminServer | None") -> None:
    """Run the 15006 listener and the admin API on one event loop until cancelled; raises OSError on bind."""
    server = await sidecar.start()
    if admin is not None:
        await admin.start()
    try:
        async with server:
            await server.serve_forever()
    finally:
        if admin is not None:
            await admin.stop()


def _ports(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(",") if p.strip())


def main(argv: list[str] | None = None) -> int:
    from kubectl_meshdoctor.lab.admin import ADMIN_HOST, ADMIN_PORT, AdminServer, PodInfo

    parser = argparse.ArgumentParser(prog="python -m kubectl_meshdoctor.lab.sidecar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=INBOUND_CAPTURE_PORT)
    parser.add_argument("--source", default=INBOUND_PASSTHROUGH_SOURCE, help="upstream bind address")
    parser.add_argument("--connect-timeout", type=float, default=10.0, help="seconds")
    parser.add_argument("--http-ports", default=",".join(map(str, DEFAULT_HTTP_PORTS)),
                        help="comma-separated original-destination ports proxied as HTTP/1 (others: TCP relay)")
    parser.add_argument("--app-ports", default="",
                        help="comma-separated container ports of the pod: one inbound|<port>|| cluster each "
                             "(default: the HTTP ports)")
    parser.add_argument("--pod-ip", default=None, help="the pod IP (default: the first non-loopback IPv4)")
    parser.add_argument("--pod-name", default="lab-pod")
    parser.add_argument("--pod-namespace", default="default")
    parser.add_argument("--upstream-fin-race", action="store_true",
                        help="do not read idle pooled upstream connections (reuse them after the app's FIN)")
    parser.add_argument("--envoy-style", choices=ENVOY_STYLES, default="2025",
                        help="which Envoy generation to imitate: UF rendering (response_flags.md section 2), "
                             "stat and cluster naming, log tags, version")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="istio",
                        help="application log line format: Istio's (what istio-proxy logs show) or Envoy's default")
    parser.add_argument("--admin-host", default=ADMIN_HOST)
    parser.add_argument("--admin-port", type=int, default=ADMIN_PORT, help="0: no admin API")
    args = parser.parse_args(argv)
    http_ports = _ports(args.http_ports)
    app_ports = _ports(args.app_ports) or http_ports
    pod_ip = args.pod_ip or pod_ipv4()
    stats = SidecarStats(listener=f"{args.host}_{args.port}")
    stats.declare(pod_ip, app_ports, http_ports)
    log = EnvoyLog(sys.stdout, log_format=args.log_format, style=args.envoy_style)
    sidecar = InboundSidecar(UpstreamConnector(args.source, args.connect_timeout), args.host, args.port,
                             http_ports=http_ports, fin_race=args.upstream_fin_race, envoy_style=args.envoy_style,
                             stats=stats, log=log)
    admin = None
    if args.admin_port:
        info = PodInfo(name=args.pod_name, namespace=args.pod_namespace, ip=pod_ip or "", app_ports=app_ports,
                       http_ports=http_ports)
        admin = AdminServer(stats, log, info, host=args.admin_host, port=args.admin_port, style=args.envoy_style)
    try:
        asyncio.run(serve(sidecar, admin))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"sidecar: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
