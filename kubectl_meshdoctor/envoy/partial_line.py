"""A TEXT access-log line of Envoy's shape that no known format reads whole (cut short in a ticket, or a format
customised a little), read as far as it can be without guessing.

Every Envoy and Istio default format starts ``[%START_TIME%] "%REQ(:METHOD)% PATH %PROTOCOL%" %RESPONSE_CODE%
%RESPONSE_FLAGS%`` (docs/access-log-formats.md), so those four are read by position. After them only values
with a shape nothing else has are taken: %RESPONSE_CODE_DETAILS% right after the flags when the token looks
like details (Envoy's details are lower-case words joined by ``_`` or ``.``, with ``{...}`` or ``[...]`` after,
envoyproxy/envoy docs/root/configuration/http/http_conn_man/response_code_details.rst), and Istio's cluster
names (``inbound|PORT||``, ``outbound|PORT|SUBSET|HOST``, istio/istio pilot/pkg/model/service.go
BuildSubsetKey). Addresses, byte counts and header values are left out: their place is the format's to say.
"""

from __future__ import annotations

import re
from typing import Any

_HEAD = re.compile(r'\[(?P<ts>\d{4}-\d\d-\d\dT[^\]\s]{8,30})\] "(?P<request>[^"]*)" (?P<code>\d{1,3}) '
                   # short (UF) or long (UpstreamConnectionFailure) flag names: upper-case first, as Envoy
                   # and extensions register them (envoy/flags.py)
                   r"(?P<flags>[A-Z][A-Za-z0-9]*(?:,[A-Z][A-Za-z0-9]*)*|-)(?= |$)")
_DETAILS = re.compile(r"[a-z0-9]+(?:[_.][a-z0-9]+)+(?:\{[^{}\s]*\}|\[[^\[\]\s]*\])?")
_CLUSTER = re.compile(r"(?:inbound|outbound)\|\d*\|[^|\s\"]*\|[^|\s\"]*"
                      r"|(?:InboundPassthroughCluster(?:Ipv[46])?|PassthroughCluster|BlackHoleCluster)")
_TCP = "- - -"


def read_partial(text: str) -> dict[str, Any] | None:
    """The values ``text`` holds at places every Envoy format shares, by AccessLogEntry field (``ts`` still the
    printed time); None when it does not start ``[TIME] "REQUEST" CODE FLAGS``."""
    m = _HEAD.match(text)
    if m is None:
        return None
    method, path, protocol = request_line(m.group("request"))
    values: dict[str, Any] = {"ts_text": m.group("ts"), "method": method, "path": path, "protocol": protocol,
                              "code": m.group("code"), "flags": m.group("flags")}
    rest = text[m.end():].split()
    if rest and _DETAILS.fullmatch(rest[0]):
        values["details"] = rest[0]
    cluster = next((token for token in rest if _CLUSTER.fullmatch(token)), None)
    if cluster is not None:
        values["upstream_cluster"] = cluster
    return values


def request_line(request: str) -> tuple[str | None, str | None, str | None]:
    """``"GET /p HTTP/1.1"`` -> (method, path, protocol); ``- - -`` (a TCP connection) -> Nones. Raises
    ValueError for anything without the three parts."""
    if request == _TCP:
        return None, None, None
    parts = request.split(" ")
    if len(parts) < 3:
        raise ValueError(f"not a request line: {request!r}")
    # A path never holds a space on the wire, but keep whatever sits between method and protocol.
    return parts[0], " ".join(parts[1:-1]), parts[-1]
