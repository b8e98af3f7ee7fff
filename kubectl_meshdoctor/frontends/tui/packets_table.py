"""The packets pane's table: one row a packet, its info (an HTTP request's start line) taking the columns the
others leave, cut with a visible "…" where it is longer (s44: at 80 columns the info column was cut off at the
screen's edge, without a sign that there was more). In a run of several pods a packet is named by where it was
captured, ``pod/iface``: a request from one pod's eth0 to another's is seen by both, and was two rows that both
said "eth0" (s45)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text

from ..shown import one_line
from .plain import PlainTable
from .pod_names import MAX_LABEL, short_names

HEADERS = ("frame", "t (s)", "iface", "source", "destination", "flags", "len")
PLACE = 2  # the column of HEADERS naming the interface (with the pod, in a run of several: "pod/iface")
MIN_INFO = 8  # columns the info keeps on the narrowest screen: the table scrolls sideways below that
MIN_POD = 6  # columns a pod's name keeps at least, cut to make room for the info ("…" and 5 of its characters)
GAP = 1  # columns between two columns: one, not the two of DataTable's cell padding, whose room the info needs


@dataclass(frozen=True, slots=True)
class Place:
    """Where a packet was captured: ``iface`` in ``pod`` (None: not known, or the run's one pod)."""

    pod: str | None
    iface: str


class PacketsTable(PlainTable):
    """A DataTable of packets (``show``): the columns of HEADERS as wide as their cells, GAP apart, then ``info``
    as wide as the rest of the table (at least MIN_INFO), laid out again when the table's width changes."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cell_padding=0, **kwargs)
        self._rows: list[tuple[object, ...]] = []
        self._pods: list[str] = []
        self._width = -1  # the table width the columns were laid out for

    def on_mount(self) -> None:
        self.show([])

    def show(self, rows: list[tuple[object, ...]], pods: list[str] | None = None) -> None:
        """``rows``: one tuple a packet, a cell for each of HEADERS and the info last (text: made one line here);
        its PLACE cell a ``Place`` or the interface's name. ``pods``: the run's pods; with more than one, each
        row's place is ``pod/iface``, the pod's short name (pod_names.short_names) cut to leave the info
        MIN_INFO columns, never below MIN_POD, the names still told apart."""
        self._rows = rows
        self._pods = list(pods or ())
        self._lay_out()

    def on_resize(self, event) -> None:
        if event.size.width != self._width:
            self._lay_out()

    def _lay_out(self) -> None:
        self._width = self.size.width
        several = len(self._pods) > 1
        headers = (*HEADERS[:PLACE], "pod/iface" if several else HEADERS[PLACE], *HEADERS[PLACE + 1:])
        labels = short_names(self._pods) if several else {}
        rows = self._placed(labels)
        widths, room = self._widths(headers, rows)
        if several and room < MIN_INFO:  # the pods' names give way to the info, down to MIN_POD columns
            longest = max((cell_len(v) for v in labels.values()), default=0)
            for width in range(min(longest, MAX_LABEL) - 1, MIN_POD - 1, -1):
                cut = short_names(self._pods, width)
                if max(cell_len(v) for v in cut.values()) > width:
                    break  # too alike to cut further apart (short_names gives them whole): the last that did
                labels = cut
                rows = self._placed(labels)
                widths, room = self._widths(headers, rows)
                if room >= MIN_INFO:
                    break
        self.clear(columns=True)
        for label, width in zip(headers, widths):
            self.add_column(label, key=label, width=width)
        self.add_column("info", key="info", width=max(room, MIN_INFO))
        for *cells, info in rows:
            self.add_row(*cells, Text(one_line(_plain(info)), no_wrap=True, overflow="ellipsis"))

    def _placed(self, labels: dict[str, str]) -> list[tuple[object, ...]]:
        """The rows with their place as shown: ``label/iface`` where the pod is known and labelled."""
        out = []
        for row in self._rows:
            place = row[PLACE]
            if isinstance(place, Place):
                label = labels.get(place.pod) if place.pod is not None else None
                place = f"{label}/{one_line(place.iface)}" if label else place.iface
            out.append((*row[:PLACE], place, *row[PLACE + 1:]))
        return out

    def _widths(self, headers: tuple[str, ...], rows: list[tuple[object, ...]]) -> tuple[list[int], int]:
        """Each column's width and the info's room."""
        widths = [GAP + max([cell_len(h), *(cell_len(_plain(r[i])) for r in rows)]) for i, h in enumerate(headers)]
        # the room a vertical scrollbar takes is kept: the info's width must not depend on how many rows there are
        return widths, self.size.width - sum(widths) - self.styles.scrollbar_size_vertical


def _plain(cell: object) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)
