from kubectl_meshdoctor.core.events import RedirectMap, RedirectMapEvent
from kubectl_meshdoctor.core.findings import Severity
from kubectl_meshdoctor.core.pipeline import Pipeline

from ..helpers import A, P, R, S, Wire, run

C, P5000, P5002 = "198.18.0.1:40001", "198.18.0.2:5000", "198.18.0.2:5002"


def collision_wire() -> Wire:
    w = Wire()
    w.handshake(C, P5000, cseq=1000, sseq=5000)
    w.pkt(C, P5000, P | A, 1001, 5001, payload_len=10)
    w.pkt(P5000, C, A, 5001, 1011)
    w.pkt(C, P5002, S, 9000)  # frame 6
    w.pkt(P5002, C, A, 5001, 1011)  # frame 7: challenge ACK carries the other connection's numbers
    w.pkt(C, P5002, R, 1011)
    w.pkt(C, P5002, S, 9000, dt=1.0)
    w.pkt(P5002, C, S | A, 7000, 9001)
    return w


def test_challenge_ack_is_an_error_naming_both_frames_and_the_live_connection():
    findings = run(collision_wire().events, only=["tuple-collision"])
    assert len(findings) == 1
    f = findings[0]
    assert f.severity is Severity.ERROR
    assert (f.flow.client, f.flow.server, f.flow.iface) == (C, P5002, "eth0")
    assert [(e.frame, e.what.split(" (")[0].split(",")[0]) for e in f.evidence[:3]] == [
        (6, "SYN"), (7, "challenge ACK"), (8, "client's RST")]  # issue 32, item 5: the RST the explanation rests on
    assert f.evidence[3].frame == 1 and "198.18.0.2:5000" in f.evidence[3].what
    assert f.evidence[3].ts == collision_wire().events[0].ts
    assert set(f.envoy_flags) == {"UC", "UF", "URX"}  # the live connection dies (UC); a failed connect: UF/URX
    assert "RFC 5961" in f.explanation and "within milliseconds" in f.explanation
    assert 'excludeInboundPorts: "5002"' in f.remediation


def test_a_challenge_ack_whose_rst_was_not_captured_is_still_reported_once():
    """The RST is waited for, not required: a capture that lost it ends with the finding all the same, from the
    retransmitted SYN's SYN-ACK, the tick after RST_WAIT_S, or the end of input."""
    from kubectl_meshdoctor_plugins.tuple_collision import RST_WAIT_S

    full = collision_wire().events
    no_rst = [e for e in full if not (e.is_rst and e.frame == 8)]
    for events in (no_rst, no_rst[:-1], no_rst[:-2]):  # SYN-ACK ends it; a later packet's tick; finish()
        (f,) = run(events, only=["tuple-collision"])
        assert [e.frame for e in f.evidence[:3]] == [6, 7, 1] and f.severity is Severity.ERROR


def test_syn_timeout_leaves_the_collision_to_tuple_collision():
    assert run(collision_wire().events, only=["syn-timeout"]) == []


def test_exposure_without_failure_is_a_warning():
    w = Wire()
    w.handshake(C, P5000)
    w.handshake(C, P5002, cseq=9000, sseq=7000)  # the NAT remapped inside the pod: SYN-ACK, no failure
    findings = run(w.events, only=["tuple-collision"])
    assert [f.severity for f in findings] == [Severity.WARNING]
    assert findings[0].flow.server == P5002
    # Nothing failed: the warning explains no response flag, and names no Envoy details.
    assert findings[0].envoy_flags == () and findings[0].response_code_details == ""


def test_closed_first_connection_is_no_collision():
    w = Wire()
    w.handshake(C, P5000)
    w.pkt(C, P5000, R, 1001)
    w.handshake(C, P5002, cseq=9000, sseq=7000)
    assert run(w.events, only=["tuple-collision"]) == []


def test_excluded_port_is_not_folded_by_redirect():
    w = Wire()
    w.handshake(C, P5000)
    w.pkt(C, "198.18.0.2:15021", S, 9000)
    w.pkt("198.18.0.2:15021", C, A, 1, 1)
    assert run(w.events, only=["tuple-collision"]) == []


def test_annotation_excluded_port_stops_the_finding():
    from kubectl_meshdoctor.istio.redirect import redirect_map_from_annotations

    p = Pipeline.with_detectors(only=["tuple-collision"])
    p.context(RedirectMapEvent(0.0, redirect_map_from_annotations(
        {"traffic.sidecar.istio.io/excludeInboundPorts": "5002"})))
    for ev in collision_wire().events:
        p.feed(ev)
    assert p.finish() == []


def test_dropped_syn_with_a_live_peer_is_an_error():
    w = Wire()
    w.handshake(C, P5000)
    w.pkt(C, P5002, S, 9000)
    w.pkt(C, P5002, S, 9000, dt=1.0)
    findings = run(w.events)
    assert [(f.detector, f.severity) for f in findings] == [("tuple-collision", Severity.ERROR)]
    assert [e.frame for e in findings[0].evidence[:2]] == [4, 5]


def test_ipv6_collision():
    c6, s6a, s6b = "[fd00::1]:40001", "[fd00::2]:5000", "[fd00::2]:5002"
    w = Wire()
    w.handshake(c6, s6a)
    w.pkt(c6, s6b, S, 9000)
    w.pkt(s6b, c6, A, 5001, 1001)
    findings = run(w.events, only=["tuple-collision"])
    assert len(findings) == 1 and findings[0].flow.client == "[fd00::1]:40001"


def test_redirect_map_default_matches_istio():
    m = RedirectMap()
    assert m.listener_for(5000) == 15006 and m.listener_for(15020) is None


def test_loopback_upstream_port_reuse_is_not_a_collision():
    w = Wire(iface="lo")
    w.handshake("127.0.0.6:40001", P5000)
    w.pkt("127.0.0.6:40001", P5002, S, 9000)
    w.pkt(P5002, "127.0.0.6:40001", A, 5001, 1001)
    assert run(w.events, only=["tuple-collision"]) == []
