"""The new-user trial at 80x24: the live status took 5-6 of the screen's 24 rows, a long problem and a long step
wrapping. What the run is doing is one row, its latest problem at most two, cut with "…" (the report keeps them
whole), so the findings keep the screen; at 80x24 (s44) the whole status is two rows: the target and the counts,
then the step, the verdict and the problem. Read on what the screen shows at 80x24 and 160x45."""

from __future__ import annotations

import pytest

from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.status_line import _second_row, _short_verdict

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
        if size == (80, 24):  # the target and the counts; the step (cut, the verdict with it), how many problems
            assert len(rows) == 2 and rows[0].rstrip().endswith("findings: 1"), rows
            assert rows[1].lstrip().startswith("waiting for the debug container meshdoctor-7f3a of pod/")
            assert "…  ·  problems: 1" in rows[1] and rows[1].rstrip().endswith("…"), rows  # the problem's text after
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


async def test_at_80x24_the_second_row_shows_the_verdict_and_the_trouble_s_counts_whole():
    """s45: the verdict (66-74 columns) left no room at 80 columns: how many problems and drops were on the first
    row, cutting the target away, and the second row showed the verdict and a stub of the step. Now the verdict's
    total gives way to its errors and warnings, the counts follow it whole, the step after them, cut, said."""
    session = replay_session("lab-collision-eth0.pcap:eth0", "lab-collision-lo.pcap:lo")
    session.problems = lambda: ["pod/collision lo: capture stream on lo ended without an exit status"]
    session.drops = lambda: {"collision/eth0": 0, "collision/lo": 3}  # what tcpdump said it dropped
    app = MeshDoctorApp(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "files read" in str(app.query_one("#status").render()))
        await pilot.pause(0.6)
        status = app.query_one("#status")
        rows = shown(app)[status.region.y:status.region.bottom]
        assert len(rows) == 2 and rows[0].rstrip().endswith(f"flows: {session.stats().flows_seen}  findings: 1")
        head = "verdict: 1 error, 0 warnings: tuple-collision  ·  problems: 1  drops: 3"
        assert rows[1].strip().startswith(f"{head}  ·  f"), rows
        assert rows[1].rstrip().endswith("…"), rows  # the step cut where the screen ends, said
        # nothing wider than the screen: the widget's second row starts with the head, within the status's width
        second = str(status.render()).split("\n")[1]
        assert second.startswith(head) and len(head) <= status.region.width - 2, second
        assert all(len(r.rstrip()) <= 80 for r in rows), rows
        await pilot.press("q")


def test_the_second_row_keeps_the_trouble_whole_at_every_width():
    """_second_row over widths from 40 to 130 columns: the head (step waited on, verdict, counts) within the width
    (a column left for the screen's "…" when more follows), the counts whole, the verdict's total given way
    before its detectors' names go after the counts (s46), and the whole verdict where it fits."""
    verdict = "verdict so far: 3 failure problems (2 errors, 1 warning): stale-keepalive, tuple-collision"
    trouble, step = "problems: 2  drops: at the end", "capturing lo, eth0 in pod/orders via meshdoctor-7f3a"
    for lead in ([], ["waiting for ephemeral container meshdoctor-7f3a: ContainerCreating (12 s)"]):
        for width in range(40, 131):
            row = _second_row([*lead, verdict], trouble, [step], width)
            head = row[:row.index(trouble) + len(trouble)]
            assert len(head) <= width - 1, (width, row)
            full = " · ".join([*lead, verdict, trouble]).replace(" · ", "  ·  ")
            if len(full) <= width - 1:
                assert head == full, (width, row)
            elif not lead and width - 1 >= len(_short_verdict(verdict)) + 5 + len(trouble):
                assert head == f"verdict so far: 2 errors, 1 warning: stale-keepalive, tuple-collision  ·  {trouble}"
            elif "keepalive" not in head and "…" not in head:  # s46: the counts whole, the names after the trouble
                assert row[len(head):].startswith("  ·  stale-keepalive, tuple-collision  ·  "), (width, row)
                assert "2 errors, 1 warning  ·  " + trouble in head, (width, row)
            else:
                assert "…  ·  " + trouble in head, (width, row)
            assert row.endswith(step), row  # the step's text whole for a search: the screen cuts it
