"""Issue 32 item 7: the screen starts with the run's verdict, as the report's first line does: the failures seen
(by problem), or "no failure seen" with what was read. At 80x24 (the compact layout) and at 160x45, over real lab
recordings read through the real pipeline; assertions are on the characters the screen shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.sources.pod_inputs import pod_inputs

from .test_app import screen_text, wait_for
from .test_small_screen import shown

DATA = Path(__file__).parent.parent.parent / "data"
SIZES = [(80, 24), (160, 45)]


def app_of(*paths: Path) -> MeshDoctorApp:
    return MeshDoctorApp(FileSession(list(pod_inputs([str(p) for p in paths]).files)))


@pytest.mark.parametrize("size", SIZES)
async def test_a_failing_run_opens_with_its_failures_named(size):
    app = app_of(DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap")
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status"))
        await pilot.pause(0.1)
        lines = [line.strip() for line in shown(app)]
        verdict = next((line for line in lines if line.startswith("verdict")), None)
        # whole, first on its row (at 80x24 what the run is doing follows it on the same row: s44)
        assert verdict.startswith("verdict: 1 failure problem (1 error, 0 warnings): tuple-collision"), lines
        # above the list, so it is read first: nothing of the findings list comes before it
        assert lines.index(verdict) < next(n for n, line in enumerate(lines) if "tuple-collision  UC" in line)
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_a_healthy_pod_says_no_failure_seen_with_what_was_read(size):
    healthy = DATA / "envoy-1.40-mesh" / "healthy" / "server"
    app = app_of(healthy)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status"))
        await pilot.pause(0.1)
        text = "\n".join(shown(app))
        # Istio's TEXT access-log lines start with the time in brackets (HTTP and TCP alike); Envoy's own log does not
        requests = sum(1 for line in (healthy / "istio-proxy.log").read_text().splitlines() if line.startswith("[20"))
        assert requests and f"verdict: no failure seen ({requests} requests logged, " in text, text
        assert "failure problem" not in text and "so far" not in text  # the files are read: no "so far"
        await pilot.press("q")
