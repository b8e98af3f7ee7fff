"""Clusters and access-log panes, fed by real Envoy's /clusters (tests/local_envoy.py) and by parsed access-log
lines."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.text import Text
from textual.widgets import DataTable, Input, Static

from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor.envoy.clusters import parse_clusters
from kubectl_meshdoctor.kube.admin import EnvoyAdmin
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.session import Session, SessionHooks

from ...local_envoy import CLUSTER, free_port, local_envoy
from ...core.test_correlate import UF, UPE
from .test_app import wait_for


class EnvoySession(Session):
    """No capture: the sidecar panes of pod "reviews", fed by ``clusters`` (a /clusters fetcher) and
    ``entries`` (access-log lines)."""

    describe = "local Envoy"

    def __init__(self, clusters=None, entries=()) -> None:
        self.pipeline = Pipeline.with_detectors()
        self._clusters = clusters
        self._entries = entries

    async def run(self, hooks: SessionHooks):
        await hooks.stop.wait()
        return None

    def stats(self):
        return self.pipeline.stats

    def pod(self):
        return "reviews"

    def clusters(self, pod=None):
        return self._clusters

    def access_log(self):
        return list(self._entries)


def row_of(table: DataTable, cluster: str, host: str) -> list:
    return table.get_row(f"{cluster}|{host}")


async def test_clusters_pane_shows_hosts_and_highlights_counters_that_moved(tmp_path):
    upstream = free_port()  # nothing listens: each request through Envoy is a real connect failure
    host = f"127.0.0.1:{upstream}"
    with local_envoy(tmp_path, upstream) as envoy:
        admin = EnvoyAdmin(None, "shop", "reviews", open_socket=envoy.admin_socket)
        try:
            fetch = lambda: parse_clusters(admin.get("/clusters", {"format": "json"}).body)  # noqa: E731
            app = MeshDoctorApp(EnvoySession(clusters=fetch))
            async with app.run_test(size=(160, 50)) as pilot:
                await pilot.press("c")
                table = app.screen.query_one("#clusters", DataTable)
                await wait_for(pilot, lambda: table.row_count > 0)
                row = row_of(table, CLUSTER, host)
                assert str(row[3]) == "0"  # cx_connect_fail
                statuses = [await asyncio.to_thread(envoy.request, f"/refused/{i}") for i in range(3)]
                assert statuses == [503, 503, 503]
                await pilot.press("f")
                await wait_for(pilot, lambda: str(row_of(table, CLUSTER, host)[3]) == "3")
                cell = row_of(table, CLUSTER, host)[3]
                assert isinstance(cell, Text) and "yellow" in str(cell.style)  # moved since the last refresh
                assert "counters moved" in str(app.screen.query_one("#clusters-status", Static).render())
                await pilot.press("escape", "q")
        finally:
            admin.close()


async def test_access_log_pane_colours_flags_and_filters():
    entries = [parse_line(UF), parse_line(UPE)]
    app = MeshDoctorApp(EnvoySession(entries=entries))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("a")
        table = app.screen.query_one("#access-log", DataTable)
        await wait_for(pilot, lambda: table.row_count == 2)
        flags = [table.get_row_at(i)[2] for i in range(2)]
        assert [f.plain for f in flags] == ["UPE", "UF"]  # newest first
        assert all(f.spans for f in flags)  # coloured
        await pilot.press("slash")
        for ch in "UF":
            await pilot.press(ch)
        await pilot.press("enter")
        await wait_for(pilot, lambda: table.row_count == 1)
        assert table.get_row_at(0)[2].plain == "UF"
        assert "filter 'UF': 1 shown" in str(app.screen.query_one("#log-status", Static).render())
        await pilot.press("escape", "q")


async def test_the_access_log_filter_cannot_find_a_hidden_token():
    """The filter matches the line as shown: typing the secret must not tell, by the rows it keeps, that it is
    there (issue 15)."""
    secret = "s3cr3t-tok3n"
    entries = [parse_line(UF.replace("GET /admin/health", f"GET /admin/health?access_token={secret}")),
               parse_line(UPE)]
    assert all(entries) and secret in entries[0].raw
    app = MeshDoctorApp(EnvoySession(entries=entries))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("a")
        table = app.screen.query_one("#access-log", DataTable)
        await wait_for(pilot, lambda: table.row_count == 2)
        await pilot.press("slash", *secret, "enter")
        await wait_for(pilot, lambda: table.row_count == 0)
        status = app.screen.query_one("#log-status", Static)
        await wait_for(pilot, lambda: f"filter '{secret}': 0 shown" in str(status.render()))
        await pilot.press("escape", "q")


TCP_NR = ('[2025-06-12T08:14:33.077Z] "- - -" 0 NR filter_chain_not_found - "-" 0 0 0 - "-" "-" "-" "-" "-" - - '
          '10.244.1.23:5000 10.244.4.12:45690 - -')


async def test_the_access_log_filter_matches_the_row_as_shown(monkeypatch):
    """Every column as the pane shows it, case-insensitively, and nothing the pane hides: `tcp` finds the TCP
    line (whose raw request is `- - -`), the local time shown finds its row (the raw line has UTC), and the
    protocol, which no column shows, finds nothing (issue 16)."""
    monkeypatch.setenv("TZ", "XST-05:30")  # shown times differ from the lines' UTC ones
    time.tzset()
    try:
        entries = [parse_line(UF), parse_line(UPE), parse_line(TCP_NR)]
        assert all(entries) and "TCP" not in entries[2].raw.upper()
        app = MeshDoctorApp(EnvoySession(entries=entries))
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.press("a")
            table = app.screen.query_one("#access-log", DataTable)
            await wait_for(pilot, lambda: table.row_count == 3)
            shown = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(3)}
            uf_time = next(t for t, row in shown.items() if row[2] == "UF")
            assert uf_time == "13:44:07.031" and uf_time not in UF

            async def filtered(text: str) -> list[list[str]]:
                filt = app.screen.query_one("#log-filter", Input)
                filt.value = ""
                await pilot.press("slash", *text, "enter")
                status = app.screen.query_one("#log-status", Static)
                await wait_for(pilot, lambda: f"filter {text!r}:" in str(status.render()))
                return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]

            assert [row[4] for row in await filtered("tcp")] == ["TCP"]
            assert [row[2] for row in await filtered(uf_time)] == ["UF"]
            assert [row[2] for row in await filtered("fiLTer_chain")] == ["NR"]  # details, any case
            assert [row[2] for row in await filtered("upe")] == ["UPE"]
            assert await filtered("HTTP/1.1") == []  # in both raw lines, in no column
            await pilot.press("escape", "q")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


async def test_the_clusters_status_counts_what_the_table_shows():
    """A real /clusters dump (tests/envoy/data/clusters.txt) with clusters that have no hosts: the table has one
    row a host, and the status said "11 clusters, 10 hosts" over 10 rows; it counts the rows now, and says how
    many clusters have none (issue 16)."""
    dump = parse_clusters((Path(__file__).parent.parent.parent / "envoy" / "data" / "clusters.txt").read_text())
    hosts = sum(len(c.hosts) for c in dump.values())
    empty = [name for name, c in dump.items() if not c.hosts]
    assert len(dump) == 11 and hosts == 10 and len(empty) == 3
    app = MeshDoctorApp(EnvoySession(clusters=lambda: dump))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("c")
        table = app.screen.query_one("#clusters", DataTable)
        status = app.screen.query_one("#clusters-status", Static)
        await wait_for(pilot, lambda: table.row_count > 0 and "reading" not in str(status.render()))
        assert table.row_count == hosts
        assert not {str(table.get_row_at(i)[0]) for i in range(table.row_count)} & set(empty)
        assert str(status.render()).startswith("10 hosts of 11 clusters (3 clusters have no hosts); 0 counters "
                                               "moved since the last refresh")
        await pilot.press("escape", "q")


async def test_a_path_from_the_traffic_is_shown_as_text_never_as_markup():
    """A request target is the traffic's: `[/]`, `[bold]` or `[@click=app.quit]` in it is shown as written, at
    80x24 and 160x45, and neither crashes the pane nor acts (Textual reads a str cell as markup)."""
    hostile = ["/q?sort[/]", "/a[bold]b[/bold]", "/x[@click=app.quit]y"]
    entries = [parse_line(UF.replace("/admin/health", path)) for path in hostile]
    for size in ((80, 24), (160, 45)):
        app = MeshDoctorApp(EnvoySession(entries=entries))
        async with app.run_test(size=size) as pilot:
            await pilot.press("a")
            table = app.screen.query_one("#access-log", DataTable)
            await wait_for(pilot, lambda: table.row_count == 3)
            shown = {str(table.get_row_at(i)[4]) for i in range(3)}  # the request
            assert shown == {f"GET {path}" for path in hostile}, size
            await pilot.press("escape")
            assert app.is_running
            await pilot.press("q")
