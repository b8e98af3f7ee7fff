"""Snapshots of the main screen, the opened detail, the help screen and the counters pane (pytest-textual-snapshot), over the lab's
recorded collision and its mixed framing recording, at 80x24 and 160x45 (issues 16 and 32: nothing essential is cut
at either; below 100x30 one pane at a time).

Stable by construction: a fixed terminal size, no clock in the header, times relative to the capture, file names
relative to tests/data. Regenerate after an intended change of the screen with
``scripts/test tests/frontends/tui/test_snapshots.py --snapshot-update`` and look at the SVGs before committing them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.screens import HelpScreen
from kubectl_meshdoctor.frontends.tui.stats_pane import CountersScreen
from kubectl_meshdoctor.sources.files import CaptureArg
from kubectl_meshdoctor.sources.pod_inputs import pod_inputs

from .test_app import wait_for
from .test_triage import ready

DATA = Path(__file__).parent.parent.parent / "data"
SIZES = [(80, 24), (160, 45)]
COLLISION = ("lab-collision-eth0.pcap", "lab-collision-lo.pcap")
FRAMING = ("lab-framing-mixed-eth0.pcap", "lab-framing-mixed-lo.pcap")


def _app(files=COLLISION) -> MeshDoctorApp:
    return MeshDoctorApp(FileSession([CaptureArg.parse(f) for f in files]))


async def _replayed(pilot) -> None:
    await ready(pilot.app, pilot)
    await pilot.pause(0.6)  # one more refresh tick: every pane has drawn the final state


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("files", [COLLISION, FRAMING], ids=["collision", "framing"])
def test_main_screen(snap_compare, monkeypatch, files, size):
    monkeypatch.chdir(DATA)
    assert snap_compare(_app(files), terminal_size=size, run_before=_replayed)


def _pressed(key: str, shown) -> object:
    """A run_before: the replay drawn, then ``key`` pressed and ``shown(app)`` true."""

    async def run_before(pilot) -> None:
        await _replayed(pilot)
        await pilot.press(key)
        await wait_for(pilot, lambda: shown(pilot.app))
        await pilot.pause(0.2)

    return run_before


@pytest.mark.parametrize("size", SIZES)
def test_help_screen(snap_compare, monkeypatch, size):
    monkeypatch.chdir(DATA)
    opened = _pressed("question_mark", lambda app: isinstance(app.screen, HelpScreen))
    assert snap_compare(_app(), terminal_size=size, run_before=opened)


@pytest.mark.parametrize("size", SIZES)
def test_detail_opened(snap_compare, monkeypatch, size):
    """Enter on the selected problem: at 80x24 its detail takes the screen (issue 32), at 160x45 it is focused."""
    monkeypatch.chdir(DATA)
    opened = _pressed("enter", lambda app: app.query_one("#detail-box").has_focus)
    assert snap_compare(_app(FRAMING), terminal_size=size, run_before=opened)


@pytest.mark.parametrize("size", SIZES)
def test_counters_pane(snap_compare, monkeypatch, size):
    """k over a pod's /stats before and after (real Envoy 1.40's, the refused recording's server): the stats that
    moved between the dumps, the cluster failures red, the dumps named (issue 32 item 10)."""
    monkeypatch.chdir(DATA)
    app = MeshDoctorApp(FileSession(list(pod_inputs(["envoy-1.40-mesh/refused/server"]).files)))

    async def run_before(pilot) -> None:
        await wait_for(pilot, lambda: "files read" in str(pilot.app.query_one("#status").render()))
        await pilot.pause(0.6)  # the panes offered are the final ones
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, CountersScreen) and pilot.app.screen.view)
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=size, run_before=run_before)
