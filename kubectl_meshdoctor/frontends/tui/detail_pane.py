"""The detail pane: the selected problem's instance (its evidence, ladder, explanation and fix) under a line that
says which instance it is and how many came since.

What it shows holds still while the user reads (issue 32): a new instance of the problem only moves the line's
counts, never the text below it or the scroll position. Another problem or another instance (``[`` ``]`` ``n``) is
read from its top.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import ScrollableContainer

from kubectl_meshdoctor.core.findings import Finding
from kubectl_meshdoctor.core.groups import FindingGroup, GroupKey

from ..hanging import Hanging
from ..ladder import NOTE_INDENT
from ..shown import block
from .detail import finding_detail, finding_explanation, ladder_text
from .plain import PlainStatic


def instance_line(g: FindingGroup | None, f: Finding, width: int = 0) -> str:
    """Which instance of ``g`` is ``f`` and how many are newer: "instance 23 of 81, seen 81 times in 2 min
    (30.0/min)  -  newer instances: 58 (] steps, n the newest)  [ older"; "" for a problem seen once. Wider than
    ``width`` columns (0: any width), the rate goes first, then the key hints, each whole from the last (s46: at
    80 columns the line wrapped as `… (30.0/min)  -  [` / `older  ] newer`)."""
    if g is None or g.count < 2 or f not in g.instances:
        return ""
    at = g.instances.index(f) + 1
    newer = g.count - at
    hints = [f"newer instances: {newer}", "(] steps, n the newest)", " [ older"] if newer else ["[ older", " ] newer"]
    span = g.span_text()
    head = f"instance {at} of {g.count}{' (newest)' if not newer else ''}, seen "
    lines = [f"{head}{span}  -  {' '.join(hints)}", f"{head}{re.sub(r' [(][^()]*/min[)]$', '', span)}"]
    lines[1:] = [lines[1] + ("  -  " + " ".join(hints[:n]) if n else "") for n in range(len(hints), -1, -1)]
    return next((line for line in lines if len(line) <= width), lines[-1]) if width > 0 else lines[0]


class DetailPane(ScrollableContainer):
    """The pane (id ``detail-box``); ``on_read`` is called once the user scrolls it away from its top, the sign
    that they read this instance (the caller then holds it: FindingsList.pin), or focuses it."""

    BINDINGS = [Binding("pagedown", "page_down", "More", key_display="PgDn"),
                Binding("left_square_bracket", "instance(-1)", "Older", key_display="["),
                Binding("right_square_bracket", "instance(1)", "Newer", key_display="]")]

    def __init__(self, on_read: Callable[[], None], **kwargs) -> None:
        super().__init__(**kwargs)
        self.on_read = on_read
        self._shown: tuple[GroupKey | None, int] | None = None  # the problem and instance shown: read from the top
        self._finding: Finding | None = None
        self._line = ""
        self._group: FindingGroup | None = None
        self._redact = True
        self._ladder_width: int | None = None  # the width the ladder was last drawn for

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # In the compact layout (80x24) the footer has room for the pane keys, not for [ ]: refused here, the
        # keys go on to the app's own (not shown), and the instance line above the detail names them.
        if action == "instance":
            return not getattr(self.app, "compact", lambda: False)()
        return True

    def action_instance(self, by: int) -> None:
        self.app.action_instance(by)  # type: ignore[attr-defined]  (the pane is MeshDoctorApp's)

    def compose(self) -> ComposeResult:
        yield PlainStatic("No findings yet.", id="detail", markup=False)
        yield PlainStatic("", id="ladder", markup=False)
        yield PlainStatic("", id="explain", markup=False)

    def show(self, f: Finding, g: FindingGroup | None, redact: bool) -> None:
        """Show ``f`` (an instance of ``g``) under its instance line (whose counts move while the rest holds),
        from the top when it is another problem or instance than the one shown."""
        self._group, self._redact = g, redact
        # fitted where the pane has the screen (80x24: the line is where [ ] are named); beside the list the footer
        # names them and the line wraps as it did
        compact = getattr(self.app, "compact", lambda: False)()
        line = instance_line(g, f, self.scrollable_content_region.width - 2 if compact else 0)  # its padding
        if f is self._finding and line == self._line:
            return
        self._line = line
        # Wrapped where drawn, each wrapped line under its own text (issue 32); block(): the traffic's text escaped
        self.query_one("#detail", PlainStatic).update(Hanging(block((line + "\n" if line else "")
                                                                    + finding_detail(f, redact))))
        if f is self._finding:
            return
        self._finding = f
        self._ladder_width = None
        self._fit_ladder()
        self.query_one("#explain", PlainStatic).update(Hanging(block(finding_explanation(f, redact)), prose=True))
        shown = (g.key if g is not None else None, g.instances.index(f) if g is not None and f in g.instances else 0)
        if shown != self._shown:
            self._shown = shown
            self.scroll_home(animate=False)

    def _fit_ladder(self) -> None:
        """The ladder drawn for the pane's width (issue 32: its rows' names were cut at 160 columns); redrawn when
        the width changes. A hidden pane (the compact layout's list) has none yet: drawn when shown."""
        width = self.scrollable_content_region.width - 2  # the ladder's padding
        if self._finding is None or width <= 0 or width == self._ladder_width:
            return
        self._ladder_width = width
        # fitted, its rows stand whole; below the narrowest lanes a row goes on under its time column
        self.query_one("#ladder", PlainStatic).update(Hanging(block(ladder_text(self._finding, width)), NOTE_INDENT))

    def on_resize(self, event) -> None:
        self.call_after_refresh(self._fit_ladder)  # the scrollbars' room is known after the layout
        self.call_after_refresh(self._fit_line)

    def _fit_line(self) -> None:
        """The instance line fitted again to the pane's new width (its key hints kept or left out whole)."""
        if self._finding is not None:
            self.show(self._finding, self._group, self._redact)

    def on_focus(self) -> None:
        self.on_read()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if new > 0 and old == 0:
            self.on_read()
