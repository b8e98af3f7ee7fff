"""Text from the traffic, the logs and the cluster, made safe to show on a terminal.

A request target, a header, a log line or a cluster name is the traffic's, and this tool runs beside production
traffic: a control byte in it must not reach the terminal (ESC starts an escape sequence that can move the
cursor, retitle the window or rewrite what was shown; C1 0x9b is a CSI by itself on 8-bit terminals), and a
bidirectional override must not reorder what the reader sees (CVE-2021-42574, "Trojan Source"). Each such
character is shown as its escape (``\\x1b``, ``\\u202e``): visible, and what the bytes were.
"""

from __future__ import annotations

import os

# C0 controls, DEL, C1 controls, and Unicode's bidirectional embeddings, overrides and isolates.
_UNSAFE = (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_ONE_LINE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _UNSAFE}
_BLOCK = {c: e for c, e in _ONE_LINE.items() if c not in (0x09, 0x0A)}  # tabs and newlines lay a block out
MAX_SHOWN = 4096  # characters of one value a cell shows; the rest is said to be cut


def one_line(value: object, limit: int = MAX_SHOWN) -> str:
    """``value`` as one line of printable text: every control character (newlines and tabs too) as its escape,
    and at most ``limit`` characters, the cut said with the count left."""
    text = str(value)
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    text = text.translate(_ONE_LINE)
    return f"{text}... ({cut} more characters)" if cut > 0 else text


def block(value: object) -> str:
    """``value`` as printable lines: newlines and tabs kept, every other control character as its escape."""
    return str(value).translate(_BLOCK)


def is_safe(text: str, *, lines: bool = False) -> bool:
    """Whether ``text`` needs no escaping (``lines``: newlines and tabs allowed)."""
    table = _BLOCK if lines else _ONE_LINE
    return not any(ord(ch) in table for ch in text)


def files_described(paths: list[str]) -> str:
    """The files of an offline run as the screen's header names them: each, up to three; more, by count and the
    directory they share, so that a dozen captures do not take the screen of an 80x24 terminal."""
    if len(paths) <= 3:
        return f"files: {' '.join(paths)}"
    dirs = {os.path.dirname(os.path.abspath(p)) for p in paths}
    try:
        under = os.path.commonpath(sorted(dirs))
    except ValueError:  # no directory in common
        under = ""
    where = f" under {under}" if under and under != os.sep else ""
    return f"files: {len(paths)} in {len(dirs)} director{'y' if len(dirs) == 1 else 'ies'}{where}"
