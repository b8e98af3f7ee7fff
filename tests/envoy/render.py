"""An access-log line written the way Envoy writes it for a format (usage.rst: each operator's value, `-` when
missing, a header cut at `:N`, START_TIME by its spec; JSON typed, null when missing), so property tests can
write lines of any format and read them back. Real Envoy checks the same in test_formats_real_envoy.py."""

from __future__ import annotations

import json
import time
from typing import Any

from kubectl_meshdoctor.envoy.log_format import Operator, tokenize

# Operators whose JSON value Envoy types as a number (usage.rst: "Renders a numeric value in typed JSON logs").
_NUMERIC = {"code", "bytes_received", "bytes_sent", "duration_ms"}


def render_time(ts: float, spec: str | None) -> str:
    """START_TIME as Envoy renders it: UTC; %s, %f and %Nf are Envoy's own, the rest strftime's."""
    millis = int(round(ts * 1000)) % 1000
    if spec is None:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{millis:03d}Z"
    nanos = int(round(ts * 1000)) % 1000 * 1_000_000
    out, i = [], 0
    while i < len(spec):
        if spec[i] != "%" or i + 1 >= len(spec):
            out.append(spec[i])
            i += 1
            continue
        d = spec[i + 1]
        if d.isdigit() and spec[i + 2:i + 3] == "f":
            out.append(f"{nanos:09d}"[:int(d)])
            i += 3
        elif d == "E" and spec[i + 2:i + 4] in ("3S", "6S"):
            out.append(time.strftime("%S", time.gmtime(ts)) + "." + f"{nanos:09d}"[:int(spec[i + 2])])
            i += 4
        elif d == "f":
            out.append(f"{nanos:09d}")
            i += 2
        elif d == "s":
            out.append(str(int(ts)))
            i += 2
        else:
            out.append(time.strftime("%" + d, time.gmtime(ts)))
            i += 2
    return "".join(out)


def value_of(op: Operator, entry: dict[str, Any]) -> str:
    """What Envoy prints for ``op`` in a TEXT line of the request ``entry`` (AccessLogEntry fields)."""
    if op.command == "START_TIME":
        return render_time(entry["ts"], op.arg)
    target = op.target
    value = entry.get(target[0]) if target else None
    if target and target[0] == "flags":
        value = ",".join(value) if value else None
        if op.command == "RESPONSE_FLAGS_LONG" and value:
            from kubectl_meshdoctor.envoy.flags import flag
            value = ",".join(flag(f).long or f for f in entry["flags"])
    if value is None or value == "":
        return "-"
    text = str(value)
    return text[:op.max_length] if op.max_length is not None else text


def render_text(fmt: str, entry: dict[str, Any]) -> str:
    """The TEXT line (without its newline) Envoy writes for ``entry`` in format ``fmt``."""
    line = "".join(t if isinstance(t, str) else value_of(t, entry) for t in tokenize(fmt))
    return line.rstrip("\n")


def render_json(fmt: str, entry: dict[str, Any]) -> str:
    """The JSON line Envoy writes for ``entry`` in the JSON format ``fmt`` (typed: numbers, null for missing)."""
    def value(template: str) -> Any:
        tokens = tokenize(template)
        if len(tokens) == 1 and isinstance(tokens[0], Operator):
            op = tokens[0]
            text = value_of(op, entry)
            if text == "-":
                return None
            target = op.target
            return int(text) if target and target[0] in _NUMERIC else text
        return "".join(t if isinstance(t, str) else value_of(t, entry) for t in tokens)

    def walk(doc: dict) -> dict:
        return {k: walk(v) if isinstance(v, dict) else value(v) for k, v in doc.items()}

    return json.dumps(walk(json.loads(fmt)), separators=(",", ":"))
