"""server-first-protocol: a server-first app behind a port its callers' sidecars sniff.

The recordings (tests/data/README.md, lab-server-first/) are real Envoy 1.40's and the real kernel's: the caller's
lo as `watch` captured it (lean BPF: no data segments on lo), the caller sidecar's /stats before and after the
round, and the same round with a printed fix applied. The hand-built wires test what must not fire."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.core.events import EnvoyCountersEvent
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.envoy.stats import parse_stats

from ..helpers import A, F, P, R, S, Wire, analyze_json, run

DATA = Path(__file__).resolve().parent.parent / "data" / "lab-server-first"
APP, DEST, REDIRECTED = "198.18.1.1:35174", "198.18.1.2:5002", "127.0.0.1:15001"
ID = "server-first-protocol"
FIXES = ["app-protocol-tcp", "tcp-port-name"]


def test_the_recorded_caller_capture_names_both_silent_connections():
    code, report = analyze_json(DATA / "caller-lo.pcap", DATA / "caller-eth0.pcap")
    found = report["findings"]
    assert code == 1 and {f["detector"] for f in found} == {ID}, found
    # The round's two connections, each closed by its client after 3 s without the greeting (frames: README).
    assert [[e["frame"] for e in f["evidence"]] for f in found] == [[1, 2, 3], [4, 5, 7]]
    for f in found:
        syn, syn_ack, fin = f["evidence"]
        assert syn["dst"] == REDIRECTED and syn_ack["src"] == f["flow"]["server"] == DEST
        assert fin["flags"] == "F." and fin["src"] == syn["src"] == f["flow"]["client"]
        assert f["details"]["waited_s"] >= 3.0 and [x["name"] for x in f["fixes"]] == FIXES
        assert "port: 5002" in f["fixes"][0]["text"] and "appProtocol: tcp" in f["fixes"][0]["text"]


def test_the_recorded_fixed_round_has_no_finding():
    code, report = analyze_json(DATA / "fixed-caller-lo.pcap", DATA / "fixed-caller-eth0.pcap",
                                DATA / "fixed-caller-istio-proxy.log")
    assert code == 0 and report["findings"] == [], report["findings"]


def counters_between(before: Path, after: Path) -> EnvoyCountersEvent:
    first, last = parse_stats(before.read_text()), parse_stats(after.read_text())
    moved = {k: v - first.get(k, 0) for k, v in last.items()
             if isinstance(v, int) and isinstance(first.get(k, 0), int) and v != first.get(k, 0)}
    return EnvoyCountersEvent(0.0, {}, moved, "the first dump", None, "caller /stats")


def test_the_recorded_stats_name_the_sniffed_listener():
    p = Pipeline.with_detectors(only=[ID])
    p.context(counters_between(DATA / "caller-stats-before.txt", DATA / "caller-stats-after.txt"))
    (f,) = p.finish()
    assert f.flow.server == "198.18.1.2_5002" and [x.name for x in f.fixes] == FIXES
    assert f.counters == {"listener.198.18.1.2_5002.downstream_listener_filter_remote_close": 2}


def test_the_recorded_stats_dumps_through_analyze():
    code, report = analyze_json(DATA / "caller-stats-before.txt", DATA / "caller-stats-after.txt")
    (f,) = report["findings"]
    assert code == 1 and f["detector"] == ID and "between the first dump and the last" in f["title"]


def test_virtual_inbound_remote_closes_are_not_a_callers_failure():
    # A kubelet tcpSocket probe connects to the pod and closes: virtualInbound's TLS inspector counts it so.
    stats = {"listener.0.0.0.0_15006.downstream_listener_filter_remote_close": 40}
    p = Pipeline.with_detectors(only=[ID])
    p.context(EnvoyCountersEvent(0.0, {}, stats, "the run", None, "pod /stats"))
    assert p.finish() == []


def silent(w: Wire, wait: float, client: str = APP, cseq: int = 1000, sseq: int = 5000, sent: int = 0,
           received: int = 0, fin_flags=F | A) -> None:
    """A REDIRECTed connection as watch captures it on lo: the SYN, the SYN-ACK from the original destination,
    then (data segments left out) the client's FIN after ``wait`` s, ``sent`` and ``received`` bytes later."""
    w.pkt(client, REDIRECTED, S, cseq)
    w.pkt(DEST, client, S | A, sseq, cseq + 1, dt=0.00002)
    w.pkt(client, REDIRECTED, fin_flags, cseq + 1 + sent, sseq + 1 + received, dt=wait)


def test_a_silent_connection_closed_by_its_client_is_named():
    w = Wire(iface="lo")
    silent(w, 10.0)
    (f,) = run(w.events, only=[ID])
    assert [e.frame for e in f.evidence] == [1, 2, 3] and f.flow.server == DEST and f.envoy_flags == ()


@pytest.mark.parametrize("case", ["client-spoke", "greeting-relayed", "quick-close", "eth0", "reset",
                                  "direct-15001", "sidecar-closed-first", "payload-seen"])
def test_what_is_not_a_client_waiting_for_a_greeting(case):
    w = Wire(iface="eth0" if case == "eth0" else "lo")
    if case == "client-spoke":  # 28 bytes the lean capture did not keep: the FIN's sequence number says so
        silent(w, 5.0, sent=28)
    elif case == "greeting-relayed":
        silent(w, 5.0, received=39)
    elif case == "quick-close":  # a TCP health check or port scan: connect, close at once
        silent(w, 0.01)
    elif case in ("eth0", "reset"):
        silent(w, 5.0, fin_flags=R | A if case == "reset" else F | A)
    elif case == "direct-15001":  # 127.0.0.1:15001 dialled itself: no original destination
        w.pkt(APP, REDIRECTED, S, 1000)
        w.pkt(REDIRECTED, APP, S | A, 5000, 1001)
        w.pkt(APP, REDIRECTED, F | A, 1001, 5001, dt=5.0)
    elif case == "sidecar-closed-first":
        w.pkt(APP, REDIRECTED, S, 1000)
        w.pkt(DEST, APP, S | A, 5000, 1001)
        w.pkt(DEST, APP, F | A, 5001, 1001, dt=5.0)
        w.pkt(APP, REDIRECTED, F | A, 1001, 5002)
    else:  # a full capture: the client's request segment is seen
        w.pkt(APP, REDIRECTED, S, 1000)
        w.pkt(DEST, APP, S | A, 5000, 1001)
        w.pkt(APP, REDIRECTED, P | A, 1001, 5001, payload_len=28)
        w.pkt(APP, REDIRECTED, F | A, 1001, 5001, dt=5.0)  # (a FIN number the test makes up: still not named)
    assert run(w.events, only=[ID]) == []
