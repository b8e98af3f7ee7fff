"""Issue 32: the triage desk at 80x24 (a tmux pane) and still right at 160x45. Below 100x30 one pane at a time
(the list full height, Enter the detail full screen, Esc back); the detail holds the instance being read while
more arrive; the help scrolls and is never cut at the right. Assertions are on the characters on the screen."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import DataTable

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.detail_pane import DetailPane
from kubectl_meshdoctor.frontends.tui.screens import HelpScreen

from .test_app import wait_for
from .test_groups_tui import FRAMING, Arriving, args, drawn
from .test_triage import collision_app, open_help, ready


def shown(app) -> list[str]:
    """The terminal's lines as drawn now (the top screen over what it covers)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def words(lines: list[str]) -> str:
    """``lines`` as one line of words, a box's border (█ ▀ ▄) and scrollbar (▁-▇) left out: wrapped text reads
    as it was written."""
    return " ".join(w for line in lines for w in line.split() if w.strip("█▀▄▁▂▃▄▅▆▇"))


async def test_at_80x24_the_list_takes_the_screen_and_enter_opens_the_detail_down_to_its_fix():
    app = collision_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await pilot.pause(0.6)
        lines = shown(app)
        assert app.screen.has_class("compact")
        assert app.query_one("#findings").region.height >= 15  # the list, not 1-2 rows of it
        assert not app.query_one(DetailPane).display or app.query_one(DetailPane).region.height == 0
        # the target (its start: s44, the status is two rows at 80x24) and the counts on the first row
        assert lines[0].strip().startswith("files: ") and "eth0: 22 pkts  lo: 17 pkts  flows: 7" in lines[0]
        assert any(line.lstrip().startswith("▶ERR") for line in lines)  # the selected row is marked
        footer = lines[-1]
        for key in ("Enter Detail", "? Help", "q Quit"):  # the keys that matter, not cut
            assert key in footer, footer
        assert "Esc Back" not in footer  # on the list Esc has nothing to go back from (s44: room for the panes')

        await pilot.press("enter")
        detail = app.query_one(DetailPane)
        await wait_for(pilot, lambda: detail.has_focus and detail.region.height >= 18)
        lines = shown(app)
        text = "\n".join(lines)
        assert "tuple-collision" in text and "frame 19: SYN" in text and "evidence:" in text
        assert "PgDn More" in lines[-1] and "Esc Back" in lines[-1]
        while "sidecar.istio.io/interceptionMode" not in "\n".join(shown(app)):  # the fix's YAML, a few PgDn
            assert detail.scroll_y < detail.max_scroll_y, "the fix is not reachable"
            await pilot.press("pagedown")
            await pilot.pause(0.05)
        assert detail.scroll_y <= 3 * detail.size.height  # within three pages, not ~20

        await pilot.press("escape")
        await wait_for(pilot, lambda: app.query_one("#findings", DataTable).has_focus)
        assert app.query_one("#findings").region.height >= 15
        await pilot.press("q")


async def test_at_160x45_the_panes_stand_side_by_side_and_enter_focuses_the_detail():
    app = collision_app()
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(app, pilot)
        assert not app.screen.has_class("compact")
        left, detail = app.query_one("#left").region, app.query_one(DetailPane).region
        assert detail.x > left.x and detail.y == left.y and app.query_one("#packets").region.height > 5
        lines = shown(app)
        assert "kubectl meshdoctor — files: " in lines[0]
        assert "Enter Detail" in lines[-1] and "Tab Pane" in lines[-1]
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.query_one(DetailPane).has_focus)
        assert app.query_one("#findings").region == left  # nothing hidden
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.query_one("#findings", DataTable).has_focus)
        await pilot.press("q")


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_help_is_wrapped_to_the_terminal_and_scrolls(size):
    app = collision_app()
    async with app.run_test(size=size) as pilot:
        await open_help(app, pilot)
        await pilot.pause(0.2)
        box = app.screen.query_one("#help-scroll")
        assert box.has_focus and box.region.right <= size[0] and box.region.bottom <= size[1]
        inside = lambda: [line[box.region.x:box.region.right] for line in shown(app)]  # noqa: E731 (the box's)
        text = words(inside())
        assert "select a problem (one row per kind of finding): its detail, ladder and packets" in text
        if size == (80, 24):
            assert box.max_scroll_y > 0 and "any pane Esc back" not in text
            await pilot.press("end")
            await wait_for(pilot, lambda: box.scroll_y == box.max_scroll_y)
            await pilot.pause(0.1)
        assert "any pane Esc back" in words(inside())  # its last line, reached
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        await pilot.press("q")


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_detail_being_read_holds_still_while_instances_arrive(size):
    recorded = await analyze(args(FRAMING), Pipeline.with_detectors())
    step = asyncio.Event()
    session = Arriving(recorded, step)
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        step.set()
        await wait_for(pilot, lambda: not step.is_set() and len(app.findings) == session.handed)
        await wait_for(pilot, lambda: drawn(app))
        await pilot.press("enter")
        detail = app.query_one(DetailPane)
        await wait_for(pilot, lambda: detail.has_focus and detail.max_scroll_y > 0)
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: detail.scroll_y > 0)
        reading, at = app.selected, detail.scroll_y
        group = app.list.group(app.list.selected)
        for _ in range(2):  # more instances of the problem arrive: neither the text nor its place moves
            step.set()
            await wait_for(pilot, lambda: not step.is_set() and len(app.findings) == session.handed)
            await wait_for(pilot, lambda: drawn(app))
            await pilot.pause(0.6)
            assert app.selected is reading and detail.scroll_y == at
        assert group.newest is not reading
        at_index = group.instances.index(reading) + 1
        await pilot.press("home")
        await wait_for(pilot, lambda: detail.scroll_y == 0)
        head = "\n".join(shown(app))
        assert f"instance {at_index} of {group.count}" in head, head  # item 4: it counts what came since
        assert f"newer instances: {group.count - at_index}" in head
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: detail.scroll_y > 0)
        await pilot.press("right_square_bracket")  # another instance: read from its top
        await wait_for(pilot, lambda: app.selected is group.instances[at_index] and detail.scroll_y == 0)
        await pilot.press("q")


async def test_a_resize_under_the_help_changes_the_layout_beneath_it():
    app = collision_app()
    async with app.run_test(size=(160, 45)) as pilot:
        await open_help(app, pilot)
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: app.default_screen.has_class("compact"))
        assert not app.screen.has_class("compact")  # the help's own screen is not the one laid out
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        await pilot.pause(0.6)
        assert shown(app)[0].strip().startswith("files: ")  # the target moved into the status line
        await pilot.resize_terminal(160, 45)
        await wait_for(pilot, lambda: not app.default_screen.has_class("compact"))
        await pilot.press("q")
