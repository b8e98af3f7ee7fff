"""Widgets that show the traffic's text as text: never as Rich markup, never as a control byte.

Textual reads a str cell of a DataTable, and a Static's content unless told otherwise, as markup: `/a[b]c` would
show as `/ac`, `[/]` in a path raises MarkupError and ends the app, and `[@click=app.quit]` becomes an action.
Every table and static pane of the TUI is one of these, so no caller has to remember it.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Static

from ..shown import block, is_safe, one_line


def cell(value: Any) -> Any:
    """A DataTable cell that shows ``value`` as written: a str (or anything but Text) as Text of one printable
    line; a Text kept with its style, its plain text escaped when it holds a control byte. Make a Text of the
    traffic's text with ``one_line`` first: Rich's Text drops BEL, BS, VT, FF and CR before anyone can show
    them."""
    if isinstance(value, Text):  # ours: its line breaks are meant (a finding's label takes two lines)
        return value if is_safe(value.plain, lines=True) else Text(block(value.plain), style=value.style)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return Text(one_line("" if value is None else value))


class PlainTable(DataTable):
    """A DataTable whose cells are text (``cell``), whatever the caller hands it."""

    def add_row(self, *cells: Any, **kwargs: Any) -> Any:
        return super().add_row(*map(cell, cells), **kwargs)

    def update_cell(self, row_key: Any, column_key: Any, value: Any, **kwargs: Any) -> None:
        super().update_cell(row_key, column_key, cell(value), **kwargs)


class PlainStatic(Static):
    """A Static whose str content is text, not markup, with its control bytes escaped (``block``)."""

    def __init__(self, content: Any = "", **kwargs: Any) -> None:
        kwargs["markup"] = False
        super().__init__(block(content) if isinstance(content, str) else content, **kwargs)

    def update(self, content: Any = "", **kwargs: Any) -> None:
        super().update(block(content) if isinstance(content, str) else content, **kwargs)
