import pytest

from kubectl_meshdoctor.core.findings import Severity

from ..helpers import A, R, S, Wire, run

SIDECAR, APP = "127.0.0.6:41234", "198.18.3.2:5000"


def test_syn_answered_by_rst_on_lo_is_uf():
    w = Wire(iface="lo")
    w.pkt(SIDECAR, APP, S, 100)
    w.pkt(APP, SIDECAR, R | A, 0, 101)
    (f,) = run(w.events, only=["upstream-refused"])
    assert f.severity is Severity.ERROR and f.envoy_flags == ("UF",)
    assert (f.flow.client, f.flow.server, f.flow.iface) == (SIDECAR, APP, "lo")
    assert [e.frame for e in f.evidence] == [1, 2]
    assert "containerPort: 5000" in f.remediation


def test_accepted_connection_and_eth0_resets_are_not_refusals():
    w = Wire(iface="lo")
    w.handshake(SIDECAR, APP)
    w.pkt(APP, SIDECAR, R | A, 5001, 1001)  # a reset later in the life of a connection
    assert run(w.events, only=["upstream-refused"]) == []
    e = Wire(iface="eth0")
    e.pkt("198.18.3.1:40000", "198.18.3.2:15021", S, 1)
    e.pkt("198.18.3.2:15021", "198.18.3.1:40000", R | A, 0, 2)
    assert run(e.events, only=["upstream-refused"]) == []


@pytest.mark.parametrize("listening, restarts, cause, words", [
    ({("127.0.0.1", 5000)}, 0, "bound-to-localhost", "127.0.0.1 only"),
    ({("0.0.0.0", 5002)}, 0, "not-listening", "no socket listening on port 5000"),
    ({("0.0.0.0", 5002)}, 4, "restarting", "restarted 4 time(s)"),
    ({("0.0.0.0", 5000)}, 0, "listening-now", "was not listening at that moment"),
    (None, 0, "unknown", "Typical causes"),
])
def test_the_pod_s_listening_sockets_and_restarts_name_the_cause(listening, restarts, cause, words):
    from kubectl_meshdoctor.core.events import ListenersEvent, PodEvent
    from kubectl_meshdoctor.core.pipeline import Pipeline

    p = Pipeline.with_detectors(only=["upstream-refused"])
    p.context(PodEvent(0.0, "web", restarts))
    if listening is not None:
        p.context(ListenersEvent(0.0, frozenset(listening)))
    w = Wire(iface="lo")
    w.pkt(SIDECAR, APP, S, 100)
    w.pkt(APP, SIDECAR, R | A, 0, 101)
    for ev in w.events:
        p.feed(ev)
    (f,) = p.finish()
    assert f.details["cause"] == cause and words in f.explanation
    # A capture alone cannot tell the cause: every fix; otherwise the cause's own.
    expected = {"bound-to-localhost": ["bind-all", "sidecar-localhost"],
                "unknown": ["app-listens", "bind-all", "sidecar-localhost"]}.get(cause, ["app-listens"])
    assert [fix.name for fix in f.fixes] == expected
    assert ("defaultEndpoint: 127.0.0.1:5000" in f.remediation) == ("sidecar-localhost" in expected)
