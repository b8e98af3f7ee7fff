"""A finding's packet evidence as a ladder (sequence) diagram across client, eth0, the sidecar and the app.

Inside an Istio pod a connection crosses two captures: on ``eth0`` between the client and the sidecar's inbound
listener (15006 after REDIRECT), and on ``lo`` between the sidecar (from 127.0.0.6) and the app. Drawing each
evidence packet as an arrow between the lanes it travels, with its flags, ports and time since the first one,
shows a challenge ACK answering a SYN, or a request crossing the app's FIN, at a glance. Plain text (box-drawing
characters), so the same lines go into the TUI and into ``-o markdown`` reports.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from kubectl_meshdoctor.core.events import split_endpoint
from kubectl_meshdoctor.core.findings import Evidence, Finding

LANES = ("client", "eth0", "sidecar", "app (lo)")
_X = (0, 12, 36, 60)  # lane columns inside the diagram; labels fit between eth0 and sidecar, sidecar and app
_TIME_W = 10  # "+1234.567 " column on the left
_NAME_W = 32  # a row's evidence name at most (after its "#145 "); the evidence list carries the whole text
MIN_NAME = 12  # a row's evidence name keeps this many columns when its lanes make room for whole labels
_MIN_LANES = 40  # narrower, a label between two lanes would be cut to nothing: the diagram scrolls instead
NOTE_INDENT = _TIME_W + 2  # where a note's text starts (after "⋮ "): a wrapped row or note goes on there


@dataclass(frozen=True, slots=True)
class Arrow:
    """One evidence packet: from lane ``start`` to lane ``end`` (indexes into LANES), ``rel_ms`` after the first
    packet of the finding; ``label`` is flags and ports (``S :40811→:5002``) and its payload's size; ``record``
    the TLS record it carries by name (``ClientHello``, ``close_notify``), which leads its text."""

    start: int
    end: int
    rel_ms: float
    label: str
    frame: int
    what: str
    record: str = ""  # the packet's TLS record by name (ClientHello, close_notify), shown before ``what``


def arrows(f: Finding) -> list[Arrow]:
    """The finding's packet evidence (those with endpoints) as arrows in time order.

    On ``lo`` a packet from the finding's server endpoint (the app) goes app -> sidecar, any other sidecar -> app.
    On other interfaces a packet from the pod (the finding's server host) goes sidecar -> client, any other
    client -> sidecar."""
    packets = sorted((e for e in f.evidence if e.src and e.dst), key=lambda e: (e.ts, e.frame))
    if not packets:
        return []
    t0 = packets[0].ts
    pod_host = split_endpoint(f.flow.server)[0]
    out = []
    for e in packets:
        src_host, src_port = split_endpoint(e.src)
        if e.iface == "lo":
            start, end = (3, 2) if e.src == f.flow.server else (2, 3)
        else:
            start, end = (2, 0) if src_host == pod_host else (0, 2)
        label = f"{e.flags} :{src_port}→:{split_endpoint(e.dst)[1]}"
        if e.payload_len:
            label += f" {e.payload_len}B"
        out.append(Arrow(start, end, (e.ts - t0) * 1000, label, e.frame, e.what, e.record))
    return out


def _lanes(width: int | None, names: list[str]) -> tuple[int, ...]:
    """The lanes' columns: _X, or spread over what ``width`` columns leave once the time column and the longest
    of the rows' ``names`` (``#19 SYN``) are set beside them."""
    if width is None:
        return _X
    return _spread(max(_MIN_LANES, width - _TIME_W - 2 - max(map(len, names), default=0) - 1))


def _spread(room: int) -> tuple[int, ...]:
    """The lanes over ``room`` columns: the client -> eth0 gap stays the narrowest, for labels go between eth0 and
    the sidecar, and the sidecar and the app."""
    eth0 = max(len(LANES[0]) + 3, room // 6)  # "client" and "eth0" apart in the header
    sidecar = eth0 + (room - eth0) // 2
    return (0, eth0, sidecar, room)


def _whole(arrow: Arrow, label: str, lanes: tuple[int, ...]) -> bool:
    """Whether ``_row`` draws ``label`` whole on ``arrow`` between ``lanes``: between its lanes (with a space each
    side and the arrow's three columns), or for an arrow across eth0, between eth0 and its far lane."""
    lo, hi = sorted((lanes[arrow.start], lanes[arrow.end]))
    if lo < lanes[1] < hi:
        return len(label) + 2 <= hi - lanes[1] - 2
    return len(label) + 2 <= hi - lo - 3


def _room_for(rows: list[Arrow], labels: list[str]) -> int:
    """The fewest columns of lanes (``_spread``) on which every row's label is whole."""
    room = _MIN_LANES
    while not all(_whole(a, label, _spread(room)) for a, label in zip(rows, labels)):
        room += 1
    return room


def _label_forms(label: str) -> list[str]:
    """``label`` (``P. :5000→:51544 95B``) and its shorter forms, the ports kept: without the payload's size
    (``P. :5000→:51544``), then without the ports' colons (``P. 5000→51544``)."""
    bare = re.sub(r" \d+B$", "", label)
    return [label, bare, bare.replace(":", "")]


def _name(arrow: Arrow, most: int = _NAME_W) -> str:
    """The row's name, ``#145 what``, its ``what`` at most ``most`` columns (a shorter one cut with "…")."""
    what = arrow.what.split(" (")[0].split(", ")[0]  # its name; the evidence list carries the rest
    if arrow.record and not what.startswith(arrow.record):  # the frame's TLS record leads: the label has no room
        what = f"{arrow.record}: {what}"
    if most < _NAME_W and len(what) > most:
        what = what[:max(most - 1, 1)].rstrip() + "…"
    return f"#{arrow.frame} {what[:_NAME_W]}"


def _row(arrow: Arrow, lanes: tuple[int, ...], label: str | None = None, name: str | None = None) -> str:
    width = lanes[-1] + 1
    cells = [" "] * width
    for x in lanes:
        cells[x] = "│"
    lo, hi = sorted((lanes[arrow.start], lanes[arrow.end]))
    for x in range(lo + 1, hi):
        cells[x] = "┼" if x in lanes else "─"
    if arrow.end > arrow.start:
        cells[hi - 1] = "▶"
    else:
        cells[lo + 1] = "◀"
    label = f" {arrow.label if label is None else label} "
    span = hi - lo - 3
    if len(label) > span:
        label = label[: max(span - 1, 0)] + "… "
    at = lo + 2 + max((span - len(label)) // 2, 0)
    # Keep the eth0 crossing visible: a client <-> sidecar label goes between eth0 and the sidecar.
    if lo < lanes[1] < hi and at <= lanes[1] < at + len(label):
        at = lanes[1] + 1 + max((hi - lanes[1] - 2 - len(label)) // 2, 0)
    for i, ch in enumerate(label):
        if lo < at + i < hi - 1 and cells[at + i] != "┼":
            cells[at + i] = ch
    return f"{'+' + format(arrow.rel_ms, '.3f'):>{_TIME_W - 1}} " + "".join(cells) + f"  {name or _name(arrow)}"


def _header(lanes: tuple[int, ...]) -> list[str]:
    width = lanes[-1] + 1
    names = [" "] * (width + 12)
    for x, name in zip(lanes, LANES):
        start = max(0, x - len(name) // 2) if x else 0
        for i, ch in enumerate(name):
            names[start + i] = ch
    drawn = [" "] * width
    for x in lanes:
        drawn[x] = "│"
    return [f"{'ms':>{_TIME_W - 1}} " + "".join(names).rstrip(), " " * _TIME_W + "".join(drawn)]


def _note(e: Evidence, width: int | None) -> list[str]:
    """A note's lines: wrapped to ``width`` under its own start (never cut: the diagram's pane does not wrap)."""
    head = f"{'':>{_TIME_W}}⋮ "
    if width is None:
        return [head + e.cited()]
    return textwrap.wrap(e.cited(), max(width - len(head), 20), initial_indent=head,
                         subsequent_indent=" " * len(head), break_long_words=True) or [head]


def render_ladder(f: Finding, width: int | None = None) -> list[str]:
    """The ladder diagram's lines for ``f`` (no trailing newlines); [] when no evidence is a packet. ``width``:
    the columns to fit (a pane's), the lanes drawn closer and the notes wrapped so that each row's frame and
    name are whole; None, the diagram's own width (a report's). Evidence without endpoints (log lines, a
    connection's first frame) follows as notes."""
    rows = arrows(f)
    if not rows:
        return []
    names, labels = [_name(a) for a in rows], [a.label for a in rows]
    lanes = _lanes(width, names)
    drawn = _header(lanes) + [_row(a, lanes, label, name) for a, label, name in zip(rows, labels, names)]
    if width is not None and not all(_whole(a, a.label, lanes) for a in rows):
        # s46: at 80 columns the labels' ports were cut (`P. :5000→:5…`) and the names wrapped. The longest label
        # form whose lanes leave the names whole, else the shortest, the names cut to what its lanes leave (the
        # evidence list above has them whole), down to MIN_NAME columns
        name_w = max(map(len, names))
        for form in range(3):
            labels = [_label_forms(a.label)[form] for a in rows]
            room = _room_for(rows, labels)
            if width - _TIME_W - 2 - room - 1 >= name_w:
                break
        lanes = _spread(room)
        names = [_name(a, max(width - _TIME_W - 2 - room - 1 - len(f"#{a.frame} "), MIN_NAME)) for a in rows]
        fitted = _header(lanes) + [_row(a, lanes, label, name) for a, label, name in zip(rows, labels, names)]
        # Narrower than whole labels and MIN_NAME leave room for: the lanes shrink as before (labels cut)
        drawn = fitted if max(map(len, fitted)) <= width else drawn
    lines = list(drawn)
    for e in f.evidence:
        if not (e.src and e.dst):
            lines += _note(e, width)
    return lines
