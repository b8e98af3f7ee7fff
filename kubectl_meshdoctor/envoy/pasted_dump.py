"""An admin dump (`/stats`, `/clusters`) as a ticket holds it, taken back to the lines Envoy's admin wrote.

People paste `/stats` and `/clusters` into issues, chats and e-mails with what those put around them (every shape
below was seen in public Istio and Envoy issues: tests/data/tickets/SOURCES.md):

- a fenced code block: a line of three or more backticks or tildes, an info string after the opening one
  (CommonMark 0.31, section 4.5: ```` ```text ````, ```` ```shell ````, ``~~~``);
- the dump inside an inline code span: a backtick before its first line and one after its last (section 6.1);
- an indented code block (section 4.4: four spaces or a tab), and e-mail quoting (``> ``, nested ``> > ``);
- a few lines of prose, or the command that made the dump, before it (``Envoy `/clusters` output:``,
  ``# kubectl exec POD -c istio-proxy -- curl localhost:15000/clusters | grep outbound``).

Envoy's admin writes no line that starts with any of these (source/server/admin/stats_render.cc: ``name: value``;
clusters_handler.cc: ``cluster::key::value``; the JSON forms start with ``{`` and are whitespace-insensitive, RFC
8259 section 2), so taking them off never changes a line of the dump itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_LEAD = 10  # lines of prose or command before a pasted dump looked through for its first line

_FENCE = re.compile(r"(?:`{3,}|~{3,})[^`]*$")
_QUOTE = re.compile(r"(?:> ?)+")
# The first line of a dump, whatever its form: `name: value` (/stats text), `cluster::...` (/clusters text), a
# JSON body (/clusters?format=json), a Prometheus exposition line (/stats/prometheus, a scrape of :15090).
# A line of /clusters text: `cluster::setting::value`, or `cluster::host::stat::value` where the host is an
# address with its port (`10.0.0.1:80`, `[fd00::1]:80`; clusters_handler.cc: address()->asString()).
CLUSTERS_TEXT_LINE = re.compile(r"^[^\s:]+::(?:\[[0-9A-Fa-f:.]+\]:\d+|[^:\s]+:\d+|[^:]+)::")
_DUMP_START = re.compile(rf'\{{|{CLUSTERS_TEXT_LINE.pattern[1:]}|[^\s"{{}}<>\[\]:]+\.[^\s"{{}}<>\[\]]*: \S'
                         r"|# (?:TYPE|HELP) ")


def unpasted_lines(lines: Iterable[str]) -> list[str]:
    """``lines`` of a pasted dump without what pasting added (this module's docstring): fence lines and blank
    lines dropped, quoting, indentation and a code span's backticks taken off each line; the prose before the
    dump (at most MAX_LEAD lines) dropped when a line of a dump follows it. Never raises."""
    out: list[str] = []
    for line in lines:
        text = line.rstrip("\r\n").lstrip("\ufeff")
        if text.startswith(">"):
            text = text[_QUOTE.match(text).end():]
        text = text.strip()
        if not text or _FENCE.fullmatch(text):
            continue
        if text.startswith("`"):
            text = text[1:]
        if text.endswith("`"):
            text = text[:-1]
        if text.strip():
            out.append(text.strip())
    start = next((i for i, text in enumerate(out[:MAX_LEAD + 1]) if _DUMP_START.match(text)), 0)
    return out[start:]


def unpasted_body(body: str) -> str:
    """``body`` (a dump as read from a file) as Envoy's admin wrote it: unpasted_lines, joined by newlines."""
    return "\n".join(unpasted_lines(body.splitlines()))
