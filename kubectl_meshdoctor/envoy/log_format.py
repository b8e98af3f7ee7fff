"""Envoy access-log format strings compiled into readers: what ``meshConfig.accessLogFormat`` (or an Envoy
``log_format``) makes Envoy write, read back into the fields of an AccessLogEntry.

Sources (docs/access-log-formats.md):
- envoyproxy/envoy ``docs/root/configuration/observability/access_log/usage.rst`` (command operators,
  ``%REQ(X?Y):Z%``, ``-`` for a missing value, format dictionaries) and
  ``source/common/formatter/substitution_formatter.cc`` (the parser: an operator is
  ``%[A-Z0-9_]+(\\([^)]*\\))?(:[0-9]+)?%``, anything else is literal text);
- real Envoy 1.40 (tests/envoy/test_formats_real_envoy.py): ``%%`` writes one ``%``; a header value is written
  as it came (a user agent may hold ``"``); JSON values are typed (numbers, ``null`` for missing).

A TEXT format becomes one regular expression: literal text as written, each operator a group whose pattern
follows what the operator prints (a number, response flags, a token, a time of the START_TIME spec, free text)
and whether it sits inside quotes. A JSON format maps each key to the operators of its value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .start_time import TimeSpec, TimeSpecError, compile_time

MISSING = "-"
_COMMAND = re.compile(r"%([A-Z0-9_]+)(?:\(([^)]*)\))?(?::([0-9]+))?%")
_HEADER_COMMANDS = ("REQ", "RESP", "TRAILER")
# Headers whose values are credentials (docs/DESIGN.md, privacy): a format that logs them (%REQ(AUTHORIZATION)%,
# a JSON key "cookie") hands their values on apart, so the line can be quoted with them hidden.
SENSITIVE_HEADERS = frozenset({"authorization", "cookie", "set-cookie", "proxy-authorization", "x-api-key"})

# Request headers (lower case, as Envoy matches them) -> the entry field; rank 1 is a stand-in used only when
# the format has no operator of rank 0 for that field.
_REQUEST_HEADERS: dict[str, tuple[str, int]] = {
    ":method": ("method", 0), ":path": ("path", 0), "x-envoy-original-path": ("path", 0),
    "x-forwarded-for": ("x_forwarded_for", 0), "user-agent": ("user_agent", 0), "x-request-id": ("request_id", 0),
    ":authority": ("authority", 0), "host": ("authority", 1),
}
_RESPONSE_HEADERS: dict[str, tuple[str, int]] = {"x-envoy-upstream-service-time": ("upstream_service_time", 0)}
_COMMANDS: dict[str, tuple[str, int]] = {
    "START_TIME": ("ts", 0), "PROTOCOL": ("protocol", 0), "RESPONSE_CODE": ("code", 0),
    "RESPONSE_FLAGS": ("flags", 0), "RESPONSE_FLAGS_LONG": ("flags", 1),
    "RESPONSE_CODE_DETAILS": ("details", 0), "CONNECTION_TERMINATION_DETAILS": ("termination_details", 0),
    "UPSTREAM_TRANSPORT_FAILURE_REASON": ("upstream_failure", 0),
    "BYTES_RECEIVED": ("bytes_received", 0), "BYTES_SENT": ("bytes_sent", 0), "DURATION": ("duration_ms", 0),
    "UPSTREAM_HOST": ("upstream_host", 0), "UPSTREAM_REMOTE_ADDRESS": ("upstream_host", 1),
    "UPSTREAM_CLUSTER": ("upstream_cluster", 0), "UPSTREAM_CLUSTER_RAW": ("upstream_cluster", 0),
    "UPSTREAM_LOCAL_ADDRESS": ("upstream_local", 0), "DOWNSTREAM_LOCAL_ADDRESS": ("downstream_local", 0),
    "DOWNSTREAM_REMOTE_ADDRESS": ("downstream_remote", 0), "DOWNSTREAM_DIRECT_REMOTE_ADDRESS": ("downstream_remote", 1),
    "REQUESTED_SERVER_NAME": ("requested_server_name", 0), "ROUTE_NAME": ("route_name", 0),
}
# What an operator prints, for the pattern of its group.
_NUMBERS = {"RESPONSE_CODE", "BYTES_RECEIVED", "BYTES_SENT", "DURATION", "REQUEST_DURATION", "REQUEST_TX_DURATION",
            "RESPONSE_DURATION", "RESPONSE_TX_DURATION", "UPSTREAM_REQUEST_ATTEMPT_COUNT", "CONNECTION_ID",
            "UPSTREAM_CONNECTION_ID", "REQUEST_HEADERS_BYTES", "RESPONSE_HEADERS_BYTES", "RESPONSE_TRAILERS_BYTES",
            "UPSTREAM_WIRE_BYTES_SENT", "UPSTREAM_WIRE_BYTES_RECEIVED", "UPSTREAM_HEADER_BYTES_SENT",
            "UPSTREAM_HEADER_BYTES_RECEIVED", "DOWNSTREAM_WIRE_BYTES_SENT", "DOWNSTREAM_WIRE_BYTES_RECEIVED",
            "DOWNSTREAM_HEADER_BYTES_SENT", "DOWNSTREAM_HEADER_BYTES_RECEIVED", "GRPC_STATUS_NUMBER"}
# Values Envoy prints without whitespace (details have it replaced by `_`; addresses and names have none).
_WORDS = {"PROTOCOL", "UPSTREAM_PROTOCOL", "RESPONSE_CODE_DETAILS", "CONNECTION_TERMINATION_DETAILS",
          "UPSTREAM_HOST", "UPSTREAM_CLUSTER", "UPSTREAM_CLUSTER_RAW", "REQUESTED_SERVER_NAME", "HOSTNAME"}
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"  # RFC 9110 token: a method
_FLAGS = r"[A-Za-z0-9_]+(?:,[A-Za-z0-9_]+)*"


class LogFormatError(ValueError):
    """A format string Envoy would refuse, or one meshdoctor cannot read back; the message is one line."""


@dataclass(frozen=True, slots=True)
class Operator:
    """One command operator: ``%COMMAND(ARG):MAX%``."""

    command: str
    arg: str | None = None
    max_length: int | None = None

    @property
    def text(self) -> str:
        arg = f"({self.arg})" if self.arg is not None else ""
        return f"%{self.command}{arg}{':' + str(self.max_length) if self.max_length is not None else ''}%"

    @property
    def target(self) -> tuple[str, int] | None:
        """The AccessLogEntry field this operator fills and its rank (0 first), or None."""
        if self.command in _HEADER_COMMANDS:
            table = _REQUEST_HEADERS if self.command == "REQ" else _RESPONSE_HEADERS if self.command == "RESP" else {}
            names = (self.arg or "").lower().split("?")
            return next((table[n] for n in names if n in table), None)
        return _COMMANDS.get(self.command)

    @property
    def secret(self) -> bool:
        """Whether it logs a header whose value is a credential (SENSITIVE_HEADERS)."""
        return self.command in _HEADER_COMMANDS and any(
            n.strip() in SENSITIVE_HEADERS for n in (self.arg or "").lower().split("?"))

    @property
    def kind(self) -> str:
        if self.command == "START_TIME":
            return "time"
        if self.command in _NUMBERS or self.target == ("upstream_service_time", 0):
            return "number"
        if self.command in ("RESPONSE_FLAGS", "RESPONSE_FLAGS_LONG"):
            return "flags"
        if self.target == ("method", 0):
            return "token"
        if self.command in _WORDS or self.command.endswith(("_ADDRESS", "_PORT", "_ADDRESS_WITHOUT_PORT")):
            return "word"
        return "text"


def tokenize(fmt: str) -> tuple[str | Operator, ...]:
    """A TEXT format string -> literal strings and Operators, as Envoy's parser splits it (``%%`` is a literal
    ``%``). Raises LogFormatError for a ``%`` that starts no operator, a header operator without its header or
    with more than one alternative, or an operator's argument on one that takes none."""
    out: list[str | Operator] = []
    literal: list[str] = []
    pos = 0
    while pos < len(fmt):
        at = fmt.find("%", pos)
        if at < 0:
            literal.append(fmt[pos:])
            break
        literal.append(fmt[pos:at])
        if fmt.startswith("%%", at):
            literal.append("%")
            pos = at + 2
            continue
        m = _COMMAND.match(fmt, at)
        if m is None:
            raise LogFormatError(f"no command operator at position {at} ({fmt[at:at + 24]!r}): operators look "
                                 f"like %RESPONSE_CODE% or %REQ(:METHOD)%, and a literal % is written %%")
        command, arg, length = m.group(1), m.group(2), m.group(3)
        if command in _HEADER_COMMANDS and not arg:
            raise LogFormatError(f"{m.group(0)} names no header: write %{command}(HEADER)% or %{command}(X?Y)%")
        if command in _HEADER_COMMANDS and arg.count("?") > 1:
            raise LogFormatError(f"{m.group(0)}: Envoy allows one alternative header (X?Y), not more")
        if "".join(literal):
            out.append("".join(literal))
        literal = []
        out.append(Operator(command, arg, int(length) if length is not None else None))
        pos = m.end()
    if literal and "".join(literal):
        out.append("".join(literal))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Slot:
    """A group of a compiled TEXT regex: its operator, the field it fills (and its rank there), and the
    START_TIME reader when it is a time."""

    group: str
    operator: Operator
    time: TimeSpec | None
    field: str | None
    rank: int


@dataclass(frozen=True, slots=True)
class _Key:
    """A key of a JSON format (its path through nested objects) and how its value is read: one operator (and
    its START_TIME reader), or a TEXT format of the value's several operators."""

    path: tuple[str, ...]
    reader: "Operator | LogFormat"
    time: TimeSpec | None = None


@dataclass(frozen=True)
class LogFormat:
    """A compiled access-log format. ``name`` names it (``custom`` for the user's, ``istio-1.9`` ... for the
    known ones), ``source`` is the format as given, ``encoding`` TEXT or JSON, ``fields`` the AccessLogEntry
    fields it carries, ``dated`` whether a START_TIME in it names a whole instant."""

    name: str
    source: str
    encoding: str
    fields: frozenset[str]
    dated: bool
    regex: re.Pattern[str] | None = field(default=None, repr=False)
    slots: tuple[_Slot, ...] = field(default=(), repr=False)
    keys: tuple[_Key, ...] = field(default=(), repr=False)
    required: frozenset[str] = frozenset()  # JSON: top-level keys a line must have; none: most of the keys
    head: re.Pattern[str] | None = field(default=None, repr=False)  # how its lines start, when that has a shape

    def values(self, text: str) -> dict[str, Any] | None:
        """The line's values by AccessLogEntry field (``ts`` as seconds since the epoch, the rest as printed:
        strings, or JSON's typed values; ``-`` and null for missing), or None when ``text`` is not a line of
        this format. Never raises."""
        try:
            return self._text_values(text) if self.encoding == "TEXT" else self._json_values(text)
        except (ValueError, TypeError, RecursionError, OverflowError, KeyError, IndexError):
            return None

    def _text_values(self, text: str) -> dict[str, Any] | None:
        assert self.regex is not None
        m = self.regex.fullmatch(text)
        if m is None:
            return None
        ranked: dict[str, tuple[int, Any]] = {}
        groups = m.groups()
        secrets = tuple(g for slot, g in zip(self.slots, groups) if slot.operator.secret and g and g != MISSING)
        if secrets:
            ranked["secrets"] = (0, secrets)
        for i, slot in enumerate(self.slots):
            if slot.field is None:
                continue
            value: Any = groups[i]
            if slot.time is not None:
                if value == MISSING:
                    continue
                value = slot.time.parse(value)
                if value is None:
                    if slot.time.dated:
                        return None  # a time of the spec's shape that names no instant: not a line of ours
                    continue
            have = ranked.get(slot.field)
            if have is None or (value != MISSING and (slot.rank < have[0] or have[1] == MISSING)):
                ranked[slot.field] = (slot.rank, value)
        return {name: value for name, (_, value) in ranked.items()}

    def _json_values(self, text: str) -> dict[str, Any] | None:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            return None
        ranked: dict[str, tuple[int, Any]] = {}
        secrets = _secret_values(doc, {key.path for key in self.keys
                                       if isinstance(key.reader, Operator) and key.reader.secret})
        if secrets:
            ranked["secrets"] = (0, secrets)
        found = 0
        for key in self.keys:
            value: Any = doc
            for part in key.path:
                if not isinstance(value, dict) or part not in value:
                    break
                value = value[part]
            else:
                found += 1
                if isinstance(key.reader, LogFormat):
                    for name, v in ((key.reader.values(value) if isinstance(value, str) else None) or {}).items():
                        ranked.setdefault(name, (0, v))
                    continue
                if key.time is not None and isinstance(value, str) and value != MISSING:
                    value = key.time.parse(value)
                    if value is None and key.time.dated:
                        return None  # a time of the spec's shape that names no instant: not a line of ours
                _keep(ranked, key.reader, value)
        # A line of this format holds most of its keys (or the ones it must have); a JSON line that shares a key
        # or two is another log's.
        enough = self.required <= doc.keys() if self.required else found * 2 >= len(self.keys)
        if not enough or not {"code", "flags"} & set(ranked):
            return None
        return {name: value for name, (_, value) in ranked.items()}


def _keep(ranked: dict[str, tuple[int, Any]], operator: Operator, value: Any) -> None:
    target = operator.target
    if target is None:
        return
    name, rank = target
    have = ranked.get(name)
    missing = value is None or value == MISSING
    if have is None or (rank < have[0] and not missing) or (have[1] in (None, MISSING) and not missing):
        ranked[name] = (rank, value)


def compile_format(fmt: str, name: str = "custom", required: frozenset[str] = frozenset()) -> LogFormat:
    """A TEXT format string, or a JSON object of keys to operators (``{"code": "%RESPONSE_CODE%", ...}``, as
    meshConfig.accessLogFormat takes for the JSON encoding; nesting allowed), compiled. Raises LogFormatError
    (one line) when Envoy would refuse it or nothing of it is readable: it needs %RESPONSE_CODE% or
    %RESPONSE_FLAGS%, the failures meshdoctor explains. ``required``: for a JSON format, the top-level keys a
    line must have to be one of its lines (by default: at least half of the format's keys)."""
    if not isinstance(fmt, str) or not fmt.strip():
        raise LogFormatError("the access-log format is empty")
    if fmt.lstrip().startswith("{"):
        return _compile_json(fmt, name, required)
    return _compile_text(fmt, name)


def _compile_text(fmt: str, name: str, whole: bool = True) -> LogFormat:
    tokens = list(tokenize(fmt))
    # Envoy writes the format's final newline as the end of the line; the reader has taken it off.
    while tokens and isinstance(tokens[-1], str) and not tokens[-1].strip("\r\n"):
        tokens.pop()
    if tokens and isinstance(tokens[-1], str):
        tokens[-1] = tokens[-1].rstrip("\r\n")
    parts: list[str] = []
    slots: list[_Slot] = []
    quoted = False
    head: str | None = None  # the line's start up to its first value of a shape of its own (wrappers.py's guard)
    for i, token in enumerate(tokens):
        if isinstance(token, str):
            parts.append(re.escape(token))
            quoted ^= token.count('"') % 2 == 1
            if head is None and i == 0 and len(token.strip()) >= 2:
                head = "".join(parts)
            continue
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        ends = all(isinstance(t, str) and not t.strip() for t in tokens[i + 1:])  # nothing but blanks after it
        closes_line = i + 2 == len(tokens)  # the literal after it is the format's last
        time = None
        if token.kind == "time":
            try:
                time = compile_time(token.arg)
            except TimeSpecError as e:
                raise LogFormatError(f"{token.text}: {e}") from None
        group = f"g{len(slots)}"
        pattern = _pattern(token, time, quoted, after, ends, closes_line)
        parts.append(f"(?P<{group}>{pattern})")
        field_name, rank = token.target or (None, 0)
        slots.append(_Slot(group, token, time, field_name, rank))
        if len(slots) == 1 and head is None and token.kind in ("time", "number", "flags", "token"):
            head = "".join(parts[:-1]) + f"(?:{pattern.removesuffix('|-')})"  # a value, not `-`
    if whole:  # a JSON value of several operators needs none of them in particular
        _check_readable([s.operator for s in slots])
    return LogFormat(name, fmt, "TEXT", _fields(s.operator for s in slots),
                     any(s.time is not None and s.time.dated for s in slots), re.compile("".join(parts), re.S),
                     tuple(slots), head=re.compile(head) if head else None)


def _pattern(op: Operator, time: TimeSpec | None, quoted: bool, after: str | Operator | None, ends: bool,
             closes_line: bool) -> str:
    """The regex of one operator's value: by what it prints, and, for free text, by what ends it."""
    if time is not None:
        return f"{time.pattern}|-"
    kind = op.kind
    if kind == "number":
        return r"-?[0-9]+|-"
    if kind == "flags":
        return f"{_FLAGS}|-"
    if kind == "token":
        return _TOKEN
    if kind == "word":
        return r'[^\s"]+' if quoted else r"\S+"
    if not quoted:
        return r".+" if ends else r"\S+"  # the last field may hold spaces (a route's name); others are words
    if isinstance(after, str) and after.startswith('"'):
        # The closing quote is the one followed by what the format writes after it: a value may hold `"` (a
        # user agent does, and Envoy writes it as it came).
        rest = after[1:]
        ahead = re.escape(rest) if rest else "$" if closes_line else ""
        return rf'(?:[^"]|"(?!{ahead}))*' if ahead else r'[^"]*'
    return r'[^"]*?'


def _fields(ops) -> frozenset[str]:
    return frozenset(t[0] for t in (op.target for op in ops) if t is not None)


def _check_readable(ops: list[Operator]) -> None:
    if not {"code", "flags"} & _fields(ops):
        raise LogFormatError("the format has neither %RESPONSE_CODE% nor %RESPONSE_FLAGS%: nothing in its lines "
                             "tells a failure from a success")


def _compile_json(fmt: str, name: str, required: frozenset[str]) -> LogFormat:
    try:
        doc = json.loads(fmt)
    except ValueError as e:
        raise LogFormatError(f"not a JSON object of keys to operators: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise LogFormatError('a JSON format is an object of keys to operators, e.g. {"code": "%RESPONSE_CODE%"}')
    keys: list[_Key] = []
    ops: list[Operator] = []
    for path, value in _leaves(doc, ()):
        tokens = tokenize(value)
        operators = [t for t in tokens if isinstance(t, Operator)]
        if not operators:
            continue  # a constant: Envoy writes it as it is
        ops += operators
        if len(tokens) == 1:
            time = None
            if operators[0].kind == "time":
                try:
                    time = compile_time(operators[0].arg)
                except TimeSpecError as e:
                    raise LogFormatError(f"{operators[0].text}: {e}") from None
            keys.append(_Key(path, operators[0], time))
        else:
            keys.append(_Key(path, _compile_text(value, f"{name}:{'.'.join(path)}", whole=False)))
    _check_readable(ops)
    dated = any(k.time is not None and k.time.dated or isinstance(k.reader, LogFormat) and k.reader.dated
                for k in keys)
    return LogFormat(name, fmt, "JSON", _fields(ops), dated, keys=tuple(keys), required=required)


def _leaves(doc: Mapping[str, Any], path: tuple[str, ...]):
    for key, value in doc.items():
        if isinstance(value, str):
            yield (*path, key), value
        elif isinstance(value, dict):
            yield from _leaves(value, (*path, key))


def _secret_values(doc: dict, paths: set[tuple[str, ...]]) -> tuple[str, ...]:
    """The values of a JSON line that are credentials: under a key named for a sensitive header (any case, at
    any depth: a mesh adds such keys to Istio's format), or under a key whose operator logs one."""
    out: list[str] = []

    def walk(value: Any, path: tuple[str, ...]) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, (*path, str(k)))
        elif isinstance(value, str) and value and value != MISSING and path and (
                path[-1].lower() in SENSITIVE_HEADERS or path in paths):
            out.append(value)

    walk(doc, ())
    return tuple(out)
