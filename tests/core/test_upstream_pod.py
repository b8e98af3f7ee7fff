"""A caller's 503 UC in a run that also holds the upstream pod (core/upstream_pod.py): the lab's real two-hop
recordings (tests/data/envoy-1.40-mesh, real Envoy 1.40 at both sidecars), the caller's access-log lines only (what
`kubectl logs POD -c istio-proxy | grep` gives: no debug log, so its finding cannot name the cause), read with the
server pod's files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kubectl_meshdoctor.core.upstream_pod import LOGGERS, unknown_upstream

from ..helpers import analyze_json

DATA = Path(__file__).resolve().parent.parent / "data"
MESH = DATA / "envoy-1.40-mesh"
UPSTREAM = "198.18.1.2:5000"  # the server pod's IP and port in every mesh recording (its README)


def _caller_lines(tmp_path: Path, scenario: str) -> Path:
    """The caller sidecar's access-log lines of ``scenario`` (Istio's TEXT format; its debug log left out)."""
    lines = [line for line in (MESH / scenario / "caller" / "istio-proxy.log").read_text().splitlines()
             if line.startswith("[20") and "] \"" in line]
    assert any(" 503 UC " in line and f'"{UPSTREAM}"' in line for line in lines)
    out = tmp_path / f"{scenario}-caller-access.log"
    out.write_text("\n".join(lines) + "\n")
    return out


def _uc(report: dict) -> dict:
    [f] = [f for f in report["findings"] if f["pod"] == "caller" and f["detector"] == "stale-keepalive"
           and any(" 503 UC " in line for line in f.get("access_log", ()))]
    return f


@pytest.mark.parametrize("scenario, detector", [("downstream-idle", "stale-keepalive"),
                                                ("conntrack-invalid", "conntrack-invalid")])
def test_a_callers_503_uc_points_to_the_upstream_pods_own_finding(tmp_path, scenario, detector):
    """The server pod's folder holds its eth0 capture of the very connection (the line's %UPSTREAM_LOCAL_ADDRESS% to
    %UPSTREAM_HOST%), and its pipeline found what ended it: the caller's finding names that finding instead of
    asking to capture a pod the run already holds."""
    code, report = analyze_json(f"{_caller_lines(tmp_path, scenario)}:caller/", MESH / scenario / "server")
    assert code == 1
    f = _uc(report)
    [server] = [g for g in report["findings"] if g["pod"] == "server" and g["detector"] == detector]
    assert server["flow"]["server"] == UPSTREAM and server["flow"]["client"] == f["flow"]["client"]
    assert f["details"]["upstream_pod"] == "server"
    assert "This run holds the upstream pod, server (198.18.1.2)" in f["explanation"]
    assert f"\"{server['title']}\" ({detector})" in f["explanation"]
    assert f"{f['flow']['client']} to {UPSTREAM}" in f["explanation"]
    assert (f"see pod server's finding on the same connection ({detector}):\n# \"{server['title']}\"\n# It prints "
            f"its fix.") in f["remediation"]
    assert "pod/<pod>" not in f["explanation"] + f["remediation"]
    assert unknown_upstream()[0] not in f["explanation"]


def test_without_a_finding_it_says_which_captures_of_the_upstream_pod_to_read(tmp_path):
    """conntrack-invalid with the server pod's lo alone: its SYNs name the pod's address (127.0.0.6 to
    198.18.1.2:5000), its packets span the request, and no finding of it is on the connection: look in that lo,
    capture its eth0, which the run lacks."""
    scenario = MESH / "conntrack-invalid"
    _, report = analyze_json(f"{_caller_lines(tmp_path, 'conntrack-invalid')}:caller/",
                             f"{scenario / 'server' / 'lo.pcap'}:server/lo")
    f = _uc(report)
    assert f["details"]["upstream_pod"] == "server"
    assert ("This run holds the upstream pod, server (198.18.1.2): look in its capture of lo over the request"
            in f["explanation"])
    assert (f"Capture next: pod server's eth0 (kubectl meshdoctor watch pod/server: the FIN or RST under the "
            f"request, and from which port), and {LOGGERS}.") in f["explanation"]
    assert "Look in pod server's capture of lo (this run's)" in f["remediation"]
    assert "capture pod server's eth0 (kubectl meshdoctor watch pod/server)" in f["remediation"]
    assert "pod/<pod>" not in f["explanation"] + f["remediation"]


def test_the_advice_is_unchanged_when_the_run_lacks_the_upstream_pod(tmp_path):
    """The caller's lines read with another pod, whose lo's SYNs name it 198.18.250.2 (the startup-ordering
    recording): no pod of the run is at the line's upstream host, so the finding still asks to capture it."""
    _, report = analyze_json(f"{_caller_lines(tmp_path, 'downstream-idle')}:caller/",
                             f"{DATA / 'lab-startup-classic-lo.pcap'}:other/lo")
    assert report["source"]["pods"] == ["caller", "other"]
    f = _uc(report)
    tail, remedy = unknown_upstream()
    assert tail in f["explanation"] and f["remediation"] == remedy
    assert "upstream_pod" not in f["details"]
    assert "This run holds" not in f["explanation"]


def test_the_caller_alone_asks_for_the_upstream_pod(tmp_path):
    """One pod's run: what the detector says, the words point_to_upstream recognises."""
    _, report = analyze_json(f"{_caller_lines(tmp_path, 'conntrack-invalid')}:caller/")
    f = _uc(report)
    assert (f["explanation"].endswith(unknown_upstream()[0] + " The caller's sidecar retries such 503s by default "
                                      "(Istio's retry on reset): the user sees them when the retries are spent."))
    assert f["remediation"] == unknown_upstream()[1]
    assert "Capture the upstream pod (kubectl meshdoctor watch pod/<pod>)" in f["remediation"]


def test_a_watch_of_both_pods_points_there_before_the_end():
    """The live join (core/live_join.py) of the same two pods mid-run: the caller's pipeline given only its
    access-log lines of downstream-idle, the server's its whole recording, each event in time order."""
    from kubectl_meshdoctor.core.events import AccessLogEvent, PacketEvent
    from kubectl_meshdoctor.core.live_join import LiveJoin
    from kubectl_meshdoctor.core.pipeline import Pipeline

    from ..mesh_replay import pod_events

    async def events() -> list:
        caller = [(ev, "caller") for ev in await pod_events(MESH / "downstream-idle" / "caller", "caller")
                  if isinstance(ev, AccessLogEvent)]
        server = [(ev, "server") for ev in await pod_events(MESH / "downstream-idle" / "server", "server")]
        return sorted(caller + server, key=lambda x: (x[0].ts, not isinstance(x[0], PacketEvent)))

    pipelines = {pod: Pipeline.with_detectors(pod=pod) for pod in ("caller", "server")}
    fed = asyncio.run(events())
    for ev, pod in fed:
        (pipelines[pod].feed if isinstance(ev, PacketEvent) else pipelines[pod].context)(ev)
    for p in pipelines.values():  # the run goes on quiet, as a watch's ticker tells the pipelines (not finished)
        p.tick(fed[-1][0].ts + 12.0)
    assert not any(p.finished for p in pipelines.values())
    view = LiveJoin(lambda: list(pipelines.values())).view()
    [f] = [f for f in view.findings if f.pod == "caller" and "UC" in f.envoy_flags]
    [server] = [g for g in view.findings if g.pod == "server" and g.detector == "stale-keepalive"]
    assert f.details["upstream_pod"] == "server"
    assert f"\"{server.title}\" (stale-keepalive)" in f.explanation and "pod/<pod>" not in f.remediation
