"""Issue 33's shutdown-ordering, live: the mesh lab's pod called through its caller pod's sidecar over mTLS while its
own sidecar is stopped as pilot-agent stops it (lab/meshdoctor_lab/shutdown.py: drain_listeners, the drain, then
SIGKILL). Classic (a 5 s drain, the app still serving, the callers still calling): `watch` of both pods and
`analyze` of each pod's saved directory and of both name shutdown-ordering with the packets on eth0 and the
caller's 503 lines. Each printed fix, applied as its annotations say: the same calls, no error."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.lint import RULES
from kubectl_meshdoctor_plugins import shutdown_ordering
from meshdoctor_lab import shutdown
from meshdoctor_lab.state import caller_pod_name

from .lab_names import caller_sidecar_lab
from .test_mesh_watch import analyze
from .watching import capturing

pytestmark = pytest.mark.lab

POD = "healthy"
CALLER = caller_pod_name(POD)


def shut_down_watched(tmp_path_factory, out: Path, order: str, drain_s: float) -> tuple[dict, shutdown.ShutdownRun,
                                                                                       str]:
    """A lab of its own (the pod's sidecar does not come back), both pods watched while the pod shuts down:
    (the watch's report, the run, the pod's address)."""
    with caller_sidecar_lab(tmp_path_factory, "sd", (POD,)) as state:
        with capturing(state, f"pod/{POD} pod/{CALLER}", "--write-pcap", str(out)) as watch:
            run = shutdown.shut_down(state, POD, order, drain_s)
            report = watch.stop()
        return report, run, f"{state.pod(POD).pod_ip}:5000"


def errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error" and f["detector"] not in RULES]


def named(findings: list[dict], pod_ip: str) -> None:
    """Only shutdown-ordering, refusals and the cut connection, each with its packets from the pod's port."""
    assert findings and {f["detector"] for f in findings} == {"shutdown-ordering"}, \
        {(f["detector"], f.get("variant")) for f in findings}
    # (a connection cut in its TLS handshake is UF, URX too, with its ClientHello first)
    refusals = [f for f in findings if f["variant"] == "connection refused after the sidecar exited"]
    assert refusals
    for f in refusals:
        syn, rst = f["evidence"][:2]
        assert (syn["iface"], syn["flags"], syn["dst"]) == ("eth0", "S", pod_ip)
        assert rst["flags"] == "R." and rst["src"] == pod_ip and f["flow"]["server"] == pod_ip


def test_a_sidecar_killed_while_callers_still_call_is_named_live_and_offline(tmp_path_factory, tmp_path):
    report, run, pod_ip = shut_down_watched(tmp_path_factory, tmp_path, "classic", shutdown.TERMINATION_DRAIN_S)
    failed = run.failed()
    # served until the kill, then refused: the drain alone fails nothing
    assert failed and all(c.ts >= run.drained for c in failed) and len(run.calls) - len(failed) > 10, run.calls
    assert any(c.result == "503" and c.path.startswith("/slow/") for c in failed), failed  # in flight at the kill
    live = errors(report)
    named(live, pod_ip)
    # the pod's status, read as the watch began, is named (istio-proxy had not restarted), and never the caller's:
    # its sidecar is not the one that exited; the two ends of the link are one finding, with the pod's status
    spec_of = [{e["source"]: e["what"] for e in f["evidence"] if e["kind"] == "spec"} for f in live]
    assert all(f"pod/{POD}" in s and f"pod/{CALLER}" not in s for s in spec_of), spec_of
    assert all(any(e["kind"] == "spec" and "[istio-proxy].restartCount = 0" in e["what"] for e in f["evidence"])
               for f in live), live
    # and as it ended: the kubelet asked istio-proxy to stop (Killing), pilot-agent exited 0 after the drain
    spec = {e["what"].split(" = ")[0].split(" (")[0]: e["what"] for f in live
            for e in f["evidence"] if e["kind"] == "spec"}
    assert "event Killing" in spec and spec["event Killing"].endswith("Stopping container istio-proxy"), spec
    assert "exitCode 0, reason Completed" in spec["status.containerStatuses[istio-proxy].state.terminated"], spec
    lines = [line for f in live for line in f.get("access_log", [])]
    assert any(" 503 URX,UF " in line and "Connection_refused" in line for line in lines), lines
    # the call in flight at the kill: its 503 UC is on a cut connection (another may be cut too: one answered, its
    # caller's close_notify not yet sent, which the capture cannot tell from one whose request was in flight)
    assert any(" 503 UC " in line for f in live if f["envoy_flags"] == ["UC"] for line in f.get("access_log", ())), \
        live
    for pod in (POD, CALLER):  # each pod's own saved directory: its eth0 holds the same packets
        named(errors(analyze(tmp_path / pod)), pod_ip)
    named(errors(analyze(tmp_path / POD, tmp_path / CALLER)), pod_ip)


@pytest.mark.parametrize("fix", shutdown_ordering.FIXES, ids=lambda f: f.name)
def test_each_printed_fix_keeps_every_call_served(tmp_path_factory, tmp_path, fix):
    order, drain_s = shutdown.order_of(dict(fix.annotations))
    assert order != "classic"
    report, run, _ = shut_down_watched(tmp_path_factory, tmp_path, order, drain_s)
    assert run.calls and run.failed() == (), run.failed()
    assert errors(report) == [] and errors(analyze(tmp_path / POD, tmp_path / CALLER)) == []


def test_exit_on_zero_active_connections_is_no_fix_while_callers_call(tmp_path_factory, tmp_path):
    """Why EXIT_ON_ZERO_ACTIVE_CONNECTIONS is a note, not a printed fix: pilot-agent exits once Envoy's
    downstream_cx_active is 0 after its minimum drain, which it is between two calls (each connection is closed
    after its answer while draining), so callers still calling are refused as in the classic order."""
    config = 'proxyMetadata:\n  EXIT_ON_ZERO_ACTIVE_CONNECTIONS: "true"'
    order, drain_s = shutdown.order_of({"proxy.istio.io/config": config})
    assert order == "exit-on-zero"
    report, run, pod_ip = shut_down_watched(tmp_path_factory, tmp_path, order, drain_s)
    assert run.killed - run.drained >= shutdown.MINIMUM_DRAIN_S
    # The exit came while callers still called: a loaded machine keeps a connection open at more of
    # pilot-agent's once-a-second checks, so when it comes varies; that calls came after it, and failed, does not.
    assert any(c.ts > run.killed for c in run.calls), (run.killed, run.calls[-1])
    assert run.failed(), run.calls
    named(errors(report), pod_ip)
    assert "EXIT_ON_ZERO_ACTIVE_CONNECTIONS" in errors(report)[0]["explanation"]


def test_the_apps_own_calls_out_are_startup_orderings_and_no_packet_is_claimed_twice(tmp_path_factory, tmp_path):
    """The pod's app keeps a connection out through its sidecar's 15001: at the kill it reads EOF, then its
    connects are refused at the REDIRECT on lo (ECONNREFUSED). That is startup-ordering's sidecar-stopped (the
    sidecar had served the app earlier in the capture); shutdown-ordering reads eth0 only."""
    with caller_sidecar_lab(tmp_path_factory, "sd", (POD,)) as state:
        with capturing(state, f"pod/{POD}", "--write-pcap", str(tmp_path)) as watch:
            run = shutdown.shut_down(state, POD, "classic", outbound=True)
            report = watch.stop()
    # the pooled connection ends at the kill (EOF; ECONNRESET when a ping crossed the FIN), then connects are refused
    events = [what for ts, what in run.outbound if ts >= run.killed - 0.5]
    ended = next((i for i, what in enumerate(events) if what in ("EOF", "ECONNRESET")), None)
    assert ended is not None and "ECONNREFUSED" in events[ended:], (run.killed, run.outbound)
    for found in (errors(report), errors(analyze(tmp_path))):  # one pod watched: its files in tmp_path itself
        by = {f["detector"]: f for f in found}
        assert set(by) == {"shutdown-ordering", "startup-ordering"}, [(f["detector"], f["title"]) for f in found]
        assert {f["flow"]["iface"] for f in found if f["detector"] == "shutdown-ordering"} == {"eth0"}
        stopped = [f for f in found if f["detector"] == "startup-ordering"]
        assert all(f["flow"]["iface"] == "lo" and f["details"]["cause"] == "sidecar-stopped" for f in stopped)
        packets = [(e["source"], e["frame"]) for f in found for e in f["evidence"] if e["kind"] == "packet"]
        assert len(packets) == len(set(packets))  # no packet is evidence of two findings
