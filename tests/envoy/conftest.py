"""Reference samples (copies in tests/envoy/data, see its README) split into what each parser receives."""

from __future__ import annotations

import re
from pathlib import Path

DATA = Path(__file__).parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


def logging_bodies() -> dict[str, str]:
    """logging.txt: {section title line: body exactly as Envoy sent it}."""
    text = read("logging.txt")
    bodies = {}
    for match in re.finditer(r"^=== (.+?) ===\n(?:#[^\n]*\n)*--- body start ---\n(.*?)--- body end ---", text,
                             re.S | re.M):
        bodies[match.group(1)] = match.group(2)
    return bodies


def access_log_lines() -> list[str]:
    """istio_access_log.txt: every access-log line ('#' lines are commentary)."""
    return [line for line in read("istio_access_log.txt").splitlines() if line.strip() and not line.startswith("#")]
