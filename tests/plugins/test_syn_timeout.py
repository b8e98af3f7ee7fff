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
