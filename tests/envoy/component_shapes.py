"""Envoy's component log rendered in every shape Envoy and Istio print it, from entries parsed out of real lines.

The real lines (tests/envoy/data/component_log/, Envoy 1.40 in the lab, Istio's >= 1.17 TEXT shape) are parsed,
then written out again the way each other format would have printed the same entry. Format strings and their
sources are in docs/envoy-component-log.md:
- ``envoy``: Envoy's default ``[%Y-%m-%d %T.%e][%t][%l][%n] [%g:%#] %v``, multi-line messages ended by an empty line;
- ``envoy-1.15``: Envoy <= 1.15's default, the location inside the message (``%v`` = ``[file:line] msg``), with
  ``external/envoy/`` paths as istio-proxy builds print them;
- ``istio``: Istio >= 1.17 ``%Y-%m-%dT%T.%fZ\\t%l\\tenvoy %n %g:%#\\t%v\\tthread=%t``;
- ``istio-1.9``: Istio 1.7 - 1.16 ``%Y-%m-%dT%T.%fZ\\t%l\\tenvoy %n\\t%v`` (an empty line ends a dump);
- ``istio-json``: Istio 1.17 - 1.21 ``log_as_json`` (``%j``: tags inside msg, thread a number);
- ``istio-json-1.22``: Istio >= 1.22 ``json_format`` (tags lifted into keys, msg without them, thread a string);
- ``istio-pasted``: Istio >= 1.17's shape as GitHub, Jira and Slack show it, each TAB a run of spaces
  (istio/istio#43238 and others);
- ``bare``: no timestamp, as people paste the message alone (``[C12][S34] upstream reset: ...``);
and each with the connection ids as Envoy >= 1.27 tags them or as ``[C12][S34]`` before.
"""

from __future__ import annotations

import json
import time

from kubectl_meshdoctor.envoy.component_log import ComponentLine

SHAPES = ("envoy", "envoy-1.15", "istio", "istio-1.9", "istio-pasted", "istio-json", "istio-json-1.22", "bare")


def _ids(e: ComponentLine, tags: bool) -> str:
    if e.connection is None:
        return ""
    if tags:
        inner = f'"ConnectionId":"{e.connection}"' + (f',"StreamId":"{e.stream}"' if e.stream is not None else "")
        return f"[Tags: {inner}] "
    return f"[C{e.connection}]" + (f"[S{e.stream}]" if e.stream is not None else "") + " "


def _when(ts: float, sep: str, digits: int) -> str:
    whole = time.strftime(f"%Y-%m-%d{sep}%H:%M:%S", time.gmtime(ts))
    frac = f"{ts % 1:.6f}"[2:2 + digits]
    return f"{whole}.{frac}"


def render(e: ComponentLine, shape: str, tags: bool = True) -> list[str]:
    """The physical lines ``e`` takes in ``shape``; ``tags``: ids as ``[Tags: ...]`` (Envoy >= 1.27)."""
    first, *dump = e.message.split("\n")
    location = e.location or "source/common/common/logger.cc:1"
    ts = e.ts or 0.0
    thread = e.thread if e.thread is not None else 1
    level = e.level or "debug"
    logger = e.logger or "misc"
    if shape == "envoy":
        return [f"[{_when(ts, ' ', 3)}][{thread}][{level}][{logger}] [{location}] {_ids(e, tags)}{first}",
                *dump] + ([""] if dump else [])
    if shape == "envoy-1.15":
        old = "external/envoy/" + location.removeprefix("./")
        return [f"[{_when(ts, ' ', 3)}][{thread:06d}][{level}][{logger}] [{old}] {_ids(e, tags)}{first}",
                *dump] + ([""] if dump else [])
    if shape == "istio":
        head = f"{_when(ts, 'T', 6)}Z\t{level}\tenvoy {logger} {location}\t{_ids(e, tags)}{first}"
        return [head, *dump, f"\tthread={thread}"] if dump else [f"{head}\tthread={thread}"]
    if shape == "istio-pasted":
        return [line.replace("\t", " " * (4 + len(line) % 5)) for line in render(e, "istio", tags)]
    if shape == "istio-1.9":
        return [f"{_when(ts, 'T', 6)}Z\t{level}\tenvoy {logger}\t{_ids(e, tags)}{first}", *dump] + \
            ([""] if dump else [])
    if shape == "istio-json":
        return [json.dumps({"level": level, "time": f"{_when(ts, 'T', 6)}Z", "scope": f"envoy {logger}",
                            "msg": _ids(e, tags) + e.message, "caller": location, "thread": thread})]
    if shape == "istio-json-1.22":
        doc = {"caller": location, "level": level, "msg": e.message, "scope": f"envoy {logger}",
               "thread": str(thread), "time": f"{_when(ts, 'T', 6)}Z"}
        if e.connection is not None:
            doc["ConnectionId"] = str(e.connection)
        if e.stream is not None:
            doc["StreamId"] = str(e.stream)
        return [json.dumps(doc)]
    if shape == "bare":
        return [f"{_ids(e, tags)}{first}", *dump] + ([""] if dump else [])
    raise ValueError(shape)


def render_log(lines: list[str], shape: str, tags: bool = True) -> list[str]:
    """A whole log (access-log lines and component entries) re-rendered: access-log lines stay as they are."""
    from kubectl_meshdoctor.envoy.component_log import ComponentLogReader, is_continuation, parse_component_line

    out: list[str] = []
    reader = ComponentLogReader()
    for line in lines:
        head = parse_component_line(line)
        if head is not None or (reader.open and is_continuation(line)):
            for _, entry in reader.feed(line, 0, head):
                out += render(entry, shape, tags)
            continue
        for _, entry in reader.flush():
            out += render(entry, shape, tags)
        out.append(line)
    for _, entry in reader.flush():
        out += render(entry, shape, tags)
    return out
