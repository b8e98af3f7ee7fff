"""s46: what a new user's trial in a real 80x24 terminal found cut that a newcomer needs: the watch's namespace
and context, the verdict's counts, the counters' cluster, the ladder's ports, whole key hints. Assertions are on
the characters the screen shows (test_small_screen.shown), at 80x24 and at 160x45 (kept as it was)."""

from __future__ import annotations

import shutil

import pytest

from kubectl_meshdoctor.core.findings import SPEC, NoFlow

from kubectl_meshdoctor.commands.watch.live_session import watch_described
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.detail_pane import DetailPane
from kubectl_meshdoctor.frontends.tui.stats_pane import SHORT_CLUSTER, CountersScreen, short_cluster
from kubectl_meshdoctor.frontends.tui.status_line import _second_row

from .test_80x24 import SIZES, status_rows
from .test_app import replay_session, screen_text, wait_for
from .test_loggers import loggers_open
from .test_no_flow_tui import AlsoSpec, spec_findings
from .test_offline_panes import DATA, REFUSED, opened, read, session_of
from .test_small_screen import shown


def watched(pod: str = "pod/collision", namespace: str = "s46nc", context: str | None = "kind-s46"):
    """The collision's recordings replayed under a watch's header line (LiveSession's, watch_described)."""
    session = replay_session("lab-collision-eth0.pcap:eth0", "lab-collision-lo.pcap:lo")
    session.describe, session.describe_short = watch_described(pod, namespace, context)
    return session


@pytest.mark.parametrize("size", SIZES)
async def test_the_namespace_and_context_stay_readable_the_packet_counts_giving_way(size):
    """The trial: ` pod/collision  namespa…  eth0: 323 pkts …` at 80 columns."""
    session = watched()
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "files read" in str(app.query_one("#status").render()))
        await pilot.pause(0.3)
        st = session.stats()
        counts = f"flows: {st.flows_seen}  findings: 1"
        if size == (80, 24):
            row = status_rows(app)[0]
            assert row.strip() == f"pod/collision  ns/s46nc  ctx/kind-s46  {st.packets} pkts  {counts}", row
        else:  # the header has the whole line, the status the per-interface counts
            assert "pod/collision  namespace s46nc  context kind-s46" in shown(app)[0], shown(app)[0]
            assert status_rows(app)[0].strip().startswith("eth0: "), status_rows(app)
        await pilot.press("q")


@pytest.mark.parametrize("pod", ["pod/[bold]x[/bold]", "pod/[@click=app.quit]q[/]", "pod/a\x1b[31mb",
                                 "pod/" + "n" * 300])
async def test_a_hostile_target_shows_as_text_or_cut_and_the_counts_stay_whole(pod):
    session = watched(pod, "[red]ns", None)
    app = MeshDoctorApp(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "files read" in str(app.query_one("#status").render()))
        await pilot.pause(0.3)
        row = status_rows(app)[0].rstrip()
        st = session.stats()
        assert row.endswith(f" pkts  flows: {st.flows_seen}  findings: 1"), row  # the counts whole, short or not
        if len(pod) < 40:
            shown_pod = pod.replace("\x1b", "\\x1b")  # its control byte escaped (shown.one_line)
            assert row.strip().startswith(f"{shown_pod}  ns/[red]ns  "), row  # markup as text, no ctx/ when none
        else:
            assert row.strip().startswith("pod/nnnn") and "…  " in row, row
        assert app.is_running  # [@click=app.quit] was not a link that ran
        await pilot.press("q")


class SpecAndDrops(AlsoSpec):
    """The collision, the pod's spec warnings, and tcpdump's drops known only when it ends (a watch's)."""

    def drops(self):
        return {"collision/eth0": None, "collision/lo": 0}


@pytest.mark.parametrize("size", SIZES)
async def test_the_verdict_row_says_its_counts_whole_the_spec_warnings_with_them_before_any_name(size):
    """The trial: `verdict so far: 1 error, 0 warnings: tuple-collision; …  ·  drops: at the end…` over two WARN
    rows: the clause counting them cut, "0 warnings" read wrong, the drops unreadable."""
    session = SpecAndDrops(spec_findings())
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "q quits" in str(app.query_one("#status").render()) and app.list.up_to_date())
        await pilot.pause(0.3)
        def specs() -> int:  # the spec warnings' problems the list shows
            return sum(isinstance(g.shown.flow, NoFlow) and g.shown.flow.kind == SPEC for g in app.list.groups())

        # the status and the list drawn from the same groups (under load one can be a tick behind the other)
        await wait_for(pilot, lambda: specs() >= 1 and any(f"{specs()} spec" in r for r in status_rows(app)))
        spec = specs()
        rows = status_rows(app)
        if size == (80, 24):
            assert rows[1].strip().startswith(f"verdict: 1 error, 0 warnings + {spec} spec (lint)  ·  drops: at the "
                                              "end  ·  tuple-"), rows
            assert len(rows[1].rstrip()) <= 80
        else:  # the wide layout: the report's verdict whole, on a row of its own
            said = (f"verdict: 1 failure problem (1 error, 0 warnings): tuple-collision; {spec} spec "
                    f"warning{'' if spec == 1 else 's'} of the pods (lint)")
            assert any(r.strip().startswith(said) for r in rows), rows
            assert any("drops: at the end" in r for r in rows), rows
        await pilot.press("q")


def test_the_counts_are_whole_before_any_name_at_every_width():
    """_second_row from 40 to 130 columns, with the spec warnings' clause the trial saw cut: where the whole head
    does not fit, the errors, warnings, the spec count and the trouble are whole before the detectors' names."""
    verdict = ("verdict so far: 2 failure problems (1 error, 1 warning): stale-keepalive, tuple-collision; "
               "2 spec warnings of the pods (lint)")
    trouble = "problems: 1  drops: at the end"
    for width in range(40, 131):
        row = _second_row([verdict], trouble, ["capturing lo, eth0"], width)
        head = row[:row.index(trouble) + len(trouble)]
        assert len(head) <= width - 1, (width, row)
        if "keepalive" not in head and width - 1 >= len("so far: 1 error, 1 warning + 2 spec  ·  ") + len(trouble):
            assert "1 error, 1 warning + 2 spec" in head, (width, row)  # the names given way: the counts first
            assert row.index("stale-keepalive, tuple-collision") > row.index(trouble), (width, row)
        if width >= 80:
            assert "…" not in head, (width, row)


HOSTILE_CLUSTERS = {"outbound|5000||[bold]x[/bold].ns.svc.cluster.local": "out [bold]x[/bold].ns:5000",
                    "outbound|80||[@click=app.quit].svc.cluster.local": "out [@click=app.quit]:80",
                    "inbound|5000||": "in :5000", "BlackHoleCluster": "BlackHoleCluster"}


def test_a_cluster_s_short_name_has_its_direction_service_namespace_port_and_subset():
    assert short_cluster("outbound|9080|v1|reviews.shop.svc.cluster.local") == "out reviews.shop:9080 v1"
    assert short_cluster("outbound|9080||reviews.shop.svc.corp.example") == "out reviews.shop:9080"
    assert short_cluster("outbound|443||api.example.com") == "out api.example.com:443"  # a ServiceEntry's host
    for name, short in HOSTILE_CLUSTERS.items():
        assert short_cluster(name) == short
    long = short_cluster("outbound|9080||" + "n" * 300 + ".shop.svc.cluster.local")
    assert len(long) == SHORT_CLUSTER and long.endswith("…")


@pytest.mark.parametrize("size", SIZES)
async def test_the_counters_keep_each_stat_s_cluster_on_screen_short_at_80_columns(tmp_path, size):
    """The trial: `108 external.upstream_rq_200` rows at 80 columns, the cluster column off-screen. Clusters of
    hostile names (markup, a link, control bytes, 300 characters) show as text, or cut."""
    pod = tmp_path / "caller"
    shutil.copytree(REFUSED / "caller", pod)
    # /stats names hold no brackets (envoy.stats.parse_stats skips such lines): markup comes without them
    on_screen = {"outbound|80||@click=app.quit.svc.cluster.local": "out @click=app.quit:80",
                 "outbound|5000||a\x1bb.svc.cluster.local": "out a\\x1bb:5000", "inbound|5000||": "in :5000",
                 "BlackHoleCluster": "BlackHoleCluster",
                 "outbound|5000||" + "n" * 300: "out " + "n" * (SHORT_CLUSTER - 5) + "…"}
    hostile = list(on_screen)
    for dump, value in (("stats-before.txt", 0), ("stats-after.txt", 7)):
        with (pod / dump).open("a") as out:
            out.writelines(f"cluster.{c};.upstream_rq_200: {value}\n" for c in hostile)
    app = MeshDoctorApp(session_of(pod))
    async with app.run_test(size=size) as pilot:
        await read(app, pilot)
        table = await opened(app, pilot, "k", CountersScreen, "#counters")
        await pilot.press("slash", *"rq_200", "enter")
        await wait_for(pilot, lambda: table.row_count == len(hostile))
        await pilot.pause(0.2)
        lines = shown(app)[table.region.y:table.region.bottom]
        assert all(len(line.rstrip()) <= size[0] for line in lines)
        rows = [" ".join(line.split()) for line in lines]
        if size[0] == 80:
            assert rows[0].startswith("moved cluster stat"), rows
            for short in on_screen.values():
                assert f"7 {short} upstream_rq_200" in rows, (short, rows)
        else:  # as it was: the stat, then its cluster whole (a long one cut by the screen)
            assert rows[0].startswith("moved stat cluster"), rows
            for name in hostile[:4]:
                assert "7 upstream_rq_200 " + name.replace("\x1b", "\\x1b") in rows, (name, rows)
        assert app.is_running
        await pilot.press("escape", "escape", "q")


@pytest.mark.parametrize("size", SIZES)
async def test_the_ladder_keeps_its_ports_whole_and_its_rows_on_one_line(size):
    """The trial: `│◀ P. :5000→:5…─│  #6 last response from`, `#8 request from the sidecar on the` wrapping: the
    labels' short forms keep the ports whole; a name is cut with "…" (the evidence list has it whole)."""
    stale = DATA / "envoy-1.40-mesh" / "stale-keepalive"
    app = MeshDoctorApp(session_of(stale / "caller", stale / "server"))
    async with app.run_test(size=size) as pilot:
        await read(app, pilot)
        await wait_for(pilot, lambda: app.selected is not None)
        f = app.selected
        await pilot.press("enter")
        detail = app.query_one(DetailPane)
        await wait_for(pilot, lambda: detail.has_focus)
        await pilot.pause(0.3)
        while not any("#10 " in line for line in shown(app)):
            assert detail.scroll_y < detail.max_scroll_y, "the ladder is not reachable"
            await pilot.press("pagedown")
            await pilot.pause(0.2)
        lines = shown(app)
        for e in (e for e in f.evidence if e.src and e.dst):
            row = next(line for line in lines if f"  #{e.frame} " in line)
            src, dst = (x.rpartition(":")[2] for x in (e.src, e.dst))
            assert f"{e.flags} {src}→{dst} " in row or f"{e.flags} :{src}→:{dst} " in row, row  # ports whole
            assert len(row.rstrip()) <= size[0]
            following = lines[lines.index(row) + 1]
            assert "│" in following or "⋮" in following, following  # no name wrapped onto a row of its own
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
async def test_the_instance_line_keeps_its_key_hints_whole(size):
    """The trial: `… (30.0/min)  -  [` / `older  ] newer` at 80 columns: the rate gives way, the hints stay whole on
    the line's one row; beside the list (160x45) the line is as it was."""
    app = MeshDoctorApp(replay_session("lab-collision3m-eth0.pcap:eth0", "lab-collision3m-lo.pcap:lo"))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "files read" in str(app.query_one("#status").render()) and app.selected)
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.query_one(DetailPane).has_focus)
        await pilot.pause(0.3)
        lines = shown(app)
        at = next(i for i, line in enumerate(lines) if "instance 90 of 90 (newest)" in line)
        if size == (80, 24):
            assert lines[at].strip().endswith("  -  [ older  ] newer"), lines[at]
            assert lines[at + 1].lstrip().startswith("ERROR"), lines[at + 1]  # nothing wrapped
        else:
            assert "(30.0/min)" in screen_text(app, "#detail")
        await pilot.press("q")


async def test_a_footer_leaves_out_a_hint_that_does_not_fit_whole(tmp_path):
    """The trial: the `l` pane's footer ended in `v detectors' l`."""
    async with loggers_open(tmp_path, (80, 24)) as (_, app, pilot, table):
        await pilot.pause(0.3)
        footer = shown(app)[-1]
        long_hint = "v detectors' loggers: debug for this run / back"
        assert long_hint in footer or "detectors'" not in footer, footer
        assert footer.rstrip().endswith("esc back"), footer  # a later hint kept where it fits
        assert len(footer.rstrip()) <= 80
