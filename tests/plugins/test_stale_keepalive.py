import pytest

from kubectl_meshdoctor.core.findings import Severity

from ..helpers import A, F, P, R, Wire, run

SIDECAR, APP = "127.0.0.6:45000", "198.18.4.2:5000"


def pooled(w: Wire, client: str = SIDECAR, server: str = APP) -> None:
    """A connection that served one request and now sits idle in a pool: frames 1-6."""
    w.handshake(client, server)
    w.pkt(client, server, P | A, 1001, 5001, payload_len=80)
    w.pkt(server, client, P | A, 5001, 1081, payload_len=120)
    w.pkt(client, server, A, 1081, 5121)


def test_request_after_the_apps_fin_answered_by_rst_is_uc():
    w = Wire(iface="lo")
    pooled(w)
    w.pkt(APP, SIDECAR, F | A, 5121, 1081, dt=0.5)  # frame 7: idle close
    w.pkt(SIDECAR, APP, A, 1081, 5122)
    w.pkt(SIDECAR, APP, P | A, 1081, 5122, payload_len=80, dt=0.5)  # frame 9: reuse of the pooled connection
    w.pkt(APP, SIDECAR, R, 5122, 0)  # frame 10
    (f,) = run(w.events, only=["stale-keepalive"])
    assert f.severity is Severity.ERROR and f.envoy_flags == ("UC",)
    assert [e.frame for e in f.evidence] == [7, 9, 10]
    assert (f.flow.client, f.flow.server) == (SIDECAR, APP)
    assert "idleTimeout" in f.remediation
    assert f.details["request_after_fin_ms"] > 0


def test_fin_and_request_in_the_same_millisecond_is_the_same_race():
    w = Wire(iface="lo")
    pooled(w)
    w.pkt(SIDECAR, APP, P | A, 1081, 5121, payload_len=80, dt=1.0)
    w.pkt(APP, SIDECAR, F | A, 5121, 1081, dt=0.0004)
    w.pkt(APP, SIDECAR, R, 5122, 0, dt=0.0001)
    (f,) = run(w.events, only=["stale-keepalive"])
    assert "before (crossing)" in f.evidence[1].what


def test_normal_fin_close_with_no_request_after_it_is_fine():
    w = Wire(iface="lo")
    pooled(w)
    w.pkt(APP, SIDECAR, F | A, 5121, 1081, dt=0.5)
    w.pkt(SIDECAR, APP, F | A, 1081, 5122)
    w.pkt(APP, SIDECAR, A, 5122, 1082)
    assert run(w.events, only=["stale-keepalive"]) == []


def test_reused_idle_connection_reset_with_no_fin_is_the_race_real_envoy_loses():
    """Real Envoy drops a pooled connection once it reads the app's FIN; what it loses is a request that lands
    after the app's idle timer fired but before its close(): unread data, so RST and never a FIN."""
    w = Wire(iface="lo")
    pooled(w)
    w.pkt(SIDECAR, APP, P | A, 1081, 5121, payload_len=80, dt=0.7)  # frame 7: reuse after 0.7 s idle
    w.pkt(APP, SIDECAR, A, 5121, 1161, dt=0.04)
    w.pkt(APP, SIDECAR, R | A, 5121, 1161, dt=0.15)  # frame 9
    (f,) = run(w.events, only=["stale-keepalive"])
    assert f.severity is Severity.ERROR and f.envoy_flags == ("UC",)
    assert [e.frame for e in f.evidence] == [5, 7, 9]  # the last response, the request, the RST
    assert "no FIN" in f.evidence[2].what and "never read" in f.explanation
    assert f.details["idle_before_reuse_s"] == pytest.approx(0.701)  # from the response (frame 5), not its ACK
    assert f.details["reset_after_request_ms"] == pytest.approx(190.0)


def test_a_late_reset_is_an_app_that_read_the_request_and_aborted_not_this_race():
    """The race's RST follows the app's idle timer closely; one a second after the request is an app that read
    it, worked on it and then reset the connection (SO_LINGER 0)."""
    w = Wire(iface="lo")
    pooled(w)
    w.pkt(SIDECAR, APP, P | A, 1081, 5121, payload_len=80, dt=0.7)
    w.pkt(APP, SIDECAR, A, 5121, 1161, dt=0.04)
    w.pkt(APP, SIDECAR, R | A, 5121, 1161, dt=1.0)
    assert run(w.events, only=["stale-keepalive"]) == []


def test_reset_of_the_first_request_on_a_connection_is_not_this_race():
    w = Wire(iface="lo")
    w.handshake(SIDECAR, APP)
    w.pkt(SIDECAR, APP, P | A, 1001, 5001, payload_len=80, dt=1.0)
    w.pkt(APP, SIDECAR, R, 5001, 0)
    assert run(w.events, only=["stale-keepalive"]) == []


def test_reset_of_a_busy_connection_is_not_this_race():
    """A request right behind the last response found the connection busy, not idle in the pool."""
    w = Wire(iface="lo")
    pooled(w)
    w.pkt(SIDECAR, APP, P | A, 1081, 5121, payload_len=80, dt=0.001)
    w.pkt(APP, SIDECAR, R, 5121, 0)
    assert run(w.events, only=["stale-keepalive"]) == []


def test_out_of_order_interfaces_do_not_mix():
    """eth0 packets interleaved between the lo frames (two capture streams) change nothing."""
    w = Wire(iface="lo")
    e = Wire(iface="eth0")
    pooled(w)
    w.pkt(APP, SIDECAR, F | A, 5121, 1081, dt=0.5)
    e.pkt("198.18.4.1:39000", "198.18.4.2:5000", P | A, 1, 1, payload_len=80)
    w.pkt(SIDECAR, APP, P | A, 1081, 5122, payload_len=80, dt=0.5)
    w.pkt(APP, SIDECAR, R, 5122, 0)
    merged = w.events[:7] + e.events + w.events[7:]
    (f,) = run(merged, only=["stale-keepalive"])
    assert f.flow.iface == "lo"


CALLER, POD = "198.18.4.1:40222", "198.18.4.2:5000"  # the downstream hop, on eth0


def downstream_pooled(w: Wire) -> None:
    pooled(w, CALLER, POD)


def test_caller_reusing_a_connection_this_pod_s_sidecar_closed_is_the_downstream_race():
    w = Wire(iface="eth0")
    downstream_pooled(w)
    w.pkt(POD, CALLER, F | A, 5121, 1081, dt=0.5)  # frame 7: the sidecar's idle timeout
    w.pkt(CALLER, POD, A, 1081, 5122)
    w.pkt(CALLER, POD, P | A, 1081, 5122, payload_len=80, dt=0.3)  # frame 9: the caller's next request on it
    w.pkt(POD, CALLER, R, 5122, 0)  # frame 10
    (f,) = run(w.events, only=["stale-keepalive"])
    assert (f.flow.client, f.flow.server, f.flow.iface) == (CALLER, POD, "eth0")
    assert [e.frame for e in f.evidence] == [7, 9, 10] and f.envoy_flags == ("UC",)
    assert f.details["hop"] == "downstream" and "this pod's sidecar" in f.evidence[0].what
    assert "caller's" in f.remediation and "DestinationRule" in f.remediation


@pytest.mark.parametrize("close", ["caller first", "sidecar first, caller closes too"])
def test_a_downstream_connection_closed_by_either_side_without_reuse_is_healthy(close):
    w = Wire(iface="eth0")
    downstream_pooled(w)
    first, second = (CALLER, POD) if close == "caller first" else (POD, CALLER)
    w.pkt(first, second, F | A, 1081 if first == CALLER else 5121, 5121 if first == CALLER else 1081, dt=0.5)
    w.pkt(second, first, F | A, 5121 if first == CALLER else 1081, 1082 if first == CALLER else 5122)
    w.pkt(first, second, A, 1082 if first == CALLER else 5122, 5122 if first == CALLER else 1082)
    assert run(w.events, only=["stale-keepalive"]) == []


@pytest.mark.parametrize("request_at", ["after the FIN", "crossing the FIN"])
def test_a_sidecar_closing_a_connection_it_just_accepted_is_not_a_keepalive_race(request_at):
    """On a TCP port the sidecar FINs right after accepting when its own upstream connect fails (127.0.0.6 port
    exhaustion, nothing listening): no request was served and no idle spell came before the FIN, so the caller's
    bytes meeting the RST are that other hop's failure, not an idle close the caller raced."""
    w = Wire(iface="eth0")
    w.handshake(CALLER, POD)
    if request_at == "crossing the FIN":
        w.pkt(CALLER, POD, P | A, 1001, 5001, payload_len=80, dt=0.001)
        w.pkt(POD, CALLER, F | A, 5001, 1081, dt=0.002)
        w.pkt(CALLER, POD, P | A, 1081, 5002, payload_len=40, dt=0.001)
        w.pkt(POD, CALLER, R, 5002, 0)
    else:
        w.pkt(POD, CALLER, F | A, 5001, 1001, dt=0.002)  # the connect upstream failed at once
        w.pkt(CALLER, POD, A, 1001, 5002)
        w.pkt(CALLER, POD, P | A, 1001, 5002, payload_len=80, dt=0.01)
        w.pkt(POD, CALLER, R, 5002, 0)
    assert run(w.events, only=["stale-keepalive"]) == []


def test_a_served_connection_closed_without_a_quiet_spell_is_not_an_idle_close():
    """The sidecar FINs right after its response (a `connection: close` drain, a failed next hop): not idle."""
    w = Wire(iface="eth0")
    downstream_pooled(w)
    w.pkt(POD, CALLER, F | A, 5121, 1081, dt=0.001)
    w.pkt(CALLER, POD, P | A, 1081, 5122, payload_len=80, dt=0.001)
    w.pkt(POD, CALLER, R, 5122, 0)
    assert run(w.events, only=["stale-keepalive"]) == []


def test_a_tls_alert_after_a_plaintext_apps_fin_is_no_request_on_a_stale_connection():
    """A DestinationRule's ISTIO_MUTUAL to an app without a sidecar, on lo (the lab's tls-to-plaintext): the
    sidecar's ClientHello is answered by the app's plaintext 400 and FIN, the sidecar's TLS alert then meets the
    app's RST. Found by the lab's CI run once TLS records were kept: that is tls-mismatch's, not a keep-alive race."""
    hello = bytes.fromhex("16030100") + bytes([40]) + bytes.fromhex("01000024") + bytes(36)
    alert = bytes.fromhex("150303000202") + bytes([70])
    w = Wire(iface="lo")
    w.handshake(SIDECAR, APP)
    w.pkt(SIDECAR, APP, P | A, 1001, 5001, tls=hello)
    w.pkt(APP, SIDECAR, P | A, 5001, 1046, http=b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
    w.pkt(APP, SIDECAR, F | A, 5051, 1046, dt=0.0001)
    w.pkt(SIDECAR, APP, P | A, 1046, 5052, tls=alert, dt=0.0001)
    w.pkt(APP, SIDECAR, R, 5052, 0)
    assert w.events[3].tls is not None and w.events[6].tls is not None and w.events[6].tls.alert is not None
    assert run(w.events, only=["stale-keepalive"]) == []
