"""The keys line of every screen of the triage desk: Textual's Footer, compact (its keys one space apart) below
COMPACT_WIDTH columns, so that at 80 columns every pane key and the main actions fit on its one row (s44: a new
user at 80x24 saw `a Log` and none of l, c, k). A key hint that does not fit is left out whole (s46: the `l`
pane's footer ended in `v detectors' l`), the ones after it kept where they fit: the help (?) names them all."""

from __future__ import annotations

from textual.widgets import Footer

COMPACT_WIDTH = 100  # below this many columns the footer's keys stand one space apart


class KeysFooter(Footer):
    """A Footer (without the command palette's key, which is no part of this tool) that is compact while it is
    narrower than COMPACT_WIDTH columns, on whichever screen it is, and shows only the key hints it has room for,
    each whole."""

    def __init__(self) -> None:
        super().__init__(show_command_palette=False)

    async def recompose(self) -> None:
        await super().recompose()
        self.call_after_refresh(self._fit)  # the hints' widths are known once laid out

    def on_resize(self, event) -> None:
        self.compact = event.size.width < COMPACT_WIDTH
        for hint in self.children:  # each measured again at the new width
            hint.display = True
        self.call_after_refresh(self._fit)

    def _fit(self) -> None:
        """Hides each hint that would go past the footer's right edge, in the order the footer names them: a
        later, shorter one stays where it fits in the room left."""
        room, used = self.size.width, 0
        for hint in self.children:
            width = hint.outer_size.width + hint.styles.margin.left + hint.styles.margin.right
            fits = used + width <= room
            hint.display = fits
            used += width if fits else 0
