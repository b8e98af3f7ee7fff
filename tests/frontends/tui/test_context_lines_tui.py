"""Issue 32 item 2: a watch opened with `ERROR access-log [UC] ... without packet evidence` for lines of requests
that ran before its capture began (the sidecar's log is followed before tcpdump starts). The live session's own
pipeline learns the capture's start (CaptureStartEvent): a failing line of a request that began earlier is context,
said in one problem line, and a failing line after the start is still an error. Only the cluster is left out: the
session's run feeds its real pipeline the events a watch feeds it. At 80x24 and 160x45, on what the screen shows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubectl_meshdoctor.commands.watch.live import WatchState
from kubectl_meshdoctor.commands.watch.live_session import LiveSession
from kubectl_meshdoctor.core.correlate import GRACE_S
from kubectl_meshdoctor.core.events import AccessLogEvent, CaptureStartEvent
from kubectl_meshdoctor.core.live_join import LiveJoin
from kubectl_meshdoctor.core.report_model import Report, ScreenSource
from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp

from ...core.test_correlate import UF
from .test_app import screen_text, wait_for
from .test_small_screen import shown, words


class CaptureBegan(LiveSession):
    """A watch of pod orders whose capture began at ``start``, after its followed log had the first line."""

    def __init__(self, lines: list, start: float) -> None:
        self.redact, self.opts = True, None
        self.describe = "pod/orders  namespace shop  context lab"
        self.pipelines, self.state, self._controls = [], WatchState(), {}
        self.joiner = LiveJoin(lambda: self.pipelines)
        self.lines, self.start = lines, start

    async def run(self, hooks) -> Report:
        p = self.new_pipeline(hooks, "orders")
        p.context(CaptureStartEvent(self.start))
        for e in self.lines:
            p.context(AccessLogEvent(e.ts, e))
        p.tick(max(e.ts for e in self.lines) + GRACE_S + 1)  # past the wait every failing line gets
        hooks.progress("capturing")
        await hooks.stop.wait()
        return Report(ScreenSource(self.describe), p.stats, p.finish(), [])


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_a_failing_line_from_before_the_capture_is_context_and_one_after_it_an_error(size):
    before = parse_line(UF)
    after = replace(before, ts=before.ts + 2.0, request_id="5a0f7c6e-0d0b-4c65-9f57-1d2c3b4a5e6f")
    session = CaptureBegan([before, after], start=before.ts + 1.0)
    app = MeshDoctorApp(session)
    async with app.run_test(size=size, notifications=True) as pilot:
        await wait_for(pilot, lambda: "capturing" in screen_text(app, "#status") and len(app.findings) >= 1)
        await pilot.pause(0.6)  # a refresh of the panes
        text = words(shown(app))
        # one error row, the line after the start; the earlier one is said as context, not listed
        # at 80x24 the verdict's total gives way to how many problems beside it (s45)
        assert ("verdict so far: 1 error, 0 warnings: upstream-refused  ·  problems: 1" if size == (80, 24)
                else "verdict so far: 1 failure problem (1 error, 0 warnings)") in " ".join(shown(app)), text
        told = "1 failing access-log line(s) of requests that began before the capture did were read as context"
        if size == (80, 24):  # s44: no status row for a problem's text there; a notification tells it
            text = words([line[40:] for line in shown(app)])  # the toast's half of the screen
        assert told in text, text
        assert len(app.findings) == 1 and app.findings[0].ts == pytest.approx(after.ts, abs=0.01)
        await pilot.press("q")
