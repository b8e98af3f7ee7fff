"""A finding's packet evidence as a ladder (sequence) diagram across client, eth0, the sidecar and the app.

Inside an Istio pod a connection crosses two captures: on ``eth0`` between the client and the sidecar's inbound
listener (15006 after REDIRECT), and on ``lo`` between the sidecar (from 127.0.0.6) and the app. Drawing each
evidence packet as an arrow between the lanes it travels, with its flags, ports and time since the first one,
shows a challenge ACK answering a SYN, or a request crossing the app's FIN, at a glance. Plain text (box-drawing
characters), so the same lines go into the TUI and into ``-o markdown`` reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubectl_meshdoctor.core.events import split_endpoint
from kubectl_meshdoctor.core.findings import Evidence, Finding

LANES = ("client", "eth0", "sidecar", "app (lo)")
_X = (0, 12, 36, 60)  # lane columns inside the diagram; labels fit between eth0 and sidecar, sidecar and app
_TIME_W = 10  # "+1234.567 " column on the left
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


def _row(arrow: Arrow) -> str:
    width = _X[-1] + 1
    cells = [" "] * width
    for x in _X:
        cells[x] = "│"
    lo, hi = sorted((_X[arrow.start], _X[arrow.end]))
    for x in range(lo + 1, hi):
        cells[x] = "┼" if x in _X else "─"
    if arrow.end > arrow.start:
        cells[hi - 1] = "▶"
    else:
        cells[lo + 1] = "◀"
    label = f" {arrow.label} "
    span = hi - lo - 3
    if len(label) > span:
        label = label[: max(span - 1, 0)] + "… "
    at = lo + 2 + max((span - len(label)) // 2, 0)
    # Keep the eth0 crossing visible: a client <-> sidecar label goes between eth0 and the sidecar.
    if lo < _X[1] < hi and at <= _X[1] < at + len(label):
        at = _X[1] + 1 + max((hi - _X[1] - 2 - len(label)) // 2, 0)
    for i, ch in enumerate(label):
        if lo < at + i < hi - 1 and cells[at + i] != "┼":
            cells[at + i] = ch
    what = arrow.what.split(" (")[0].split(", ")[0]  # its name; the evidence list carries the rest
    if arrow.record and not what.startswith(arrow.record):  # the frame's TLS record leads: the label has no room
        what = f"{arrow.record}: {what}"
    what = what[:32]  # the evidence list carries the whole text
    return f"{'+' + format(arrow.rel_ms, '.3f'):>{_TIME_W - 1}} " + "".join(cells) + f"  #{arrow.frame} {what}"


def _header() -> list[str]:
    width = _X[-1] + 1
    names = [" "] * (width + 12)
    for x, name in zip(_X, LANES):
        start = max(0, x - len(name) // 2) if x else 0
        for i, ch in enumerate(name):
            names[start + i] = ch
    lanes = [" "] * width
    for x in _X:
        lanes[x] = "│"
    return [f"{'ms':>{_TIME_W - 1}} " + "".join(names).rstrip(), " " * _TIME_W + "".join(lanes)]


def _note(e: Evidence) -> str:
    return f"{'':>{_TIME_W}}⋮ {e.cited()}"


def render_ladder(f: Finding) -> list[str]:
    """The ladder diagram's lines for ``f`` (no trailing newlines); [] when no evidence is a packet.
    Evidence without endpoints (log lines, a connection's first frame) follows as notes."""
    rows = arrows(f)
    if not rows:
        return []
    lines = _header() + [_row(a) for a in rows]
    lines += [_note(e) for e in f.evidence if not (e.src and e.dst)]
    return lines
