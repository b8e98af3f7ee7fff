"""What Envoy's component log tells of one request: the story (envoy/story.py builds it) and the lines it rests
on. The boundary between the story builder and the detectors that read stories."""

from __future__ import annotations

from dataclasses import dataclass

from .access_log import AccessLogEntry
from .component_log import ComponentLine
from .flags import RESET_BY_TOKEN, flags_of_details, status_of_details


@dataclass(frozen=True, slots=True)
class LogRef:
    """One line of Envoy's log that a story rests on: where (``source``, 1-based ``line``), when (``ts``, seconds
    since the epoch, None when the line had no time), its ``kind`` (a fact kind) and ``text`` (the line as read,
    its first physical line)."""

    source: str
    line: int
    ts: float | None
    kind: str
    text: str  # the message's first line, with its connection id: "[C11] using existing connection"
    raw: str = ""  # the line as logged (its first physical line)


# The router's timeout lines and the response code details of the request they end (envoyproxy/envoy
# source/common/router/router.cc: onResponseTimeout logs "upstream timeout" and fails the request with
# response_timeout; onPerTryTimeout and onPerTryIdleTimeout log "upstream per try [idle] timeout" and, when no
# retry follows, fail it with upstream_per_try_[idle_]timeout; each sets response flag UT). A pasted excerpt often
# ends at that line, before the local reply's own.
ROUTER_TIMEOUT_DETAILS = {"upstream timeout": "response_timeout",
                          "upstream per try timeout": "upstream_per_try_timeout",
                          "upstream per try idle timeout": "upstream_per_try_idle_timeout"}


@dataclass(frozen=True, slots=True)
class StreamStory:
    """What Envoy's log tells of one request (or of one connection refused before any request).

    Times are seconds since the epoch. ``upstream_idle_s``: how long the pooled connection sat idle before this
    stream was put on it (None for a new connection). ``upstream_closed_after_s``: seconds from the request going
    out to the upstream connection's close (remote close, or the disconnect that reset this stream).
    """

    source: str
    connection: int | None
    stream: int | None
    start: float | None
    end: float | None
    method: str | None = None
    path: str | None = None
    authority: str | None = None
    request_id: str | None = None
    status: int | None = None
    details: str | None = None
    reset_reason: str | None = None
    transport_failure: str | None = None
    errno: int | None = None
    cluster: str | None = None
    upstream_connection: int | None = None
    upstream_address: str | None = None
    upstream_reused: bool | None = None
    upstream_idle_s: float | None = None
    upstream_remote_close: bool = False
    upstream_closed: bool = False  # the upstream connection went away with this request on it
    upstream_closed_after_s: float | None = None
    codec_error: str | None = None
    timeout: str | None = None
    goaway: bool = False
    overflow: bool = False
    no_healthy: bool = False
    no_route: bool = False
    filter_chain_not_found: bool = False
    tls_error: str | None = None
    downstream_remote: str | None = None
    refs: tuple[LogRef, ...] = ()
    pod: str | None = None
    upstream_shared: int = 0  # other streams in flight on the upstream connection when it closed (HTTP/2)
    upstream_answered: bool = False  # the upstream's response headers came (a reset after them is mid-response)
    retried: tuple[str, ...] = ()  # what failed each attempt the router retried ("performing retry"), in order
    tcp: bool = False  # a tcp_proxy session (no HTTP request): the downstream connection is the request

    @property
    def flags(self) -> tuple[str, ...]:
        """The response flags Envoy's access log would carry for this request, as far as the log tells them."""
        flags = flags_of_details(self.told_details)
        if not flags and self.reset_reason:
            phase = "after" if self.upstream_answered else "before"
            flags = flags_of_details("upstream_reset_%s_response_started{%s}"
                                     % (phase, self.reset_reason.replace(" ", "_")))
        if not flags and self.filter_chain_not_found:
            flags = ("NR",)
        if self.retried and "URX" not in flags and (self.reset_reason or self.details == "upstream_per_try_timeout"):
            # The router retried and the last attempt failed as the ones before: its retries were spent (Envoy's
            # access log says URX first: "URX,UC", "URX,UF", "URX,UT").
            flags = ("URX", *flags)
        return flags

    @property
    def told_details(self) -> str | None:
        """The response code details: the local reply's, else what a router timeout line implies."""
        return self.details or ROUTER_TIMEOUT_DETAILS.get(self.timeout or "")

    @property
    def failed(self) -> bool:
        """Whether Envoy failed the request (a response flag, or a reply of its own): an upstream's own 5xx,
        passed on as it came, is the app's answer, not Envoy's failure (its access log says via_upstream)."""
        return (bool(self.flags) or self.filter_chain_not_found or bool(self.tls_error)
                or bool(self.details and self.details != "via_upstream"))

    def _reset_status(self) -> int:
        """The status Envoy answers a reset before the response with (its reason's), 0 when not known."""
        reset = RESET_BY_TOKEN.get((self.reset_reason or "").strip().replace(" ", "_"))
        return reset.status if reset is not None else 0

    def entry(self) -> AccessLogEntry:
        """The access-log line Envoy would have written for this request, from what the log tells (fields it does
        not tell are None): how detectors that read access-log lines read a story."""
        details = self.told_details or ("filter_chain_not_found" if self.filter_chain_not_found else None)
        duration = round(1000 * (self.end - self.start)) if self.end and self.start else 0
        return AccessLogEntry(
            ts=self.start or self.end or 0.0, method=self.method, path=self.path, protocol=None,
            code=self.status if self.status is not None else 0 if self.tcp else (status_of_details(details)
                                                                                 or self._reset_status()),
            flags=self.flags, details=details, termination_details=None,
            upstream_failure=self.transport_failure, bytes_received=0, bytes_sent=0, duration_ms=max(duration, 0),
            upstream_host=self.upstream_address, upstream_cluster=self.cluster, upstream_local=None,
            downstream_local=None, downstream_remote=self.downstream_remote, request_id=self.request_id,
            authority=self.authority, raw="", pod=self.pod)


def log_ref(source: str, number: int, line: ComponentLine, kind: str) -> LogRef:
    """The reference to component-log entry ``line`` (its head at 1-based line ``number`` of ``source``)."""
    first = line.message.split("\n", 1)[0]
    ids = f"[C{line.connection}] " if line.connection is not None else ""
    return LogRef(source, number, line.ts, kind, (ids + first)[:500], line.raw[:2000])
