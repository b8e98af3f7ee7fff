"""Issue 31's trial of a watch over two pods at 80x24 and 160x45: the rows show the findings joined as the report
will join them while the run goes on (a finding replaced by its joined form in place, the selection kept), every
row names its pod, and the access-log and clusters panes keep the pods apart.

The live runs replay the mesh recordings of real Envoy 1.40 at both hops (tests/data/envoy-1.40-mesh) through
the watch's own session (LiveSession: its pipelines, its joined view) as the live path feeds them (tests/mesh_replay.py);
the run is not over when the screen is read."""

from __future__ import annotations

import asyncio
import re

import pytest
from kubernetes.client import ApiClient
from textual.widgets import DataTable, Static

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.commands.watch.live import WatchOptions
from kubectl_meshdoctor.commands.watch.live_session import LiveSession
from kubectl_meshdoctor.core.live_join import LiveJoin
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.session import Session, SessionHooks
from kubectl_meshdoctor.kube.client import Kube
from kubectl_meshdoctor.kube.target import parse_targets
from kubectl_meshdoctor.sources.envoy_files import read_clusters
from kubectl_meshdoctor.sources.files import CaptureArg

from ...mesh_replay import DATA, replay
from .test_app import screen_text, wait_for
from .test_hostile_text import UNSAFE, screen_output

SIZES = [(80, 24), (160, 45)]
MESH = DATA / "envoy-1.40-mesh"


class Replayed(LiveSession):
    """`watch pod/CALLER pod/SERVER` whose pods' events come from a recording: the session, its pipelines and its
    joined view are the watch's; only the cluster is not there (its API client is never called)."""

    def __init__(self, scenario: str, pods: tuple[str, str]) -> None:
        targets = parse_targets([f"pod/{p}" for p in pods])
        super().__init__(Kube(ApiClient(), "mesh", "lab", None), WatchOptions(targets, "mesh"))
        self.scenario = scenario
        self.pod_names = pods
        self.replayed = asyncio.Event()

    async def run(self, hooks: SessionHooks):
        await replay(self.scenario, lambda pod: self.new_pipeline(hooks, pod), pods=self.pod_names,
                     step=lambda: asyncio.sleep(0))  # the screen draws between events, as it does live
        self.replayed.set()
        await hooks.stop.wait()  # the run goes on until q: nothing is finished
        return None


def held(scenario: str, pods: tuple[str, str]) -> tuple[Replayed, list[float], MeshDoctorApp]:
    """A replayed watch whose joined view is made once, then again only when the test moves ``clock`` a minute on:
    the rows as handed are seen first, then joined."""
    session = Replayed(scenario, pods)
    clock = [0.0]
    session.joiner = LiveJoin(lambda: session.pipelines, every_s=60.0, clock=lambda: clock[0])
    return session, clock, MeshDoctorApp(session)


def rows(app) -> list[str]:
    table = app.query_one("#findings", DataTable)
    return [str(table.get_row_at(i)[1]) for i in range(table.row_count)]


@pytest.mark.parametrize("size", SIZES)
async def test_one_failure_of_two_pods_is_one_row_naming_both_before_the_run_ends(size):
    """downstream-idle: both pods' eth0 hold the connection the pod's sidecar closed, and each pod's pipeline
    hands a stale-keepalive; the report makes them one, the caller's, quoting its 503 UC. So does the screen."""
    session = Replayed("downstream-idle", ("downstream-idle-caller", "downstream-idle"))
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: session.replayed.is_set() and len(app.findings) == 2 and len(rows(app)) == 1
                       and "503 UC" in screen_text(app, "#detail"))
        assert sorted(f.pod for f in app.findings) == ["downstream-idle", "downstream-idle-caller"]  # as handed
        (row,) = rows(app)
        # each pod by what tells it from the other (their common leading part left out), the kept one first
        assert row.startswith("idle-caller+idle  stale-keepalive  UC"), row
        assert app.report is None  # the run goes on
        assert "also seen from pod/downstream-idle" in screen_text(app, "#detail")
        await wait_for(pilot, lambda: re.search(r"findings: 1\b", screen_text(app, "#status"))
                       and "so far: 1 failure problem (1 error, 0 warnings): stale-keepalive" in screen_text(app, "#status"))
        pods = app.query_one("#pods", DataTable)
        assert [str(c) for c in pods.get_row("downstream-idle-caller")][3] == "1"  # the error is the caller's
        assert [str(c) for c in pods.get_row("downstream-idle")][3] == "0"
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_a_row_folded_into_another_hands_it_the_selection_and_loses_no_line(size):
    """refused: the server's upstream-refused, and the caller's next-hop (its relayed 503). The user picks the
    caller's row; then the join folds it into the server's, which takes the selection and quotes both lines."""
    session, clock, app = held("refused", ("refused-caller", "refused"))
    async with app.run_test(size=size) as pilot:
        table = app.query_one("#findings", DataTable)
        await wait_for(pilot, lambda: session.replayed.is_set() and len(app.findings) == 2 and len(rows(app)) == 2)
        shown = rows(app)
        assert any(r.startswith("refused-caller  next-hop") for r in shown), shown
        assert any(r.startswith("refused  upstream-refused  UF") for r in shown), shown
        table.focus()
        at = next(i for i, r in enumerate(shown) if "next-hop" in r)
        await pilot.press(*(("down", "up") if at == 0 else ("up", "down")))  # away and back: the user's own pick
        await wait_for(pilot, lambda: app.selected is not None and app.selected.detector == "next-hop"
                       and not app.list.following)
        caller_line = app.selected.access_log[0]
        clock[0] += 60.0  # the next join is due
        await wait_for(pilot, lambda: len(rows(app)) == 1)
        (row,) = rows(app)
        assert row.startswith("refused+refused-caller  upstream-refused  UF"), row
        await wait_for(pilot, lambda: app.selected.detector == "upstream-refused")
        assert caller_line in app.selected.access_log and len(app.selected.access_log) == 2
        assert table.cursor_row == 0 and app.report is None
        assert "via_upstream" in screen_text(app, "#detail")
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_a_joined_row_is_updated_in_place_and_keeps_the_selection(size):
    session, clock, app = held("stale-keepalive", ("stale-keepalive-caller", "stale-keepalive"))
    async with app.run_test(size=size) as pilot:
        table = app.query_one("#findings", DataTable)
        await wait_for(pilot, lambda: session.replayed.is_set() and len(rows(app)) == 2)
        at = next(i for i, r in enumerate(rows(app)) if "stale-keepalive  UC" in r)
        table.focus()
        table.move_cursor(row=at)
        await wait_for(pilot, lambda: app.selected is not None and app.selected.detector == "stale-keepalive"
                       and not app.list.following)
        key = app.list.selected
        assert not app.selected.access_log  # as handed: no line attached yet
        clock[0] += 60.0
        await wait_for(pilot, lambda: len(rows(app)) == 1 and len(app.selected.access_log) == 2)
        assert app.list.selected == key and app.selected.detector == "stale-keepalive"
        assert rows(app)[0].startswith("keepalive+keepalive-caller  stale-keepalive"), rows(app)
        await pilot.press("q")


HOSTILE_PODS = ("web-7d9f-[b]x\x1b]0;owned\x07[/]", "web-7d9f-" + "q" * 300 + "\u202eexe")


@pytest.fixture
def hostile_pods(tmp_path) -> list[CaptureArg]:
    """Two pods (as `analyze FILE:POD/` names them), named with markup, control bytes, a bidi override and 300
    characters, each with a recorded sidecar log of the refused scenario."""
    out = []
    for name, side in zip(HOSTILE_PODS, ("caller", "server")):
        log = tmp_path / side / "istio-proxy.log"
        log.parent.mkdir()
        log.write_bytes((MESH / "refused" / side / "istio-proxy.log").read_bytes())
        out.append(CaptureArg(str(log), "", False, name))
    return out


@pytest.mark.parametrize("size", SIZES)
async def test_hostile_pod_names_are_shown_as_text_on_the_rows_and_the_access_log(hostile_pods, size):
    app = MeshDoctorApp(FileSession(hostile_pods))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "files read" in screen_text(app, "#status") and len(rows(app)) >= 1
                       and app.list.up_to_date() and app._view is not None and app._view.covers == len(app.findings))
        shown = [screen_output(app)]
        names = rows(app)
        assert all("+" in r.split("  ")[0] or r.startswith(("[b]", "…")) for r in names), names
        # escaped, its markup as written, each name cut to 20 columns keeping its end
        assert any("…qqqqqqqqqq\\u202eexe+…\\x1b]0;owned\\x07[/]  upstream-refused" in r for r in names), names
        assert all(len(line) <= size[0] for r in names for line in r.splitlines()), names  # 300 characters cut
        await pilot.press("a")
        await wait_for(pilot, lambda: app.screen.query("#access-log")
                       and app.screen.query_one("#access-log", DataTable).row_count > 0)
        access = app.screen.query_one("#access-log", DataTable)
        assert [str(c.label) for c in access.columns.values()][0] == "pod"
        pods = {str(access.get_row_at(i)[0]) for i in range(access.row_count)}
        assert len(pods) == 2 and all(len(p) <= 20 for p in pods), pods
        # the title says whose lines these are: both pods', not the first pod's alone
        assert app.screen.sub_title == "Envoy access log of 2 pods (p: one pod's lines)", app.screen.sub_title
        assert "Envoy access log of 2 pods" in screen_output(app).splitlines()[0]
        everyone = access.row_count
        await pilot.press("p")  # one pod's lines
        await wait_for(pilot, lambda: "(p: next pod)" in str(app.screen.query_one("#log-status", Static).render()))
        one = {str(access.get_row_at(i)[0]) for i in range(access.row_count)}
        assert len(one) == 1 and 0 < access.row_count < everyone
        title = app.screen.sub_title
        assert title.startswith("Envoy access log of pod/") and title.endswith("(1 of 2; p: next pod)"), title
        assert not [ch for ch in UNSAFE if ch in title], title  # the hostile name, escaped
        shown.append(screen_output(app))
        await pilot.press("p", "p")  # the other pod's, then every pod's again
        await wait_for(pilot, lambda: access.row_count == everyone)
        await pilot.press("escape")
        assert app.is_running, "markup in a pod's name acted"
        await pilot.press("q")
    text = "\n".join(shown)
    assert not [ch for ch in UNSAFE if ch in text], [ch for ch in UNSAFE if ch in text]


class TwoSidecars(Session):
    """The clusters pane of a watch of two pods: each pod's /clusters as its real Envoy 1.40 dumped it (the
    mesh recording's caller and server)."""

    describe = "two pods"
    live = True

    def __init__(self) -> None:
        self.asked: list[str | None] = []

    async def run(self, hooks):
        await hooks.stop.wait()
        return None

    def stats(self):
        from kubectl_meshdoctor.core.pipeline import PipelineStats

        return PipelineStats()

    def pod(self):
        return "refused-caller"

    def pods(self):
        return ["refused-caller", "refused"]

    def clusters(self, pod=None):
        side = {"refused-caller": "caller", "refused": "server", None: "caller"}[pod]

        def fetch():
            self.asked.append(pod)
            return read_clusters(str(MESH / "refused" / side / "clusters.txt"))

        return fetch


@pytest.mark.parametrize("size", SIZES)
async def test_c_shows_each_pods_clusters_one_pod_at_a_time(size):
    session = TwoSidecars()
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await pilot.press("c")
        await wait_for(pilot, lambda: app.screen.query("#clusters")
                       and app.screen.query_one("#clusters", DataTable).row_count > 0)
        table = app.screen.query_one("#clusters", DataTable)

        def clusters() -> set[str]:
            return {str(table.get_row_at(i)[0]) for i in range(table.row_count)}

        assert any(c.startswith("outbound|5000||refused.") for c in clusters())  # the caller's
        assert "pod/refused-caller (1 of 2; p: next pod)" in app.screen.sub_title
        assert "next pod" in screen_output(app)  # the key, in the footer
        await pilot.press("p")
        await wait_for(pilot, lambda: table.row_count > 0 and "inbound|5000||" in clusters())
        assert not any(c.startswith("outbound|5000||refused.") for c in clusters())  # the server's only
        assert "pod/refused (2 of 2" in app.screen.sub_title
        assert "pod/refused: " in str(app.screen.query_one("#clusters-status", Static).render())
        assert session.asked[0] == "refused-caller" and "refused" in session.asked
        await pilot.press("escape", "q")
