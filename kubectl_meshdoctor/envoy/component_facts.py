"""What one component-log entry says about a connection or a stream: a Fact, or None for lines no detector reads.

Each rule matches the message text Envoy writes (docs/envoy-component-log.md gives the source file of each and
the older spellings it also matches). The facts are the pieces of a request's story in Envoy's words: the pool's
decision (a new upstream connection or a pooled one), the connect and its errno, closes, resets with their
reason, codec errors, timeouts, GOAWAY, overflow, no healthy host, no route, filter chain not found, TLS errors,
the local reply's details and the statuses and request ids of the header dumps.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from .component_log import ComponentLine
from .flags import transport_errno

# Fact kinds. Each is a contract between this module and the timeline that reads them (core/envoy_story.py).
NEW_DOWNSTREAM = "new-downstream"  # [C] new connection from IP:PORT (a listener accepted it)
POOL_NEW = "pool-new"  # the pool decided to open a new upstream connection
POOL_REUSE = "pool-reuse"  # [C] the pool gave the stream an existing (idle, pooled) connection
POOL_QUEUED = "pool-queued"  # no connection free: the stream waits for one
CONNECTING = "connecting"  # [C] connecting to IP:PORT
CONNECTED = "connected"  # [C] connected
CONNECT_ERROR = "connect-error"  # [C] delayed/immediate connect error: errno
CONNECT_TIMEOUT = "connect-timeout"  # [C] connect timeout
REMOTE_CLOSE = "remote-close"  # [C] remote close: the peer's FIN (or RST) was read
LOCAL_CLOSE = "local-close"  # [C] closing data_to_write=N type=T: Envoy closes it
PENDING_RESET = "pending-reset"  # [C] disconnect. resetting N pending requests
ATTACH = "attach"  # upstream connection [C11] attached to downstream connection [C12]
UPSTREAM_RESET = "upstream-reset"  # [C][S] upstream reset: reset reason: R, transport failure reason: T
CODEC_ERROR = "codec-error"  # an HTTP codec refused bytes: HPE_* / Balsa names, HTTP/2 protocol errors
TIMEOUT = "timeout"  # upstream (route) timeout, per-try timeout, idle timeouts, max stream duration
GOAWAY = "goaway"  # an HTTP/2 GOAWAY received (remote) or sent (local)
OVERFLOW = "overflow"  # a circuit breaker refused a request or a connection
NO_HEALTHY = "no-healthy-host"  # the cluster had no healthy host for the request
EJECTED = "outlier-ejected"  # host ADDRESS in cluster DETAIL was ejected by the outlier detector
NO_ROUTE = "no-route"  # no route (or no cluster) matched the request
ROUTE = "route"  # [C][S] cluster 'X' match for URL 'Y'
FILTER_CHAIN_NOT_FOUND = "filter-chain-not-found"  # a connection matched no filter chain: closed at once
TLS_ERROR = "tls-error"  # a TLS handshake or record failed
LOCAL_REPLY = "local-reply"  # [C][S] Sending local reply with details D
REQUEST = "request"  # [C][S] request headers (dump): method, path, authority, x-request-id
RESPONSE = "response"  # [C][S] encoding headers via codec (dump): the status sent downstream
POOL_ATTACHING = "pool-attaching"  # [C] attaching to next stream (a new connection, connected, gets its stream)
POOL_READY = "pool-ready"  # [C][S] pool ready: the stream got its upstream connection
STREAM_DONE = "stream-done"  # [C][S] Codec completed encoding stream.
STREAM_RESET = "stream-reset"  # [C][S] stream reset: reset reason: R, response details: D (``transport``)
POOL_STREAM_DONE = "pool-stream-done"  # [C] destroying stream: N (active) remaining: a stream left the connection
TCP_SESSION = "tcp-session"  # [C] new tcp proxy session: a downstream connection tcp_proxy relays
TCP_CLUSTER = "tcp-cluster"  # [C] Creating connection to cluster X: tcp_proxy asks the pool for an upstream
RETRY = "retry"  # [C][S] performing retry: the router sends the request again (the attempt before it failed)
UPSTREAM_HEADERS = "upstream-headers"  # [C][S] upstream headers complete: the upstream answered this attempt


@dataclass(frozen=True, slots=True)
class Fact:
    """One thing Envoy's log says happened. ``connection``/``stream``: the entry's ids (for ATTACH,
    ``connection`` is the upstream connection and ``peer`` the downstream one). ``detail``: the reason, errno
    text, details or codec error as Envoy wrote it; ``address``: an ``IP:PORT`` it names; ``count``: a number it
    gives (pending requests reset); ``headers``: the header dump's (name, value) pairs, lowercase names."""

    kind: str
    ts: float | None
    connection: int | None
    stream: int | None
    detail: str = ""
    address: str | None = None
    peer: int | None = None
    count: int | None = None
    errno: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    transport: str = ""  # UPSTREAM_RESET: the transport failure reason ("delayed connect error: Connection refused")
    thread: int | None = None  # the Envoy worker that logged it (a pool hands a stream its connection on one)


_ADDRESS = r"(\[[0-9a-fA-F:.]+\]:\d+|[0-9.]+:\d+|[\w.\-]+:\d+)"
_HEADER = re.compile(r"^'([^']*)', '(.*)'$")


def _headers(message: str) -> tuple[tuple[str, str], ...]:
    out = []
    for line in message.split("\n")[1:]:
        m = _HEADER.match(line.strip())
        if m:
            out.append((m.group(1).lower(), m.group(2)))
    return tuple(out)


def _connect_error(m: re.Match, line: ComponentLine) -> Fact:
    text = m.group(0)
    return Fact(CONNECT_ERROR, line.ts, line.connection, line.stream, detail=text,
                errno=transport_errno(text.replace("connection error", "connect error")))


def _reset(m: re.Match, line: ComponentLine) -> Fact:
    transport = (m.group(2) or "").strip()
    return Fact(UPSTREAM_RESET, line.ts, line.connection, line.stream, detail=(m.group(1) or "").strip(),
                errno=transport_errno(transport), transport=transport)


def _simple(kind: str, group: int | None = None) -> Callable[[re.Match, ComponentLine], Fact]:
    def make(m: re.Match, line: ComponentLine) -> Fact:
        return Fact(kind, line.ts, line.connection, line.stream,
                    detail=(m.group(group) if group is not None else m.group(0)).strip())
    return make


def _with_address(kind: str) -> Callable[[re.Match, ComponentLine], Fact]:
    def make(m: re.Match, line: ComponentLine) -> Fact:
        return Fact(kind, line.ts, line.connection, line.stream, detail=m.group(0), address=m.group(1))
    return make


def _codec(m: re.Match, line: ComponentLine) -> Fact | None:
    detail = (m.group(1) or "").strip()
    # After a graceful GOAWAY the codec client logs an empty dispatch error: the connection closed cleanly.
    return Fact(CODEC_ERROR, line.ts, line.connection, line.stream, detail=detail) if detail else None


def _stream_reset(m: re.Match, line: ComponentLine) -> Fact:
    details = (m.group(2) or "").strip()
    return Fact(STREAM_RESET, line.ts, line.connection, line.stream, detail=(m.group(1) or "").strip(),
                transport="" if details in ("", "-") else details)


def _ejected(m: re.Match, line: ComponentLine) -> Fact:
    return Fact(EJECTED, line.ts, line.connection, line.stream, detail=m.group(2), address=m.group(1))


def _attach(m: re.Match, line: ComponentLine) -> Fact:
    return Fact(ATTACH, line.ts, int(m.group(1)), line.stream, detail=m.group(0), peer=int(m.group(2)))


def _pending(m: re.Match, line: ComponentLine) -> Fact:
    return Fact(PENDING_RESET, line.ts, line.connection, line.stream, detail=m.group(0), count=int(m.group(1)))


def _stream_left(m: re.Match, line: ComponentLine) -> Fact:
    return Fact(POOL_STREAM_DONE, line.ts, line.connection, line.stream, detail=m.group(0), count=int(m.group(1)))


def _request(m: re.Match, line: ComponentLine) -> Fact:
    return Fact(REQUEST, line.ts, line.connection, line.stream, detail=m.group(0), headers=_headers(line.message))


def _response(m: re.Match, line: ComponentLine) -> Fact:
    return Fact(RESPONSE, line.ts, line.connection, line.stream, detail=m.group(0), headers=_headers(line.message))


# (pattern on the message's first line, maker). The first that matches wins; order the specific before the
# general. Spellings of older Envoy sit beside the current ones in each pattern (docs/envoy-component-log.md
# gives each with its source and the releases that wrote it). A pattern that starts with ".*" is searched for
# anywhere in the line, the others at its start.
_RULES: tuple[tuple[re.Pattern[str], Callable[[re.Match, ComponentLine], Fact | None]], ...] = tuple(
    (re.compile(p), make) for p, make in (
        (rf"^new connection(?: from {_ADDRESS})?", _with_address(NEW_DOWNSTREAM)),
        (r"^creating a new connection", _simple(POOL_NEW)),
        (r"^using existing (?:fully connected |early data ready )?connection", _simple(POOL_REUSE)),
        (r"^queueing (?:stream|request) due to no available connections", _simple(POOL_QUEUED)),
        (rf"^connecting to {_ADDRESS}", _with_address(CONNECTING)),
        (r"^attaching to next (?:stream|request)", _simple(POOL_ATTACHING)),
        (r"^pool ready", _simple(POOL_READY)),
        (r"^destroying stream: (\d+) (?:active )?remaining", _stream_left),
        (r"^connected$", _simple(CONNECTED)),
        (r"^(?:delayed|immediate) connect(?:ion)? error:.*", _connect_error),
        (r"^connect timeout", _simple(CONNECT_TIMEOUT)),
        (r"^(?:remote close|remote early close|write: rst close from peer\.?|read: rst close from peer)$",
         _simple(REMOTE_CLOSE)),
        (r"^closing data_to_write=\d+ type=\d+", _simple(LOCAL_CLOSE)),
        (r"^disconnect\. resetting (\d+) pending requests?", _pending),
        (r"[Aa]ttached upstream connection \[C(\d+)\] to downstream connection \[C(\d+)\]", _attach),
        (r"^upstream reset(?:: reset reason:? ([^,]*))?(?:, transport failure reason: ?(.*))?$", _reset),
        (r"^(?:Error dispatching received data|dispatch error|codec error|protocol error): ?(.*)$", _codec),
        (r"^(http/1\.1 protocol error: .*|premature response)$", _codec),
        (r"^(invalid frame: .*|invalid http2: .*)$", _codec),
        (r"^(upstream (?:per try )?timeout|upstream per try idle timeout|idle timeout|connect timeout|"
         r"max connection duration reached|Stream max duration time reached)\b.*", _simple(TIMEOUT, 1)),
        (r"^(?:remote goaway|sent goaway code=\d+).*", _simple(GOAWAY)),
        (r"^max (?:pending )?(?:streams|requests) overflow", _simple(OVERFLOW)),
        (r"^no healthy host(?: for (?:HTTP|TCP) connection pool)?$|^no healthy upstream", _simple(NO_HEALTHY)),
        (rf"^host {_ADDRESS} in cluster (\S+) was ejected by the outlier detector", _ejected),
        (r"^(?:no cluster match for URL|no route match for URL|unknown cluster) ?'?([^']*)'?", _simple(NO_ROUTE, 0)),
        (r"^cluster '([^']*)' match for URL", _simple(ROUTE, 1)),
        (r"^performing retry", _simple(RETRY)),
        (r"^new tcp proxy session", _simple(TCP_SESSION)),
        (r"^Creating connection to cluster (\S+)", _simple(TCP_CLUSTER, 1)),
        (r"^upstream headers complete", _simple(UPSTREAM_HEADERS)),
        (rf"^closing connection(?: from {_ADDRESS})?: no matching filter chain found",
         _with_address(FILTER_CHAIN_NOT_FOUND)),
        (r"^(?:Sending|Preparing) local reply with details (.*)$", _simple(LOCAL_REPLY, 1)),
        (r"^tls inspector: parseClientHello failed.*", _simple(TLS_ERROR)),
        (r".*(?:TLS error: |TLS_error[:|]|handshake error: |Secret is not supplied by SDS).*", _simple(TLS_ERROR)),
        (r"^(?:request headers complete|router decoding headers)", _request),
        (r"^encoding headers via codec", _response),
        (r"^Codec completed encoding stream", _simple(STREAM_DONE)),
        (r"^stream reset(?:: reset reason:? ([^,]*))?(?:, response details: (.*))?$", _stream_reset),
    ))


def fact_of(line: ComponentLine) -> Fact | None:
    """The fact ``line`` states, or None for a line no detector reads. Never raises."""
    first = line.message.split("\n", 1)[0].strip()
    for pattern, make in _RULES:
        m = pattern.search(first) if pattern.pattern.startswith(".*") else pattern.match(first)
        if m is not None:
            try:
                fact = make(m, line)
            except (ValueError, IndexError, TypeError):
                return None
            return replace(fact, thread=line.thread) if fact is not None and line.thread is not None else fact
    return None
