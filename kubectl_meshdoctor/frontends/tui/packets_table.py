"""The packets pane's table: one row a packet, its info (an HTTP request's start line) taking the columns the
others leave, cut with a visible "…" where it is longer (s44: at 80 columns the info column was cut off at the
screen's edge, without a sign that there was more)."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text

from ..shown import one_line
from .plain import PlainTable

HEADERS = ("frame", "t (s)", "iface", "source", "destination", "flags", "len")
MIN_INFO = 8  # columns the info keeps on the narrowest screen: the table scrolls sideways below that
GAP = 1  # columns between two columns: one, not the two of DataTable's cell padding, whose room the info needs


class PacketsTable(PlainTable):
    """A DataTable of packets (``show``): the columns of HEADERS as wide as their cells, GAP apart, then ``info``
    as wide as the rest of the table (at least MIN_INFO), laid out again when the table's width changes."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cell_padding=0, **kwargs)
        self._rows: list[tuple[object, ...]] = []
        self._width = -1  # the table width the columns were laid out for

    def on_mount(self) -> None:
        self.show([])

    def show(self, rows: list[tuple[object, ...]]) -> None:
        """``rows``: one tuple a packet, a cell for each of HEADERS and the info last (text: made one line here)."""
        self._rows = rows
        self._lay_out()

    def on_resize(self, event) -> None:
        if event.size.width != self._width:
            self._lay_out()

    def _lay_out(self) -> None:
        self._width = self.size.width
        widths = [GAP + max([cell_len(h), *(cell_len(_plain(r[i])) for r in self._rows)])
                  for i, h in enumerate(HEADERS)]
        # the room a vertical scrollbar takes is kept: the info's width must not depend on how many rows there are
        room = self.size.width - sum(widths) - self.styles.scrollbar_size_vertical
        self.clear(columns=True)
        for label, width in zip(HEADERS, widths):
            self.add_column(label, key=label, width=width)
        self.add_column("info", key="info", width=max(room, MIN_INFO))
        for *cells, info in self._rows:
            self.add_row(*cells, Text(one_line(_plain(info)), no_wrap=True, overflow="ellipsis"))


def _plain(cell: object) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)
