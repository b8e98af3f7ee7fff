"""The loggers pane, driven by the keyboard against real Envoy's admin API (tests/local_envoy.py, on loopback): a
level shows on screen once the proxy reports it, and it is the proxy's level."""

from __future__ import annotations

import asyncio
import io
from contextlib import asynccontextmanager

import pytest
from rich.console import Console
from textual.widgets import DataTable, Static

from kubectl_meshdoctor.commands.log_level import LoggerControl, current_levels
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.kube.admin import EnvoyAdmin
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.loggers import LoggersScreen
from kubectl_meshdoctor.frontends.tui.session import Session, SessionHooks

from ...local_envoy import free_port, local_envoy
from .test_app import wait_for


class IdleSession(Session):
    """No capture: only the sidecar's loggers, of a real Envoy."""

    describe = "local Envoy"

    def __init__(self, control: LoggerControl) -> None:
        self.control = control
        self.pipeline = Pipeline.with_detectors()

    async def run(self, hooks: SessionHooks):
        await hooks.stop.wait()
        return None

    def stats(self):
        return self.pipeline.stats

    def loggers(self, pod=None):
        return self.control


def idle_session(control: LoggerControl) -> Session:
    return IdleSession(control)


@asynccontextmanager
async def loggers_open(tmp_path, size: tuple[int, int]):
    """The app over a real local Envoy, its loggers screen open and filled: (envoy, app, pilot, table)."""
    with local_envoy(tmp_path, free_port()) as envoy:
        admin = EnvoyAdmin(None, "shop", "reviews", open_socket=envoy.admin_socket)
        try:
            app = MeshDoctorApp(idle_session(LoggerControl(admin)))
            async with app.run_test(size=size) as pilot:
                await pilot.press("l")
                table = app.screen.query_one("#loggers", DataTable)
                await wait_for(pilot, lambda: table.row_count > 50)
                yield envoy, app, pilot, table
                await pilot.press("escape")
                await pilot.press("q")
        finally:
            admin.close()


async def test_change_a_level_with_the_keyboard_and_see_what_the_proxy_reports(tmp_path):
    async with loggers_open(tmp_path, (120, 70)) as (envoy, app, pilot, table):
        proxy_view = EnvoyAdmin(None, "shop", "reviews", open_socket=envoy.admin_socket)
        try:
            names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
            target = names.index("connection")
            assert str(table.get_row_at(target)[1]) == "warning"  # Istio's default (-l warning)
            for _ in range(target):
                await pilot.press("down")
            await pilot.press("d")
            await wait_for(pilot, lambda: str(table.get_row_at(target)[1]) == "debug")
            status = str(app.screen.query_one("#loggers-status", Static).render())
            assert "connection: debug: confirmed by the proxy" in status
            # What the screen shows is what the proxy itself now reports.
            reported = await asyncio.to_thread(current_levels, proxy_view)
            assert reported["connection"] == "debug" and reported["http"] == "warning"
            await pilot.press("r")
            await wait_for(pilot, lambda: str(table.get_row_at(target)[1]) == "warning")
            reported = await asyncio.to_thread(current_levels, proxy_view)
            assert reported["connection"] == "warning" and reported["misc"] == "error"
        finally:
            proxy_view.close()


def screen_lines(app) -> list[str]:
    """The text of every cell on screen, row by row, as the terminal shows it (App.export_screenshot's
    rendering, as text)."""
    console = Console(width=app.size.width, height=app.size.height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text().splitlines()


async def test_every_key_of_the_loggers_screen_is_on_an_80x24_screen(tmp_path):
    """At 80 columns the footer is cut and listed three of the screen's keys (issue 16): every binding's keys,
    each with what it does, are on screen now."""
    async with loggers_open(tmp_path, (80, 24)) as (_, app, pilot, table):
        assert isinstance(app.screen, LoggersScreen)
        lines = screen_lines(app)
        assert len(lines) == 24 and max(map(len, lines)) <= 80
        shown = " ".join(" ".join(lines).split())
        for b in LoggersScreen.BINDINGS:
            keys = "/".join("esc" if k == "escape" else k for k in b.key.split(","))
            if b.action == "next_pod":  # one pod: no next one, and the key is not named
                assert f"{keys} {b.description}" not in shown
                continue
            assert f"{keys} {b.description}" in shown, (b.key, b.description, lines)


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_v_without_a_watch_says_so_and_changes_nothing(tmp_path, size):
    """v raises the detectors' loggers for a watch's run (tests/lab/test_envoy_debug_tui.py); a control with no run
    behind it (log levels of a proxy alone) has nothing to raise for: the pane says so, the proxy is untouched."""
    async with loggers_open(tmp_path, size) as (envoy, app, pilot, table):
        before = [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
        await pilot.press("v")
        await wait_for(pilot, lambda: "only a live watch" in str(app.screen.query_one("#loggers-status",
                                                                                      Static).render()))
        proxy_view = EnvoyAdmin(None, "shop", "reviews", open_socket=envoy.admin_socket)
        try:
            reported = await asyncio.to_thread(current_levels, proxy_view)
        finally:
            proxy_view.close()
        assert list(reported.values()) == before
