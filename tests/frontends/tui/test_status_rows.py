"""The new-user trial at 80x24: the live status took 5-6 of the screen's 24 rows, a long problem and a long step
wrapping. What the run is doing is one row, its latest problem at most two, cut with "…" (the report keeps them
whole), so the findings keep the screen; read on what the screen shows at 80x24 and 160x45."""

from __future__ import annotations

import pytest

from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp

from .test_app import replay_session, wait_for
from .test_small_screen import shown

LONG_PROBLEM = ("pod/collision lo: capture stream on lo ended without an exit status (connection lost) "
                "[/] \x1b[31m" + "x" * 300)
LONG_STEP = "waiting for the debug container meshdoctor-7f3a of pod/collision to start: " + "y" * 200


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_step_is_one_row_and_the_latest_problem_two(size):
    session = replay_session("lab-collision-eth0.pcap:eth0")
    session.problems = lambda: [LONG_PROBLEM]
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "files read" in "\n".join(shown(app)))
        app._on_progress(LONG_STEP)
        await wait_for(pilot, lambda: any("waiting for the debug container" in line for line in shown(app)))
        status = app.query_one("#status")
        rows = shown(app)[status.region.y:status.region.bottom]
        at = next(i for i, r in enumerate(rows) if "problems (1)" in r)
        problem = ["".join(rows[at:])]
        step = [r for r in rows if "waiting for the debug container" in r]
        assert len(rows) - at == 2 and rows[-1].rstrip().endswith("…"), rows
        assert len(step) == 1 and step[0].rstrip().endswith("…"), rows
        assert any(r.lstrip().startswith("verdict") for r in rows), rows
        if size[0] > 100:  # its ESC escaped once, its markup as text
            assert "(connection lost) [/] \\x1b[31mxxx" in problem[0], problem
        # the target (when the header is hidden, as at 80x24), the counts, the verdict, the step, the problem's two
        assert status.region.height == (6 if size == (80, 24) else 5), rows
