from kubectl_meshdoctor.core.findings import Severity

from ..helpers import A, S, Wire, run

C, SRV = "198.18.0.1:41000", "198.18.0.2:5000"


def test_three_unanswered_retransmissions_are_one_error_at_the_end():
    w = Wire()
    w.pkt(C, SRV, S, 1)
    for dt in (1.0, 2.0, 4.0):
        w.pkt(C, SRV, S, 1, dt=dt)
    (f,) = run(w.events, only=["syn-timeout"])
    assert f.severity is Severity.ERROR and f.details["retransmits"] == 3 and not f.details["answered"]
    assert [e.frame for e in f.evidence] == [1, 4]
    assert f.details["waited_s"] == 7.0


def test_late_answer_concludes_with_the_syn_ack_as_evidence():
    w = Wire()
    w.pkt(C, SRV, S, 1)
    for dt in (1.0, 1.0, 1.0):
        w.pkt(C, SRV, S, 1, dt=dt)
    w.pkt(SRV, C, S | A, 10, 2, dt=0.01)
    (f,) = run(w.events, only=["syn-timeout"])
    assert f.severity is Severity.ERROR and f.details["answered"]
    assert [e.frame for e in f.evidence] == [1, 4, 5]


def test_silence_after_retransmissions_concludes_live_without_waiting_for_the_end():
    from kubectl_meshdoctor.core.pipeline import Pipeline

    w = Wire()
    w.pkt(C, SRV, S, 1)
    w.pkt(C, SRV, S, 1, dt=1.0)
    w.pkt("198.18.0.9:1", "198.18.0.2:80", A, 1, 1, dt=11.0)  # other traffic moves packet time on
    p = Pipeline.with_detectors(only=["syn-timeout"])
    for ev in w.events:
        p.feed(ev)
    assert [f.severity for f in p.findings] == [Severity.WARNING]
    assert p.finish() == p.findings and len(p.findings) == 1


def test_syn_retransmitted_once_then_answered_is_no_error():
    w = Wire()
    w.pkt(C, SRV, S, 1)
    w.pkt(C, SRV, S, 1, dt=1.0)
    w.pkt(SRV, C, S | A, 10, 2)
    findings = run(w.events, only=["syn-timeout"])
    assert all(f.severity is not Severity.ERROR for f in findings)


def test_answered_syn_is_silent():
    w = Wire()
    w.handshake(C, SRV)
    assert run(w.events, only=["syn-timeout"]) == []


def test_new_syn_with_new_seq_is_not_a_retransmission():
    w = Wire()
    w.pkt(C, SRV, S, 1)
    w.pkt(C, SRV, S, 99, dt=1.0)
    assert run(w.events, only=["syn-timeout"]) == []


# On lo an outbound SYN shows its REDIRECTed destination and its answer the original one (conntrack restores it).
APP, OUTBOUND, ORIGINAL = "198.18.0.1:41021", "127.0.0.1:15001", "198.18.0.2:5000"


def test_syn_resent_at_once_was_answered_and_is_never_called_dropped():
    w = Wire(iface="lo")
    w.pkt(APP, OUTBOUND, S, 1)
    w.pkt(APP, OUTBOUND, S, 1, dt=0.011)  # the kernel rejected an answer this capture lacks
    for _ in range(4):
        w.pkt(APP, OUTBOUND, S, 1, dt=1.02)
    (f,) = run(w.events, only=["syn-timeout"])
    assert f.variant == "SYN answered, answer not captured" and f.details["answered"]
    assert f.severity is Severity.ERROR and f.details["retransmits"] == 4
    assert "not dropped" in f.explanation and "--full-capture" in f.explanation
    assert "Something between" not in f.explanation and not f.envoy_flags


def test_an_old_connections_ack_on_lo_answers_the_redirected_syn():
    w = Wire(iface="lo")
    w.pkt(APP, OUTBOUND, S, 1)
    for _ in range(4):
        w.pkt(ORIGINAL, APP, A, 900, 61)  # FIN-WAIT-2 socket's ACK, de-NATed source
        w.pkt(APP, OUTBOUND, S, 1, dt=1.02)
    assert run(w.events, only=["syn-timeout"]) == []


def test_a_syn_ack_from_the_original_destination_ends_the_attempt_on_lo():
    w = Wire(iface="lo")
    w.pkt(APP, OUTBOUND, S, 1)
    w.pkt(APP, OUTBOUND, S, 1, dt=1.0)
    w.pkt(ORIGINAL, APP, S | A, 10, 2)
    (f,) = run(w.events, only=["syn-timeout"])
    assert f.details["answered"] and f.variant == "SYN retransmitted, no answer"
    assert [e.frame for e in f.evidence] == [1, 2, 3]
