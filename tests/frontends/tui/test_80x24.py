"""s44: what a new user met running scripts/demo (watch's TUI) in an 80x24 terminal, and that 160x45 stays right.
The status took 5 rows, the clusters pane cut its last column, the filter prompt and the packets' info were cut,
a fix's comment wrapped oddly (on screen: test_s40x_breaks) and the footer named one pane key. Assertions are on
the characters the screen shows (test_small_screen.shown), over the lab's recordings."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Input

from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.detail import comment_paragraphs
from kubectl_meshdoctor.frontends.tui.detail_pane import DetailPane
from kubectl_meshdoctor.frontends.tui.envoy import ClustersScreen
from kubectl_meshdoctor.frontends.tui.screens import PathPrompt

from ...helpers import prefiltered
from .test_app import DATA, replay_session, wait_for
from .test_offline_panes import REFUSED, opened, read, session_of
from .test_several_pods import Replayed
from .test_small_screen import shown, words
from .test_triage import collision_app, ready

SIZES = [(80, 24), (160, 45)]
PANE_KEYS = ("l Levels", "c Clusters", "a Log", "k Stats")


def rows_end_with_health(app, table: DataTable) -> int:
    """Asserts that each row of the clusters table shown ends with its host's health, whole, and shows its
    cluster's name whole or cut with "…"; returns how many were cut."""
    lines, width, cut = shown(app), table.ordered_columns[0].width, 0
    assert lines[table.region.y].rstrip().endswith("health"), lines[table.region.y]
    for i in range(min(table.row_count, table.region.height - 1)):
        cells, line = table.get_row_at(i), lines[table.region.y + 1 + i]
        assert line.rstrip().endswith(str(cells[-1])), line
        name = str(cells[0])
        assert name[:width - 1] in line and (len(name) <= width or name[:width - 1] + "…" in line), line
        cut += len(name) > width
    return cut


def status_rows(app) -> list[str]:
    status = app.query_one("#status")
    return shown(app)[status.region.y:status.region.bottom]


@pytest.mark.parametrize("size", SIZES)
async def test_the_status_is_two_rows_at_80x24_and_keeps_the_target_the_interfaces_and_the_counts(size):
    session = replay_session("lab-collision-eth0.pcap:eth0", "lab-collision-lo.pcap:lo")
    problem = "pod/collision lo: capture stream on lo ended without an exit status (connection lost) " + "x" * 200
    session.problems = lambda: [problem]
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await ready(app, pilot)
        await pilot.pause(0.6)
        rows = status_rows(app)
        lo, eth0 = prefiltered(DATA / "lab-collision-lo.pcap"), prefiltered(DATA / "lab-collision-eth0.pcap")
        counts = f"eth0: {eth0} pkts  lo: {lo} pkts  flows: "
        if size == (80, 24):
            assert len(rows) == 2, rows  # it took 5 (6 with a problem's two rows)
            assert rows[0].lstrip().startswith("files: ") and counts in rows[0], rows  # the target, then the counts
            assert rows[0].rstrip().endswith("findings: 1"), rows  # the traffic's counts whole
            # the verdict first (its total left to its errors and warnings: s45), how many problems, then the step,
            # cut where the screen ends, said
            assert rows[1].lstrip().startswith("verdict: 1 error, 0 warnings: tuple-collision  ·  problems: 1  ·  "
                                               "files r"), rows
            assert rows[1].rstrip().endswith("…"), rows
            assert not app.query_one("Header").display
        else:  # the wide layout keeps its rows: the counts, the verdict, the step, the problem in two
            assert len(rows) == 5 and rows[0].lstrip().startswith(counts), rows
            assert "files: " in shown(app)[0]  # the target in the header
            assert "problems (1): pod/collision lo: capture stream" in rows[3], rows
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_the_footer_names_every_pane_key_and_the_main_actions(size):
    """A watch (every Envoy pane offered): the list's footer, then the detail's; s and e work where they are not
    shown."""
    session = Replayed("downstream-idle", ("downstream-idle-caller", "downstream-idle"))
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: session.replayed.is_set() and app.selected is not None)
        await pilot.pause(0.6)
        footer = shown(app)[-1]
        for key in ("Enter Detail", "? Help", "q Quit", "/ Filter", *PANE_KEYS):
            assert key in footer, footer
        assert "Esc Back" not in footer  # on the list Esc has nothing to go back from
        assert ("s Save" in footer and "e Export" in footer) == (size[0] > 100), footer

        await pilot.press("enter")
        detail = app.query_one(DetailPane)
        await wait_for(pilot, lambda: detail.has_focus and "PgDn More" in shown(app)[-1])
        footer = shown(app)[-1]
        for key in ("PgDn More", "Esc Back", "? Help", "q Quit", "/ Filter", *PANE_KEYS):
            assert key in footer, footer
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.query_one("#findings", DataTable).has_focus)

        await pilot.press("e")  # out of the 80-column footer, the key still works
        await wait_for(pilot, lambda: isinstance(app.screen, PathPrompt))
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.default_screen)
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_the_filter_prompt_is_one_whole_row(size):
    app = collision_app()
    async with app.run_test(size=size) as pilot:
        await ready(app, pilot)
        await pilot.press("slash")
        box = app.query_one("#filter", Input)
        await wait_for(pilot, lambda: box.has_focus and box.region.height > 0)
        assert box.region.height == 1  # no border: the packets keep the rows
        row = shown(app)[box.region.y]
        assert "filter: ip, port, flags S F R P ., lo/eth0, frame:N; Enter applies, Esc clears" in row, row
        await pilot.press("escape")
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_the_packets_info_takes_the_rest_of_the_width_and_a_cut_shows(size):
    app = MeshDoctorApp(replay_session("lab-framing-mixed-eth0.pcap", "lab-framing-mixed-lo.pcap"))
    async with app.run_test(size=size) as pilot:
        await ready(app, pilot)
        await pilot.press("slash", "enter")  # no filter: the selected finding's packets (the whole screen at 80)
        table = app.query_one("#packets", DataTable)
        await wait_for(pilot, lambda: table.has_focus and table.region.height > 3)
        await pilot.pause(0.3)
        lines = shown(app)[table.region.y:table.region.bottom]
        assert lines[0].split()[-1] == "info", lines[0]  # its header on screen
        request = next(line for line in lines if " GET /" in line)
        assert len(request.rstrip()) <= size[0]
        if size[0] == 80:  # the frame and its four-tuple whole, the request line cut where the screen ends, said
            assert request.rstrip().endswith("…") and "GET /bad-header" in request, request
        else:
            assert "GET /bad-header-name HTTP/1.1" in request, request
        await pilot.press("escape")
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_the_clusters_pane_shows_its_last_column_and_every_counter(size):
    """The caller's /clusters dump of the refused recording: outbound clusters with long names."""
    app = MeshDoctorApp(session_of(REFUSED / "caller"))
    async with app.run_test(size=size) as pilot:
        await read(app, pilot)
        table = await opened(app, pilot, "c", ClustersScreen, "#clusters")
        await pilot.pause(0.3)
        lines = shown(app)
        header = lines[table.region.y]
        assert header.rstrip().endswith("health"), header  # the last column, whole, on screen
        assert ("cx_connect_fail" in header) == (size[0] > 100), header  # the counters where they have room
        rows_end_with_health(app, table)
        if size[0] == 80:  # narrower, the names cut, said with "…"
            await pilot.resize_terminal(70, 24)
            await pilot.pause(0.3)
            assert rows_end_with_health(app, table) == table.row_count
        await pilot.press("down")  # the highlighted host whole under the table, every counter with it
        await pilot.pause(0.2)
        under = words(shown(app)[table.region.bottom:])
        row = table.get_row_at(table.cursor_row)
        assert str(row[1]) in under, under
        for name in ("cx_active", "cx_connect_fail", "cx_total", "rq_active", "rq_error", "rq_timeout", "rq_total"):
            assert f"{name} " in under, under
        await pilot.press("escape")
        await pilot.press("q")


def test_comment_paragraphs_joins_a_sentence_going_on_and_nothing_else():
    fix = ("# Fix 1 of 2 (a): title\n#   keeps: all\n#   costs: none\n# in the client: connect() without bind(), so"
           "\n# that each\n# (ephemeral) port\n# A new sentence.\n  # nested\n  # goes on\n# other indent\nkey: v")
    assert comment_paragraphs(fix).split("\n") == [
        "# Fix 1 of 2 (a): title", "#   keeps: all", "#   costs: none",
        "# in the client: connect() without bind(), so that each (ephemeral) port", "# A new sentence.",
        "  # nested goes on", "# other indent", "key: v"]
