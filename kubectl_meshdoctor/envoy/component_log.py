"""Envoy's own log (the component log: `pool`, `connection`, `router`, ... at debug or trace), parsed in every
shape Envoy and Istio print it, one entry at a time.

Shapes (docs/envoy-component-log.md has each with its source):
- Envoy's default ``[%Y-%m-%d %T.%e][%t][%l][%n] [%g:%#] %v`` (envoyproxy/envoy
  source/common/common/logger.h DEFAULT_LOG_FORMAT), older builds without ``[%g:%#]``, and source paths such as
  ``external/envoy/source/...`` or ``./source/...``: any run of leading bracketed fields is read by what each
  holds, so custom ``--log-format`` patterns of the same family read too;
- Istio's proxy format ``%Y-%m-%dT%T.%fZ\\t%l\\tenvoy %n %g:%#\\t%v\\tthread=%t`` (istio/istio pkg/envoy/proxy.go,
  pkg/bootstrap; older releases without ``%g:%#`` and ``thread=``);
- Istio's ``log_as_json`` ({"level", "time", "scope": "envoy <logger>", "msg", "caller", "thread"});
- lines without a timestamp (``[debug][pool] ...``, a bare ``[C12] using existing connection``).

Connection and stream ids come as ``[C12]`` / ``[C12][S34]`` (ENVOY_CONN_LOG / ENVOY_STREAM_LOG) or, from Envoy
1.3x on, as ``[Tags: "ConnectionId":"12","StreamId":"34"]``. Messages that span lines (the HCM's header dumps
after ``request headers complete`` and ``encoding headers via codec``) are joined by ComponentLogReader.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone

LEVELS = frozenset({"trace", "debug", "info", "warning", "warn", "error", "err", "critical", "off"})
# Shapes, for what a line was read as (the report counts them).
ENVOY_DEFAULT, ISTIO_TEXT, ISTIO_JSON, BARE = "envoy", "istio", "istio-json", "bare"

MAX_MESSAGE_CHARS = 16_384  # a header dump of a huge request is cut here: the facts read sit at its head
MAX_CONTINUATION_LINES = 200

# spdlog's %z is `+02:00`; a --log-format may put a space before it (`%T.%e %z`).
_TIME = r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?: ?(?:Z|[+-]\d\d:?\d\d))?"
_TIME_RE = re.compile(_TIME)
_SPACED_OFFSET = re.compile(r" ([+-]\d\d:?\d\d)$")
_BRACKET = re.compile(r"\[([^\[\]]{0,300})\]")
_LOCATION = re.compile(r"(?:[\w.\-]*/)*[\w.\-]+\.(?:cc|h|cpp|c|hpp):\d+")
_LOGGER = re.compile(r"[a-z][a-z0-9_]{0,30}")
# Istio's TAB-separated shape; pasted into GitHub, Jira or Slack its TABs come back as runs of spaces, so any
# run of blanks separates its fields (a source location has none; the message is what follows it).
_ISTIO_TEXT = re.compile(
    rf"({_TIME})[\t ]+([a-z]+)[\t ]+envoy ([a-z][a-z0-9_]*)(?: ((?:[\w.\-]*/)*[\w.\-]+\.(?:cc|h|cpp|c|hpp):\d+))?"
    rf"(?:[\t ]+(.*?))??(?:[\t ]+thread=(\d+))?$", re.S)
_THREAD_END = re.compile(r"(.*?)[\t ]+thread=(\d+)$", re.S)
# `[C12]`, `[C12][S34]`, `[Tags: "ConnectionId":"12","StreamId":"34"]` at the head of a message.
_CONN_IDS = re.compile(r"\[C(\d+)\](?:\[S(\d+)\])?\s?")
# Envoy <= 1.15 put `[file:line] ` at the head of the message itself (LOG_PREFIX), so Istio 1.6's `%v` has it.
_MESSAGE_LOCATION = re.compile(r"\[((?:[\w.\-]*/)*[\w.\-]+\.(?:cc|h|cpp|c|hpp):\d+)\] ")
# Istio 1.4 and 1.5 wrote `[Envoy (Epoch N)] ` before Envoy's default format.
_EPOCH = re.compile(r"\[Envoy \(Epoch \d+\)\] ")
# HashiCorp Consul's hclog around Envoy: `2023-06-03T00:02:37.601Z+00:00 [debug] envoy.pool(28) [C21] ...`.
_HCLOG = re.compile(rf"({_TIME})(?:\+\d\d:\d\d)? \[([a-z]+)\] +envoy\.([a-z][a-z0-9_]*)\((\d+)\) (.*)$", re.S)
_TAGS = re.compile(r"\[Tags: ((?:\"[^\"]*\":\"[^\"]*\",?)*)\]\s?")
_TAG = re.compile(r"\"([^\"]*)\":\"([^\"]*)\"")
# Messages Envoy logs with no connection id that are still unmistakably its own when quoted alone, with no
# timestamp or level (docs/envoy-component-log.md gives their sources).
_BARE_MESSAGES = re.compile(
    r"^(?:Attached upstream connection \[C\d+\] to downstream connection \[C\d+\]"
    r"|closing connection(?: from \S+)?: no matching filter chain found"
    r"|host \S+ in cluster \S+ was ejected by the outlier detector"
    r"|max pending (?:streams|requests) overflow|no healthy host(?: for (?:HTTP|TCP) connection pool)?"
    r"|tls inspector: parseClientHello failed: .*)$")


@dataclass(frozen=True, slots=True)
class ComponentLine:
    """One entry of Envoy's component log.

    ``ts``: seconds since the epoch (UTC; Envoy's default format prints local time, which is UTC in a pod),
    None when the line carried none. ``level``: spdlog's level name as printed (``debug``, ``warning``).
    ``logger``: Envoy's logger id (``pool``, ``router``); None for a bare line. ``location``: ``file:line`` as
    printed. ``connection``/``stream``: Envoy's connection and stream ids. ``message``: the text after the ids,
    continuation lines joined with ``\\n``. ``shape``: which of ENVOY_DEFAULT, ISTIO_TEXT, ISTIO_JSON, BARE.
    ``raw``: the line as read (its first physical line for a multi-line entry).
    """

    ts: float | None
    level: str | None
    logger: str | None
    location: str | None
    thread: int | None
    connection: int | None
    stream: int | None
    message: str
    shape: str
    raw: str = ""


def parse_time(text: str) -> float | None:
    """``2026-12-03 13:40:08.211`` or ``2026-12-03T13:40:08.210633Z`` -> seconds since the epoch (UTC unless an
    offset is given); None when it is not a time. Never raises."""
    try:
        when = datetime.fromisoformat(_SPACED_OFFSET.sub(r"\1", text.replace(",", ".").replace("Z", "+00:00")))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    try:
        return when.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def _ids(message: str) -> tuple[int | None, int | None, str]:
    """(connection, stream, rest) of a message that starts with Envoy's id prefix; (None, None, message) else.
    A ``[file:line] `` before the ids (Envoy <= 1.15's own prefix) is dropped."""
    loc = _MESSAGE_LOCATION.match(message)
    if loc is not None:
        message = message[loc.end():]
    m = _CONN_IDS.match(message)
    if m:
        return int(m.group(1)), (int(m.group(2)) if m.group(2) else None), message[m.end():]
    m = _TAGS.match(message)
    if m:
        tags = dict(_TAG.findall(m.group(1)))
        conn, stream = tags.get("ConnectionId", ""), tags.get("StreamId", "")
        return (int(conn) if conn.isdigit() else None, int(stream) if stream.isdigit() else None,
                message[m.end():])
    return None, None, message


def _bracketed(text: str) -> ComponentLine | None:
    """The Envoy-default family: leading ``[...]`` fields told apart by what each holds, then the message."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(text) and len(fields) < 8:
        m = _BRACKET.match(text, pos)
        if m is None:
            break
        value = m.group(1).strip()
        key = ("ts" if _TIME_RE.fullmatch(value) else
               "thread" if value.isdigit() and fields and "level" not in fields else
               "level" if value.lower() in LEVELS and "level" not in fields else
               "location" if _LOCATION.fullmatch(value) else
               "logger" if "level" in fields and "logger" not in fields and _LOGGER.fullmatch(value) else None)
        if key is None or key in fields:
            break  # the message's own brackets ([C12], [Tags: ...]) start here
        fields[key] = value
        pos = m.end()
        if text.startswith(" ", pos) and "logger" in fields:
            pos += 1
            if not _BRACKET.match(text, pos) or not _LOCATION.fullmatch(_BRACKET.match(text, pos).group(1)):
                break
    rest = text[pos:].lstrip(" ")
    if "level" not in fields:
        return None
    if not ("ts" in fields or "logger" in fields):
        return None
    # A location without brackets ([2020-..][12][debug][pool] source/common/...cc:277] msg): older builds' %@.
    m = re.match(rf"({_LOCATION.pattern})\]?\s", rest)
    if m and "location" not in fields:
        fields["location"] = m.group(1)
        rest = rest[m.end():]
    conn, stream, message = _ids(rest)
    ts = parse_time(fields["ts"]) if "ts" in fields else None
    return ComponentLine(ts, fields["level"].lower(), fields.get("logger"), fields.get("location"),
                         int(fields["thread"]) if "thread" in fields else None, conn, stream, message,
                         ENVOY_DEFAULT if "ts" in fields else BARE, text)


def _istio_json(text: str) -> ComponentLine | None:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    scope, msg = doc.get("scope"), doc.get("msg")
    if not isinstance(scope, str) or not scope.startswith("envoy ") or not isinstance(msg, str):
        return None
    level, when, caller, thread = doc.get("level"), doc.get("time"), doc.get("caller"), doc.get("thread")
    conn, stream, message = _ids(msg)
    # Istio >= 1.22's json_format lifts the tags out of msg into keys of their own, as strings; thread too.
    if conn is None and str(doc.get("ConnectionId", "")).isdigit():
        conn = int(doc["ConnectionId"])
        stream = int(doc["StreamId"]) if str(doc.get("StreamId", "")).isdigit() else None
    if isinstance(thread, str) and thread.isdigit():
        thread = int(thread)
    return ComponentLine(parse_time(when) if isinstance(when, str) else None,
                         level.lower() if isinstance(level, str) else None, scope[len("envoy "):].strip() or None,
                         caller if isinstance(caller, str) else None,
                         thread if isinstance(thread, int) and not isinstance(thread, bool) else None,
                         conn, stream, message, ISTIO_JSON, text)


def parse_component_line(line: str) -> ComponentLine | None:
    """The head of one component-log entry in any shape above, or None for anything else (access-log lines,
    pilot-agent's own lines, a continuation line of a header dump). Never raises.

    An Istio TEXT line whose message goes on over several lines has no ``thread=`` suffix here: the
    continuation lines and the suffix follow (ComponentLogReader joins them)."""
    text = line.rstrip("\r\n")
    if not text or len(text) > 1_000_000:
        return None
    epoch = _EPOCH.match(text)
    if epoch is not None:
        text = text[epoch.end():]
        if not text:
            return None
    first = text[0]
    if first == "{":
        return _istio_json(text)
    if first.isdigit():
        m = _ISTIO_TEXT.match(text)
        if m is None:
            h = _HCLOG.match(text)
            if h is None:
                return None
            when, level, logger, thread, message = h.groups()
            conn, stream, message = _ids(message)
            return ComponentLine(parse_time(when), level.lower(), logger, None, int(thread), conn, stream,
                                 message, BARE, text)
        when, level, logger, location, message, thread = m.groups()
        if level.lower() not in LEVELS:
            return None
        conn, stream, message = _ids(message or "")
        return ComponentLine(parse_time(when), level.lower(), logger, location or None,
                             int(thread) if thread else None, conn, stream, message, ISTIO_TEXT, text)
    if first == "[":
        if text.startswith(("[C", "[Tags: ")):
            conn, stream, message = _ids(text)
            if conn is not None:
                return ComponentLine(None, None, None, None, None, conn, stream, message, BARE, text)
        try:
            return _bracketed(text)
        except (ValueError, OverflowError):
            return None
    if _BARE_MESSAGES.match(text):
        return ComponentLine(None, None, None, None, None, None, None, text, BARE, text)
    return None


def parse_component_stages(texts: Iterable[str]) -> ComponentLine | None:
    """The head of a component-log entry in the first of ``texts`` that is one: the stages of a line a wrapper
    may have come off, innermost first (envoy/wrappers.py unwrap_layers, reversed). The line itself is the
    last resort: Istio's TAB shape pasted with spaces starts as `kubectl logs --timestamps` output does."""
    return next((head for head in map(parse_component_line, texts) if head is not None), None)


class ComponentLogReader:
    """Joins physical lines into component-log entries.

    ``feed(line, number)`` returns the entries the line completes, each with the 1-based line number of its
    head: a new head completes the one before; in Istio's TEXT shape the ``\tthread=N`` that ends a multi-line
    message completes it at once. Lines that belong to no entry (access-log lines, pilot-agent's) end the entry
    before them and are otherwise ignored here (the caller reads them as what they are). ``flush()`` returns the
    entry still open at the end.
    """

    def __init__(self) -> None:
        self._open: ComponentLine | None = None
        self._number = 0
        self._more: list[str] = []
        self._chars = 0

    def feed(self, line: str, number: int = 0, head: ComponentLine | None = None) -> list[tuple[int, ComponentLine]]:
        """``head``: ``parse_component_line(line)`` when the caller already has it."""
        text = line.rstrip("\r\n")
        head = head if head is not None else parse_component_line(text)
        if head is not None:
            done = self.flush()
            if head.message.rstrip().endswith(":") and (head.shape != ISTIO_TEXT or head.thread is None):
                self._open, self._number = head, number  # a header dump follows
            else:
                done.append((number, head))
            return done
        if self._open is None:
            return []
        if not is_continuation(text):
            return self.flush()
        end = _THREAD_END.match(text)
        if end is not None:  # Istio's TEXT shape: `\tthread=N` ends the message
            self._add(end.group(1))
            return [(n, replace(entry, thread=int(end.group(2)))) for n, entry in self.flush()]
        self._add(text)
        return []

    @property
    def open(self) -> bool:
        """Whether an entry's continuation lines are being collected (a header dump)."""
        return self._open is not None

    def _add(self, text: str) -> None:
        if text.strip() and len(self._more) < MAX_CONTINUATION_LINES and self._chars < MAX_MESSAGE_CHARS:
            self._more.append(text)
            self._chars += len(text)

    def flush(self) -> list[tuple[int, ComponentLine]]:
        if self._open is None:
            return []
        entry = self._open
        if self._more:
            entry = replace(entry, message=(entry.message + "\n" + "\n".join(self._more))[:MAX_MESSAGE_CHARS])
        number = self._number
        self._open, self._more, self._chars = None, [], 0
        return [(number, entry)]


def is_continuation(text: str) -> bool:
    """A line of a header dump (``':status', '503'``, ``'x-request-id', '...'``) or the ``\tthread=N`` that
    ends one in Istio's TEXT shape."""
    stripped = text.strip()
    return stripped.startswith("'") or stripped.startswith("thread=") or text.startswith("\t")


def read_component_log(lines: Iterable[str]) -> Iterator[tuple[int, ComponentLine]]:
    """Every component-log entry of ``lines`` (an istio-proxy container log, Envoy's stderr), in order, with
    the 1-based number of its first line."""
    reader = ComponentLogReader()
    for number, line in enumerate(lines, 1):
        yield from reader.feed(line, number)
    yield from reader.flush()
