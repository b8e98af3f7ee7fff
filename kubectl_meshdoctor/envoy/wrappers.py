"""What people's tools put around a log line, taken off again: ``unwrap(line)`` gives the line Envoy wrote.

A line pasted from a ticket or read from a node rarely comes as Envoy wrote it. Each wrapper below is taken from
the tool that adds it (docs/access-log-formats.md, "Wrappers"):

- ``kubectl-timestamps``: ``kubectl logs --timestamps``: the kubelet's RFC 3339 time (nanoseconds, ``Z``; an
  offset is accepted too) and one space before the line.
- ``kubectl-prefix``: ``kubectl logs --prefix``: ``[pod/NAME/CONTAINER] `` (kubernetes/kubernetes
  staging/src/k8s.io/kubectl/pkg/cmd/logs/logs.go, addPrefixIfNeeded: always ``pod/``; the container may be
  empty). It comes before the kubelet's timestamp.
- ``stern``: stern's default template ``{{.PodName}} {{.ContainerName}} {{.Message}}``, with ``{{.Namespace}} ``
  before it for several namespaces (stern/stern cmd/cmd.go), coloured with ANSI escapes on a terminal; with
  ``--timestamps`` the message starts with the time (RFC 3339 with nanoseconds and the zone's offset, or
  ``01-02 15:04:05`` for ``--timestamps=short``: ``stern-timestamps``).
- ``ansi``: terminal colour escapes (ECMA-48 CSI sequences) anywhere in the line, taken off the whole line
  first (so listed first).
- ``docker-json``: Docker's json-file driver, ``{"log":"...\\n","stream":"stdout","time":"..."}``; a ``log``
  without its final ``\\n`` is a piece of a longer line (``docker-partial``).
- ``cri``: the CRI log format the kubelet keeps in /var/log/pods (``TIME stdout F text``); a ``P`` tag is a piece
  of a longer line (``cri-partial``: the reader joins the pieces).
- ``grep-n`` (``123:``), ``grep-H`` (``file:``), ``grep-Hn`` (``file:123:``), and the context lines of
  ``grep -A/-B/-C`` (``123-``, ``file-123-``). A file name is never taken for a pod.
- ``json-string``: the whole line as a JSON string (``"[2026-...] \\"GET / HTTP/1.1\\" 503 ..."``), and
  ``json-escaped``: the same without the outer quotes (a log viewer's copy of a JSON field).
- What a paste into a ticket, a chat or an e-mail adds: ``bom`` (a UTF-8 byte-order mark, as Windows editors
  write), ``quote`` (``> ``, nested ``> > ``), ``backticks`` (a line in inline code), ``k9s`` (its log view's
  ``│ ... │`` borders), ``indent`` (a Markdown code block's four spaces, or a tab), ``bullet`` (``- ``, ``* ``),
  and ``label`` (one name before the line: ``istio-proxy ``, docker compose's ``app-envoy-1     | ``). Each is
  taken off only when what remains starts as a line Envoy writes (or another wrapper) does.

Never eats part of Envoy's own lines: an access-log line starts with ``[2026-...]`` or ``{``, Envoy's component
log with ``[2026-12-03 13:40:08.211][12][debug]`` or (Istio's format) ``2026-12-03T13:40:08.210633Z<TAB>``.
The wrappers whose prefix could be the start of a line (stern's words, grep's file names and numbers) are taken
off only when what remains starts as one of those lines does, or as another wrapper.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_NAME = 4096  # PATH_MAX: a grep file name is no longer
MAX_DEPTH = 8  # wrappers nest a few deep (grep over kubectl --prefix --timestamps over CRI); more is not a log

# An RFC 3339 date-time: the kubelet's (RFC3339Nano, Z), CRI's, Docker's, stern's (offset).
_RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)"
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:(Z)|([+-])(\d\d):(\d\d))")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_CRI = re.compile(rf"({_RFC3339}) (stdout|stderr) ([FP]) ?")
_TIMESTAMP = re.compile(rf"({_RFC3339}) ")
_STERN_SHORT = re.compile(r"\d\d-\d\d \d\d:\d\d:\d\d ")
_PREFIX = re.compile(r"\[pod/([^/\]\s]+)/([^/\]\s]*)\] ")
# Kubernetes object names: a pod is a DNS-1123 subdomain, a container and a namespace DNS-1123 labels.
_LABEL, _SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_STERN = re.compile(rf"({_SUBDOMAIN}) ({_LABEL}) ")
_STERN_NAMESPACED = re.compile(rf"({_LABEL}) ({_SUBDOMAIN}) ({_LABEL}) ")
_GREP_N = re.compile(r"(\d{1,12})([:-])")
_SEPARATOR = re.compile(r"[:-]")
# Where a line Envoy wrote, or another wrapper, can start: a bracketed time (access log, Envoy's component log),
# a JSON object, an RFC 3339 time (Istio's component log, CRI, kubectl), kubectl's prefix, a JSON string; and
# the continuation lines of Envoy's multi-line debug messages: a header of a dumped header map
# (`'name', 'value'`) and, in Istio's format, the message's end (`<TAB>thread=N`); and an access-log line pasted
# without its `[START_TIME] `.
# That untimed access-log start: the quoted request line (`"- - -"` for tcp_proxy), the code and the flags. The
# access-log reader (access_log.py) reads such a line; here it is where a line starts.
UNTIMED_ACCESS_START = r'"(?:- - -|[!#$%&\'*+.^_`|~0-9A-Za-z-]+ [^"]* [^" ]+)" \d{1,3} (?:[A-Z][A-Za-z0-9,]*|-)(?: |$)'
_START = re.compile(r'\[\d{4}-\d\d-\d\d[T ]\d\d:\d\d|\{|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|\[pod/|"\[|"\{'
                    r"|'[^']*', '|\tthread=\d+$|\[C\d+\]|\[Tags: |\[Envoy \(Epoch \d+\)\] |" + UNTIMED_ACCESS_START)
_DOCKER_KEYS = frozenset({"log", "stream", "time", "attrs"})
# What pasting adds around a line (a ticket, a chat, an e-mail's quoting, a terminal's log viewer).
_QUOTE = re.compile(r"(?:> ?)+")
_K9S = re.compile(r"│ ?(.*?) *│?\s*$")
_INDENT = re.compile(r"(?: {2,}|\t+)")
_BULLET = re.compile(r"[-*•] +")
_LABEL_PREFIX = re.compile(rf"({_LABEL})(?: +\| ?| +)")


@dataclass(frozen=True, slots=True)
class Unwrapped:
    """A line with its wrappers taken off: ``text`` as Envoy wrote it (JSON-unescaped where a wrapper escaped it),
    the time a wrapper carried (``ts``, seconds since the epoch), the pod and container a wrapper named
    (kubectl --prefix, stern; never a grep file name), and the ``wrappers`` removed, outermost first."""

    text: str
    ts: float | None = None
    pod: str | None = None
    container: str | None = None
    wrappers: tuple[str, ...] = ()

    @property
    def partial(self) -> bool:
        """Whether ``text`` is a piece of a longer line (CRI ``P``, Docker's split lines) that the next
        record continues."""
        return any(w.endswith("-partial") for w in self.wrappers)


def rfc3339(text: str) -> float | None:
    """``2026-12-03T13:40:08.210633123Z`` (or with an offset) -> seconds since the epoch; None if not RFC 3339.
    Nanoseconds are kept as far as a float holds them (about a microsecond today)."""
    m = _TIME.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second <= 60):
        return None
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if m.group(9):
        offset = int(m.group(10)) * 3600 + int(m.group(11)) * 60
        seconds -= offset if m.group(9) == "+" else -offset
    return seconds + (int(m.group(7)) / 10 ** len(m.group(7)) if m.group(7) else 0.0)


def unwrap(line: str) -> Unwrapped:
    """``line`` without the wrappers listed in this module's docstring, in any nesting; a line with none comes
    back as ``Unwrapped(line)`` (trailing ``\\r\\n`` aside). Never raises."""
    return _ENVOY.layers(line)[-1]


def unwrap_layers(line: str, start: re.Pattern[str] | None = None) -> tuple[Unwrapped, ...]:
    """Every stage of ``unwrap(line)``, from the line itself to the innermost text, one wrapper more off at each:
    a reader that knows the line's format can take the innermost stage its format reads (a format that starts
    with an RFC 3339 time looks like kubectl's timestamp). ``start``: where a line of the user's own format
    starts (LogFormat.head), so grep's and stern's prefixes come off before such a line too. Never raises."""
    peeler = _ENVOY if start is None else _Peeler(re.compile(f"{_START.pattern}|{start.pattern}"))
    return peeler.layers(line)


Step = tuple[str, str, "float | None", "str | None", "str | None"]  # inner text, name, ts, pod, container


@dataclass(frozen=True, slots=True)
class _Peeler:
    """Takes wrappers off, one at a time, outermost first. ``start``: where a line Envoy writes can start, the
    guard of the wrappers whose prefix could be part of the line itself."""

    start: re.Pattern[str]

    def layers(self, line: str) -> tuple[Unwrapped, ...]:
        """The line, then the line with one more wrapper off, to the innermost text."""
        text = line.rstrip("\r\n")
        out = [Unwrapped(text)]
        try:
            for _ in range(MAX_DEPTH):
                last = out[-1]
                step = self.peel(last.text, last.wrappers[-1] if last.wrappers else "")
                if step is None:
                    break
                text, name, ts, pod, container = step
                out.append(Unwrapped(text, last.ts if last.ts is not None else ts,
                                     last.pod if last.pod is not None else pod,
                                     last.container if last.pod is not None else container,
                                     (*last.wrappers, name)))
        except (ValueError, TypeError, RecursionError, OverflowError):  # a hostile line: whatever it is, not ours
            return (Unwrapped(line.rstrip("\r\n")),)
        return tuple(out)

    def peel(self, text: str, outer: str) -> Step | None:
        """The outermost wrapper of ``text``, or None."""
        if "\x1b" in text:
            stripped = _ANSI.sub("", text)
            if stripped != text:
                return stripped, "ansi", None, None, None
        head = text[:1]
        if head == "{" and text.startswith('{"'):
            step = _docker(text)
            if step is not None:
                return step
        if head == '"':
            return _json_string(text)
        if head == "[":
            m = _PREFIX.match(text)
            if m:
                return text[m.end():], "kubectl-prefix", None, m.group(1), m.group(2) or None
        if head.isdigit():
            m = _CRI.match(text)
            if m:
                return (text[m.end():], "cri-partial" if m.group(3) == "P" else "cri", rfc3339(m.group(1)), None,
                        None)
            m = _TIMESTAMP.match(text)
            if m:
                name = "stern-timestamps" if outer == "stern" else "kubectl-timestamps"
                return text[m.end():], name, rfc3339(m.group(1)), None, None
            m = _STERN_SHORT.match(text) if outer == "stern" else None
            if m:
                return text[m.end():], "stern-timestamps", None, None, None
        if not self.start.match(text):  # a line Envoy (or Istio) starts so has no prefix of stern's or grep's
            step = self.stern(text) or self.grep(text)
            if step is not None:
                return step
        if '\\"' in text and '"' not in text.replace('\\"', ""):
            return _json_escaped(text)
        return self.pasted(text)

    def pasted(self, text: str) -> Step | None:
        """What pasting put around the line (the module's docstring), taken off only before a line's start."""
        if text.startswith("\ufeff"):
            return text[1:], "bom", None, None, None
        head = text[:1]
        if head == ">":
            rest = text[_QUOTE.match(text).end():]
            return (rest, "quote", None, None, None) if self.leads(rest) or self.guarded(rest) else None
        if head == "`" and text.rstrip().endswith("`") and len(text.rstrip()) > 2:
            rest = text.strip()[1:-1]
            return (rest, "backticks", None, None, None) if self.leads(rest) else None
        if head == "│":
            m = _K9S.match(text)
            return (m.group(1), "k9s", None, None, None) if m and self.leads(m.group(1)) else None
        if head in (" ", "\t"):
            m = _INDENT.match(text)
            rest = text[m.end():] if m else ""
            return (rest, "indent", None, None, None) if rest and self.leads(rest) else None
        if head and head in "-*•":
            m = _BULLET.match(text)
            return (text[m.end():], "bullet", None, None, None) if m and self.leads(text[m.end():]) else None
        m = _LABEL_PREFIX.match(text)
        if m and self.strict(text[m.end():]):
            return text[m.end():], "label", None, None, None
        return None

    def leads(self, rest: str, depth: int = 0) -> bool:
        """Whether ``rest`` starts as a line Envoy writes does, or as another of pasting's wrappers around one
        (an indented bullet, a quoted code span): a few deep at most."""
        if self.strict(rest):
            return True
        if depth >= 3 or not rest or rest[:1] not in " \t>`│-*•":
            return False
        inner = _PEEL_PASTED.get(rest[:1], lambda r: None)(rest)
        return inner is not None and self.leads(inner, depth + 1)

    def strict(self, rest: str) -> bool:
        """Whether ``rest`` starts as a line Envoy writes does, or as a wrapper with a shape of its own."""
        return bool(self.start.match(rest) or _TIMESTAMP.match(rest) or _CRI.match(rest)
                    or rest.startswith("\x1b["))

    def guarded(self, rest: str) -> bool:
        """The test a prefix that could be part of the line itself (grep's, stern's) must pass before it is
        taken off: what remains starts as a line Envoy writes, or another wrapper, does. Bounded: stern's words
        and a grep line number are the only loose wrappers looked through, and only for a strict start after
        them."""
        if self.strict(rest):
            return True
        return any(m is not None and self.strict(rest[m.end():])
                   for m in (_STERN.match(rest), _STERN_NAMESPACED.match(rest), _GREP_N.match(rest)))

    def stern(self, text: str) -> Step | None:
        """stern's ``POD CONTAINER `` (or ``NAMESPACE POD CONTAINER ``): taken off only before a line's start."""
        for shape in (_STERN, _STERN_NAMESPACED):
            m = shape.match(text)
            if m and (self.strict(text[m.end():]) or _STERN_SHORT.match(text, m.end())):
                return text[m.end():], "stern", None, m.group(shape.groups - 1), m.group(shape.groups)
        return None

    def grep(self, text: str, nested: bool = True) -> Step | None:
        """grep's prefixes: ``N:`` (-n), ``FILE:`` (-H), ``FILE:N:`` (-Hn), and ``-`` for the context lines of
        -A/-B/-C. A file name may hold ``:`` and ``-`` itself, so every split is tried, leftmost first, and the
        one whose remainder starts as a log line does is taken. ``nested``: look through one more grep prefix
        (grep -n over grep -H's output)."""
        m = _GREP_N.match(text)
        if m and (self.guarded(text[m.end():]) or nested and self.grep(text[m.end():], nested=False)):
            return text[m.end():], "grep-n", None, None, None
        for found in _SEPARATOR.finditer(text, 1, MAX_NAME):
            cut, sep = found.start(), found.group()
            rest = text[cut + 1:]
            m = _GREP_N.match(rest)
            if m and m.group(2) == sep and self.guarded(rest[m.end():]):
                return rest[m.end():], "grep-Hn", None, None, None
            if self.guarded(rest):
                return rest, "grep-H", None, None, None
        return None


def _pasted_inner(pattern: re.Pattern[str]) -> "Callable[[str], str | None]":
    def inner(text: str) -> str | None:
        m = pattern.match(text)
        return text[m.end():] if m else None
    return inner


# What one of pasting's wrappers leaves, by its first character, for Peeler.leads' look ahead.
_PEEL_PASTED: "dict[str, Callable[[str], str | None]]" = {
    ">": _pasted_inner(_QUOTE), " ": _pasted_inner(_INDENT), "\t": _pasted_inner(_INDENT),
    "-": _pasted_inner(_BULLET), "*": _pasted_inner(_BULLET), "•": _pasted_inner(_BULLET),
    "`": lambda t: t.strip()[1:-1] if t.rstrip().endswith("`") and len(t.strip()) > 2 else None,
    "│": lambda t: m.group(1) if (m := _K9S.match(t)) else None,
}

_ENVOY = _Peeler(_START)


def _docker(text: str) -> tuple[str, str, float | None, None, None] | None:
    """Docker's json-file record (moby daemon/logger/jsonfilelog): log, stream, time; never an access-log JSON
    line, which has none of those keys but many others."""
    if not text.startswith('{"log":') and '"log":' not in text[:200]:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("log"), str) or not set(doc) <= _DOCKER_KEYS:
        return None
    log: str = doc["log"]
    when = doc.get("time")
    ts = rfc3339(when) if isinstance(when, str) else None
    if log.endswith("\n"):
        return log[:-1].rstrip("\r"), "docker-json", ts, None, None
    return log, "docker-partial", ts, None, None


def _json_string(text: str) -> tuple[str, str, None, None, None] | None:
    if len(text) < 2 or not text.endswith('"'):
        return None
    try:
        inner = json.loads(text)
    except ValueError:
        return None
    if not isinstance(inner, str):
        return None
    return inner.rstrip("\r\n"), "json-string", None, None, None


def _json_escaped(text: str) -> tuple[str, str, None, None, None] | None:
    """A line whose every quote is escaped: a JSON string's contents copied without its quotes."""
    try:
        inner = json.loads(f'"{text}"')
    except ValueError:
        return None
    if not isinstance(inner, str) or inner == text:
        return None
    return inner.rstrip("\r\n"), "json-escaped", None, None, None
