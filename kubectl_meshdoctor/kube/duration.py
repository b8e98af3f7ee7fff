"""kubectl's duration flags, read as kubectl reads them (Go's time.ParseDuration, or bare seconds); no client
library imported, so the parser that checks every flag stays quick."""

from __future__ import annotations

import re

MAX_SECONDS = 365 * 86400.0  # a longer timeout is no timeout, and the HTTP client cannot hold one far longer
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


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
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"invalid --request-timeout {text!r}: a number of seconds or a duration such as 30s, "
                             f"1m30s or 500ms (0: no timeout)")
        seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if seconds > MAX_SECONDS:
        raise ValueError(f"invalid --request-timeout {text!r}: at most {MAX_SECONDS // 86400:.0f} days (0: no timeout)")
    return seconds or None
