"""The new-user trial at 80x24: the live status took 5-6 of the screen's 24 rows, a long problem and a long step
wrapping. What the run is doing is one row, its latest problem at most two, cut with "…" (the report keeps them
whole), so the findings keep the screen; at 80x24 (s44) the whole status is two rows: the target and the counts,
then the step, the verdict and the problem. Read on what the screen shows at 80x24 and 160x45."""

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
        await wait_for(pilot, lambda: "files read" in str(app.query_one("#status").render()))
        app._on_progress(LONG_STEP)
        await wait_for(pilot, lambda: any("waiting for the debug container" in line for line in shown(app)))
        status = app.query_one("#status")
        rows = shown(app)[status.region.y:status.region.bottom]
        if size == (80, 24):  # the target, the counts and how many problems; the step (cut), the rest after it
            assert len(rows) == 2 and rows[0].rstrip().endswith("findings: 1  problems: 1"), rows
            assert rows[1].lstrip().startswith("waiting for the debug container meshdoctor-7f3a of pod/collision")
            assert rows[1].rstrip().endswith("…"), rows
            await pilot.press("q")
            return
        at = next(i for i, r in enumerate(rows) if "problems (1)" in r)
        problem = ["".join(rows[at:])]
        step = [r for r in rows if "waiting for the debug container" in r]
        assert len(rows) - at == 2 and rows[-1].rstrip().endswith("…"), rows
        assert len(step) == 1 and step[0].rstrip().endswith("…"), rows
        assert any(r.lstrip().startswith("verdict") for r in rows), rows
        assert "(connection lost) [/] \\x1b[31mxxx" in problem[0], problem  # its ESC escaped once, markup as text
        # the counts, the verdict, the step, the problem's two
        assert status.region.height == 5, rows


async def test_a_step_said_from_an_api_call_s_thread_is_drawn_by_the_app_s_own_thread():
    """watch's API calls run in threads of their own (commands/watch/stopping.py), and kube/debug.py says its steps
    from there: under CI's load one reached the widgets outside the app's context and the run ended with
    'error: <ContextVar name='active_app'...>' (the race itself is not reproduced here). A step said from a raw
    thread is handed to the app's loop: the screen is redrawn on the app's thread, and shows it."""
    import threading

    app = MeshDoctorApp(replay_session("lab-collision-eth0.pcap:eth0"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "files read" in str(app.query_one("#status").render()))
        drawn_on: list[int] = []
        refresh = app._refresh
        app._refresh = lambda: (drawn_on.append(threading.get_ident()), refresh())[1]
        said = threading.Thread(target=app.hooks.progress, args=("adding ephemeral container meshdoctor-x",))
        said.start()
        said.join(5)
        await wait_for(pilot, lambda: any("adding ephemeral container" in line for line in shown(app)))
        assert app.error is None and app.last_progress == "adding ephemeral container meshdoctor-x"
        assert drawn_on and set(drawn_on) == {threading.get_ident()}, drawn_on  # the test's loop is the app's
