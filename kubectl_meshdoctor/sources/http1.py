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


# What a line's name says, kept by name: 0 no field name (the line is raw), 1 a field line that may be cached
# (reusable), 2 one that never is (new in every request, a credential). A request's five or so id and trace
# lines miss the line cache by design, and each miss checked its name and lowered it again: a synthetic Envoy
# request 5.39 -> 4.54 us with the names kept (bench/RESULTS.md).
_RAW_LINE, _KEPT_FIELD, _FRESH_FIELD = 0, 1, 2
_MAX_NAMES = 1024  # names kept, then the table starts again
_MAX_NAME_CHARS = 64  # a longer name is checked at each miss, not kept


def _name_kind(name: str) -> int:
    """What ``name``, a line's text before its first colon (a name holds none), says of the line. A field line's
    name is a token of visible ASCII (RFC 9110 section 5.1) with nothing around it, checked with string methods
    (a third of a regex's cost): ASCII, printable, no space."""
    if not (name and name.isascii() and name.isprintable() and " " not in name):
        return _RAW_LINE
    return _KEPT_FIELD if reusable(name, 0) else _FRESH_FIELD


class _FieldLines(dict):
    """Header line -> its (name, value), the value stripped of spaces and tabs, or _RAW when it is no field
    line; at most _MAX_CACHED_LINES short, non-credential field lines kept (reusable), no raw line."""

    def __init__(self) -> None:
        super().__init__()
        self._names: dict[str, int] = {}

    def __missing__(self, text: str) -> tuple[str, str]:
        name, colon, value = text.partition(":")
        if colon:
            names = self._names
            kind = names.get(name)
            if kind is None:
                kind = _name_kind(name)
                if kind and len(name) <= _MAX_NAME_CHARS:  # a field's name, never a raw line's text
                    if len(names) >= _MAX_NAMES:
                        names.clear()
                    names[name] = kind
            pair = (name, value.strip(" \t")) if kind else _RAW
        else:
            pair, kind = _RAW, _RAW_LINE
        # A field line as reusable says, by its name and length. Never a raw line: rare (bad bytes, an obs-fold
        # continuation), and one may carry a credential (a folded Cookie's second line) that no name tells.
        if kind == _KEPT_FIELD and len(text) <= _CACHED_LINE_CHARS:
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
