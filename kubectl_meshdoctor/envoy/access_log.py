"""Envoy access-log lines parsed into AccessLogEntry: every default format Istio has shipped and Envoy's own
(TEXT and JSON, istio_formats.py), a user's ``meshConfig.accessLogFormat`` compiled by log_format.py, a line of
Envoy's shape no format reads whole (partial_line.py), and whatever a tool wrapped around the line
(wrappers.py: kubectl --timestamps and --prefix, stern, CRI, Docker json-file, grep, JSON escaping).

Sources: docs/access-log-formats.md (each format with its Istio versions and repo:path@tag);
envoyproxy/envoy ``docs/root/configuration/observability/access_log/usage.rst`` (operators, ``-`` for a
missing value, START_TIME's default rendering ``%Y-%m-%dT%H:%M:%E3SZ``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from .flags import ResponseFlag, decode_flags
from .istio_formats import JSON_FORMATS, TEXT_FORMATS
from .log_format import MISSING, LogFormat, compile_format
from .numbers import ascii_int
from .partial_line import read_partial, request_line
from .start_time import compile_time
from .wrappers import UNTIMED_ACCESS_START, Unwrapped, unwrap, unwrap_layers

PARTIAL = "partial"  # the format name of a line read in part (partial_line.py)
_JSON_REQUIRED = frozenset({"start_time", "response_code"})
KNOWN_TEXT: tuple[LogFormat, ...] = tuple(compile_format(f.format, f.name) for f in TEXT_FORMATS)
KNOWN_JSON: tuple[LogFormat, ...] = tuple(compile_format(f.format, f.name, _JSON_REQUIRED) for f in JSON_FORMATS)
_DEFAULT_TIME = compile_time(None)
_METHOD = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# The start of what only an access-log line has: TEXT's `[START_TIME] "REQUEST"` (Envoy's own log lines are
# `[2025-06-12 08:14:01.207][15][info]`: a space in the time, no quote), JSON's start_time and response_code.
_TEXT_START = re.compile(r'\[\d{4}-\d\d-\d\dT[^\]]*\] "')
# The same line pasted without its leading `[START_TIME] ` (a ticket's copy, a log tool that shows its own time
# column): it starts with the quoted request line, then the code and the flags.
_UNTIMED_START = re.compile(UNTIMED_ACCESS_START)
# Read as if its time were there; the entry's time is then the wrapper's, if any, else unknown (0.0), as for
# Envoy's own lines pasted without a time.
_UNTIMED_PREFIX = "[1970-01-01T00:00:00.000Z] "


@dataclass(frozen=True)
class AccessLogEntry:
    """One access-log line. Fields Envoy printed as `-` (JSON: null), or that the line's format does not carry,
    are None; `code` 0 = nothing sent (or no %RESPONSE_CODE% in the format)."""

    ts: float  # START_TIME, seconds since the epoch
    method: str | None
    path: str | None
    protocol: str | None
    code: int
    flags: tuple[str, ...]  # short response flag names in printed order, () for `-`
    details: str | None  # %RESPONSE_CODE_DETAILS%
    termination_details: str | None  # %CONNECTION_TERMINATION_DETAILS%
    upstream_failure: str | None  # %UPSTREAM_TRANSPORT_FAILURE_REASON%
    bytes_received: int
    bytes_sent: int
    duration_ms: int
    upstream_host: str | None
    upstream_cluster: str | None
    upstream_local: str | None
    downstream_local: str | None
    downstream_remote: str | None
    upstream_service_time: int | None = None  # x-envoy-upstream-service-time, ms
    x_forwarded_for: str | None = None
    user_agent: str | None = None
    request_id: str | None = None
    authority: str | None = None
    requested_server_name: str | None = None
    route_name: str | None = None
    raw: str = field(default="", compare=False)  # the line as read, wrappers and all
    pod: str | None = None  # the pod whose sidecar wrote it, when a wrapper names it (kubectl --prefix, stern)
    # Values in the line that are credentials (a format that logs %REQ(AUTHORIZATION)%, a JSON "cookie" key):
    # hidden wherever the line is quoted (quoted()), unless redaction is off.
    secrets: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def quoted(self, redact: bool = True) -> str:
        """The line as read, its credentials hidden unless ``redact`` is False."""
        text = self.raw
        if redact:
            for value in sorted(self.secrets, key=len, reverse=True):
                text = text.replace(value, "<redacted>")
        return text

    @property
    def response_flags(self) -> tuple[ResponseFlag, ...]:
        return decode_flags(",".join(self.flags))

    @property
    def is_tcp(self) -> bool:
        """A tcp_proxy line: `"- - -"`, no HTTP request."""
        return self.method is None and self.path is None and self.protocol is None

    @property
    def inbound(self) -> bool:
        return (self.upstream_cluster or "").startswith("inbound|")


@dataclass(frozen=True, slots=True)
class ReadLine:
    """A line read: its ``entry``, the ``format`` that read it (a KnownFormat's name, ``custom``, or
    ``partial``), and the line without its wrappers (``unwrapped``: the text, the wrappers' time, pod,
    container and names)."""

    entry: AccessLogEntry
    format: str
    unwrapped: Unwrapped


def _opt(value: Any) -> str | None:
    return None if value is None or value == MISSING or value == "" else str(value)


def _int(value: Any, default: int | None = 0) -> int | None:
    """A count or code of the line; ValueError unless ASCII digits (JSON: an int), which Envoy always writes."""
    if value is None or value == MISSING or value == "":
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"not an integer: {type(value).__name__}")
    n = ascii_int(str(value), signed=True)
    if n is None:
        raise ValueError("not an integer Envoy writes")
    return n


def parse_start_time(text: str) -> float:
    """`2025-06-12T08:14:01.207Z` -> seconds since the epoch (UTC when no offset is given)."""
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def read_line(line: str, log_format: LogFormat | None = None) -> ReadLine | None:
    """``line`` (as read: wrappers and all) -> ReadLine, or None when it is no access-log line (Envoy's own
    log lines, blank lines, a line of another format). ``log_format``: the user's compiled format, tried before
    the known ones. Never raises."""
    return read_layers(layers_for(line, log_format), line.rstrip("\r\n"), log_format)


def layers_for(line: str, log_format: LogFormat | None = None) -> tuple[Unwrapped, ...]:
    """``line``'s unwrapping stages (wrappers.unwrap_layers), wrappers coming off before a line of
    ``log_format``'s own start too."""
    return unwrap_layers(line, log_format.head if log_format is not None else None)


def read_layers(layers: tuple[Unwrapped, ...], raw: str, log_format: LogFormat | None = None) -> ReadLine | None:
    """``read_unwrapped`` of the innermost stage; with ``log_format``, of the outermost stage that format reads
    whole, if any: a line of the user's format may start as a wrapper does (with an RFC 3339 time, a word), and
    what the format reads whole is not taken for a wrapper. Never raises."""
    if log_format is not None and len(layers) > 1:
        for u in layers:
            try:
                read = _read(log_format, u.text.strip(), raw, u)
            except (ValueError, TypeError, OverflowError):  # a count no Envoy writes: not this stage's line
                continue
            if read is not None:
                return read
    return read_unwrapped(layers[-1], raw, log_format)


def read_unwrapped(u: Unwrapped, raw: str, log_format: LogFormat | None = None) -> ReadLine | None:
    """``read_line`` of a line already unwrapped (a reader that joined the pieces of a split line); ``raw`` is
    the line as read. Never raises."""
    text = u.text.strip()
    try:
        if log_format is not None:
            read = _read(log_format, text, raw, u)
            if read is not None:
                return read
        if text.startswith("{"):
            return next((r for r in (_read(f, text, raw, u) for f in KNOWN_JSON) if r is not None), None)
        if text.startswith("["):
            found = next((r for r in (_read(f, text, raw, u) for f in KNOWN_TEXT) if r is not None), None)
            return found if found is not None else _read_partial(text, raw, u)
        if text.startswith('"') and _UNTIMED_START.match(text):
            return _read_untimed(text, raw, u)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError):
        return None  # a line of another shape, or one no Envoy wrote ("duration": 1e400, nesting 1000 deep)
    return None


def parse_line(line: str, log_format: LogFormat | None = None) -> AccessLogEntry | None:
    """A TEXT or JSON access-log line (of a known format, or of ``log_format``), wrapped or not ->
    AccessLogEntry; None for anything else (Envoy's own log lines, blank lines, other formats). Never raises."""
    read = read_line(line, log_format)
    return read.entry if read is not None else None


def looks_like_access_log(line: str) -> bool:
    """Whether ``line`` has the start of an access-log line (TEXT or JSON): one that then gives no entry from
    ``parse_line`` is a damaged or hostile line, not one of Envoy's own log lines. Never raises."""
    text = unwrap(line).text.strip()
    if text.startswith("{"):
        return '"start_time"' in text and '"response_code"' in text
    return bool(_TEXT_START.match(text) or _UNTIMED_START.match(text))


def parse_lines(text: str, log_format: LogFormat | None = None) -> list[AccessLogEntry]:
    """Every access-log line of a log (e.g. `kubectl logs -c istio-proxy`), skipping the rest."""
    return [e for e in (parse_line(line, log_format) for line in text.splitlines()) if e is not None]


def _read(fmt: LogFormat, text: str, raw: str, u: Unwrapped) -> ReadLine | None:
    values = fmt.values(text)
    if values is None:
        return None
    entry = entry_of(values, raw, u)
    return ReadLine(entry, fmt.name, u) if entry is not None else None


def _read_untimed(text: str, raw: str, u: Unwrapped) -> ReadLine | None:
    """A TEXT line of a known format (or read in part) with its leading ``[START_TIME] `` cut off. Its time is
    the wrapper's (when the line was written) less the duration, else 0.0: unknown."""
    framed = _UNTIMED_PREFIX + text
    found = next((r for r in (_read(f, framed, raw, u) for f in KNOWN_TEXT) if r is not None), None)
    found = found if found is not None else _read_partial(framed, raw, u)
    if found is None:
        return None
    ts = u.ts - found.entry.duration_ms / 1000.0 if u.ts is not None else 0.0
    return replace(found, entry=replace(found.entry, ts=ts))


def _read_partial(text: str, raw: str, u: Unwrapped) -> ReadLine | None:
    values = read_partial(text)
    if values is None:
        return None
    values["ts"] = _DEFAULT_TIME.parse(values.pop("ts_text"))
    if values["ts"] is None:
        return None
    entry = entry_of(values, raw, u)
    return ReadLine(entry, PARTIAL, u) if entry is not None else None


def entry_of(values: dict[str, Any], raw: str, u: Unwrapped) -> AccessLogEntry | None:
    """An AccessLogEntry of a line's values by field (LogFormat.values). The time is the line's START_TIME, or,
    for a format without one, the time a wrapper carried (when the line was written, so when its request ended)
    less the duration; None when neither is known. Raises ValueError for a count Envoy would not write."""
    duration = _int(values.get("duration_ms")) or 0
    ts = values.get("ts")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        if u.ts is None:
            return None
        ts = u.ts - duration / 1000.0
    method = _opt(values.get("method"))
    if method is not None and not _METHOD.fullmatch(method):
        method = None  # Istio 1.1.0 - 1.1.2's JSON wrote the start time under "method"
    flags = values.get("flags")
    return AccessLogEntry(
        ts=float(ts), method=method, path=_opt(values.get("path")), protocol=_opt(values.get("protocol")),
        code=_int(values.get("code")) or 0,
        flags=tuple(f.short for f in decode_flags(None if flags is None else str(flags))),
        details=_opt(values.get("details")), termination_details=_opt(values.get("termination_details")),
        upstream_failure=_opt(values.get("upstream_failure")),
        bytes_received=_int(values.get("bytes_received")) or 0, bytes_sent=_int(values.get("bytes_sent")) or 0,
        duration_ms=duration, upstream_host=_opt(values.get("upstream_host")),
        upstream_cluster=_opt(values.get("upstream_cluster")), upstream_local=_opt(values.get("upstream_local")),
        downstream_local=_opt(values.get("downstream_local")),
        downstream_remote=_opt(values.get("downstream_remote")),
        upstream_service_time=_int(values.get("upstream_service_time"), None),
        x_forwarded_for=_opt(values.get("x_forwarded_for")), user_agent=_opt(values.get("user_agent")),
        request_id=_opt(values.get("request_id")), authority=_opt(values.get("authority")),
        requested_server_name=_opt(values.get("requested_server_name")), route_name=_opt(values.get("route_name")),
        raw=raw, pod=u.pod, secrets=tuple(values.get("secrets") or ()),
    )


__all__ = ["AccessLogEntry", "PARTIAL", "ReadLine", "entry_of", "looks_like_access_log", "parse_line", "parse_lines",
           "layers_for", "parse_start_time", "read_layers", "read_line", "read_unwrapped", "request_line"]
