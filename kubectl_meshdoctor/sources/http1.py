"""The start of an HTTP/1 message, cut from one TCP segment's payload with wire case and duplicates intact.

We parse this ourselves on purpose: finding framing errors (RFC 9112 section 6) needs the header lines exactly
as they were sent, which a tolerant parser normalizes away.
"""

from __future__ import annotations

import functools
import re

from ..events import HttpStart

_METHODS = (b"GET ", b"POST ", b"PUT ", b"DELETE ", b"HEAD ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE ")
# The first four bytes of every message start parse_http_start accepts: what capture filters look for.
START_PREFIXES = tuple(sorted({m[:4] for m in _METHODS} | {b"HTTP"}))
_MAX_HEADER_BYTES = 16_384
# A field line whose name is a token of visible ASCII (RFC 9110 section 5.1), nothing around it, then a colon.
_FIELD = re.compile(r"([!-9;-~]+):(.*)", re.S)


@functools.lru_cache(maxsize=8192)
def _field_line(text: str) -> tuple[str, str] | None:
    # Cached: a pod's messages repeat most of their header lines (Server, Content-Type, Connection: keep-alive),
    # so equal lines share one (name, value) pair. Half of analyze's Python memory was header strings held while
    # the time merge waits for the other interface (bench/RESULTS.md).
    m = _FIELD.fullmatch(text)
    return (m.group(1), m.group(2).strip(" \t")) if m else None


def parse_http_start(payload: bytes) -> HttpStart | None:
    """The start line and header lines if ``payload`` begins an HTTP/1.x message, else None."""
    if not (payload.startswith(b"HTTP/1.") or payload.startswith(_METHODS)):
        return None
    head = payload[:_MAX_HEADER_BYTES]
    end = head.find(b"\r\n\r\n")
    complete = end >= 0
    block = head[:end] if complete else head
    lines = block.decode("latin-1").split("\r\n")
    start = lines[0]
    headers: list[tuple[str, str]] = []
    raw: list[str] = []
    for text in lines[1:]:
        pair = _field_line(text)
        if pair is not None:
            headers.append(pair)
        else:
            raw.append(text)
    return HttpStart(start, tuple(headers), tuple(raw), complete)
