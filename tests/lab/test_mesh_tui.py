"""Issue 31's trial on the pod lab, at 80x24 and 160x45: the TUI of `watch pod/POD-caller pod/POD` (real Envoy 1.40
at both hops, Istio mTLS between them: `lab up --caller sidecar`) shows one row for one failure while the run goes
on, joined as the report joins it and naming both pods; `c` shows each pod's own /clusters (`p`: the next pod) and
`a` names each line's pod. refused: the server's upstream-refused quoting the caller's relayed 503; downstream-idle:
the connection the pod's sidecar closed, seen on both pods' eth0, one row (the caller's 503 UC).
Needs root, iproute2, iptables, openssl, tcpdump and tshark."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import DataTable

from kubectl_meshdoctor.commands.watch.live import WatchOptions
from kubectl_meshdoctor.commands.watch.live_session import LiveSession
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.pod_names import short_names
from kubectl_meshdoctor.kube.client import KubeOptions, connect
from kubectl_meshdoctor.kube.target import Target
from meshdoctor_lab import lab
from meshdoctor_lab.state import caller_pod_name

from .lab_names import caller_sidecar_lab
from .test_envoy_debug_tui import wait_for

pytestmark = pytest.mark.lab
SCENARIOS = ("refused", "downstream-idle")


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    with caller_sidecar_lab(tmp_path_factory, "t", SCENARIOS) as state:
        yield state


def rows(app) -> list[str]:
    table = app.query_one("#findings", DataTable)
    return [str(table.get_row_at(i)[1]) for i in range(table.row_count)]


@pytest.mark.parametrize("scenario, detector", [("refused", "upstream-refused"),
                                                ("downstream-idle", "stale-keepalive")])
@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_one_failure_is_one_row_naming_both_pods_while_the_watch_runs(mesh, scenario, detector, size):
    kube = connect(KubeOptions(kubeconfig=str(mesh.kubeconfig)))
    caller = caller_pod_name(scenario)
    session = LiveSession(kube, WatchOptions((Target("pod", caller), Target("pod", scenario)), kube.namespace))
    app = MeshDoctorApp(session)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, "both pods capturing", lambda: len(session.state.pods) == 2
                       and all(st.phase == "capturing" for st in session.state.pods), 90.0)
        result = await asyncio.to_thread(lab.trigger_round, mesh, scenario)
        assert result.statuses, result

        def errors() -> list[str]:
            return [r for r in rows(app) if detector in r.splitlines()[0]]

        def settled() -> bool:  # every finding handed on is in the joined view, and the failure quotes the 503
            view = app._view  # the caller's sidecar logged (its outbound cluster)
            return (view is not None and view.covers == len(app.findings) and app.list.up_to_date()
                    and any(f.detector == detector and any('" 503 ' in line and "outbound|5000||" in line
                                                           for line in f.access_log) for f in view.findings))

        await wait_for(pilot, "the failure joined on screen", settled, 90.0)
        assert app.report is None  # before the end
        shown = errors()
        assert len(shown) == 1, rows(app)
        (joined,) = [f for f in app.shown_findings() if f.detector == detector]
        # the pods whose sidecars or captures had it: both for refused; for downstream-idle the server's capture
        # may show a clean close (the caller answered its close_notify first: test_mesh_watch.py)
        pods = [joined.pod, *(h["pod"] for h in joined.details.get("hops", ()) if h.get("pod") != joined.pod)]
        names = short_names([caller, scenario])  # refused, refused-caller; idle, idle-caller
        assert shown[0].split("  ")[0].split("+") == [names[p] for p in pods], (shown, pods)
        assert set(pods) == {caller, scenario} or scenario == "downstream-idle" and pods == [caller], pods
        assert not [r for r in rows(app) if r.splitlines()[0].split("  ")[1] in ("next-hop", "access-log")], rows(app)

        await pilot.press("c")
        await wait_for(pilot, "the caller's clusters", lambda: app.screen.query("#clusters")
                       and any(str(r[0]).startswith("outbound|5000||") for r in _rows(app, "#clusters")))
        assert f"pod/{caller} (1 of 2; p: next pod)" in app.screen.sub_title
        await pilot.press("p")
        await wait_for(pilot, "the pod's own clusters", lambda: f"pod/{scenario} (2 of 2" in app.screen.sub_title
                       and any(str(r[0]) == "inbound|5000||" for r in _rows(app, "#clusters")))
        await pilot.press("escape", "a")
        await wait_for(pilot, "both pods' lines", lambda: app.screen.query("#access-log")
                       and {str(r[0]) for r in _rows(app, "#access-log")} == set(names.values()))
        await pilot.press("escape", "q")
        await wait_for(pilot, "the screen closed", lambda: not app.is_running)
    report = app.return_value
    assert [f.detector for f in report.findings if f.detector == detector] == [detector]


def _rows(app, selector: str) -> list[list]:
    table = app.screen.query_one(selector, DataTable)
    return [table.get_row_at(i) for i in range(table.row_count)]
