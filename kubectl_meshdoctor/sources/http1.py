"""The start of an HTTP/1 message, cut from one TCP segment's payload with wire case and duplicates intact.

We parse this ourselves on purpose: finding framing errors (RFC 9112 section 6) needs the header lines exactly
as they were sent, which a tolerant parser normalizes away.
"""

from __future__ import annotations

from ..events import HttpStart

_METHODS = (b"GET ", b"POST ", b"PUT ", b"DELETE ", b"HEAD ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE ")
# The first four bytes of every message start parse_http_start accepts: what capture filters look for.
START_PREFIXES = tuple(sorted({m[:4] for m in _METHODS} | {b"HTTP"}))
_MAX_HEADER_BYTES = 16_384


def parse_http_start(payload: bytes) -> HttpStart | None:
    """The start line and header lines if ``payload`` begins an HTTP/1.x message, else None."""
    if not (payload.startswith(b"HTTP/1.") or payload.startswith(_METHODS)):
        return None
    head = payload[:_MAX_HEADER_BYTES]
    end = head.find(b"\r\n\r\n")
    complete = end >= 0
    block = head[:end] if complete else head
    lines = block.split(b"\r\n")
    start = lines[0].decode("latin-1")
    headers: list[tuple[str, str]] = []
    raw: list[str] = []
    for line in lines[1:]:
        text = line.decode("latin-1")
        name, sep, value = text.partition(":")
        if sep and name and name == name.strip() and all(33 <= ord(c) <= 126 for c in name):
            headers.append((name, value.strip(" \t")))
        else:
            raw.append(text)
    return HttpStart(start, tuple(headers), tuple(raw), complete)
