"""Issue 32 item 11: the demo's own failure in the access-log pane. A tuple collision's UC, UF, URX are logged by the
caller's sidecar (it opened the connection), and the watched pod's log has none of them: the pane, opened on the
finding, says so and how to read the caller's log; once a line carrying them is read (the caller's pod too), it
says nothing of it. Over the lab's 3-minute collision recording (its pod's own access log: 200s and TCP lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.detail_pane import DetailPane
from kubectl_meshdoctor.frontends.tui.envoy import AccessLogScreen
from kubectl_meshdoctor.sources.files import CaptureArg

from .test_app import screen_text, wait_for
from .test_small_screen import shown, words

DATA = Path(__file__).parent.parent.parent / "data"
FILES = ("lab-collision3m-eth0.pcap", "lab-collision3m-lo.pcap", "lab-collision3m-access.log")
# A caller sidecar's own line of a connection its upstream reset (real Envoy 1.40, the lab's downstream-idle
# recording: tests/data/envoy-1.40-mesh/downstream-idle/caller/istio-proxy.log).
CALLER_UC = next(line for line in (DATA / "envoy-1.40-mesh" / "downstream-idle" / "caller" / "istio-proxy.log")
                 .read_text().splitlines() if '" 503 UC ' in line)


class Watched(FileSession):
    """The recording as a watch of pod ``name`` shows it (the pane names the pod whose log it is)."""

    def __init__(self, name: str, caller_lines: tuple[str, ...] = ()) -> None:
        super().__init__([CaptureArg.parse(str(DATA / f)) for f in FILES])
        self.name = name
        self.caller_lines = caller_lines

    def pod(self):
        return self.name

    def access_logs(self):
        if not self.caller_lines:
            return {}
        return {self.name: self.access_log(), f"{self.name}-caller": [parse_line(x) for x in self.caller_lines]}


async def open_access_log(app, pilot) -> list[str]:
    await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status") and app.selected is not None
                   and app.selected.detector == "tuple-collision")
    await pilot.press("a")
    await wait_for(pilot, lambda: isinstance(app.screen, AccessLogScreen)
                   and "access-log lines" in words(shown(app)))
    await pilot.pause(0.2)
    return shown(app)


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_pane_says_the_callers_sidecar_logs_the_collisions_flags(size):
    app = MeshDoctorApp(Watched("collision"))
    async with app.run_test(size=size) as pilot:
        lines = await open_access_log(app, pilot)
        text = words(lines)
        assert "The selected tuple-collision explains UC, UF, URX: pod/collision's sidecar logged none." in text, text
        assert "The caller's sidecar at 198.18.1.1 logs them (it opened the connection; a caller without a sidecar " \
               "logs none)." in text
        assert "kubectl get pods -A --field-selector status.podIP=198.18.1.1, then kubectl logs -n NS POD -c " \
               "istio-proxy (or watch both: kubectl meshdoctor watch pod/collision pod/POD)" in text
        assert all(len(line) <= size[0] for line in lines)
        # the rows are still there under it: the pod's own 200s
        assert "via_upstream" in text and "GET /" in text
        await pilot.press("escape")
        await pilot.press("q")


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_no_note_once_a_line_carrying_the_flags_is_read(size):
    app = MeshDoctorApp(Watched("collision", (CALLER_UC,)))
    async with app.run_test(size=size) as pilot:
        text = words(await open_access_log(app, pilot))
        assert "503" in text and "UC" in text  # the caller's line is shown
        assert "explains" not in text and "logs them" not in text, text
        await pilot.press("q")


async def test_the_detail_says_whose_log_has_the_flags():
    app = MeshDoctorApp(Watched("collision"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status") and app.selected is not None
                       and app.selected.detector == "tuple-collision")
        await pilot.pause(0.6)
        await pilot.press("enter")
        detail = app.query_one(DetailPane)
        await wait_for(pilot, lambda: detail.has_focus)
        await pilot.pause(0.2)
        said = ("access log: UC, UF, URX are logged by the caller's sidecar at 198.18.1.1 (it opened this connection; "
                "a caller without a sidecar logs none), not by this pod's")
        while said not in (text := words(shown(app))):  # below the evidence: a line at a time, until it is whole
            assert detail.scroll_y < detail.max_scroll_y, text
            await pilot.press("down")
            await pilot.pause(0.05)
        await pilot.press("q")


async def test_a_hostile_pod_name_is_shown_as_text():
    app = MeshDoctorApp(Watched("col[/]li\x1b[31msion[@click=app.quit]"))
    async with app.run_test(size=(160, 45)) as pilot:
        text = words(await open_access_log(app, pilot))
        assert "pod/col[/]li\\x1b[31msion[@click=app.quit]'s sidecar logged none" in text, text
        assert "\x1b" not in text and app.is_running
        await pilot.press("q")


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_flags_of_the_pods_own_sidecar_are_said_to_be_its_own(size, tmp_path):
    """A framing error on lo is logged by the pod's own sidecar: with a log given that holds none of its lines (only
    200s), it says so. (Captures alone offer no access-log pane: there is no log to show.)"""
    healthy = DATA / "envoy-1.40-mesh" / "healthy" / "server" / "istio-proxy.log"
    ok = [line for line in healthy.read_text().splitlines() if line.startswith("[20") and '" 200 ' in line]
    (tmp_path / "access.log").write_text("\n".join(ok) + "\n")
    app = MeshDoctorApp(FileSession([CaptureArg.parse(str(DATA / f))
                                     for f in ("lab-framing-mixed-eth0.pcap", "lab-framing-mixed-lo.pcap")]
                                    + [CaptureArg.parse(str(tmp_path / "access.log"))]))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status") and app.selected is not None)
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, AccessLogScreen) and "explains" in words(shown(app)))
        text = words(shown(app))
        assert f"{len(ok)} access-log lines" in text, text
        assert "The selected http-framing explains UPE: the lines read carry none. This pod's sidecar logs them: " \
               "none logged yet, or its access log is off." in text, text
        assert "field-selector" not in text
        await pilot.press("q")
