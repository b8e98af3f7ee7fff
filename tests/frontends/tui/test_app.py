"""The TUI driven by Textual's pilot, replaying a recorded lab capture; assertions are on what the screen shows."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import DataTable, Static

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.session import Session, SessionHooks
from kubectl_meshdoctor.sources.files import CaptureArg

from ...helpers import prefiltered
from ...waiting import wait_until_async

DATA = Path(__file__).parent.parent.parent / "data"


def replay_session(*files: str) -> Session:
    """A Session that plays recorded captures through the real pipeline, then waits for q like a live run."""
    return FileSession([CaptureArg.parse(str(DATA / f)) for f in files])


async def wait_for(pilot, condition, seconds: float = 30.0) -> None:
    """``condition`` true within ``seconds``, looked at every 50 ms; the screen catches up between looks."""
    await wait_until_async("the screen's condition", seconds, condition, poll_s=0.05, pause=pilot.pause)


def screen_text(app, selector: str) -> str:
    """The pane's text: a Rich renderable's as given (the detail's Hanging: unwrapped), else as rendered."""
    pane = app.query_one(selector, Static)
    return str(pane.content) if hasattr(pane.content, "__rich_console__") else str(pane.render())


async def test_findings_appear_with_counts_and_detail_then_q_quits():
    app = MeshDoctorApp(replay_session("lab-collision-eth0.pcap:eth0", "lab-collision-lo.pcap:lo"))
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.query_one("#findings", DataTable)
        await wait_for(pilot, lambda: table.row_count >= 1)
        row = table.get_row_at(0)
        assert str(row[0]) == "▶ERR\n ×1"  # the selected row is marked, not only coloured
        assert str(row[1]).startswith("tuple-collision  UC,UF,URX  198.18.1.2:5002\nchallenge ACK to a SYN for")
        lo, eth0 = prefiltered(DATA / "lab-collision-lo.pcap"), prefiltered(DATA / "lab-collision-eth0.pcap")
        await wait_for(pilot, lambda: f"lo: {lo} pkts" in screen_text(app, "#status")
                       and f"eth0: {eth0} pkts" in screen_text(app, "#status"))
        assert "1 error" in screen_text(app, "#status")
        detail = screen_text(app, "#detail")
        assert "frame 19: SYN" in detail and "frame 20: challenge ACK" in detail
        explain = screen_text(app, "#explain")
        # The fixes as printed, in their order, from the same objects the lab tests apply (core/fixes.py).
        assert explain.index("Fix 1 of 3 (tproxy)") < explain.index('interceptionMode: "TPROXY"') \
            < explain.index("Fix 2 of 3 (exclude-port)") < explain.index('excludeInboundPorts: "5002"') \
            < explain.index("Fix 3 of 3 (client-port)")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_value is not None or not app.is_running)
    assert app.return_value is not None and app.return_value.exit_code() == 1



async def test_a_lost_capture_stream_shows_on_screen():
    lost: list[str] = []
    session = replay_session("lab-collision-eth0.pcap:eth0")
    session.problems = lambda: list(lost)
    app = MeshDoctorApp(session)
    async with app.run_test(size=(140, 40)) as pilot:
        eth0 = prefiltered(DATA / "lab-collision-eth0.pcap")
        await wait_for(pilot, lambda: f"eth0: {eth0} pkts" in screen_text(app, "#status"))
        assert "problems" not in screen_text(app, "#status")
        lost.append("pod/collision lo: capture stream on lo ended without an exit status (connection lost)")
        await wait_for(pilot, lambda: "problems (1): pod/collision lo: capture stream on lo ended"
                       in screen_text(app, "#status"))
        await pilot.press("q")


async def test_many_pods_get_one_row_each():
    """Several pods: a row per pod with its packet counts and findings, the findings tagged with their pod."""
    from dataclasses import replace

    from kubectl_meshdoctor.core.pipeline import IfaceStats, PipelineStats

    stats = PipelineStats()
    for pod, lo, eth0 in (("web-1", 10, 20), ("web-2", 3, 4)):
        stats.by_iface[f"{pod}/lo"] = IfaceStats(packets=lo)
        stats.by_iface[f"{pod}/eth0"] = IfaceStats(packets=eth0)
    stats.packets = 37
    base = replay_session("lab-collision-eth0.pcap:eth0")

    class TwoPods(Session):
        describe = "two pods"

        async def run(self, hooks):
            inner = SessionHooks(on_finding=lambda f: hooks.on_finding(replace(f, pod="web-2")),
                                 progress=hooks.progress, stop=hooks.stop)
            return await base.run(inner)

        def stats(self):
            return stats

    app = MeshDoctorApp(TwoPods())
    async with app.run_test(size=(140, 40)) as pilot:
        pods = app.query_one("#pods", DataTable)
        await wait_for(pilot, lambda: pods.row_count == 2 and str(pods.get_row("web-2")[3]) == "1")
        assert [str(c) for c in pods.get_row("web-1")] == ["web-1", "10", "20", "0", "0"]
        assert [str(c) for c in pods.get_row("web-2")][:4] == ["web-2", "3", "4", "1"]
        assert "2 pods: 37 pkts" in screen_text(app, "#status")
        await pilot.press("q")

async def test_a_timer_tick_while_the_panes_are_torn_down_is_no_fault():
    """The refresh timers keep ticking while the app exits; a tick after the panes were removed refreshes
    nothing (under load one came then and failed the exit with NoMatches), and one while they are there and a
    pane is missing is still a fault."""
    import pytest
    from textual.css.query import NoMatches

    app = MeshDoctorApp(replay_session("lab-collision-eth0.pcap:eth0", "lab-collision-lo.pcap:lo"))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: "pkts" in screen_text(app, "#status"))
        await app.query_one("#packets", DataTable).remove()
        app._packets_key = None  # as if new packets had come: the pane is redrawn
        with pytest.raises(NoMatches):
            app._on_timer(app._refresh_packets)  # #status is there: the missing pane is a real fault
        await app.query_one("#status", Static).remove()
        app._on_timer(app._refresh)  # the teardown: nothing to refresh, nothing raised
        app._on_timer(app._refresh_packets)
        app.exit()  # not q: quitting refreshes the status line itself, which this test took away


class HeldSession(Session):
    """A live session whose wind-down the API server holds: after the stop its run never returns (as the end's
    calls against a server that stopped answering). It found one finding before."""

    describe = "held"
    live = True

    def __init__(self, finding) -> None:
        from kubectl_meshdoctor.core.pipeline import Pipeline

        self.pipeline = Pipeline.with_detectors()
        self.finding = finding
        self.forever = asyncio.Event()

    async def run(self, hooks: SessionHooks):
        hooks.on_finding(self.finding)
        await hooks.stop.wait()
        await self.forever.wait()  # held: nothing sets it

    def stats(self):
        return self.pipeline.stats


async def test_a_stop_the_session_cannot_wind_down_leaves_with_the_findings_so_far():
    """Issue 29, item 9, on the screen: q, and the session is still held WIND_DOWN_S later: the app leaves with
    the findings so far and a problem saying so (exit 2 unless one is an error), not after the client's
    timeouts."""
    from kubectl_meshdoctor.core.findings import Finding, FlowRef, Severity
    from kubectl_meshdoctor.frontends.tui.signals import WIND_DOWN_S

    found = Finding(detector="upstream-refused", severity=Severity.WARNING, title="found before the stop",
                    flow=FlowRef("198.18.0.1:1", "198.18.0.2:2", "lo"), evidence=())
    app = MeshDoctorApp(HeldSession(found))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.query_one("#findings", DataTable).row_count == 1)
        started = asyncio.get_running_loop().time()
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running or app.return_value is not None, WIND_DOWN_S + 10)
        took = asyncio.get_running_loop().time() - started
    report = app.return_value
    assert app.held and report is not None and took >= WIND_DOWN_S
    assert [f.title for f in report.findings] == ["found before the stop"]
    assert any("did not wind down" in p.what and "findings so far" in p.what for p in report.problems)
    assert report.exit_code() == 2
