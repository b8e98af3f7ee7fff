"""``%START_TIME(SPEC)%`` read back: the text Envoy rendered for a time spec, to seconds since the epoch.

Sources: envoyproxy/envoy ``docs/root/configuration/observability/access_log/usage.rst`` (%START_TIME%: a
``std::put_time``-style spec plus ``%s``, ``%f`` and ``%[1-9]f``; the default rendering is
``%Y-%m-%dT%H:%M:%E3SZ``, UTC with milliseconds), checked against real Envoy 1.40 (tests/envoy/
test_formats_real_envoy.py): ``%f`` prints 9 digits, ``%e`` pads with a space, ``%E3S`` is ``SS.mmm``, ``%z``
is ``+0000``. Envoy renders START_TIME in UTC; an offset in the text (``%z``, ``%Ez``) is honoured.
"""

from __future__ import annotations

import calendar
import re
from datetime import datetime
from collections.abc import Callable
from dataclasses import dataclass

from .numbers import ascii_int

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH_NAMES = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
                "october", "november", "december")
_DAYS = "Mon|Tue|Wed|Thu|Fri|Sat|Sun"
_DAY_NAMES = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"

# Directive -> (regex, group name or None). Only what a time of day and a date can be read from is named.
_DIRECTIVES: dict[str, tuple[str, str | None]] = {
    "Y": (r"\d{4}", "Y"), "E4Y": (r"\d{4}", "Y"), "y": (r"\d\d", "y"), "C": (r"\d\d", None),
    "m": (r"\d\d", "m"), "d": (r"\d\d", "d"), "e": (r"[ \d]\d", "d"), "j": (r"\d{3}", "j"),
    "H": (r"\d\d", "H"), "k": (r"[ \d]\d", "H"), "I": (r"\d\d", "I"), "l": (r"[ \d]\d", "I"),
    "M": (r"\d\d", "M"), "S": (r"\d\d", "S"), "p": (r"AM|PM|am|pm", "p"),
    "b": ("|".join(m.capitalize() for m in _MONTHS), "b"), "h": ("|".join(m.capitalize() for m in _MONTHS), "b"),
    "B": ("|".join(m.capitalize() for m in _MONTH_NAMES), "B"),
    "a": (_DAYS, None), "A": (_DAY_NAMES, None), "u": (r"[1-7]", None), "w": (r"[0-6]", None),
    "z": (r"[+-]\d{4}", "z"), "Ez": (r"[+-]\d\d:\d\d", "z"), "Z": (r"[A-Za-z]{1,5}|[+-]\d{2,4}", None),
    "s": (r"\d{1,12}", "s"), "f": (r"\d{9}", "f"), "E*S": (r"\d\d(?:\.\d+)?", "ES"),
    "n": (r"\n", None), "t": (r"\t", None), "%": (r"%", None),
}
_ALIASES = {"T": "%H:%M:%S", "F": "%Y-%m-%d", "D": "%m/%d/%y", "R": "%H:%M", "r": "%I:%M:%S %p"}
_DIRECTIVE = re.compile(r"%(E\*S|E\dS|E4Y|Ez|\d?f|[A-Za-z%])")

DEFAULT_PATTERN = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)"


class TimeSpecError(ValueError):
    """A START_TIME spec with a directive meshdoctor cannot read back; the message is one line."""


@dataclass(frozen=True, slots=True)
class TimeSpec:
    """A compiled START_TIME spec: ``pattern`` matches what Envoy renders (no groups of its own), ``parse`` turns
    that text into seconds since the epoch, or None when the text does not name a whole instant (a spec with
    no date, or a value out of range)."""

    spec: str | None  # None: the default rendering
    pattern: str
    parse: Callable[[str], float | None]
    dated: bool  # whether the spec names a whole instant (a date and a time, or %s)


def compile_time(spec: str | None) -> TimeSpec:
    """The reader of ``%START_TIME(spec)%`` (``spec`` None: ``%START_TIME%``). Raises TimeSpecError for a
    directive it cannot read (a locale's %c or %x, whose text varies)."""
    if spec is None:
        return TimeSpec(None, DEFAULT_PATTERN, _iso, True)
    text = _expand(spec)
    parts: list[str] = []
    names: set[str] = set()
    pos = 0
    for m in _DIRECTIVE.finditer(text):
        parts.append(re.escape(text[pos:m.start()]))
        pos = m.end()
        directive = m.group(1)
        if re.fullmatch(r"E\dS", directive):
            regex, name = rf"\d\d\.\d{{{directive[1]}}}", "ES"
        elif re.fullmatch(r"\df", directive):
            regex, name = rf"\d{{{directive[0]}}}", "f"
        elif directive in _DIRECTIVES:
            regex, name = _DIRECTIVES[directive]
        else:
            raise TimeSpecError(f"START_TIME directive %{directive} cannot be read back (its text depends on the "
                                f"locale or is unknown)")
        if name is None or name in names:
            parts.append(f"(?:{regex})")
        else:
            names.add(name)
            parts.append(f"(?P<{name}>{regex})")
    parts.append(re.escape(text[pos:]))
    full = re.compile("".join(parts))
    day = "j" in names or "d" in names and bool({"m", "b", "B"} & names)
    clock = {"H", "M"} <= names or {"I", "M", "p"} <= names or "ES" in names and "M" in names
    dated = "s" in names or bool({"Y", "y"} & names) and day and clock
    plain = re.sub(r"\(\?P<\w+>", "(?:", full.pattern)

    def parse(rendered: str) -> float | None:
        match = full.fullmatch(rendered)
        return _instant(match.groupdict()) if match else None

    return TimeSpec(spec, plain, parse, bool(dated))


def _expand(spec: str) -> str:
    """%T, %F, %D, %R and %r written out (absl::FormatTime and strftime agree on them)."""
    out, pos = [], 0
    for m in re.finditer(r"%(.)", spec):
        out.append(spec[pos:m.start()])
        out.append(_ALIASES.get(m.group(1), m.group(0)))
        pos = m.end()
    out.append(spec[pos:])
    return "".join(out)


def _iso(text: str) -> float | None:
    if len(text) == 24 and text[23] == "Z":  # Envoy's own rendering, `2026-12-03T13:40:08.211Z`: the common case
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            return None
    m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:(Z)|([+-])(\d\d):?(\d\d))", text)
    if m is None:
        return None
    fraction = m.group(7) or ""
    zone = None if m.group(8) else f"{m.group(9)}{m.group(10)}{m.group(11)}"
    return _instant({"Y": m.group(1), "m": m.group(2), "d": m.group(3), "H": m.group(4), "M": m.group(5),
                     "S": m.group(6), "frac": fraction, "z": zone})


def _instant(g: dict[str, str | None]) -> float | None:
    """Seconds since the epoch from the named parts of a rendered time; None when they name no instant."""
    fraction = 0.0
    digits = g.get("f") or g.get("frac")
    if g.get("ES"):
        seconds, _, digits = (g["ES"] or "").partition(".")
        g = {**g, "S": seconds}
    if digits:
        fraction = int(digits) / 10 ** len(digits)
    if g.get("s"):
        return int(g["s"] or 0) + fraction
    year = ascii_int(g.get("Y") or "") if g.get("Y") else (2000 + int(g["y"] or 0) if g.get("y") else None)
    month = int(g["m"]) if g.get("m") else _month(g.get("b"), g.get("B"))
    day = int((g.get("d") or "0").strip() or 0)
    hour = int((g.get("H") or "0").strip() or 0)
    if g.get("I"):
        hour = int((g["I"] or "0").strip()) % 12 + (12 if (g.get("p") or "").upper() == "PM" else 0)
    minute, second = int(g.get("M") or 0), int(g.get("S") or 0)
    if year is None:
        return None
    if g.get("j"):
        month, day = 1, int(g["j"] or 0)
        if not 1 <= day <= 366:
            return None
    elif not (month and 1 <= month <= 12 and 1 <= day <= 31):
        return None
    if hour > 23 or minute > 59 or second > 60:
        return None
    epoch = calendar.timegm((year, month, 1, hour, minute, second, 0, 0, 0)) + (day - 1) * 86400
    zone = g.get("z")
    if zone:
        sign = -1 if zone[0] == "-" else 1
        digits_only = zone[1:].replace(":", "")
        epoch -= sign * (int(digits_only[:2]) * 3600 + int(digits_only[2:4] or 0) * 60)
    return epoch + fraction


def _month(short: str | None, full: str | None) -> int | None:
    if short:
        return _MONTHS.index(short.lower()) + 1
    if full:
        return _MONTH_NAMES.index(full.lower()) + 1
    return None
