"""bench/fuzz's mutations of text inputs (logs, /stats, /clusters) and of their gzip.

One mutation a case, drawn from a seeded random source:
- ``flip``: 1-16 bits flipped; ``splice``: 1-4 hostile strings put in (HOSTILE: control bytes, ESC sequences,
  Rich markup, bidi overrides, NUL, invalid UTF-8, random bytes); ``truncate``: cut anywhere;
  ``duplicate``: a run of lines repeated; ``huge-line``: a line of 0.5-3 MiB (the product reads 1 MiB of a line);
  ``absurd-numbers`` (dumps): counters of 2^64, -1, 1e308, nan, 10,000 digits ...;
- ``gzip-cut``, ``gzip-bad-crc``: the input gzipped, then cut short or its CRC-32 or ISIZE changed;
- ``bomb-*``: the input gzipped, then a second gzip member (RFC 1952 section 2.2: a file is a series of
  members) expanding to BOMB_MB MiB of zeros or of one repeated byte, with or without newlines: about 1 MB on
  disk. The member is built once a run and shared by every bomb of its fill; one case in ten is a bomb.
Any other mutation is also gzipped one time in four. Lines carrying a planted secret's marker are never touched
by ``flip`` or ``splice`` (a flipped bit in ``authorization`` makes it a header nobody promises to hide); cuts
and duplicates may cross them.
"""

from __future__ import annotations

import gzip
import random
import re
import struct
import threading
import zlib

# What a terminal acts on: C0 but LF and TAB, DEL, C1, the bidi embeddings, overrides and isolates; and a lone
# surrogate, which is how an undecodable byte reads back (surrogateescape). bench/fuzz and bench/fuzz_tui count it.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\udc80-\udcff]")

BOMB_MB = 1024  # expanded: 16x what the product reads of a dump (64 MiB), 1,000 of its 1 MiB lines
HOSTILE = (b"\x1b[2J", b"\x1b]0;owned\x07", b"\x1b[31m", b"\x1bP+q\x1b\\", "\x9b31m".encode(), b"\x9b31m",
           b"[/]", b"[@click=app.quit]", b"[bold]", b"[/x]", b"[link=https://example.invalid]x[/link]",
           "\u202egnp.exe".encode(), "\u2066\u2067\u2068\u2069".encode(), "\u202a\u202b\u202c\u202d".encode(),
           b"\x00", b"\x00\x00\x00", b"\xff\xfe", b"\xc3(", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80\x9f",
           b"\x07", b"\x08\x08", b"\r", b"\x7f", "\u0085".encode(), "\u2028".encode(), "\ufeff".encode(),
           b"%s%n%x", b"'\"\\", b"{", b"}", b"\t\t", b"\n", b"A" * 10_000)
TEXT_MUTATIONS = ("flip", "splice", "truncate", "duplicate", "huge-line")
GZIP_MUTATIONS = ("gzip-cut", "gzip-bad-crc")
BOMBS = ("bomb-zeros", "bomb-zeros-lines", "bomb-byte", "bomb-byte-lines")
_NUMBER = re.compile(rb"(?<=[ :])-?\d+(?:\.\d+)?(?=\s|$|,)", re.M)
_ABSURD = (b"18446744073709551616", b"18446744073709551615", b"-1", b"-9223372036854775809", b"1e308", b"nan",
           b"inf", b"0x10", b"1" * 10_000, b"00000000000000000000001", b"1.5", b"\xd9\xa3")
_bombs: dict[str, bytes] = {}
_bombs_lock = threading.Lock()


def mutations(kind: str) -> tuple[str, ...]:
    """The mutations that apply to an input of ``kind`` (log, stats, clusters)."""
    return TEXT_MUTATIONS + (("absurd-numbers",) if kind in ("stats", "clusters") else ()) + GZIP_MUTATIONS + BOMBS


def _protected(data: bytes, markers: list[str]) -> list[tuple[int, int]]:
    spans = []
    for m in markers:
        for hit in re.finditer(re.escape(m.encode()), data):
            start = data.rfind(b"\n", 0, hit.start()) + 1
            end = data.find(b"\n", hit.end())
            spans.append((start, len(data) if end < 0 else end + 1))
    return spans


def _free(pos: int, spans: list[tuple[int, int]]) -> bool:
    return not any(start <= pos < end for start, end in spans)


def _position(n: int, spans: list[tuple[int, int]], rnd: random.Random) -> int | None:
    for _ in range(200):
        pos = rnd.randrange(n)
        if _free(pos, spans):
            return pos
    return None


def bomb(fill: str) -> bytes:
    """A gzip member expanding to BOMB_MB MiB of ``fill``: zeros or one byte, each with or without newlines."""
    with _bombs_lock:
        if fill not in _bombs:
            byte = b"\x00" if "zeros" in fill else b"A"
            # With newlines: lines of 1 MiB and a bit, each just past what the product reads of one line.
            chunk = (byte * ((1 << 20) + 7) + b"\n") if fill.endswith("lines") else byte * (1 << 20)
            z = zlib.compressobj(9, zlib.DEFLATED, 31)
            parts, total = [], 0
            while total < BOMB_MB << 20:
                parts.append(z.compress(chunk))
                total += len(chunk)
            parts.append(z.flush())
            _bombs[fill] = b"".join(parts)
        return _bombs[fill]


def mutate_text(data: bytes, kind: str, markers: list[str], rnd: random.Random) -> tuple[str, bytes]:
    """One mutation of a text input: (its name, the new bytes, gzipped when the name says gzip or bomb)."""
    # A bomb takes seconds to read (1 GiB to decompress): one case in ten, so a run's time goes to the others too.
    name = rnd.choice(BOMBS) if rnd.random() < 0.1 else rnd.choice([m for m in mutations(kind) if m not in BOMBS])
    spans = _protected(data, markers)
    b = bytearray(data)
    if name == "flip":
        for _ in range(rnd.randint(1, 16)):
            pos = _position(len(b), spans, rnd)
            if pos is not None:
                b[pos] ^= 1 << rnd.randrange(8)
    elif name == "splice":
        for _ in range(rnd.randint(1, 4)):
            piece = rnd.choice(HOSTILE) if rnd.random() < 0.8 else rnd.randbytes(rnd.randint(1, 64))
            pos = _position(len(b) + 1, spans, rnd)
            if pos is not None:
                b[pos:pos] = piece
                spans = _protected(bytes(b), markers)
    elif name == "truncate":
        del b[rnd.randrange(1, max(2, len(b))):]
    elif name == "duplicate":
        lines = bytes(b).split(b"\n")
        i = rnd.randrange(len(lines))
        j = min(len(lines), i + rnd.randint(1, 50))
        lines[j:j] = lines[i:j] * rnd.randint(1, 20)
        b = bytearray(b"\n".join(lines))
    elif name == "huge-line":
        size = rnd.choice((512 << 10, (1 << 20) - 1, (1 << 20) + 1, 3 << 20))
        fill = rnd.choice(HOSTILE[:20]) if rnd.random() < 0.5 else bytes([rnd.randrange(256)])
        line = (fill * (size // len(fill) + 1))[:size]
        cut = b.find(b"\n", rnd.randrange(len(b))) + 1 if b else 0
        b[cut:cut] = line + b"\n"
    elif name == "absurd-numbers":
        hits = list(_NUMBER.finditer(bytes(b)))
        for m in sorted(rnd.sample(hits, min(len(hits), rnd.randint(1, 30))), key=lambda m: -m.start()):
            b[m.start():m.end()] = rnd.choice(_ABSURD)
    out = bytes(b)
    if name in GZIP_MUTATIONS or name in BOMBS or rnd.random() < 0.25:
        out = gzip.compress(out, compresslevel=6, mtime=0)
        if name == "gzip-cut":
            out = out[:rnd.randrange(10, len(out))]
        elif name == "gzip-bad-crc":
            crc, size = struct.unpack("<II", out[-8:])
            crc, size = (crc ^ (1 << rnd.randrange(32)), size) if rnd.random() < 0.7 else (crc, size + 1)
            out = out[:-8] + struct.pack("<II", crc, size)
        elif name in BOMBS:
            out += bomb(name)
        elif name not in GZIP_MUTATIONS:
            name += "+gzip"
    return name, out
