"""Issue 32 item 6: the framing finding for `X-Bad : 1` gave the reason of TE+CL ("body length is ambiguous") and
hid the space before the colon, the whole point, under `'X-Bad <redacted>'`. On screen, at 80x24 (the detail full
screen) and 160x45: the row of that violation, its evidence with the name's bytes and the value redacted, its own
rule (RFC 9112 section 5.1), and the reason of another violation nowhere in it. Over the lab's recorded framing
capture, on what the screen shows."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.detail_pane import DetailPane

from .test_app import screen_text, wait_for
from .test_groups_tui import FRAMING, args
from .test_small_screen import shown, words


async def read_detail(app, pilot) -> str:
    """Everything the detail pane shows from its top to its end, paging through it."""
    detail = app.query_one(DetailPane)
    seen = [words(shown(app))]
    while detail.scroll_y < detail.max_scroll_y:
        await pilot.press("pagedown")
        await pilot.pause(0.05)
        seen.append(words(shown(app)))
    return " ".join(seen)


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_an_invalid_header_name_shows_its_bytes_and_its_own_rule(size):
    app = MeshDoctorApp(FileSession(args(FRAMING)))
    async with app.run_test(size=size) as pilot:
        table = app.query_one("#findings", DataTable)
        await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status") and table.row_count >= 5)
        await pilot.pause(0.6)
        for _ in range(table.row_count):
            if app.selected is not None and app.selected.variant == "invalid header name bytes":
                break
            await pilot.press("down")
            await pilot.pause(0.05)
        assert app.selected.variant == "invalid header name bytes"
        await pilot.press("enter")
        detail = app.query_one(DetailPane)
        await wait_for(pilot, lambda: detail.has_focus and detail.region.height > 0)
        text = await read_detail(app, pilot)
        assert "invalid header name bytes: 'X-Bad : <redacted>'" in text, text  # the space before the colon
        assert "RFC 9112 section 5.1" in text and "no whitespace before its colon" in text
        assert "ambiguous" not in text and "RFC 9112 section 6" not in text  # TE+CL's reason, not this one's
        assert "1\\r" not in text and "X-Bad : 1" not in text  # the value stays redacted
        await pilot.press("q")
