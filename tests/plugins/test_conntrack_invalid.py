"""conntrack-invalid (issue 33, class 4): a segment conntrack marks INVALID misses Istio's REDIRECT and the app's
port resets the live connection. Read from the lab's recording (tests/data/lab-conntrack-invalid: real Envoy 1.40 at
both hops, mTLS, the pod's eth0 and lo as watch wrote them, the caller sidecar's access log), and from hand-built
wires for what must not fire: a socket's own abort (RST with ACK), late data after the pod's FIN, lo, a port
Istio does not capture."""

from __future__ import annotations

from pathlib import Path

from kubectl_meshdoctor.core.events import RedirectMap, RedirectMapEvent
from kubectl_meshdoctor.core.pipeline import Pipeline

from ..helpers import A, F, P, R, Wire, analyze_json, run

DATA = Path(__file__).resolve().parent.parent / "data" / "lab-conntrack-invalid"
ETH0, LO, CALLER_LOG = DATA / "healthy-http-eth0.pcap", DATA / "healthy-http-lo.pcap", DATA / "caller-istio-proxy.log"
C, POD = "198.18.0.1:40001", "198.18.0.2:5000"


def live_wire() -> Wire:
    """An upload on a live connection: the client's data and the pod's ACKs."""
    w = Wire()
    w.handshake(C, POD, cseq=1000, sseq=5000)
    w.pkt(C, POD, P | A, 1001, 5001, payload_len=4000)
    w.pkt(POD, C, A, 5001, 5001)
    return w


def test_the_lab_recording_names_the_rst_from_the_app_port():
    code, report = analyze_json(ETH0, LO)
    assert code == 1
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [f["detector"] for f in errors] == ["conntrack-invalid"]
    (f,) = errors
    assert f["flow"]["server"] == "198.18.1.2:5000" and f["flow"]["iface"] == "eth0"
    rst = f["evidence"][-1]
    assert rst["frame"] == 13 and rst["flags"] == "R" and rst["src"] == "198.18.1.2:5000"
    assert "without ACK" in rst["what"] and f["evidence"][0]["frame"] == 1  # the live connection's first packet
    assert [x["name"] for x in f["fixes"]] == ["invalid-drop", "conntrack-be-liberal"]
    assert "INVALID_DROP" in f["remediation"] and "nf_conntrack_tcp_be_liberal=1" in f["remediation"]


def test_with_the_callers_access_log_the_uc_is_this_class_not_a_keepalive_race():
    """The wrong diagnosis replayed with the packets: the caller's 503 UC is quoted by the conntrack-invalid finding,
    and nothing calls it a stale keep-alive."""
    code, report = analyze_json(ETH0, LO, CALLER_LOG)
    assert code == 1
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [f["detector"] for f in errors] == ["conntrack-invalid"]
    (line,) = errors[0]["access_log"]
    assert '" 503 UC upstream_reset_before_response_started{connection_termination} ' in line
    assert "keep-alive" not in errors[0]["explanation"]


def test_the_callers_access_log_alone_names_no_cause_and_says_what_to_capture():
    """The wrong diagnosis replayed from the access log alone: the 503 UC cannot tell a keep-alive race from this
    class, so no cause is named, no fix printed, and the finding says what to capture next."""
    code, report = analyze_json(CALLER_LOG)
    assert code == 1
    (f,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert f["detector"] == "stale-keepalive" and f["details"]["proven"] is False
    assert "likely" not in f["title"] and "cause not in this evidence" in f["title"]
    assert "Most often" not in f["explanation"] and "cannot tell" in f["explanation"]
    assert "conntrack-INVALID" in f["explanation"] and "Capture next: the upstream pod's eth0" in f["explanation"]
    assert not f.get("fixes") and "none yet" in f["remediation"]


def test_an_rst_without_ack_with_the_segment_it_answers():
    w = live_wire()
    w.pkt(C, POD, A, 1001 + 2**30, 5001)  # out of the window; its ACK the pod's next sequence number
    w.pkt(POD, C, R, 5001)
    (f,) = run(w.events, only=["conntrack-invalid"])
    assert [e.frame for e in f.evidence] == [1, 6, 7]
    assert f.details == {"rst_seq": 5001, "trigger_seen": True, "trigger_seq": 1001 + 2**30}
    assert set(f.envoy_flags) == {"UC", "DC"}


def test_a_segment_whose_ack_is_not_the_rsts_sequence_is_not_named_its_cause():
    w = live_wire()
    w.pkt(C, POD, A, 1001 + 2**30, 4000)
    w.pkt(POD, C, R, 5001)
    (f,) = run(w.events, only=["conntrack-invalid"])
    assert [e.frame for e in f.evidence] == [1, 7] and f.details["trigger_seen"] is False


def test_a_sockets_own_abort_carries_ack_and_is_not_this_class():
    w = live_wire()
    w.pkt(POD, C, R | A, 5001, 5001)
    assert run(w.events, only=["conntrack-invalid"]) == []


def test_late_data_after_the_pods_fin_is_not_this_class():
    """A socket the pod closed (its FIN first) answers later data with RST without ACK too: stale-keepalive's
    downstream case, not a segment that missed the REDIRECT."""
    w = live_wire()
    w.pkt(POD, C, F | A, 5001, 5001)
    w.pkt(C, POD, P | A, 5001, 5002, payload_len=100)
    w.pkt(POD, C, R, 5002)
    assert run(w.events, only=["conntrack-invalid"]) == []


def test_lo_and_an_uncaptured_port_are_not_this_class():
    w = live_wire()
    w.pkt(POD, C, R, 5001)
    lo = Wire(iface="lo")
    lo.events = [type(ev)(**{**{s: getattr(ev, s) for s in ev.__slots__}, "iface": "lo"}) for ev in w.events]
    assert run(lo.events, only=["conntrack-invalid"]) == []
    p = Pipeline.with_detectors(only=["conntrack-invalid"])
    p.context(RedirectMapEvent(0.0, RedirectMap(excluded=frozenset({5000}))))
    for ev in w.events:
        p.feed(ev)
    assert p.finish() == []


def test_a_plaintext_upload_reset_without_ack_is_not_an_mtls_only_port():
    """The lab's plain-client round: a plaintext POST, then the app port's RST without ACK. tls-mismatch took it for
    a STRICT listener closing the request unread, whose RST (real Envoy 1.40) carries ACK."""
    w = Wire()
    w.handshake(C, POD, cseq=1000, sseq=5000)
    w.pkt(C, POD, P | A, 1001, 5001, http=b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n")
    w.pkt(POD, C, A, 5001, 1101)
    w.pkt(POD, C, R, 5001)
    assert [f.detector for f in run(w.events)] == ["conntrack-invalid"]
    w.events[-1] = type(w.events[-1])(**{**{s: getattr(w.events[-1], s) for s in w.events[-1].__slots__},
                                         "flags": R | A})
    assert [f.detector for f in run(w.events)] == ["tls-mismatch"]


def test_one_finding_a_connection():
    w = live_wire()
    w.pkt(POD, C, R, 5001)
    w.pkt(POD, C, R, 5001)
    assert len(run(w.events, only=["conntrack-invalid"])) == 1
