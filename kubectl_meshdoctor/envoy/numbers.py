"""Integers read from outside text (Envoy admin bodies, logs, /proc): ASCII digits only, and never more of them
than the field can hold.

`str.isdigit()` is True for `²` and `٣`, which `int()` then rejects or reads as a number no peer sent, and
`int()` refuses more than 4300 digits (Python >= 3.11); a parser that trusts either dies of one odd line.
"""

from __future__ import annotations

import re

UINT64_DIGITS = 20  # Envoy counters and gauges are uint64: anything longer was never a counter

_SIGNED = re.compile(r"-?[0-9]+", re.ASCII)
_UNSIGNED = re.compile(r"[0-9]+", re.ASCII)


def ascii_int(text: str, *, signed: bool = False, max_digits: int = UINT64_DIGITS) -> int | None:
    """`text` as an int if it is nothing but ASCII digits (a leading `-` when ``signed``), else None."""
    if len(text) > max_digits + signed or not (_SIGNED if signed else _UNSIGNED).fullmatch(text):
        return None
    return int(text)
