"""s46: what a new user's trial in a real 80x24 terminal found cut that a newcomer needs: the watch's namespace
and context, the verdict's counts, the counters' cluster, the ladder's ports, whole key hints. Assertions are on
the characters the screen shows (test_small_screen.shown), at 80x24 and at 160x45 (kept as it was)."""

from __future__ import annotations

import pytest

from kubectl_meshdoctor.commands.watch.live_session import watch_described
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp

from .test_80x24 import SIZES, status_rows
from .test_app import replay_session, wait_for
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
