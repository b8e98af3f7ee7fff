"""The triage desk driven by Textual's pilot over the lab's recorded captures: ladder, packets pane and filter,
pause, save, export, help, narrow layout and start-up progress. Assertions are on what the screen shows."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from textual.widgets import DataTable, Input, Static

from kubectl_meshdoctor.commands.analyze import FileSession, analyze
from kubectl_meshdoctor.core.findings import Severity
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.screens import KEYS, HelpScreen, PathPrompt, offered_keys
from kubectl_meshdoctor.frontends.tui.session import Session
from kubectl_meshdoctor.sources.files import CaptureArg

from .test_app import screen_text, wait_for

DATA = Path(__file__).parent.parent.parent / "data"
FILES = ("lab-collision-eth0.pcap", "lab-collision-lo.pcap")


def collision_app() -> MeshDoctorApp:
    return MeshDoctorApp(FileSession([CaptureArg.parse(str(DATA / f)) for f in FILES]))


def packet_rows(app) -> list[list[str]]:
    table = app.query_one("#packets", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def ready(app, pilot) -> None:
    """The replay has run to its end and the collision is selected."""
    table = app.query_one("#findings", DataTable)
    await wait_for(pilot, lambda: table.row_count >= 1 and "files read" in screen_text(app, "#status")
                   and app.query_one("#packets", DataTable).row_count > 0)


async def test_selecting_the_finding_shows_its_ladder_with_the_challenge_ack():
    app = collision_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await ready(app, pilot)
        lines = screen_text(app, "#ladder").splitlines()
        syn = next(line for line in lines if "#19 SYN" in line)
        ack = next(line for line in lines if "#20 challenge ACK" in line)
        # The SYN goes client -> sidecar across eth0; the challenge ACK comes back sidecar -> client.
        assert "S :40811→:5002" in syn and syn.index("┼") < syn.index("▶")
        assert ". :5002→:40811" in ack and ack.index("◀") < ack.index("┼")
        assert "+0.000" in syn and "+0.0" in ack
        await pilot.press("q")


async def test_packets_pane_follows_the_finding_and_the_typed_filter_narrows_it():
    app = collision_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await ready(app, pilot)
        rows = packet_rows(app)
        # The finding's client endpoint on eth0: both connections of 198.18.1.1:40811, evidence frames included.
        assert all(r[2] == "eth0" and "198.18.1.1:40811" in (r[3], r[4]) for r in rows)
        assert {"19", "20"} <= {r[0] for r in rows}
        assert "packets of the selected finding" in screen_text(app, "#packets-title")

        await pilot.press("slash")
        assert app.query_one("#filter", Input).has_focus
        await pilot.press(*"eth0 R", "enter")
        await wait_for(pilot, lambda: "filter: eth0 R" in screen_text(app, "#packets-title"))
        narrowed = packet_rows(app)
        assert narrowed and all(r[2] == "eth0" and "R" in r[5] for r in narrowed)
        everything = [ev for ev in app.session.packets() if ev.iface == "eth0"]
        assert len(narrowed) == sum(1 for ev in everything if ev.is_rst) < len(everything)

        # A term it does not understand changes nothing and says so.
        await pilot.press("slash")
        app.query_one("#filter", Input).value = "bogus"
        await pilot.press("enter")
        await wait_for(pilot, lambda: "not understood: 'bogus'" in screen_text(app, "#packets-title"))
        assert screen_text(app, "#packets-title").startswith("filter: eth0 R")
        assert packet_rows(app) == narrowed

        await pilot.press("escape")
        await wait_for(pilot, lambda: "packets of the selected finding" in screen_text(app, "#packets-title"))
        await pilot.press("q")


async def test_s_saves_a_pcapng_that_analyze_reads_back_to_the_same_finding(tmp_path):
    out = tmp_path / "evidence.pcapng"
    out.write_bytes(b"not yours to overwrite")
    app = collision_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await ready(app, pilot)
        selected = app.selected
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, PathPrompt)
                       and app.screen.query_one("#prompt-path", Input).has_focus)
        box = app.screen.query_one("#prompt-path", Input)
        assert box.value.endswith(f"meshdoctor-tuple-collision-{selected.evidence[0].frame}.pcapng")
        box.value = str(out)
        await pilot.press("enter")
        await wait_for(pilot, lambda: "exists: Enter again" in str(app.screen.query_one("#prompt-warning",
                                                                                          Static).render()))
        assert out.read_bytes() == b"not yours to overwrite"  # asked first, nothing written yet
        await pilot.press("enter")
        await wait_for(pilot, lambda: out.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a")
        await pilot.press("q")
    (again,) = (await analyze([CaptureArg.parse(str(out))], Pipeline.with_detectors())).findings
    assert (again.detector, again.severity, again.flow, again.envoy_flags) == \
        (selected.detector, selected.severity, selected.flow, selected.envoy_flags)


async def test_e_exports_the_report_with_the_ladder(tmp_path):
    out = tmp_path / "incident.md"
    app = collision_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await ready(app, pilot)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PathPrompt)
                       and app.screen.query_one("#prompt-path", Input).has_focus)
        app.screen.query_one("#prompt-path", Input).value = str(out)
        await pilot.press("enter")
        await wait_for(pilot, out.exists)
        await pilot.press("q")
    md = out.read_text()
    assert "| error | `tuple-collision` | UC,UF,URX | 1 |" in md and "#20 challenge ACK" in md and "◀" in md


async def test_p_pauses_the_display_while_findings_keep_coming():
    app = collision_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await ready(app, pilot)
        table = app.query_one("#findings", DataTable)
        shown = table.row_count
        await pilot.press("p")
        assert "PAUSED" in screen_text(app, "#status")
        from dataclasses import replace

        app.hooks.on_finding(replace(app.findings[0], variant="held while paused", severity=Severity.WARNING))
        await wait_for(pilot, lambda: "1 new findings held" in screen_text(app, "#status"))
        assert table.row_count == shown
        await pilot.press("p")
        await wait_for(pilot, lambda: table.row_count == shown + 1)
        assert str(table.get_row_at(0)[1]).endswith("\nheld while paused")  # the newest group first
        assert "PAUSED" not in screen_text(app, "#status")
        await pilot.press("q")


async def open_help(app, pilot) -> None:
    """The replay at its end, then ? pressed and the help on top."""
    await ready(app, pilot)
    await pilot.press("question_mark")
    await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))


async def test_help_lists_every_key_of_the_footer():
    app = collision_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await open_help(app, pilot)
        text = str(app.screen.query_one("#help-keys", Static).render())
        for binding in app.BINDINGS:  # each the footer shows: not one the session does not offer (a, of captures)
            if binding.show and app.check_action(binding.action, ()) is not False:
                assert f"  {binding.key_display or binding.key}" in text, binding
        # every key the session offers, wrapped to the box: of the captures alone, none of the Envoy panes'
        assert app.offered == frozenset()
        flat, kept = " ".join(text.split()), {what for _, _, what in offered_keys(app.offered)}
        assert all(what in flat for what in kept)
        assert not [what for _, _, what in KEYS if what not in kept and what in flat]
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        await pilot.press("q")


async def test_narrow_terminal_stacks_the_panes():
    app = collision_app()
    async with app.run_test(size=(105, 50)) as pilot:
        await ready(app, pilot)
        assert app.screen.has_class("narrow") and not app.screen.has_class("compact")
        left, detail = app.query_one("#left"), app.query_one("#detail-box")
        assert detail.region.y > left.region.y and detail.region.x == left.region.x
        await pilot.press("q")


async def test_a_slow_start_up_step_shows_what_is_waited_on_and_for_how_long():
    class Slow(Session):
        describe = "slow"

        async def run(self, hooks):
            hooks.progress("waiting for the debug container meshdoctor-x to run")
            await hooks.stop.wait()
            return None

        def stats(self):
            return PipelineStats()

    app = MeshDoctorApp(Slow())
    async with app.run_test(size=(160, 50)) as pilot:
        # Its age from 2 s on; the exact second depends on when the 0.5 s refresh came (late on a busy machine).
        waited = re.compile(r"waiting for the debug container meshdoctor-x to run \(([2-9]|\d\d+) s\)")
        await wait_for(pilot, lambda: waited.search(screen_text(app, "#status")), seconds=10)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)
        assert asyncio.get_running_loop()  # the app left without a report and without an error


async def test_the_mouse_selects_a_finding_and_clicks_the_footer_keys():
    from dataclasses import replace

    app = collision_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await ready(app, pilot)
        first = app.findings[0]
        app.hooks.on_finding(replace(first, title="a second finding", variant="a second finding",
                                     severity=Severity.WARNING))
        table = app.query_one("#findings", DataTable)
        await wait_for(pilot, lambda: table.row_count == 2)
        assert app.selected.title == "a second finding"  # the newest, on top, followed
        top = table.rows[table.coordinate_to_cell_key((0, 0)).row_key].height
        await pilot.click("#findings", offset=(4, 1 + top))  # the second row (the header is one line)
        # the report's form of it (the list shows what the report gives once the files are read)
        await wait_for(pilot, lambda: app.selected is app.shown_findings()[0] and app.selected.title == first.title)
        assert first.title in screen_text(app, "#detail")
        help_key = next(k for k in app.screen.query("FooterKey") if k.key == "question_mark")
        await pilot.click(help_key)  # the footer's "? Help"
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await pilot.press("q")
