"""startup-ordering: the app's calls refused at its own REDIRECT before the sidecar listens.

The recorded captures (tests/data/README.md, lab-startup-*) are the real kernel's: the lab's pod namespace with
istio-init's outbound rules, an app calling out as it starts, and real Envoy started after it (classic) or before
it and waited on (held)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.core.events import ContainerEvent, ContainerExit, PodEvent
from kubectl_meshdoctor.core.pipeline import Pipeline

from ..helpers import A, R, S, Wire, analyze_json, run

DATA = Path(__file__).resolve().parent.parent / "data"
APP, DEST, REDIRECTED = "198.18.250.2:48140", "198.18.250.1:5000", "127.0.0.1:15001"


def refused(w: Wire, client: str = APP, seq: int = 100) -> None:
    """What the kernel writes on lo for one refused call: the SYN after nat OUTPUT, the RST de-NATed."""
    w.pkt(client, REDIRECTED, S, seq, dt=0.02)
    w.pkt(DEST, client, R | A, 0, seq + 1, dt=0.00001)


def test_the_recorded_classic_start_is_named_with_its_packets():
    code, report = analyze_json(DATA / "lab-startup-classic-lo.pcap", DATA / "lab-startup-classic-eth0.pcap")
    found = report["findings"]
    assert code == 1 and {f["detector"] for f in found} == {"startup-ordering"}, found
    # The recording's app made 3 calls before Envoy listened (its app.log: 3 ECONNREFUSED, then ok).
    assert len(found) == 3
    for f in found:
        syn, rst = f["evidence"]
        assert syn["iface"] == rst["iface"] == "lo" and syn["flags"] == "S" and rst["flags"] == "R."
        assert syn["dst"] == REDIRECTED and rst["src"] == f["flow"]["server"] == DEST != syn["dst"]
        assert rst["dst"] == syn["src"] == f["flow"]["client"]
        assert [x["name"] for x in f["fixes"]] == ["hold-application", "native-sidecar"]


def test_the_recorded_held_start_has_no_finding():
    code, report = analyze_json(DATA / "lab-startup-held-lo.pcap", DATA / "lab-startup-held-eth0.pcap")
    assert code == 0 and report["findings"] == [], report["findings"]


def test_upstream_refused_does_not_claim_the_redirected_refusal():
    w = Wire(iface="lo")
    refused(w)
    found = run(w.events)
    assert [f.detector for f in found] == ["startup-ordering"]


@pytest.mark.parametrize("answer", ["syn-ack", "rst-from-15001", "wrong-ack", "eth0"])
def test_what_is_not_a_refusal_at_the_redirect(answer):
    w = Wire(iface="eth0" if answer == "eth0" else "lo")
    w.pkt(APP, REDIRECTED, S, 100)
    if answer == "syn-ack":  # the sidecar listens: the handshake's answer comes from the address dialled
        w.pkt(DEST, APP, S | A, 7000, 101)
        w.pkt(DEST, APP, R | A, 7001, 101)  # and a reset later in its life is not a refusal
    elif answer == "rst-from-15001":  # 127.0.0.1:15001 dialled itself: no REDIRECT, no original destination
        w.pkt(REDIRECTED, APP, R | A, 0, 101)
    elif answer == "wrong-ack":
        w.pkt(DEST, APP, R | A, 0, 555)
    else:
        w.pkt(DEST, APP, R | A, 0, 101)
    assert run(w.events, only=["startup-ordering"]) == []


@pytest.mark.parametrize("pod, cause, fixes", [
    (None, "unknown", ["hold-application", "native-sidecar"]),
    (PodEvent(0.0, "web", 0, hold=""), "not-held", ["hold-application", "native-sidecar"]),
    (PodEvent(0.0, "web", 0, hold="native sidecar"), "held", []),
    (PodEvent(0.0, "web", 0, sidecar_restarts=2, sidecar_started=1_764_439_363.5, hold="native sidecar"),
     "sidecar-restarted", []),
])
def test_the_pod_s_spec_and_status_name_the_start(pod, cause, fixes):
    p = Pipeline.with_detectors(only=["startup-ordering"], pod="web")
    if pod is not None:
        p.context(pod)
    w = Wire(iface="lo")
    refused(w)
    for ev in w.events:
        p.feed(ev)
    (f,) = p.finish()
    assert f.details["cause"] == cause and [x.name for x in f.fixes] == fixes
    assert f.details["original_destination"] == DEST and f.flow.server == DEST
    spec = [e for e in f.evidence if e.frame is None]
    assert bool(spec) == (pod is not None)
    if pod is not None and pod.sidecar_started is not None:
        assert any("startedAt" in e.what for e in spec) and "istio-proxy's current run had started" in f.explanation
    if cause == "held":
        assert "native sidecar" in f.explanation and "--previous" in f.remediation


def test_a_restarted_sidecar_s_last_exit_and_the_kubelet_s_events_are_its_evidence():
    """The pod as watch reads it after istio-proxy was killed and started again: its lastState (exit 137) and
    the kubelet's events of its runs (kube/pod_events.py) are quoted; events of the app, or of after the
    refusal by more than a minute, are not."""
    t = 1_764_439_300.0
    history = (ContainerEvent(t, "istio-proxy", "Started", "Started container istio-proxy"),
               ContainerEvent(t + 1, "app", "Started", "Started container app"),
               ContainerEvent(t + 50, "istio-proxy", "Created", "Created container: istio-proxy"),
               ContainerEvent(t + 50, "istio-proxy", "Started", "Started container istio-proxy"),
               ContainerEvent(t + 900, "istio-proxy", "Killing", "Stopping container istio-proxy"))
    pod = PodEvent(0.0, "web", 0, sidecar_restarts=1, sidecar_started=t + 50, hold="native sidecar",
                   sidecar_last_exit=ContainerExit(t + 49, 137, "Error"), history=history)
    p = Pipeline.with_detectors(only=["startup-ordering"], pod="web")
    p.context(pod)
    w = Wire(iface="lo", t0=t + 40)
    refused(w)
    for ev in w.events:
        p.feed(ev)
    (f,) = p.finish()
    assert f.details["cause"] == "sidecar-restarted" and not f.fixes
    spec = [e.what for e in f.evidence if e.frame is None]
    assert any(w.startswith("status.containerStatuses[istio-proxy].lastState.terminated = exitCode 137, reason "
                            "Error") for w in spec), spec
    events = [w for w in spec if w.startswith("event ")]
    assert [w.split(" ")[1] for w in events] == ["Started", "Started"] and not any("app" in w for w in events)
    assert "exit code 137 (Error): killed by SIGKILL" in f.explanation


def test_the_printed_fixes_are_start_orders_the_lab_applies():
    """The lab proves each fix by the start order its annotations make (tests/lab/test_startup_ordering.py)."""
    from kubectl_meshdoctor_plugins.startup_ordering import FIXES
    from meshdoctor_lab.startup import order_of

    assert [order_of(dict(f.annotations)) for f in FIXES] == ["held", "native"]
    assert order_of({}) == order_of({"proxy.istio.io/config": "holdApplicationUntilProxyStarts: false"}) == "classic"


def test_a_refusal_after_the_sidecar_served_the_app_is_a_sidecar_that_stopped():
    """The same packets once the sidecar has accepted the app's connections in this capture: it went down while
    the app ran (a crash, a restart), which no start order fixes."""
    w = Wire(iface="lo")
    w.pkt("198.18.250.2:40000", REDIRECTED, S, 10)
    w.pkt(DEST, "198.18.250.2:40000", S | A, 900, 11)  # served: the answer de-NATed as the RST is
    refused(w)
    (f,) = run(w.events, only=["startup-ordering"])
    assert f.details["cause"] == "sidecar-stopped" and f.fixes == () and "any more" in f.title
    assert "--previous" in f.remediation and "order only the start" in f.explanation
