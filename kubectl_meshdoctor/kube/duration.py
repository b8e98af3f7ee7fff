"""kubectl's duration flags, read as kubectl reads them (Go's time.ParseDuration, or bare seconds), and our own
spans of time in the same forms; no client library imported, so the parser that checks every flag stays quick."""

from __future__ import annotations

import re

MAX_SECONDS = 365 * 86400.0  # a longer timeout is no timeout, and the HTTP client cannot hold one far longer
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def _go_duration(text: str) -> float | None:
    """Seconds of a Go duration (``1m30s``, ``500ms``), else None."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def parse_seconds(text: str) -> float:
    """A span of time a kubectl user types (``watch --duration``, ``--ttl``, ``--start-timeout``): a number of
    seconds (``90``, ``1.5``) or a Go duration as kubectl's ``--request-timeout`` takes (``2m``, ``1m30s``,
    ``500ms``). Seconds, more than 0 and at most MAX_SECONDS. Raises ValueError, one line without the flag's
    name (the parser adds it), for anything else: ``inf`` and ``nan`` too."""
    text = text.strip()
    if len(text) > 40:
        raise ValueError(f"at most {MAX_SECONDS // 86400:.0f} days: {text[:20]!r}...")
    if re.fullmatch(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", text):
        seconds: float | None = float(text)
    else:
        seconds = _go_duration(text)
    if seconds is None:
        raise ValueError(f"not a number of seconds or a duration such as 90s, 2m or 1h30m: {text!r}")
    if seconds <= 0:
        raise ValueError(f"must be more than 0 seconds: {text!r}")
    if seconds > MAX_SECONDS:
        raise ValueError(f"at most {MAX_SECONDS // 86400:.0f} days: {text!r}")
    return seconds


def parse_request_timeout(text: str) -> float | None:
    """kubectl's ``--request-timeout``: a whole number of seconds, or a Go duration (``500ms``, ``30s``,
    ``1m30s``); 0 means no timeout (None). Seconds otherwise. Raises ValueError for anything else, negative
    durations included (kubectl refuses them too)."""
    text = text.strip()
    if len(text) > 40:  # no timeout anyone types; and int() refuses thousands of digits with its own words
        raise ValueError(f"invalid --request-timeout {text[:20]!r}...: at most 365 days (0: no timeout)")
    if re.fullmatch(r"[0-9]+", text):
        seconds = float(int(text))
    else:
        parsed = _go_duration(text)
        if parsed is None:
            raise ValueError(f"invalid --request-timeout {text!r}: a number of seconds or a duration such as 30s, "
                             f"1m30s or 500ms (0: no timeout)")
        seconds = parsed
    if seconds > MAX_SECONDS:
        raise ValueError(f"invalid --request-timeout {text!r}: at most {MAX_SECONDS // 86400:.0f} days (0: no timeout)")
    return seconds or None
