"""Issue 16: the triage desk at incident scale, over the lab's recordings (tests/data/README.md): a three-minute
collision is one row that counts its 90 instances; five framing violations of one app are five rows told apart at
80x24 and 160x45; while findings keep arriving, the highlighted row, the detail, the packets pane and `s` refer to
the same problem, and `[` `]` step through its instances."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Static

from kubectl_meshdoctor.commands.analyze import FileSession, analyze
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats
from kubectl_meshdoctor.core.report_model import Report
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.session import Session
from kubectl_meshdoctor.sources.files import CaptureArg

from .test_app import screen_text, wait_for

DATA = Path(__file__).parent.parent.parent / "data"
COLLISION = ("lab-collision3m-eth0.pcap", "lab-collision3m-lo.pcap")
FRAMING = ("lab-framing-mixed-eth0.pcap", "lab-framing-mixed-lo.pcap")
VIOLATIONS = ("more than one Transfer-Encoding field", "Transfer-Encoding together with Content-Length",
              "conflicting Content-Length values", "chunked is not the final transfer coding",
              "invalid header name bytes")


def args(files) -> list[CaptureArg]:
    return [CaptureArg.parse(str(DATA / f)) for f in files]


def drawn(app) -> bool:
    """Every finding handed to the app is in the list, and the list's table shows it."""
    return app._shown == len(app.findings) and app.list.up_to_date()


def rows(app) -> list[tuple[str, str]]:
    table = app.query_one("#findings", DataTable)
    return [(str(table.get_row_at(i)[0]), str(table.get_row_at(i)[1])) for i in range(table.row_count)]


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_a_three_minute_collision_is_one_row_that_counts(size):
    app = MeshDoctorApp(FileSession(args(COLLISION)))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status"), seconds=60)
        await wait_for(pilot, lambda: rows(app) == [("▶ERR\n ×90", rows(app)[0][1])])
        (sev, finding), = rows(app)
        assert finding.startswith("tuple-collision  UC,UF,URX  198.18.1.2:5002\nchallenge ACK to a SYN for")
        status = screen_text(app, "#status")
        assert re.search(r"findings: 90\b", status) and "verdict: 1 failure problem (1 error, 0 warnings): tuple-collision" in status
        detail = screen_text(app, "#detail")
        assert re.match(r"instance 90 of 90 \(newest\), seen 90 times in 2 min \d+ s \(30\.\d/min\)", detail), detail
        await pilot.press("q")


class Arriving(Session):
    """The framing recording's findings handed to the screen a few at a time, as a live watch hands them."""

    saves_evidence = True  # the prompt is what the test reads; it never saves

    def __init__(self, report: Report, step: asyncio.Event) -> None:
        self.describe = "pod/framing  namespace lab  context lab"
        self.recorded = report
        self.step = step  # set by the test: hand over the next batch
        self.handed = 0

    async def run(self, hooks) -> Report:
        for i in range(0, len(self.recorded.findings), 10):
            await self.step.wait()
            self.step.clear()
            for f in self.recorded.findings[i:i + 10]:
                hooks.on_finding(f)
            self.handed = min(i + 10, len(self.recorded.findings))
        hooks.progress("all handed; q quits")
        await hooks.stop.wait()
        return self.recorded

    def stats(self) -> PipelineStats:
        return self.recorded.stats


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 45), (200, 50)])
async def test_framing_violations_are_told_apart_and_the_selection_holds_while_findings_arrive(size):
    recorded = await analyze(args(FRAMING), Pipeline.with_detectors())
    assert len(recorded.findings) == 75
    step = asyncio.Event()
    session = Arriving(recorded, step)
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        assert app.query_one("#findings", DataTable).has_focus  # the arrow keys work at once
        header = app.screen.query_one("HeaderTitle")
        await wait_for(pilot, lambda: "pod/framing" in str(header.render()))  # the header keeps the pod
        while len(rows(app)) < 5:
            step.set()
            await wait_for(pilot, lambda: not step.is_set() and len(app.findings) == session.handed)
            await wait_for(pilot, lambda: drawn(app))  # the list draws at its twice-a-second tick
        shown = rows(app)
        for violation in VIOLATIONS:  # each row names its violation in full, whatever the width
            (row,) = [r for r in shown if violation in r[1].replace("\n", " ")]
            assert row[1].startswith("http-framing  UPE  198.18.1.2:5000\n"), row
        await pilot.press("down", "down")
        table = app.query_one("#findings", DataTable)
        chosen = app.list.group(app.list.selected)
        picked, picked_count = app.selected, chosen.count
        assert picked is chosen.newest
        assert table.get_row_at(table.cursor_row)[1].plain.endswith(chosen.label.split()[-1])
        for _ in range(3):  # more findings of every group arrive: the chosen problem and instance hold still
            step.set()
            await wait_for(pilot, lambda: not step.is_set() and len(app.findings) == session.handed)
            await wait_for(pilot, lambda: drawn(app))
            assert app.list.group(app.list.selected) is chosen
            assert chosen.label in table.get_row_at(table.cursor_row)[1].plain.replace("\n", " ")
            assert app.selected is picked and chosen.newest is not picked  # issue 32: no replacing while read
            assert chosen.label in screen_text(app, "#detail").replace("\n", " ") or \
                picked.title in screen_text(app, "#detail")
            # issue 32 item 4: the instance line follows the group's count
            assert (f"instance {picked_count} of {chosen.count}, seen {chosen.count} times"
                    f"") in screen_text(app, "#detail")
            assert f"newer instances: {chosen.count - picked_count} (] steps" in screen_text(app, "#detail")
            assert f"({picked.flow.client} on lo)" in screen_text(app, "#packets-title")
        # [ steps to an older instance: detail, packets and s go with it.
        await pilot.press("left_square_bracket")
        older = chosen.instances[picked_count - 2]
        assert app.selected is older
        assert f"instance {picked_count - 1} of {chosen.count}" in screen_text(app, "#detail")
        assert f"({older.flow.client} on lo)" in screen_text(app, "#packets-title")
        await pilot.press("s")
        await wait_for(pilot, lambda: app.screen.query("#prompt-path"))
        prompt = "\n".join(str(w.render()) for w in app.screen.query(Static))
        assert older.title in prompt and older.flow.client in prompt
        assert app.screen.query_one("#prompt-path", Input).value.endswith(
            f"meshdoctor-http-framing-{next(e.frame for e in older.evidence if e.frame)}.pcapng")
        await pilot.press("escape")
        await pilot.press("right_square_bracket")
        assert app.selected is picked
        await pilot.press("n")  # the newest instance at once
        assert app.selected is chosen.newest
        assert f"instance {chosen.count} of {chosen.count} (newest)" in screen_text(app, "#detail")
        await pilot.press("q")


async def test_stepping_through_instances_holds_the_selection_when_a_new_problem_arrives():
    """`[` without moving the cursor is a choice too: a problem that arrives after it does not take over."""
    from dataclasses import replace

    recorded = await analyze(args(FRAMING), Pipeline.with_detectors())
    first_ten = recorded.findings[:10]  # two rounds: five problems of two instances each
    newcomer = [replace(f, variant="a problem that arrives later", ts=f.ts + 60) for f in recorded.findings[10:20]]
    step = asyncio.Event()
    session = Arriving(replace(recorded, findings=first_ten + newcomer), step)
    app = MeshDoctorApp(session)
    async with app.run_test(size=(160, 45)) as pilot:
        step.set()
        await wait_for(pilot, lambda: not step.is_set() and len(app.findings) == 10)
        await wait_for(pilot, lambda: len(rows(app)) == 5)
        chosen = app.list.group(app.list.selected)
        await pilot.press("left_square_bracket")
        stepped = app.selected
        assert stepped is chosen.instances[0]
        step.set()  # the new problem arrives, on top
        await wait_for(pilot, lambda: len(app.findings) == 20)
        await wait_for(pilot, lambda: len(rows(app)) == 6)
        assert rows(app)[0][1].endswith("a problem that arrives later")
        assert app.list.group(app.list.selected) is chosen and app.selected is stepped
        await pilot.press("q")
