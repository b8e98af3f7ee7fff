"""Issue 32 item 5: the collision's ladder shows the client's RST the explanation rests on, and each row's frame
and name are whole in the detail pane (they were cut at 160 columns: `#145 challe`). At 80x24 (the detail full
screen after Enter) and 160x45 (the detail beside the list), over the lab's recorded collision, on what the screen
shows."""

from __future__ import annotations

import pytest

from kubectl_meshdoctor.frontends.tui.detail_pane import DetailPane

from .test_app import wait_for
from .test_small_screen import shown
from .test_triage import collision_app, ready

ROWS = ("#19 SYN", "#20 challenge ACK", "#21 client's RST")


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_ladder_rows_are_whole_in_the_pane_down_to_the_clients_rst(size):
    app = collision_app()
    async with app.run_test(size=size) as pilot:
        await ready(app, pilot)
        await pilot.press("enter")
        detail = app.query_one(DetailPane)
        await wait_for(pilot, lambda: detail.has_focus and detail.region.width > 0)
        right = detail.region.right  # the pane's last column: what is past it is not read
        while not all(any(r in line for line in shown(app)) for r in ROWS):
            assert detail.scroll_y < detail.max_scroll_y, "the ladder's rows are not all reachable"
            await pilot.press("down")
            await pilot.pause(0.05)
        for name in ROWS:
            line = next(line for line in shown(app) if name in line)
            # the row's name ends inside the pane, and the arrow's lanes are on the same line
            assert line.index(name) + len(name) <= right - 1, (name, line)
            assert "│" in line[:line.index(name)] and ":40811" in line, line
        await pilot.press("q")
