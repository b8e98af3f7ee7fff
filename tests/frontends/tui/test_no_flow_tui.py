"""Issue 30: a finding of a pod's spec (lint) or of Envoy's counters has no flow, and the triage desk says so: its
detail names each piece of evidence by its kind (a spec field by its field, a counter by its name), never as
"frame 0", and no pane or prompt shows a placeholder flow ("- -> 10.244.1.23:5000 on")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from textual.widgets import DataTable, Static

from kubectl_meshdoctor.commands.analyze import FileSession, analyze
from kubectl_meshdoctor.core.findings import COUNTER, SPEC, Finding
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats
from kubectl_meshdoctor.core.report_model import LintSource, Report
from kubectl_meshdoctor.lint import lint_pods
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.session import Session
from kubectl_meshdoctor.sources.files import CaptureArg

from .test_app import screen_text, wait_for
from .test_small_screen import shown, words

ROOT = Path(__file__).resolve().parent.parents[2]
PLACEHOLDERS = ("frame 0", "- ->", "-> -", " on \n", "line 0")


class Handed(Session):
    """A run whose findings are handed to the screen at once, then waits for q."""

    saves_evidence = True  # the `s` prompt is what the test reads; it never saves

    def __init__(self, findings: list[Finding]) -> None:
        self.describe = "pod/classic  namespace shop"
        self.findings = findings

    async def run(self, hooks) -> Report:
        for f in self.findings:
            hooks.on_finding(f)
        hooks.progress("all handed; q quits")
        await hooks.stop.wait()
        return Report(LintSource(("shop/classic",)), PipelineStats(), self.findings)

    def stats(self) -> PipelineStats:
        return PipelineStats()


def spec_findings() -> list[Finding]:
    pod = yaml.safe_load((ROOT / "tests" / "lint" / "data" / "classic.yaml").read_text())
    found = [f for f in lint_pods([pod]) if any(e.kind == SPEC for e in f.evidence)]
    assert found
    return found


async def counter_findings() -> list[Finding]:
    report = await analyze([CaptureArg.parse(str(ROOT / "tests" / "envoy" / "data" / "stats_sample.txt"))],
                           Pipeline.with_detectors())
    found = [f for f in report.findings if any(e.kind == COUNTER for e in f.evidence)]
    assert found
    return found


async def check_each_finding(findings: list[Finding], size: tuple[int, int], kind: str, said: str) -> None:
    app = MeshDoctorApp(Handed(findings))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status"))
        await wait_for(pilot, lambda: app.list is not None and app.list.up_to_date() and app.selected is not None)
        seen = set()
        for _ in range(len(findings) + 1):
            f = app.selected
            seen.add(id(f))
            detail = screen_text(app, "#detail")
            assert f.connection is None
            assert f"where: {f.flow.server} ({said}: no connection)" in detail, detail
            for e in f.evidence:
                if e.kind == kind:
                    assert e.cited() in detail and e.cited().startswith(f"{e.source} {e.locator()} ")
            for placeholder in PLACEHOLDERS:
                assert placeholder not in detail, (placeholder, detail)
            title = screen_text(app, "#packets-title")
            assert "- on" not in title and "no connection" in title, title
            await pilot.press("s")
            await wait_for(pilot, lambda: app.screen.query("#prompt-path"))
            prompt = "\n".join(str(w.render()) for w in app.screen.query(Static))
            assert "no packet among its evidence" in prompt and "frame 0" not in prompt and "- ->" not in prompt
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.screen.query("#prompt-path"))
            await pilot.press("down")
            await pilot.pause(0.1)
        assert len(seen) == len({id(g.newest) for g in app.list.grouper.groups()})  # every row was looked at
        await pilot.press("q")


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_a_spec_finding_shows_no_flow_and_names_its_fields(size):
    await check_each_finding(spec_findings(), size, SPEC, "the pod's spec")


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_a_counter_finding_shows_no_flow_and_names_its_counters(size):
    await check_each_finding(await counter_findings(), size, COUNTER, "Envoy's counters")


class AlsoSpec(FileSession):
    """The lab's collision recording, and the pod's spec findings lint gives at a watch's start."""

    def __init__(self, spec: list[Finding]) -> None:
        super().__init__([CaptureArg.parse(str(ROOT / "tests" / "data" / f))
                          for f in ("lab-collision-eth0.pcap", "lab-collision-lo.pcap")])
        self.spec = spec

    async def run(self, hooks):
        for f in self.spec:
            hooks.on_finding(f)
        return await super().run(hooks)


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_packets_pane_of_a_spec_finding_says_it_has_none_and_shows_the_latest(size):
    app = MeshDoctorApp(AlsoSpec(spec_findings()))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status") and app.list.up_to_date())
        while app.selected.connection is not None:  # the collision (an error) first, then the spec's warnings
            await pilot.press("down")
            await pilot.pause(0.1)
        f = app.selected
        if app.compact():
            await pilot.press("slash")  # the packets pane, full screen
        table = app.query_one("#packets", DataTable)
        await wait_for(pilot, lambda: table.row_count > 0)
        await pilot.pause(0.2)
        text = words(shown(app))
        assert f"selected: {f.flow.server} (the pod's spec: no connection), no packets of its own; latest packets " \
               f"analysed: {table.row_count} packets" in text, text
        assert table.row_count == len(app.session.packets())  # the latest, every one the run keeps
        assert "evidence in bold" not in text and "frame 0" not in text and "- on" not in text
        await pilot.press("q")
