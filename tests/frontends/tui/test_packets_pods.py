"""s45, the new-user trial of a watch over two pods: a packet both pods saw (the caller's request from its eth0 to
the server's eth0) was two rows of the packets pane that both said "eth0". In a run of several pods each row
names its capture's pod (``pod/iface``), cut to fit 80 columns; a run of one pod keeps its "iface" column
(its snapshots are unchanged). Pods' names are shown as written, however hostile: markup as text, control
bytes escaped, a long name cut with "…".

The packets are real Envoy 1.40's at both hops (tests/data/envoy-1.40-mesh, read by tshark) through the real
pipelines, one a pod, as a live watch names them (``pod/iface``, tests/mesh_replay.py); the offline run reads
the same recordings as two pods' directories (its packets' source is the file's path)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from textual.widgets import DataTable

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats, merged_stats
from kubectl_meshdoctor.frontends.shown import one_line
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.session import Session, SessionHooks
from kubectl_meshdoctor.sources.pod_inputs import pod_inputs

from ...mesh_replay import replay
from .test_app import wait_for
from .test_hostile_text import UNSAFE, screen_output
from .test_several_pods import MESH, Replayed
from .test_small_screen import shown

SIZES = [(80, 24), (160, 45)]
LONG = "\x1b]0;owned\x07" + "z" * 300  # an escape sequence, a BEL, and far more than a row


class TwoPods(Session):
    """``downstream-idle``'s caller and server replayed into a pipeline each, named ``pods``: what a watch of two
    pods hands the screen (the default pod_of reads the sources, ``pod/iface``)."""

    live = True

    def __init__(self, pods: tuple[str, str]) -> None:
        self.names = pods
        self.pipelines: list[Pipeline] = []
        self.replayed = asyncio.Event()

    async def run(self, hooks: SessionHooks):
        def new(pod: str) -> Pipeline:
            self.pipelines.append(Pipeline.with_detectors(pod=pod, on_finding=hooks.on_finding, keep_recent=200))
            return self.pipelines[-1]

        await replay("downstream-idle", new, pods=self.names, quiet_s=0, step=lambda: asyncio.sleep(0))
        self.replayed.set()
        await hooks.stop.wait()
        return None

    def stats(self) -> PipelineStats:
        return merged_stats(self.pipelines) if self.pipelines else PipelineStats()

    def pods(self) -> list[str]:
        return [p.ctx.pod for p in self.pipelines if p.ctx.pod]

    def packets(self):
        return sorted((ev for p in self.pipelines for ev in p.recent), key=lambda ev: ev.ts)


async def packets_shown(app, pilot) -> tuple[DataTable, list[str]]:
    """The packets pane opened on the selected finding's packets (the whole screen at 80x24): its rows as drawn."""
    await wait_for(pilot, lambda: app.selected is not None)
    await pilot.press("slash", "enter")  # no filter: the selected finding's packets
    table = app.query_one("#packets", DataTable)
    await wait_for(pilot, lambda: table.has_focus and table.row_count >= 4 and table.region.height > 3)
    await pilot.pause(0.3)
    return table, shown(app)[table.region.y:table.region.bottom]


def by_frame(table: DataTable, lines: list[str]) -> dict[str, list[tuple[str, str]]]:
    """frame -> [(the place cell, the line drawn)] of the rows on screen."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for i in range(min(table.row_count, len(lines) - 1)):
        cells = table.get_row_at(i)
        out[str(cells[0])].append((str(cells[2]), lines[1 + i]))
    return out


def written(label: str, pod: str) -> bool:
    """Whether ``label`` shows ``pod``'s name as written (its control bytes escaped): whole, or cut with "…"."""
    name = one_line(pod)
    return label == name or (label.startswith("…") and name.endswith(label[1:])) or (
        label.endswith("…") and name.startswith(label[:-1]))


def both_seen(table: DataTable, lines: list[str], width: int) -> list[tuple[str, str]]:
    """Asserts that the header names the pod column and that a frame seen in both pods is two rows on screen
    with two places, each ``POD/eth0``, drawn whole within ``width``; returns those two (place, line)."""
    assert lines[0].split()[:3] == ["frame", "t", "(s)"] and "pod/iface" in lines[0], lines[0]
    twice = [rows for rows in by_frame(table, lines).values() if len(rows) == 2]
    assert twice, lines
    for rows in twice:
        places = [p for p, _ in rows]
        assert len(set(places)) == 2 and all(p.endswith("/eth0") for p in places), rows
        for place, line in rows:
            assert f" {place} " in line and len(line.rstrip()) <= width, (place, line)
    return twice[0]


@pytest.mark.parametrize("size", SIZES)
async def test_a_packet_both_pods_saw_is_two_rows_each_naming_its_pod(size):
    session = Replayed("downstream-idle", ("downstream-idle-caller", "downstream-idle"))
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: session.replayed.is_set())
        table, lines = await packets_shown(app, pilot)
        rows = both_seen(table, lines, size[0])
        # each pod by what tells it from the other (their common part left out), as the findings' rows name them;
        # at 80 columns cut to leave the info its room, said with "…"
        assert sorted(p for p, _ in rows) == (["idle-caller/eth0", "idle/eth0"] if size[0] == 160
                                              else ["idle/eth0", "…caller/eth0"]), rows
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_offline_two_pods_directories_name_the_pods_too(size):
    """analyze --tui over two pods' directories: a packet's source is its file's path; the session knows whose."""
    scenario = MESH / "downstream-idle"
    app = MeshDoctorApp(FileSession(list(pod_inputs([str(scenario / "caller"), str(scenario / "server")]).files)))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "files read" in str(app.query_one("#status").render()))
        table, lines = await packets_shown(app, pilot)
        assert sorted(p for p, _ in both_seen(table, lines, size[0])) == ["caller/eth0", "server/eth0"]
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("pods", [("[b]x[/b]", LONG), ("[@click=app.quit]a", "[/]b\u202e\x9b31m")],
                         ids=["markup-and-long", "action-and-controls"])
async def test_hostile_pod_names_are_shown_as_written_and_cut(size, pods):
    session = TwoPods(pods)
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: session.replayed.is_set())
        table, lines = await packets_shown(app, pilot)
        rows = both_seen(table, lines, size[0])
        output = screen_output(app)
        assert app.is_running, "markup in a pod's name acted"
        assert not [ch for ch in UNSAFE if ch in output], [ch for ch in UNSAFE if ch in output]
        labels = sorted(p.removesuffix("/eth0") for p, _ in rows)
        # each the name of a pod of its own as written (escaped): whole, or its start or end cut with "…"
        assert sorted(next(p for p in pods if written(label, p)) for label in labels) == sorted(pods), labels
        assert all(len(label) <= 20 for label in labels), labels
        if pods[0] == "[b]x[/b]":  # the markup as text (whole at 160, its end at 80); the long name cut
            assert ("[b]x[/b]" if size[0] == 160 else "…]x[/b]") in labels, labels
            assert any(label.startswith("…zzz") for label in labels), labels
        await pilot.press("q")
