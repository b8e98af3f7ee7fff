"""A SPDY/3.1 framer: bytes <-> frames, with the zlib-compressed name/value header blocks. No I/O, no sessions.

Why our own: kubectl speaks SPDY/3.1 for exec, attach and port-forward (the only transport before 1.29/1.31, and
the fallback after), and no maintained Python SPDY library exists. Everything here follows
draft-mbelshe-httpbis-spdy-00 (SPDY/3) with the SPDY/3.1 session flow control frame (WINDOW_UPDATE for stream
0); section numbers below are that draft's. What Kubernetes uses (client-go and the kubelet through
moby/spdystream) is a subset: no PUSH, no credential slots, no flow control in practice (spdystream never sends
WINDOW_UPDATE and ignores the ones it gets), so a framer that reads and writes every frame type is all we need.

Frame shapes (2.2): a control frame is `1 | version(15) | type(16) | flags(8) | length(24) | data`, a data frame
`0 | stream-id(31) | flags(8) | length(24) | data`. Header blocks (2.6.10) are `count(32)` then `len(32) name
len(32) value` pairs, values joined by NUL, compressed by one zlib stream per direction, primed with DICTIONARY
and flushed with Z_SYNC_FLUSH after every block (2.6.10.1).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Union

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN, FLAG_UNIDIRECTIONAL = 0x01, 0x02
# RST_STREAM status codes (2.6.3).
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, UNSUPPORTED_VERSION, CANCEL, INTERNAL_ERROR = 1, 2, 3, 4, 5, 6
MAX_DATA_LENGTH = (1 << 24) - 1
MAX_FRAME_LENGTH = 16 << 20  # frames we accept; spdystream never sends more than a 64 KiB data frame

_WORDS = (
    "options head post put delete trace accept accept-charset accept-encoding accept-language accept-ranges age "
    "allow authorization cache-control connection content-base content-encoding content-language content-length "
    "content-location content-md5 content-range content-type date etag expect expires from host if-match "
    "if-modified-since if-none-match if-range if-unmodified-since last-modified location max-forwards pragma "
    "proxy-authenticate proxy-authorization range referer retry-after server te trailer transfer-encoding upgrade "
    "user-agent vary via warning www-authenticate method get status 200_OK version HTTP/1.1 url public set-cookie "
    "keep-alive origin").replace("_", "\x00").split(" ")
_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505203 "
    "Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized403 "
    "Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May "
    "Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,"
    "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.")
# The SPDY/3 header compression dictionary (2.6.10.1): 65 length-prefixed words (one is "200 OK"), then a run
# of text; 1423 bytes.
DICTIONARY = b"".join(struct.pack(">I", len(w)) + w.replace("\x00", " ").encode("ascii") for w in _WORDS) + _TAIL.encode("ascii")

Headers = tuple[tuple[str, str], ...]  # (lower-case name, value); a repeated name = several values


class SpdyError(ValueError):
    """Bytes that are not SPDY/3.1 (bad version, bad length, undecodable header block): the session must end."""


@dataclass(frozen=True)
class SynStream:
    """2.6.1: a new stream. `priority` 0 (highest) .. 7."""
    stream_id: int
    headers: Headers = ()
    associated_id: int = 0
    priority: int = 0
    fin: bool = False
    unidirectional: bool = False


@dataclass(frozen=True)
class SynReply:
    """2.6.2: the receiver accepts a stream."""
    stream_id: int
    headers: Headers = ()
    fin: bool = False


@dataclass(frozen=True)
class RstStream:
    """2.6.3: the stream ends abnormally, in both directions."""
    stream_id: int
    status: int = CANCEL


@dataclass(frozen=True)
class Settings:
    """2.6.4: (flags, id, value) entries."""
    entries: tuple[tuple[int, int, int], ...] = ()
    clear: bool = False


@dataclass(frozen=True)
class Ping:
    """2.6.5: answered with the same id by the side that did not send it (odd ids are the client's)."""
    ping_id: int


@dataclass(frozen=True)
class GoAway:
    """2.6.6: no new streams after `last_good_id`; status 0 OK, 1 protocol error, 2 internal error."""
    last_good_id: int
    status: int = 0


@dataclass(frozen=True)
class HeadersFrame:
    """2.6.7: more headers for an open stream."""
    stream_id: int
    headers: Headers = ()
    fin: bool = False


@dataclass(frozen=True)
class WindowUpdate:
    """2.6.8 (and SPDY/3.1 for stream 0, the session window): `delta` more bytes may be sent."""
    stream_id: int
    delta: int


@dataclass(frozen=True)
class Data:
    """2.2.2: payload bytes of a stream; `fin` half-closes the sender's side."""
    stream_id: int
    data: bytes = b""
    fin: bool = False


Frame = Union[SynStream, SynReply, RstStream, Settings, Ping, GoAway, HeadersFrame, WindowUpdate, Data]


def header(headers: Headers, name: str) -> str | None:
    """The first value of `name` (case-insensitive, as Go's http.Header.Get), None when absent."""
    name = name.lower()
    return next((v for k, v in headers if k == name), None)


def _encode_block(headers: Headers) -> bytes:
    grouped: dict[str, list[str]] = {}
    for name, value in headers:
        grouped.setdefault(name.lower(), []).append(value)
    out = [struct.pack(">I", len(grouped))]
    for name, values in grouped.items():
        n, v = name.encode("utf-8"), "\x00".join(values).encode("utf-8")
        out += [struct.pack(">I", len(n)), n, struct.pack(">I", len(v)), v]
    return b"".join(out)


def _decode_block(raw: bytes) -> Headers:
    """Raises SpdyError on a truncated block."""
    try:
        (count,), pos, out = struct.unpack_from(">I", raw), 4, []
        for _ in range(count):
            (n,) = struct.unpack_from(">I", raw, pos)
            name = raw[pos + 4:pos + 4 + n].decode("utf-8").lower()
            pos += 4 + n
            (n,) = struct.unpack_from(">I", raw, pos)
            value = raw[pos + 4:pos + 4 + n].decode("utf-8")
            pos += 4 + n
            if pos > len(raw):
                raise SpdyError("header block shorter than its lengths")
            out += [(name, v) for v in value.split("\x00")]
    except (struct.error, UnicodeDecodeError) as exc:
        raise SpdyError(f"bad header block: {exc}") from None
    return tuple(out)


class Framer:
    """One side of a SPDY/3.1 connection: `encode` frames to send, `feed` received bytes to get frames.

    Keeps the two zlib streams (one per direction, 2.6.10.1), so one Framer serves one connection for its life.
    """

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(zlib.Z_BEST_COMPRESSION, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY,
                                         zdict=DICTIONARY)
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._buf = bytearray()

    # ---------------------------------------------------------------------------------------------- encoding

    def _block(self, headers: Headers) -> bytes:
        return self._deflate.compress(_encode_block(headers)) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    @staticmethod
    def _control(kind: int, flags: int, body: bytes) -> bytes:
        return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(body)) + body

    def encode(self, frame: Frame) -> bytes:
        """The wire bytes of `frame`. Raises SpdyError for a data frame over MAX_DATA_LENGTH or a zero stream id."""
        if isinstance(frame, Data):
            if len(frame.data) > MAX_DATA_LENGTH or not 0 < frame.stream_id < 1 << 31:
                raise SpdyError("data frame too long or without a stream id")
            return struct.pack(">II", frame.stream_id, (FLAG_FIN if frame.fin else 0) << 24 | len(frame.data)) \
                + frame.data
        if isinstance(frame, SynStream):
            flags = (FLAG_FIN if frame.fin else 0) | (FLAG_UNIDIRECTIONAL if frame.unidirectional else 0)
            body = struct.pack(">IIBB", frame.stream_id, frame.associated_id, (frame.priority & 7) << 5, 0)
            return self._control(SYN_STREAM, flags, body + self._block(frame.headers))
        if isinstance(frame, SynReply):
            return self._control(SYN_REPLY, FLAG_FIN if frame.fin else 0,
                                 struct.pack(">I", frame.stream_id) + self._block(frame.headers))
        if isinstance(frame, HeadersFrame):
            return self._control(HEADERS, FLAG_FIN if frame.fin else 0,
                                 struct.pack(">I", frame.stream_id) + self._block(frame.headers))
        if isinstance(frame, RstStream):
            return self._control(RST_STREAM, 0, struct.pack(">II", frame.stream_id, frame.status))
        if isinstance(frame, Settings):
            body = struct.pack(">I", len(frame.entries)) + b"".join(
                struct.pack(">II", (flags << 24) | ident, value) for flags, ident, value in frame.entries)
            return self._control(SETTINGS, 1 if frame.clear else 0, body)
        if isinstance(frame, Ping):
            return self._control(PING, 0, struct.pack(">I", frame.ping_id))
        if isinstance(frame, GoAway):
            return self._control(GOAWAY, 0, struct.pack(">II", frame.last_good_id, frame.status))
        if isinstance(frame, WindowUpdate):
            return self._control(WINDOW_UPDATE, 0, struct.pack(">II", frame.stream_id, frame.delta))
        raise TypeError(f"not a SPDY frame: {frame!r}")

    # ---------------------------------------------------------------------------------------------- decoding

    def feed(self, data: bytes) -> list[Frame]:
        """Frames completed by `data` (possibly none: a frame may arrive in pieces). Unknown control frame types
        are skipped (2.2.1: a receiver ignores them). Raises SpdyError on bytes that are not SPDY/3.1."""
        self._buf += data
        frames: list[Frame] = []
        while len(self._buf) >= 8:
            first, flags_len = struct.unpack_from(">II", self._buf)
            flags, length = flags_len >> 24, flags_len & 0xFFFFFF
            if length > MAX_FRAME_LENGTH:
                raise SpdyError(f"frame of {length} bytes")
            if len(self._buf) < 8 + length:
                break
            body = bytes(self._buf[8:8 + length])
            del self._buf[:8 + length]
            if not first & 0x80000000:
                frames.append(Data(first & 0x7FFFFFFF, body, bool(flags & FLAG_FIN)))
                continue
            version, kind = (first >> 16) & 0x7FFF, first & 0xFFFF
            if version != VERSION:
                raise SpdyError(f"SPDY version {version}, not 3")
            frame = self._control_frame(kind, flags, body)
            if frame is not None:
                frames.append(frame)
        return frames

    def _inflate_block(self, raw: bytes) -> Headers:
        try:
            return _decode_block(self._inflate.decompress(raw))
        except zlib.error as exc:
            raise SpdyError(f"header block does not inflate: {exc}") from None

    def _control_frame(self, kind: int, flags: int, body: bytes) -> Frame | None:
        fin = bool(flags & FLAG_FIN)
        try:
            if kind == SYN_STREAM:
                sid, assoc, prio = struct.unpack_from(">IIB", body)
                return SynStream(sid & 0x7FFFFFFF, self._inflate_block(body[10:]), assoc & 0x7FFFFFFF, prio >> 5,
                                 fin, bool(flags & FLAG_UNIDIRECTIONAL))
            if kind in (SYN_REPLY, HEADERS):
                (sid,) = struct.unpack_from(">I", body)
                cls = SynReply if kind == SYN_REPLY else HeadersFrame
                return cls(sid & 0x7FFFFFFF, self._inflate_block(body[4:]), fin)
            if kind == RST_STREAM:
                sid, status = struct.unpack_from(">II", body)
                return RstStream(sid & 0x7FFFFFFF, status)
            if kind == SETTINGS:
                (count,) = struct.unpack_from(">I", body)
                pairs = [struct.unpack_from(">II", body, 4 + 8 * i) for i in range(count)]
                return Settings(tuple((fid >> 24, fid & 0xFFFFFF, value) for fid, value in pairs), bool(flags & 1))
            if kind == PING:
                return Ping(struct.unpack_from(">I", body)[0])
            if kind == GOAWAY:
                last, status = struct.unpack_from(">II", body)
                return GoAway(last & 0x7FFFFFFF, status)
            if kind == WINDOW_UPDATE:
                sid, delta = struct.unpack_from(">II", body)
                return WindowUpdate(sid & 0x7FFFFFFF, delta & 0x7FFFFFFF)
        except struct.error:
            raise SpdyError(f"control frame type {kind} of {len(body)} bytes is too short") from None
        return None
