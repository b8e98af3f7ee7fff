"""The keys line of every screen of the triage desk: Textual's Footer, compact (its keys one space apart) below
COMPACT_WIDTH columns, so that at 80 columns every pane key and the main actions fit on its one row (s44: a new
user at 80x24 saw `a Log` and none of l, c, k)."""

from __future__ import annotations

from textual.widgets import Footer

COMPACT_WIDTH = 100  # below this many columns the footer's keys stand one space apart


class KeysFooter(Footer):
    """A Footer (without the command palette's key, which is no part of this tool) that is compact while it is
    narrower than COMPACT_WIDTH columns, on whichever screen it is."""

    def __init__(self) -> None:
        super().__init__(show_command_palette=False)

    def on_resize(self, event) -> None:
        self.compact = event.size.width < COMPACT_WIDTH
