"""Header values that must not leave the machine in a report or on screen (docs/DESIGN.md, privacy)."""

from __future__ import annotations

SENSITIVE_HEADERS = frozenset({"authorization", "cookie", "set-cookie", "proxy-authorization", "x-api-key"})
REDACTED = "<redacted>"


def header_line(name: str, value: str, redact: bool = True) -> str:
    """``Name: value`` as on the wire, the value replaced for sensitive headers unless ``redact`` is False."""
    if redact and name.strip().lower() in SENSITIVE_HEADERS:
        value = REDACTED
    return f"{name}: {value}"


def raw_line(line: str, redact: bool = True) -> str:
    """A header line that did not parse (bad name bytes); its value is hidden when the name looks sensitive."""
    name, sep, _ = line.partition(":")
    if redact and sep and name.strip().lower() in SENSITIVE_HEADERS:
        return f"{name}: {REDACTED}"
    return line
