"""The start of an HTTP/1 message, cut from one TCP segment's payload with wire case and duplicates intact.

We parse this ourselves on purpose: finding framing errors (RFC 9112 section 6) needs the header lines exactly
as they were sent, which a tolerant parser normalizes away.
"""

from __future__ import annotations

from kubectl_meshdoctor.core.events import HttpStart
from kubectl_meshdoctor.core.redact import SENSITIVE_HEADERS

_METHODS = (b"GET ", b"POST ", b"PUT ", b"DELETE ", b"HEAD ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE ")
# The first four bytes of every message start parse_http_start accepts: what capture filters look for.
START_PREFIXES = tuple(sorted({m[:4] for m in _METHODS} | {b"HTTP"}))
_MAX_HEADER_BYTES = 16_384


_CACHED_LINE_CHARS = 160  # a few MB of cache at most; long lines (tokens, cookies) are rarely repeated


def _field_line(text: str) -> tuple[str, str] | None:
    name, colon, value = text.partition(":")  # a name holds no colon: the first one ends it
    # A field line: a name that is a token of visible ASCII (RFC 9110 section 5.1), nothing around it, then a
    # colon; checked with string methods, a third of a regex's cost: ASCII, printable, no space.
    if colon and name and name.isascii() and name.isprintable() and " " not in name:
        return name, value.strip(" \t")
    return None


# A pod's messages repeat most of their header lines (Server, Content-Type, Connection: keep-alive), so equal
# lines share one (name, value) pair: half of analyze's Python memory was header strings held while the time
# merge waits for the other interface (bench/RESULTS.md). Only short lines, and never credentials, which would
# otherwise outlive their packets in the cache (redaction applies to what is shown, not to memory). A plain dict
# looked up before anything else is done to the line: a hit, most lines, costs one lookup, where each line was
# checked before an lru_cache lookup (parse_http_start on bench/gen's lo messages: 5.2 -> 4.4 us).
_MAX_CACHED_LINES = 8192  # then the cache starts again: bounded, and a changed pod's lines are cached anew
# Fields whose value is new in every request: the request id Envoy generates (x-request-id) and the trace
# context of W3C Trace Context (traceparent, tracestate) and Zipkin's B3 (x-b3-*), which Envoy's tracers
# propagate. Caching them only filled the cache (cleared every ~1,600 messages on bench/gen's traffic, its
# repeated lines then missing again): they are parsed and never kept. Names lowercase: matched whatever their case.
_NEW_EACH_REQUEST = frozenset(("x-request-id", "traceparent", "tracestate", "x-b3-traceid", "x-b3-spanid",
                               "x-b3-parentspanid", "b3", "x-client-trace-id"))
_RAW = ("", "")  # the cache's mark of a line that is not a field line


def reusable(name: str, chars: int) -> bool:
    """Whether a header line of field ``name`` and ``chars`` characters may be kept for the messages after it:
    short, not new in every request, never a credential."""
    if chars > _CACHED_LINE_CHARS:
        return False
    name = name.lower()  # field names are case-insensitive (RFC 9110 section 5.1): an app may send X-Request-Id
    return name not in _NEW_EACH_REQUEST and name not in SENSITIVE_HEADERS


class _FieldLines(dict):
    """Header line -> its (name, value), or _RAW; at most _MAX_CACHED_LINES short, non-credential lines."""

    def __missing__(self, text: str) -> tuple[str, str]:
        pair = _field_line(text) or _RAW
        # A line that begins with a credential's name and a colon is a field line (the name is a token), so
        # looking at the parsed name is enough: lowering the whole line was a third of a miss's cost.
        if reusable(pair[0], len(text)):
            if len(self) >= _MAX_CACHED_LINES:
                self.clear()
            self[text] = pair
        return pair


_shared_field_line = _FieldLines()


def parse_http_start(payload: bytes) -> HttpStart | None:
    """The start line and header lines if ``payload`` begins an HTTP/1.x message, else None."""
    if not (payload.startswith(b"HTTP/1.") or payload.startswith(_METHODS)):
        return None
    head = payload[:_MAX_HEADER_BYTES]
    end = head.find(b"\r\n\r\n")
    complete = end >= 0
    lines = (head[:end] if complete else head).decode("latin-1").split("\r\n")
    pairs = list(map(_shared_field_line.__getitem__, lines[1:]))
    if _RAW not in pairs:  # every line a field line: the common case
        return HttpStart(lines[0], tuple(pairs), (), complete, ())
    headers: list[tuple[str, str]] = []
    raw: list[str] = []
    owners: list[str] = []
    owner = ""  # the field the next continuation line folds into
    for text, pair in zip(lines[1:], pairs):
        if pair is not _RAW:
            headers.append(pair)
            owner = pair[0]
        else:
            raw.append(text)
            owners.append(owner)
            if text[:1] not in (" ", "\t"):
                owner = text.partition(":")[0]
    return HttpStart(lines[0], tuple(headers), tuple(raw), complete, tuple(owners))
