"""Envoy's component log as a timeline per connection and per stream: the story of each request in Envoy's words.

Facts (envoy/component_facts.py) arrive in log order. A stream's story holds what its downstream connection, its
stream id and the upstream connection the pool gave it say: the pool's decision (a new connection, or a pooled
one and how long it sat idle), the connect and its errno, closes on the upstream connection while the request was
in flight, the reset and its reason, codec errors, timeouts, GOAWAY, the local reply's details, the status sent
and the request's id. A story ends with the stream (``Codec completed encoding stream``), else when its
connection goes quiet for STALE_S, else at ``finish``. A connection refused before any stream (no filter chain,
a TLS handshake that failed) is a story of its own, with no stream id.

The joins follow Envoy's own words: ``Attached upstream connection [C11] to downstream connection [C12]`` (and the
``pool ready`` of the stream waiting on it); a connect that failed before any attach goes to the stream whose
reset names the same transport failure. Everything is bounded: MAX_OPEN connections and streams, MAX_REFS lines
of evidence a story.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from . import component_facts as k
from .component_facts import Fact
from .stream_story import LogRef, StreamStory, log_ref

__all__ = ["STORY_LOGGERS", "LogRef", "StoryBuilder", "StreamStory", "log_ref"]

# The Envoy loggers whose debug lines a story is made of (docs/envoy-component-log.md names each message's):
# conn_handler (accepts, filter chains), connection (connects, closes, TLS), client (codec client resets and
# errors), pool (reuse, new connections, overflow, GOAWAY), router (routes, resets, timeouts, the attach line),
# http (header dumps, local replies, downstream codec errors), http2 (HTTP/2 codec errors), upstream (no
# healthy host), filter (tcp_proxy's sessions, the TLS inspector's verdicts).
STORY_LOGGERS = ("conn_handler", "connection", "client", "pool", "router", "http", "http2", "upstream", "filter")
MAX_OPEN = 20_000  # connections and streams followed at once; the oldest goes first
MAX_REFS = 24  # evidence lines kept a story
STALE_S = 60.0  # a stream with no fact for this long is told as it stands
POOL_READY_S = 0.05  # a pool decision and the 'pool ready' of the stream it served: this close on one worker
# The facts a finding quotes as evidence: decisions and failures, not every state change.
EVIDENCE_KINDS = frozenset({
    k.POOL_NEW, k.POOL_REUSE, k.CONNECTING, k.CONNECT_ERROR, k.CONNECT_TIMEOUT, k.REMOTE_CLOSE, k.PENDING_RESET,
    k.UPSTREAM_RESET, k.CODEC_ERROR, k.TIMEOUT, k.GOAWAY, k.OVERFLOW, k.NO_HEALTHY, k.NO_ROUTE,
    k.FILTER_CHAIN_NOT_FOUND, k.TLS_ERROR, k.LOCAL_REPLY, k.RESPONSE, k.ATTACH, k.NEW_DOWNSTREAM, k.EJECTED,
    k.RETRY,
})
# Lines that name no connection (the pool's overflow, the cluster manager's ejections and "no healthy host", the
# TLS inspector's verdict on a ClientHello) belong to the story they explain: kept this long (seconds) for it.
LOOSE_S = 2.0
_LOOSE_FOR = {  # a story's mark -> the loose facts that explain it
    "overflow": (k.OVERFLOW,), "no_healthy": (k.NO_HEALTHY, k.EJECTED), "filter_chain": (k.TLS_ERROR,),
}


@dataclass(slots=True)
class _Conn:
    address: str | None = None  # upstream: what it dials; downstream: the peer it came from
    downstream: bool = False
    stream: int | None = None  # the downstream stream it serves now (upstream) / its latest stream (downstream)
    streams: int = 0
    last_done: float | None = None  # when its previous stream ended (upstream: the pool's idle start)
    new: bool = False
    remote_close: float | None = None
    errno: int | None = None
    refs: list[LogRef] = field(default_factory=list)


@dataclass(slots=True)
class _Stream:
    connection: int
    stream: int
    start: float | None
    last: float | None
    facts: dict = field(default_factory=dict)
    refs: list[LogRef] = field(default_factory=list)
    sent_at: float | None = None


class StoryBuilder:
    """Facts in, finished stories out: ``add`` returns the stories the fact ends; ``expire(now)`` those gone quiet;
    ``finish`` the rest. One builder per Envoy (connection ids are an Envoy process's own)."""

    def __init__(self, source: str, pod: str | None = None) -> None:
        self.source = source
        self.pod = pod  # the pod whose sidecar this is, when the log names it (kubectl --prefix)
        self._conns: OrderedDict[int, _Conn] = OrderedDict()
        self._streams: OrderedDict[tuple[int, int], _Stream] = OrderedDict()
        # Upstream connections whose connect failed: (connection, when, worker).
        self._failed_connects: list[tuple[int, float | None, int | None]] = []
        self._loose: list[tuple[Fact, LogRef]] = []  # recent facts with no connection id (LOOSE_S)
        self._pool_last: dict[int | None, tuple[int, float | None]] = {}  # worker -> its pool's last handed conn
        self._told: OrderedDict[tuple[int, int], None] = OrderedDict()  # streams already told: later lines of
        # theirs (a reset after the local reply) must not start a story of their own
        self._pending: list[StreamStory] = []  # stories told because the window let their streams go
        # The open streams of each connection: an upstream one carries several at once over HTTP/2, a downstream
        # one receives several at once over HTTP/2; a close or a GOAWAY on it is each one's.
        self._on_upstream: dict[int, dict[tuple[int, int], None]] = {}
        self._on_downstream: dict[int, dict[tuple[int, int], None]] = {}
        self._ready: dict[int | None, tuple[tuple[int, int], float | None]] = {}  # worker -> its last 'pool ready'
        self._tcp_wait: dict[int | None, tuple[tuple[int, int], float | None]] = {}  # worker -> its tcp_proxy
        # session waiting for the upstream connection the pool opens next

    def _conn(self, cid: int) -> _Conn:
        conn = self._conns.get(cid)
        if conn is None:
            conn = self._conns[cid] = _Conn()
            if len(self._conns) > MAX_OPEN:
                self._conns.popitem(last=False)
        return conn

    def _stream(self, cid: int, sid: int, ts: float | None) -> _Stream:
        st = self._streams.get((cid, sid))
        if st is None:
            st = self._streams[(cid, sid)] = _Stream(cid, sid, ts, ts)
            self._on_downstream.setdefault(cid, {})[(cid, sid)] = None
            if len(self._streams) > MAX_OPEN:
                # Told as it stands, not dropped: a log whose streams never end (the http logger left at info)
                # must lose none of its failures.
                self._pending.append(self._tell(next(iter(self._streams.values()))))
            conn = self._conn(cid)
            conn.downstream, conn.stream = True, sid
        st.last = ts if ts is not None else st.last
        return st

    def add(self, fact: Fact, ref: LogRef) -> list[StreamStory]:
        """Take one fact (with the line it came from); return the stories it ends."""
        told = self._add(fact, ref)
        if self._pending:
            told, self._pending = self._pending + told, []
        return told

    def _add(self, fact: Fact, ref: LogRef) -> list[StreamStory]:
        cid, sid = fact.connection, fact.stream
        if fact.kind == k.ATTACH and cid is not None and fact.peer is not None:
            return self._attach(fact, ref)
        if cid is not None and sid is not None:
            if (cid, sid) in self._told:
                return []
            return self._on_stream(self._stream(cid, sid, fact.ts), fact, ref)
        if fact.kind == k.FILTER_CHAIN_NOT_FOUND:  # no connection id: the listener closed it before any
            conn = self._conns.get(cid) if cid is not None else None
            tls = next((f for f, _ in reversed(self._loose_for("filter_chain", fact.ts))), None)
            return [StreamStory(self.source, cid, None, fact.ts, fact.ts, details="filter_chain_not_found",
                                filter_chain_not_found=True, tls_error=tls.detail if tls else None,
                                downstream_remote=fact.address or (conn.address if conn else None),
                                refs=tuple(r for _, r in self._loose_for("filter_chain", fact.ts))
                                + tuple((conn.refs if conn else [])[-4:]) + (ref,), pod=self.pod)]
        if cid is not None and fact.kind in (k.TCP_SESSION, k.TCP_CLUSTER):
            return self._tcp(cid, fact, ref)
        if cid is None:
            if fact.kind in (k.OVERFLOW, k.NO_HEALTHY, k.EJECTED, k.TLS_ERROR):
                self._loose = [(f, r) for f, r in self._loose[-31:]
                               if fact.ts is None or f.ts is None or fact.ts - f.ts <= LOOSE_S] + [(fact, ref)]
            return []
        conn = self._conn(cid)
        if fact.kind in EVIDENCE_KINDS and len(conn.refs) < MAX_REFS:
            conn.refs.append(ref)
        match fact.kind:
            case k.NEW_DOWNSTREAM:
                conn.downstream, conn.address = True, fact.address
            case k.CONNECTING:
                conn.address, conn.new = fact.address, True
                self._tcp_connecting(cid, fact, ref)
            case k.POOL_ATTACHING:
                self._pool_last[fact.thread] = (cid, fact.ts)
            case k.POOL_REUSE:
                conn.new = False
                self._pool_last[fact.thread] = (cid, fact.ts)
            case k.CONNECT_ERROR | k.CONNECT_TIMEOUT:
                # Envoy's own connect timeout is no errno of the kernel's, but means what ETIMEDOUT does.
                conn.errno = fact.errno if fact.kind == k.CONNECT_ERROR else 110
                self._failed_connects = [*self._failed_connects[-15:], (cid, fact.ts, fact.thread)]
                for key in self._on_upstream.get(cid, ()):  # a tcp_proxy session's: no router logs its reset
                    st = self._streams.get(key)
                    if st is not None and st.facts.get("tcp"):
                        timeout = fact.kind == k.CONNECT_TIMEOUT
                        st.facts.setdefault("reset", "connection timeout" if timeout else "remote connection failure")
                        st.facts.setdefault("transport", None if timeout else fact.detail)
                        st.facts.setdefault("errno", conn.errno)
                        if ref not in st.refs and len(st.refs) < MAX_REFS:
                            st.refs.append(ref)
            case k.LOCAL_CLOSE | k.REMOTE_CLOSE if self._tcp_session(cid) is not None:
                # A tcp_proxy session ends with its downstream connection.
                st = self._streams[(cid, 0)]
                if len(st.refs) < MAX_REFS:
                    st.refs.append(ref)
                st.last = fact.ts if fact.ts is not None else st.last
                return [self._tell(st)]
            case k.POOL_STREAM_DONE if fact.count == 0:
                # The connection holds no stream now: what was on it is done with it (over HTTP/1 a stream
                # whose downstream end the log does not tell, the http logger left at info), and it sits idle
                # in the pool from here.
                for key in list(self._on_upstream.get(cid, ())):
                    st = self._streams.get(key)
                    if st is not None:
                        self._unlink(st)
                conn.last_done = fact.ts
            case k.REMOTE_CLOSE:
                conn.remote_close = fact.ts
                return self._connection_event(cid, fact, ref)
            case k.PENDING_RESET | k.CODEC_ERROR | k.GOAWAY | k.TLS_ERROR:
                return self._connection_event(cid, fact, ref)
        return []

    def _attach(self, fact: Fact, ref: LogRef) -> list[StreamStory]:
        """The attach line names the downstream connection, not the stream: over HTTP/2 that connection carries
        several. Envoy logs it right after the 'pool ready' of its stream, on the same worker."""
        ready = self._ready.get(fact.thread)
        if (ready is not None and ready[0][0] == fact.peer and ready[0] in self._streams
                and (fact.ts is None or ready[1] is None or fact.ts - ready[1] <= POOL_READY_S)):
            self._bind(self._streams[ready[0]], fact.connection, fact.ts, ref)
            return []
        down = self._conn(fact.peer)
        if down.stream is None:
            return []
        self._bind(self._stream(fact.peer, down.stream, fact.ts), fact.connection, fact.ts, ref)
        return []

    def _pool_ready(self, st: _Stream, fact: Fact, ref: LogRef) -> None:
        """Envoy before 1.27 logs no 'Attached ...' line: the pool hands a stream its connection on the worker
        that logged the connection's pool decision just before, and the stream logs 'pool ready' right after."""
        last = self._pool_last.get(fact.thread)
        if "upstream" in st.facts or last is None:
            return
        cid, ts = last
        if fact.ts is not None and ts is not None and fact.ts - ts > POOL_READY_S:
            return
        self._bind(st, cid, fact.ts, ref)

    def _bind(self, st: _Stream, upstream: int, ts: float | None, ref: LogRef) -> None:
        """Stream ``st`` goes out on upstream connection ``upstream``: the pool's reuse (and idle spell) or its new
        connection is the stream's."""
        up = self._conn(upstream)
        if st.facts.get("upstream") == upstream:
            if ref not in st.refs and len(st.refs) < MAX_REFS:
                st.refs.append(ref)
            return
        sid = st.stream
        fact_ts = ts
        self._unlink(st)
        st.facts["upstream"] = upstream
        self._on_upstream.setdefault(upstream, {})[(st.connection, sid)] = None
        st.facts["reused"] = not up.new and up.streams > 0 or (not up.new and up.address is None)
        if up.last_done is not None and fact_ts is not None and st.facts["reused"]:
            st.facts["idle"] = fact_ts - up.last_done
        up.new = False
        up.streams += 1
        up.stream = sid
        st.sent_at = fact_ts
        if len(st.refs) < MAX_REFS:
            st.refs.extend(r for r in up.refs[-4:] if r not in st.refs)
            st.refs.append(ref)
        up.refs.clear()  # what the pool said before this stream is this stream's; what comes later the next's

    def _connection_event(self, cid: int, fact: Fact, ref: LogRef) -> list[StreamStory]:
        """A close, reset, codec error or GOAWAY on a connection: it belongs to every open stream the connection
        serves upstream, else to the connection's own open streams (a downstream connection). Over HTTP/1 that is
        one stream; over HTTP/2, each stream multiplexed on it."""
        keys = self._on_upstream.get(cid)
        upstream = bool(keys)
        if not keys:
            keys = self._on_downstream.get(cid)
        owners = [self._streams[key] for key in (keys or ()) if key in self._streams]
        for owner in owners:
            if len(owner.refs) < MAX_REFS and ref not in owner.refs:
                owner.refs.append(ref)
            if fact.kind == k.REMOTE_CLOSE:
                owner.facts.setdefault("remote_close" if upstream else "downstream_close", fact.ts)
            elif fact.kind == k.PENDING_RESET and (fact.count or 0) > 0 and upstream:
                owner.facts.setdefault("closed_at", fact.ts)
            elif fact.kind == k.CODEC_ERROR:
                owner.facts.setdefault("codec", fact.detail)
            elif fact.kind == k.GOAWAY:
                owner.facts["goaway"] = True
            elif fact.kind == k.TLS_ERROR:
                owner.facts.setdefault("tls", fact.detail)
            if upstream and fact.kind in (k.REMOTE_CLOSE, k.PENDING_RESET):
                owner.facts["shared"] = max(owner.facts.get("shared", 0), len(owners) - 1)
        return []

    def _tcp(self, cid: int, fact: Fact, ref: LogRef) -> list[StreamStory]:
        """tcp_proxy: the downstream connection is the request (its story's stream id is 0); the upstream
        connection the pool opens next on the same worker is its."""
        st = self._stream(cid, 0, fact.ts)
        st.facts["tcp"] = True
        if fact.kind == k.TCP_CLUSTER:
            st.facts.setdefault("cluster", fact.detail)
            self._tcp_wait[fact.thread] = ((cid, 0), fact.ts)
        if len(st.refs) < MAX_REFS:
            st.refs.append(ref)
        return []

    def _tcp_session(self, cid: int) -> _Stream | None:
        """The open tcp_proxy session whose downstream connection is ``cid``, if any."""
        st = self._streams.get((cid, 0))
        return st if st is not None and st.facts.get("tcp") else None

    def _tcp_connecting(self, cid: int, fact: Fact, ref: LogRef) -> None:
        wait = self._tcp_wait.pop(fact.thread, None)
        if wait is None or wait[0] not in self._streams:
            return
        if fact.ts is not None and wait[1] is not None and fact.ts - wait[1] > POOL_READY_S:
            return
        st = self._streams[wait[0]]
        if "upstream" not in st.facts:
            self._bind(st, cid, fact.ts, ref)

    def _unlink(self, st: _Stream) -> None:
        """Forget ``st`` on the upstream connection it had (a retry goes out afresh, a told stream is done)."""
        up = st.facts.get("upstream")
        on = self._on_upstream.get(up) if up is not None else None
        if on is not None:
            on.pop((st.connection, st.stream), None)
            if not on:
                del self._on_upstream[up]

    def _on_stream(self, st: _Stream, fact: Fact, ref: LogRef) -> list[StreamStory]:
        if fact.kind in EVIDENCE_KINDS and len(st.refs) < MAX_REFS:
            st.refs.append(ref)
        f = st.facts
        match fact.kind:
            case k.REQUEST:
                headers = dict(fact.headers)
                for name, key in ((":method", "method"), (":path", "path"), (":authority", "authority"),
                                  ("x-request-id", "request_id"), ("host", "authority")):
                    if headers.get(name):
                        f.setdefault(key, headers[name])
            case k.RESPONSE:
                status = dict(fact.headers).get(":status", "")
                if status.isdigit() and len(status) == 3:
                    f["status"] = int(status)
            case k.UPSTREAM_RESET:
                f.setdefault("reset", fact.detail)
                f.setdefault("transport", fact.transport or None)
                f.setdefault("errno", fact.errno)
                if "upstream" not in f and (fact.transport or "connection failure" in fact.detail
                                            or "connection timeout" in fact.detail):
                    self._link_failed_connect(st, fact)
            case k.LOCAL_REPLY:
                f.setdefault("details", fact.detail)
            case k.TIMEOUT:
                f.setdefault("timeout", fact.detail)
            case k.ROUTE:
                f.setdefault("cluster", fact.detail)
            case k.POOL_READY:
                self._ready[fact.thread] = ((st.connection, st.stream), fact.ts)
                self._pool_ready(st, fact, ref)
            case k.UPSTREAM_HEADERS:
                f["answered"] = True
            case k.RETRY:
                # The attempt before failed and the router tries again, on a connection the pool gives anew:
                # the story's outcome is the last attempt's (Envoy's access log logs a retried success as
                # 200 with no flag); what failed before is kept as what was retried.
                f["retried"] = (*f.get("retried", ()), f.get("reset") or f.get("timeout") or "a failed attempt")
                self._unlink(st)
                for key in ("reset", "transport", "errno", "timeout", "codec", "goaway", "answered", "upstream",
                            "reused", "idle", "remote_close", "closed_at", "shared"):
                    f.pop(key, None)
            case k.NO_ROUTE:
                f["no_route"] = True
            case k.OVERFLOW:
                f["overflow"] = True
            case k.NO_HEALTHY:
                f["no_healthy"] = True
            case k.CODEC_ERROR:
                f.setdefault("codec", fact.detail)
            case k.STREAM_DONE:
                return [self._tell(st)]
            case k.STREAM_RESET:
                # The downstream stream ends without a response: when its caller closed first, Envoy logs it
                # 0 DC downstream_remote_disconnect (the reset reason reads "connection termination").
                if fact.transport:
                    f.setdefault("details", fact.transport)  # Envoy >= 1.26 names the response details
                if "downstream_close" in f and "status" not in f:
                    f.setdefault("details", "downstream_remote_disconnect")
                    f["status"] = 0
                f.setdefault("stream_reset", fact.detail)
                return [self._tell(st)]
        return []

    def _loose_for(self, mark: str, ts: float | None) -> list[tuple[Fact, LogRef]]:
        """The recent loose facts that explain a story marked ``mark`` ending at ``ts``."""
        kinds = _LOOSE_FOR[mark]
        return [(f, r) for f, r in self._loose if f.kind in kinds
                and (ts is None or f.ts is None or -0.1 <= ts - f.ts <= LOOSE_S)]

    def _link_failed_connect(self, st: _Stream, fact: Fact) -> None:
        """A connect that failed before any attach: the newest failed upstream connection of the worker is this
        stream's. Every stream waiting in the pool for that connection is failed with it, one reset after the
        other (Envoy 1.40 on loopback: two streams queued on one refused connect), so it is not used up."""
        cid = next((c for c, ts, thread in reversed(self._failed_connects)
                    if (fact.thread is None or thread in (None, fact.thread))
                    and (fact.ts is None or ts is None or 0 <= fact.ts - ts <= LOOSE_S)), None)
        if cid is None:
            return
        conn = self._conns.get(cid)
        if conn is None:
            return
        st.facts["upstream"] = cid
        st.facts["reused"] = False
        self._on_upstream.setdefault(cid, {})[(st.connection, st.stream)] = None
        for r in conn.refs[-6:]:
            if len(st.refs) < MAX_REFS and r not in st.refs:
                st.refs.append(r)

    def _tell(self, st: _Stream) -> StreamStory:
        self._streams.pop((st.connection, st.stream), None)
        self._unlink(st)
        down_open = self._on_downstream.get(st.connection)
        if down_open is not None:
            down_open.pop((st.connection, st.stream), None)
            if not down_open:
                del self._on_downstream[st.connection]
        self._told[(st.connection, st.stream)] = None
        if len(self._told) > MAX_OPEN:
            self._told.popitem(last=False)
        f = st.facts
        up_id = f.get("upstream")
        up = self._conns.get(up_id) if up_id is not None else None
        if up is not None:
            up.last_done = st.last
            up.stream = None
        closed = f.get("remote_close") if f.get("remote_close") is not None else f.get("closed_at")
        details = f.get("details") or ""
        marks = [m for m, there in (("overflow", f.get("reset") == "overflow" or "{overflow}" in details),
                                    ("no_healthy", details == "no_healthy_upstream")) if there]
        for mark in marks:
            for fact, ref in self._loose_for(mark, st.last):
                f["overflow" if mark == "overflow" else "no_healthy"] = True
                if ref not in st.refs:
                    st.refs.append(ref)
        down = self._conns.get(st.connection)
        refs = sorted(st.refs, key=lambda r: (r.ts or 0.0, r.line))
        return StreamStory(
            self.source, st.connection, st.stream, st.start, st.last, method=f.get("method"), path=f.get("path"),
            authority=f.get("authority"), request_id=f.get("request_id"), status=f.get("status"),
            details=f.get("details"), reset_reason=f.get("reset"), transport_failure=f.get("transport"),
            errno=f.get("errno") if f.get("errno") is not None else (up.errno if up else None),
            cluster=f.get("cluster"), upstream_connection=up_id, upstream_address=up.address if up else None,
            upstream_reused=f.get("reused") if up_id is not None else None, upstream_idle_s=f.get("idle"),
            upstream_remote_close="remote_close" in f, upstream_closed="remote_close" in f or "closed_at" in f,
            upstream_closed_after_s=(closed - st.sent_at) if closed is not None and st.sent_at is not None else None,
            codec_error=f.get("codec"), timeout=f.get("timeout"), goaway=bool(f.get("goaway")),
            overflow=bool(f.get("overflow")), no_healthy=bool(f.get("no_healthy")), no_route=bool(f.get("no_route")),
            tls_error=f.get("tls"), downstream_remote=down.address if down else None, refs=tuple(refs), pod=self.pod,
            upstream_shared=f.get("shared", 0), upstream_answered=bool(f.get("answered")),
            retried=tuple(f.get("retried", ())), tcp=bool(f.get("tcp")))

    def expire(self, now: float) -> list[StreamStory]:
        """The stories of streams with no fact for STALE_S before ``now`` (seconds since the epoch)."""
        quiet = [st for st in self._streams.values() if st.last is not None and now - st.last > STALE_S]
        return [self._tell(st) for st in quiet]

    def finish(self) -> list[StreamStory]:
        """The stories of every stream still open, as they stand."""
        return [self._tell(st) for st in list(self._streams.values())]
