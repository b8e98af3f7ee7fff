"""Istio's default Envoy access-log lines (TEXT and JSON encodings) parsed into AccessLogEntry.

Sources (the samples in tests/envoy/data/istio_access_log.txt; the lab's Envoy writes the same formats):
- istio/istio `pilot/pkg/model/telemetry_logging.go`: `EnvoyTextLogFormat` (field order; Istio >= 1.24 uses
  `%UPSTREAM_CLUSTER_RAW%`, 1.9 - 1.23 `%UPSTREAM_CLUSTER%` in the same place) and `EnvoyJSONLogFormatIstio`
  (JSON key names);
- envoyproxy/envoy `docs/root/configuration/observability/access_log/usage.rst` (operators, `-` for a
  missing value, START_TIME default rendering `%Y-%m-%dT%H:%M:%E3SZ`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .flags import ResponseFlag, decode_flags
from .numbers import ascii_int

MISSING = "-"

# One token of a TEXT line: the bracketed start time, a quoted field (may hold spaces), or a bare word.
_TOKEN = re.compile(r'\[([^\]]*)\]|"([^"]*)"|(\S+)')
_FIELDS = 22  # positions listed in istio_access_log.txt
# `kubectl logs --timestamps` puts the kubelet's RFC 3339 time before each line.
_KUBECTL_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d) (?=[\[{])")
# The start of what only an access-log line has: TEXT's `[START_TIME] "REQUEST"` (Envoy's own log lines are
# `[2025-06-12 08:14:01.207][15][info]`: a space in the time, no quote), JSON's start_time and response_code.
_TEXT_START = re.compile(r'\[\d{4}-\d\d-\d\dT[^\]]*\] "')


@dataclass(frozen=True)
class AccessLogEntry:
    """One access-log line. Fields Envoy printed as `-` (JSON: null) are None; `code` 0 = nothing sent."""

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
    raw: str = field(default="", compare=False)  # the line as read

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


def _opt(value: str | None) -> str | None:
    return None if value is None or value == MISSING else value


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


def parse_line(line: str) -> AccessLogEntry | None:
    """A TEXT or JSON access-log line -> AccessLogEntry; None for anything else (Envoy's own log lines, blank
    lines, other formats). Never raises."""
    text = _KUBECTL_TS.sub("", line.strip(), count=1)
    try:
        if text.startswith("{"):
            return _parse_json(text, line)
        if text.startswith("["):
            return _parse_text(text, line)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError):
        return None  # a line of another shape, or one no Envoy wrote ("duration": 1e400, nesting 1000 deep)
    return None


def looks_like_access_log(line: str) -> bool:
    """Whether ``line`` has the start of an access-log line (TEXT or JSON): one that then gives no entry from
    ``parse_line`` is a damaged or hostile line, not one of Envoy's own log lines. Never raises."""
    text = _KUBECTL_TS.sub("", line.strip(), count=1)
    if text.startswith("{"):
        return '"start_time"' in text and '"response_code"' in text
    return bool(_TEXT_START.match(text))


def parse_lines(text: str) -> list[AccessLogEntry]:
    """Every access-log line of a log (e.g. `kubectl logs -c istio-proxy`), skipping the rest."""
    return [e for e in map(parse_line, text.splitlines()) if e is not None]


def _parse_text(text: str, raw: str) -> AccessLogEntry | None:
    tokens = [m.group(1) if m.group(1) is not None else m.group(2) if m.group(2) is not None else m.group(3)
              for m in _TOKEN.finditer(text)]
    # The first token must be the bracketed time and the second the quoted request line: checking the
    # shape, not just the count, keeps other bracketed log lines out.
    if len(tokens) != _FIELDS or not text.startswith("[") or not re.match(r'\[[^\]]*\] "', text):
        return None
    (start, request, code, flags, details, term, failure, rx, tx, duration, service_time, xff, agent,
     request_id, authority, upstream_host, cluster, upstream_local, downstream_local, downstream_remote,
     sni, route) = tokens
    method, path, protocol = _request_line(request)
    return AccessLogEntry(
        ts=parse_start_time(start), method=method, path=path, protocol=protocol, code=_int(code),
        flags=tuple(f.short for f in decode_flags(flags)), details=_opt(details),
        termination_details=_opt(term), upstream_failure=_opt(failure),
        bytes_received=_int(rx), bytes_sent=_int(tx), duration_ms=_int(duration),
        upstream_host=_opt(upstream_host), upstream_cluster=_opt(cluster), upstream_local=_opt(upstream_local),
        downstream_local=_opt(downstream_local), downstream_remote=_opt(downstream_remote),
        upstream_service_time=_int(service_time, None), x_forwarded_for=_opt(xff), user_agent=_opt(agent),
        request_id=_opt(request_id), authority=_opt(authority), requested_server_name=_opt(sni),
        route_name=_opt(route), raw=raw,
    )


def _request_line(request: str) -> tuple[str | None, str | None, str | None]:
    parts = request.split(" ")
    if len(parts) < 3:
        raise ValueError(f"not a request line: {request!r}")
    # A path never holds a space on the wire, but keep whatever sits between method and protocol.
    return _opt(parts[0]), _opt(" ".join(parts[1:-1])), _opt(parts[-1])


def _parse_json(text: str, raw: str) -> AccessLogEntry | None:
    doc = json.loads(text)
    if not isinstance(doc, dict) or "start_time" not in doc or "response_code" not in doc:
        return None

    def s(key: str) -> str | None:
        value = doc.get(key)
        return None if value is None else _opt(str(value))

    return AccessLogEntry(
        ts=parse_start_time(str(doc["start_time"])), method=s("method"), path=s("path"), protocol=s("protocol"),
        code=_int(doc["response_code"]) or 0,
        flags=tuple(f.short for f in decode_flags(s("response_flags"))), details=s("response_code_details"),
        termination_details=s("connection_termination_details"),
        upstream_failure=s("upstream_transport_failure_reason"),
        bytes_received=_int(doc.get("bytes_received")) or 0, bytes_sent=_int(doc.get("bytes_sent")) or 0,
        duration_ms=_int(doc.get("duration")) or 0,
        upstream_host=s("upstream_host"), upstream_cluster=s("upstream_cluster"),
        upstream_local=s("upstream_local_address"), downstream_local=s("downstream_local_address"),
        downstream_remote=s("downstream_remote_address"),
        upstream_service_time=_int(doc.get("upstream_service_time"), None),
        x_forwarded_for=s("x_forwarded_for"), user_agent=s("user_agent"), request_id=s("request_id"),
        authority=s("authority"), requested_server_name=s("requested_server_name"), route_name=s("route_name"),
        raw=raw,
    )
