"""The live Envoy panes over real Envoy (tests/local_envoy.py, on loopback): a several-pod watch's `l` steps through
the pods' sidecars with `p`, and `k` shows the sidecar's /stats that moved since the run's first read of them, read
by the watch's own session (LiveSession.counters). At 80x24 and 160x45, on the characters the screen shows."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from kubernetes.client import ApiClient
from textual.widgets import DataTable

from kubectl_meshdoctor.commands.log_level import LoggerControl
from kubectl_meshdoctor.commands.watch.live import WatchOptions
from kubectl_meshdoctor.commands.watch.live_session import LiveSession
from kubectl_meshdoctor.envoy.stats import parse_stats
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.loggers import LoggersScreen
from kubectl_meshdoctor.frontends.tui.stats_pane import NARROW, CountersScreen, short_cluster
from kubectl_meshdoctor.kube.admin import EnvoyAdmin
from kubectl_meshdoctor.kube.client import Kube
from kubectl_meshdoctor.kube.target import parse_targets

from ...local_envoy import CLUSTER, free_port, local_envoy
from .test_app import wait_for
from .test_several_pods import TwoSidecars
from .test_small_screen import shown, words

SIZES = [(80, 24), (160, 45)]
PODS = tuple(TwoSidecars().pods())  # the caller's and the server's


class TwoProxies(TwoSidecars):
    """A watch of two pods whose sidecars are two real Envoys: the loggers pane's controls, one a pod."""

    def __init__(self, controls: dict[str, LoggerControl]) -> None:
        super().__init__()
        self.controls = controls

    def loggers(self, pod=None):
        self.asked.append(pod)
        return self.controls[pod or PODS[0]]


@contextlib.contextmanager
def admins(envoys) -> dict[str, EnvoyAdmin]:
    made = {pod: EnvoyAdmin(None, "shop", pod, open_socket=envoy.admin_socket) for pod, envoy in zip(PODS, envoys)}
    try:
        yield made
    finally:
        for admin in made.values():
            admin.close()


def level_of(table: DataTable, logger: str) -> str | None:
    rows = [table.get_row_at(i) for i in range(table.row_count)]
    return next((str(r[1]) for r in rows if str(r[0]) == logger), None)


@pytest.mark.parametrize("size", SIZES)
async def test_l_steps_through_the_pods_loggers_with_p(tmp_path, size):
    with local_envoy(tmp_path / "one", free_port()) as first, local_envoy(tmp_path / "two", free_port()) as second:
        status, _ = await asyncio.to_thread(second.admin, "/logging?connection=debug", "POST")
        assert status == 200  # the second pod's sidecar only: what tells the two apart on screen
        with admins((first, second)) as by_pod:
            session = TwoProxies({pod: LoggerControl(admin) for pod, admin in by_pod.items()})
            app = MeshDoctorApp(session)
            async with app.run_test(size=size) as pilot:
                await pilot.press("l")
                await wait_for(pilot, lambda: isinstance(app.screen, LoggersScreen)
                               and level_of(app.screen.query_one("#loggers", DataTable), "connection") is not None)
                table = app.screen.query_one("#loggers", DataTable)
                assert level_of(table, "connection") == "warning"  # the first pod's: Istio's default
                await pilot.pause(0.1)
                screen = words(shown(app))
                assert f"loggers of pod/{PODS[0]} (1 of 2; p: next pod)" in screen, screen
                assert "p next pod" in screen  # the keys line names it
                await pilot.press("p")
                await wait_for(pilot, lambda: level_of(table, "connection") == "debug")
                await pilot.pause(0.1)
                screen = words(shown(app))
                assert f"loggers of pod/{PODS[1]} (2 of 2; p: next pod)" in screen, screen
                assert session.asked[-1] == PODS[1]
                await pilot.press("p")  # round to the first again
                await wait_for(pilot, lambda: level_of(table, "connection") == "warning")
                await pilot.press("escape", "q")


class OneSidecar(LiveSession):
    """The watch's own session (its counters: LiveSession.counters) over a real Envoy standing in for pod
    reviews's sidecar, reached on loopback instead of through a port-forward; the run's first read of /stats
    taken as watch_pod takes it (open_proxy), before the traffic."""

    def __init__(self, admin: EnvoyAdmin) -> None:
        super().__init__(Kube(ApiClient(), "shop", "lab", None),
                         WatchOptions(parse_targets(["pod/reviews"]), "shop"))
        self.admin = admin
        self.state.pod = "reviews"

    async def run(self, hooks):
        body = (await asyncio.to_thread(self.admin.get, "/stats")).body
        self.state.stats_before = parse_stats(body)
        hooks.progress("capturing")
        await hooks.stop.wait()
        return None

    def loggers(self, pod=None):
        return LoggerControl(self.admin)


@pytest.mark.parametrize("size", SIZES)
async def test_k_shows_the_sidecars_counters_that_moved_since_the_run_began(tmp_path, size):
    upstream = free_port()  # nothing listens: each request through Envoy is a real connect failure
    with local_envoy(tmp_path, upstream) as envoy:
        admin = EnvoyAdmin(None, "shop", "reviews", open_socket=envoy.admin_socket)
        try:
            session = OneSidecar(admin)
            app = MeshDoctorApp(session)
            async with app.run_test(size=size) as pilot:
                await wait_for(pilot, lambda: bool(session.state.stats_before))
                await pilot.press("k")
                await wait_for(pilot, lambda: isinstance(app.screen, CountersScreen) and app.screen.view is not None)
                name = f"cluster.{CLUSTER};.upstream_cx_connect_fail"  # the alt_stat_name, as Istio names it
                assert name not in app.screen.view.stats  # nothing failed since the first read
                statuses = [await asyncio.to_thread(envoy.request, f"/refused/{i}") for i in range(3)]
                assert statuses == [503, 503, 503]
                await pilot.press("slash", *"connect_fail", "enter")
                await pilot.press("f")
                table = app.screen.query_one("#counters", DataTable)
                await wait_for(pilot, lambda: table.row_count == 1)
                await pilot.pause(0.1)
                screen = words(shown(app))
                if size[0] < NARROW:  # s46: the cluster short, before the stat
                    assert f"3 {short_cluster(CLUSTER)} upstream_cx_connect_fail" in screen, screen
                else:
                    assert f"3 upstream_cx_connect_fail {CLUSTER}" in screen, screen  # the stat, then its cluster
                assert "moved since the run's first read of /stats" in screen and "refresh now" in screen
                await pilot.press("escape", "q")
        finally:
            admin.close()
