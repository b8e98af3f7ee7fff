from kubectl_meshdoctor.findings import Severity

from ..helpers import A, S, Wire, run

C, SRV = "198.18.0.1:41000", "198.18.0.2:5000"


def test_retransmitted_syn_without_answer_warns_then_errors_after_three():
    w = Wire()
    w.pkt(C, SRV, S, 1)
    for dt in (1.0, 2.0, 4.0):
        w.pkt(C, SRV, S, 1, dt=dt)
    findings = run(w.events, only=["syn-timeout"])
    assert [f.severity for f in findings] == [Severity.WARNING, Severity.ERROR]
    assert findings[1].details["retransmits"] == 3
    assert [e.frame for e in findings[1].evidence] == [1, 4]
    assert findings[1].details["waited_s"] == 7.0


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
