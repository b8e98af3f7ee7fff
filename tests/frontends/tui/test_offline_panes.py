"""Issue 32 item 10: `analyze --tui` offers the Envoy panes the files given hold, and shows what they hold: `a` the
access-log lines of the logs, `c` the /clusters dumps (named as a dump, no refresh), `k` the /stats counters that
moved between the dumps; `l` never (no sidecar to ask). A pane not offered is in neither the footer nor `?`, and its
key opens nothing. Read at 80x24 and 160x45, on the characters the screen shows, over real Envoy 1.40's recordings
(tests/data/envoy-1.40-mesh/refused: each hop's log, /clusters and /stats before and after)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from textual.widgets import DataTable

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.envoy import AccessLogScreen, ClustersScreen
from kubectl_meshdoctor.frontends.tui.screens import HelpScreen
from kubectl_meshdoctor.frontends.tui.stats_pane import NARROW, CountersScreen
from kubectl_meshdoctor.sources.files import CaptureArg
from kubectl_meshdoctor.sources.pod_inputs import pod_inputs

from .test_app import DATA, screen_text, wait_for
from .test_small_screen import shown, words

SIZES = [(80, 24), (160, 45)]
REFUSED = DATA / "envoy-1.40-mesh" / "refused"
PANE_KEYS = {"l": "the sidecar's Envoy loggers", "c": "Envoy clusters and hosts", "a": "the sidecar's access log",
             "k": "/stats counters that moved"}


def session_of(*paths: Path) -> FileSession:
    """``analyze --tui PATH...`` as the command builds it (DIRs are pods, sources/pod_inputs.py)."""
    inputs = pod_inputs([str(p) for p in paths])
    return FileSession(list(inputs.files), skipped=inputs.skipped)


async def read(app, pilot) -> None:
    """The files read to their end and the panes offered as they will stay."""
    await wait_for(pilot, lambda: "files read" in screen_text(app, "#status"))
    await pilot.pause(0.6)  # one refresh tick after the end: the keys offered are the final ones


def no_palette(app) -> None:
    """Neither the header's ⭘ nor the footer's ^p of Textual's command palette is on the screen (the new-user trial
    read them as the tool's)."""
    screen = "\n".join(shown(app))
    assert "⭘" not in screen and "palette" not in screen, screen


async def help_words(app, pilot) -> str:
    """Every line `?` shows, scrolled from its top to its end, as one line of words."""
    await pilot.press("question_mark")
    await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
    box = app.screen.query_one("#help-scroll")
    await pilot.pause(0.2)
    seen: list[str] = []
    while True:
        seen += [line[box.region.x:box.region.right] for line in shown(app)]
        if box.scroll_y >= box.max_scroll_y:
            break
        at = box.scroll_y
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: box.scroll_y > at)
        await pilot.pause(0.05)
    await pilot.press("escape")
    await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
    return words(seen)


async def opened(app, pilot, key: str, screen: type, table: str) -> DataTable:
    """``key`` pressed, its pane on top and rows in its table."""
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, screen) and app.screen.query_one(table, DataTable).row_count)
    await pilot.pause(0.1)
    return app.screen.query_one(table, DataTable)


def stat_value(path: Path, name: str) -> int:
    """A counter's value in a /stats dump, read from its `name: value` line (0 when Envoy had not made it)."""
    m = re.search(rf"^{re.escape(name)}: (\d+)$", path.read_text(), re.M)
    return int(m.group(1)) if m else 0


@pytest.mark.parametrize("size", SIZES)
async def test_captures_alone_offer_no_envoy_pane(size):
    app = MeshDoctorApp(FileSession([CaptureArg.parse(str(DATA / f))
                                     for f in ("lab-collision-eth0.pcap", "lab-collision-lo.pcap")]))
    async with app.run_test(size=size) as pilot:
        await read(app, pilot)
        footer = shown(app)[-1]
        assert "q Quit" in footer and not re.search(r"\b[lcak] ", footer), footer
        text = await help_words(app, pilot)
        assert "select a problem" in text and "any pane Esc back" in text  # the help, read to its end
        assert not [what for what in PANE_KEYS.values() if what in text], text
        for key in "lcak":
            await pilot.press(key)
            await pilot.pause(0.2)
            assert app.screen is app.default_screen, key  # nothing opened
            assert "not known yet" not in screen_text(app, "#status")  # nor a line said for a key never named
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_a_pods_log_and_dumps_are_its_panes(size):
    """server/ of the refused recording: its log's one access-log line (503 UF), its /clusters dump, its /stats
    before and after. The loggers are not offered (no sidecar to ask), the dump's pane has no refresh."""
    server = REFUSED / "server"
    app = MeshDoctorApp(session_of(server))
    async with app.run_test(size=size) as pilot:
        await read(app, pilot)
        footer = shown(app)[-1]  # a, where the 503 is told, is in the footer itself once a log is read
        assert "a Log" in footer and "q Quit" in footer, footer
        text = await help_words(app, pilot)
        assert all(PANE_KEYS[k] in text for k in "cak") and PANE_KEYS["l"] not in text, text
        await pilot.press("l")
        await pilot.pause(0.2)
        assert app.screen is app.default_screen

        no_palette(app)
        await pilot.press("ctrl+p")  # Textual's command palette is not this tool's: the key opens nothing
        await pilot.pause(0.2)
        assert app.screen is app.default_screen

        table = await opened(app, pilot, "a", AccessLogScreen, "#access-log")
        screen = words(shown(app))
        no_palette(app)
        assert {"503", "UF"} <= set(screen.split()), screen  # its code and response flag, on screen
        assert table.row_count == 1 and str(table.get_row_at(0)[4]) == "GET /refused"
        await pilot.press("escape")

        await opened(app, pilot, "c", ClustersScreen, "#clusters")
        no_palette(app)
        lines = shown(app)
        screen = words(lines)
        assert "/clusters dump" in screen and "clusters.txt" in screen, screen  # a dump, and which
        assert "as dumped in" in screen and "since the last refresh" not in screen
        assert "inbound|5000|| 198.18.2.2:5000" in screen, screen  # the server's inbound cluster and its host
        assert "refresh" not in lines[-1], lines[-1]  # f is not offered for a dump
        await pilot.press("escape")

        table = await opened(app, pilot, "k", CountersScreen, "#counters")
        screen = words(shown(app))
        name = "cluster.inbound|5000||;.upstream_cx_connect_fail"
        moved = stat_value(server / "stats-after.txt", name) - stat_value(server / "stats-before.txt", name)
        assert moved > 0
        assert "moved between the dumps" in screen and "/stats dumps" in screen, screen
        await pilot.press("slash", *"connect_fail", "enter")
        await wait_for(pilot, lambda: table.row_count == 1)
        await pilot.pause(0.1)
        if size[0] < NARROW:  # s46: the cluster short before the stat, on screen at 80 columns
            assert f"{moved} in :5000 upstream_cx_connect_fail" in words(shown(app))
            assert [str(c) for c in table.get_row_at(0)] == [str(moved), "in :5000", "upstream_cx_connect_fail"]
        else:
            assert f"{moved} upstream_cx_connect_fail inbound|5000||" in words(shown(app))  # the stat whole, then
            assert [str(c) for c in table.get_row_at(0)] == [str(moved), "upstream_cx_connect_fail", "inbound|5000||"]
        await pilot.press("escape", "escape", "q")


@pytest.mark.parametrize("size", SIZES)
async def test_two_pods_dumps_are_stepped_with_p(size):
    """caller/ and server/ given as pods: `c` and `k` show one pod's dumps, `p` the other's."""
    app = MeshDoctorApp(session_of(REFUSED / "caller", REFUSED / "server"))
    async with app.run_test(size=size) as pilot:
        await read(app, pilot)

        table = await opened(app, pilot, "c", ClustersScreen, "#clusters")

        def clusters() -> set[str]:
            return {str(table.get_row_at(i)[0]) for i in range(table.row_count)}

        assert "pod/caller (1 of 2; p: next pod)" in app.screen.sub_title
        assert any(c.startswith("outbound|5000||refused.") for c in clusters())  # the caller's
        assert "caller/clusters.txt" in words(shown(app)) or size[0] < 100
        await pilot.press("p")
        await wait_for(pilot, lambda: table.row_count > 0 and "inbound|5000||" in clusters()
                       and not any(c.startswith("outbound|5000||refused.") for c in clusters()))
        assert "pod/server (2 of 2" in app.screen.sub_title
        assert "pod/server: " in words(shown(app))
        await pilot.press("escape")

        counters = await opened(app, pilot, "k", CountersScreen, "#counters")

        def names() -> set[str]:  # each row's stat by its full name, as /stats writes it (160: the cluster whole)
            return {f"cluster.{row[2]};.{row[1]}" if str(row[2]) else str(row[1])
                    for row in (counters.get_row_at(i) for i in range(counters.row_count))}

        def shown_short() -> set[tuple[str, str]]:  # 80 (s46): each row's short cluster and stat
            return {(str(row[1]), str(row[2])) for row in (counters.get_row_at(i) for i in range(counters.row_count))}

        assert "pod/caller (1 of 2; p: next pod)" in app.screen.sub_title
        assert "pod/caller: " in words(shown(app))
        narrow = size[0] < NARROW
        if narrow:
            assert any(c.startswith("out refused.") and c.endswith(":5000") for c, _ in shown_short())
        else:
            assert any(n.startswith("cluster.outbound|5000||refused.") for n in names())
        await pilot.press("p")
        await wait_for(pilot, lambda: "pod/server: " in words(shown(app)))
        if narrow:
            assert ("in :5000", "upstream_cx_connect_fail") in shown_short()
            assert not any(c.startswith("out refused.") for c, _ in shown_short())
        else:
            assert "cluster.inbound|5000||;.upstream_cx_connect_fail" in names()
            assert not any(n.startswith("cluster.outbound|5000||refused.") for n in names())
        await pilot.press("escape")

        lines = await opened(app, pilot, "a", AccessLogScreen, "#access-log")
        await wait_for(pilot, lambda: lines.row_count == 2)  # both pods' lines
        await pilot.press("p")
        await wait_for(pilot, lambda: lines.row_count == 1)  # one pod's line
        await pilot.press("escape", "q")


@pytest.mark.parametrize("size", SIZES)
async def test_a_damaged_dump_is_one_line_on_its_pane(tmp_path, size):
    """A gzipped /stats dump cut short: its head reads as /stats (the pane is offered: a dump was given), its body
    does not; the pane says so in one line, and the screen goes on."""
    whole = gzip.compress((REFUSED / "server" / "stats-after.txt").read_bytes())
    cut = tmp_path / "stats.txt.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    app = MeshDoctorApp(FileSession([CaptureArg.parse(str(cut))]))
    async with app.run_test(size=size) as pilot:
        await read(app, pilot)
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, CountersScreen)
                       and "cannot read /stats" in words(shown(app)))
        screen = words(shown(app))
        assert "compressed file cut short or damaged" in screen, screen
        assert "Traceback" not in screen
        await pilot.press("escape")
        assert app.is_running
        await pilot.press("q")
