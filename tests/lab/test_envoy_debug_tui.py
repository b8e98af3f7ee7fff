"""The TUI's key for the run's raise, on the pod lab: in the loggers pane (l), v raises the loggers the detectors
read to debug for the run, v again puts them back, and q at the end puts back what is still raised. Each level is
read from the real Envoy's admin API; the screen is 80x24 and 160x45."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import DataTable, Static

from kubectl_meshdoctor.commands.watch.live import WatchOptions
from kubectl_meshdoctor.commands.watch.live_session import LiveSession
from kubectl_meshdoctor.kube.client import KubeOptions, connect
from kubectl_meshdoctor.kube.target import Target
from kubectl_meshdoctor.core.envoy_debug_report import EnvoyDebugReport
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.loggers import LoggersScreen

from ..waiting import wait_until_async
from .test_envoy_debug import WANTED, lab_up, levels

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory):
    with lab_up(tmp_path_factory, ("refused",)) as state:
        yield state


async def wait_for(pilot, what: str, condition, seconds: float = 60.0) -> None:
    """``condition`` true within ``seconds``, looked at every 100 ms; the screen catches up between looks."""
    await wait_until_async(what, seconds, condition, poll_s=0.1, pause=pilot.pause)


def status(app) -> str:
    return str(app.screen.query_one("#loggers-status", Static).render())


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_v_raises_for_the_run_v_puts_back_and_q_puts_back_what_is_raised(lab_state, size):
    kube = connect(KubeOptions(kubeconfig=str(lab_state.kubeconfig)))
    before = await asyncio.to_thread(levels, kube, lab_state, "refused")
    up = [n for n in WANTED if before[n] not in ("debug", "trace")]
    assert up, (WANTED, before)
    session = LiveSession(kube, WatchOptions((Target("pod", "refused"),), kube.namespace))
    app = MeshDoctorApp(session)

    async def proxy() -> dict[str, str]:
        return await asyncio.to_thread(levels, kube, lab_state, "refused")

    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, "the watch capturing", lambda: session.state.phase == "capturing")
        await pilot.press("l")
        table = app.screen.query_one("#loggers", DataTable)
        await wait_for(pilot, "the loggers listed", lambda: table.row_count > 50)
        shown = " ".join(str(app.screen.query_one("#loggers-keys", Static).render()).split())
        assert "v detectors' loggers: debug for this run / back" in shown

        def row(name: str) -> str:
            return next(str(table.get_row_at(i)[1]) for i in range(table.row_count)
                        if str(table.get_row_at(i)[0]) == name)

        await pilot.press("v")
        await wait_for(pilot, "raised on screen", lambda: status(app).startswith("raised ")
                       and all(row(n) == "debug" for n in up))
        during = await proxy()
        assert all(during[n] == "debug" for n in up)  # what the screen shows, the proxy says
        await pilot.press("v")
        await wait_for(pilot, "put back on screen", lambda: status(app).startswith("put back")
                       and all(row(n) == before[n] for n in up))
        assert await proxy() == before
        await pilot.press("v")
        await wait_for(pilot, "raised again", lambda: status(app).startswith("raised "))
        assert isinstance(app.screen, LoggersScreen)
        await pilot.press("escape")
        await pilot.press("q")
        await wait_for(pilot, "the screen closed", lambda: not app.is_running)
    assert await proxy() == before
    report = app.return_value
    debug = report.envoy.debug
    assert isinstance(debug, EnvoyDebugReport)
    assert [r.logger for r in debug.raised] == up and debug.restored and debug.restored_by == "watch"
    assert debug.seconds > 0
