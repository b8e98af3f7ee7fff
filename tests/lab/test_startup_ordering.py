"""Issue 33's startup-ordering, live: the mesh lab's caller pod started again as the kubelet starts it, its app
calling the pod through its own sidecar (real Envoy 1.40) from the moment it runs. Classic order (the app, then
istio-proxy, nobody waiting): the app's first calls are refused at its REDIRECT, and `watch` of the caller pod and
`analyze` of what it saved name startup-ordering with the packets on lo. Held (istio-proxy first, the app once it
is ready, as pilot-agent wait or a native sidecar's startupProbe orders it): the same calls, no error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubectl_meshdoctor.lint import RULES
from kubectl_meshdoctor_plugins import startup_ordering
from meshdoctor_lab import startup
from meshdoctor_lab.state import caller_pod_name

from .lab_names import caller_sidecar_lab
from .watching import capturing, capturing_all, stop_all

pytestmark = pytest.mark.lab

POD = "healthy"
CALLER = caller_pod_name(POD)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    with caller_sidecar_lab(tmp_path_factory, "so", (POD,)) as state:
        yield state


def start_watched(state, order: str, out: Path) -> tuple[dict, tuple[str, ...], set[int]]:
    """watch the caller pod, and the pod it calls, while the caller starts in ``order``, each writing its captures
    and then its sidecar's log to a directory named after it under ``out``: (the caller's watch's report, the
    app's call results, the source ports of its refused calls)."""
    with capturing_all(state, (f"pod/{POD}", "--write-pcap", str(out / POD)),
                       (f"pod/{CALLER}", "--write-pcap", str(out / CALLER))) as runs:
        _, calls = startup.start_caller_pod(state, POD, order)
        called, report = stop_all(runs)
    assert errors(called) == []  # nothing of it reached the called pod
    for pod in (POD, CALLER):
        (out / pod / "istio-proxy.log").write_text(kubectl_logs(state, pod))
    return report, tuple(r for r, _ in calls), {p for r, p in calls if r == "ECONNREFUSED"}


def kubectl_logs(state, pod: str) -> str:
    proc = subprocess.run(["kubectl", "--kubeconfig", str(state.kubeconfig), "logs", pod, "-c", "istio-proxy"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def analyze(*dirs: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *map(str, dirs), "-o", "json"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error" and f["detector"] not in RULES]


def ports(findings: list[dict]) -> set[int]:
    """The app's source ports the findings name (their flow's client)."""
    return {int(f["flow"]["client"].rpartition(":")[2]) for f in findings}


def test_an_app_started_before_its_sidecar_is_named_live_and_offline(mesh, tmp_path):
    report, calls, refused = start_watched(mesh, "classic", tmp_path)
    # Real Envoy took its time to listen: the app's first calls were refused, the later ones served.
    n = len(refused)
    assert n >= 1 and calls[n:] == ("ok",) * (len(calls) - n), calls
    live = errors(report)
    # one finding per refused call, each naming that call's source port
    assert {f["detector"] for f in live} == {"startup-ordering"} and ports(live) == refused and len(live) == n, live
    for f in live:
        syn, rst = f["evidence"][:2]
        assert (syn["iface"], syn["flags"], syn["dst"]) == ("lo", "S", "127.0.0.1:15001")
        # the RST carries what the app dialled: the called pod's address, not the REDIRECT's
        assert rst["flags"] == "R." and rst["src"] == f["flow"]["server"] == f"{mesh.pod(POD).pod_ip}:5000"
        assert f["pod"] == CALLER and f["details"]["cause"] == "not-held"
        # the caller pod's kernel counted each refusal (nstat in its namespace, before and after the watch)
        moved = {k.rsplit(".", 1)[-1].rsplit("/", 1)[-1]: v for k, v in f["counters"].items()}
        assert moved.get("TcpAttemptFails", 0) >= n and moved.get("TcpOutRsts", 0) >= n, f["counters"]
        assert [x["name"] for x in f["fixes"]] == ["hold-application", "native-sidecar"]
        # joined to the spec: lint's hold-application reading of the caller pod
        assert any("hold-application" in e["what"] for e in f["evidence"] if e["kind"] == "spec"), f["evidence"]
    assert "hold-application" in {f["detector"] for f in report["findings"]}  # lint's own warning, still there
    # offline: the caller pod's directory, the called pod's (where nothing of it arrived), and both
    offline = errors(analyze(tmp_path / CALLER))
    assert {f["detector"] for f in offline} == {"startup-ordering"} and ports(offline) == refused
    assert errors(analyze(tmp_path / POD)) == []
    both = errors(analyze(tmp_path / CALLER, tmp_path / POD))
    assert {(f["detector"], f["pod"]) for f in both} == {("startup-ordering", CALLER)} and ports(both) == refused


@pytest.mark.parametrize("fix", startup_ordering.FIXES, ids=lambda f: f.name)
def test_each_printed_fix_starts_the_app_once_its_sidecar_is_ready_with_no_error(mesh, tmp_path, fix):
    """The finding's fixes, applied as their annotations say (startup.order_of): the same calls, none refused."""
    order = startup.order_of(dict(fix.annotations))
    assert order != "classic"
    report, calls, _ = start_watched(mesh, order, tmp_path)
    assert calls == ("ok",) * startup.CALLS
    assert errors(report) == [] and errors(analyze(tmp_path / CALLER, tmp_path / POD)) == []


def test_a_sidecar_that_goes_down_while_the_app_runs_is_not_called_a_start(mesh, tmp_path):
    """istio-proxy stopped after serving the app, then started again (as the kubelet restarts a container): the
    same packets, but the capture saw the sidecar serve first, so no start-order fix is offered."""
    with capturing(mesh, f"pod/{CALLER}", "--write-pcap", str(tmp_path)) as run:
        _, calls = startup.restart_caller_sidecar(mesh, POD)
        report = run.stop()
    refused = {p for r, p in calls if r == "ECONNREFUSED"}
    assert len(calls) == startup.CALLS and refused, calls
    assert [r for r, _ in calls[:startup.SERVED_FIRST]] == ["ok"] * startup.SERVED_FIRST
    live = errors(report)
    assert {f["detector"] for f in live} == {"startup-ordering"} and ports(live) == refused, (calls, ports(live))
    assert all(f["details"]["cause"] == "sidecar-stopped" and not f.get("fixes") for f in live), live
    assert ports(errors(analyze(tmp_path))) == refused

    # What kubectl shows of it, as on a cluster: the container restarted once, its last run killed (137, Error),
    # and the kubelet's events of both runs, with no Killing (nobody asked it to stop).
    (proxy,) = [c for c in kubectl(mesh, "get", "pod", CALLER)["status"]["containerStatuses"]
                if c["name"] == "istio-proxy"]
    last = proxy["lastState"]["terminated"]
    assert proxy["restartCount"] == 1 and (last["exitCode"], last["reason"]) == (137, "Error"), proxy
    assert "running" in proxy["state"] and proxy["state"]["running"]["startedAt"] >= last["finishedAt"]
    events = kubectl(mesh, "get", "events", "--field-selector", f"involvedObject.name={CALLER}")["items"]
    of_proxy = [e["reason"] for e in events if e["involvedObject"].get("fieldPath") == "spec.containers{istio-proxy}"]
    assert of_proxy.count("Started") == 2 and "Killing" not in of_proxy, events

    # A second crash, watched: the watch read the pod with that history, so the findings quote how the last run
    # ended and the kubelet's events of the runs (the product's reading: kube/pod_events.py); read again as the
    # watch ends, the third run's Started too.
    with capturing(mesh, f"pod/{CALLER}") as run:
        _, calls = startup.restart_caller_sidecar(mesh, POD)
        report = run.stop()
    again = errors(report)
    assert again and {f["detector"] for f in again} == {"startup-ordering"}, calls
    spec = [e["what"] for e in again[0]["evidence"] if e["kind"] == "spec"]
    assert any(w.startswith("status.containerStatuses[istio-proxy].lastState.terminated = exitCode 137") for w in spec)
    assert sum(w.startswith("event Started (istio-proxy") for w in spec) == 3, spec


def kubectl(state, *args: str) -> dict:
    proc = subprocess.run(["kubectl", "--kubeconfig", str(state.kubeconfig), *args, "-o", "json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


REUSED_PORT = 40123  # in the lab's fixed-port range (netns.CLIENT_FIXED_PORTS): the kernel picks no other call's


def test_a_port_reused_while_the_sidecar_is_down_is_a_refusal_not_a_collision(mesh, tmp_path):
    """The app calls from one port, istio-proxy is killed, the app calls again from that port. The dead sidecar's
    TIME-WAIT socket still holds the four-tuple on 127.0.0.1:15001 and answers the SYN with an ACK of the old
    connection (no listener takes it); the app's RST frees it and the resent SYN is refused. Seen in CI with the
    kernel's own port picks. The failure is the refusal (startup-ordering, sidecar-stopped), not a collision."""
    with capturing(mesh, f"pod/{CALLER}", "--write-pcap", str(tmp_path)) as run:
        _, calls, held = startup.reuse_port_after_crash(mesh, POD, REUSED_PORT)
        report = run.stop()
    assert calls == (("ok", REUSED_PORT), ("ECONNREFUSED", REUSED_PORT)) and held == 1, (calls, held)
    # the stale socket answered: on lo, a pure ACK to the app's port that is not the SYN's (tshark's reading)
    (lo,) = tmp_path.glob("*lo*.pcap")
    acks = subprocess.run(["tshark", "-r", str(lo), "-Y", f"tcp.dstport == {REUSED_PORT} && tcp.flags == 0x010",
                           "-T", "fields", "-e", "frame.number"], capture_output=True, text=True, timeout=60)
    assert acks.returncode == 0 and acks.stdout.split(), acks
    for found in (report, analyze(tmp_path)):
        assert {f["detector"] for f in errors(found)} == {"startup-ordering"}, errors(found)
        assert ports(errors(found)) == {REUSED_PORT}
        assert not [f for f in found["findings"] if f["detector"] == "tuple-collision"]
