"""The log-visible classes that the wire shows too, found from packets alone on eth0: Envoy's own 504 (UT), a
caller that closes before its response (DC), and the requests the sidecar's codec refuses (DPE)."""

from __future__ import annotations

import pytest

from ..helpers import A, F, P, R, Wire, run

CALLER, POD = "198.18.6.1:40500", "198.18.6.2:5000"
ENVOY_504 = (b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 24\r\ncontent-type: text/plain\r\n"
             b"date: Tue, 01 Dec 2026 10:54:35 GMT\r\nserver: istio-envoy\r\n\r\n")  # the lab's Envoy 1.40
NGINX_504 = (b"HTTP/1.1 504 Gateway Time-out\r\nServer: nginx\r\nContent-Type: text/html\r\n"
             b"Content-Length: 167\r\n\r\n")
APP_504 = (b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 2\r\nx-envoy-upstream-service-time: 3\r\n"
           b"server: istio-envoy\r\n\r\n")
GET = b"GET /slow/3 HTTP/1.1\r\nHost: lab\r\n\r\n"


def exchange(request: bytes, response: bytes | None, after_s: float, close_first: bool = False) -> Wire:
    w = Wire(iface="eth0")
    w.handshake(CALLER, POD)
    w.pkt(CALLER, POD, P | A, 1001, 5001, http=request)  # frame 4
    if close_first:
        w.pkt(CALLER, POD, F | A, 1001 + len(request), 5001, dt=after_s)  # frame 5
    if response is not None:
        w.pkt(POD, CALLER, P | A, 5001, 1001 + len(request), dt=after_s, http=response)
    return w


def test_envoy_s_own_504_is_the_route_timeout():
    (f,) = run(exchange(GET, ENVOY_504, 1.0).events, only=["upstream-timeout"])
    assert f.envoy_flags == ("UT",) and [e.frame for e in f.evidence] == [4, 5]
    assert (f.flow.client, f.flow.server, f.flow.iface) == (CALLER, POD, "eth0")
    assert "1000 ms" in f.title and "GET /slow/3" in f.title and "timeout: 2s" in f.remediation


@pytest.mark.parametrize("response", [APP_504, NGINX_504], ids=["the app's, through Envoy", "another server's"])
def test_a_504_envoy_did_not_make_is_not_a_route_timeout(response):
    assert run(exchange(GET, response, 1.0).events, only=["upstream-timeout"]) == []


def test_a_caller_that_closes_before_its_response_is_a_downstream_disconnect():
    (f,) = run(exchange(GET, None, 0.4, close_first=True).events, only=["downstream-disconnect"])
    assert f.envoy_flags == ("DC",) and [e.frame for e in f.evidence] == [4, 5] and "400 ms" in f.title


def test_a_caller_whose_fin_answers_the_pod_s_close_did_not_give_up():
    """The pod closed first with the request unanswered (a sidecar's exit: real Envoy 1.40 in
    tests/data/lab-shutdown-plain, its FIN then the caller's): not the caller's disconnect."""
    w = Wire(iface="eth0")
    w.handshake(CALLER, POD)
    w.pkt(CALLER, POD, P | A, 1001, 5001, http=GET)
    w.pkt(POD, CALLER, F | A, 5001, 1001 + len(GET), dt=1.4)
    w.pkt(CALLER, POD, F | A, 1001 + len(GET), 5002, dt=0.0002)
    assert run(w.events, only=["downstream-disconnect"]) == []


def test_a_caller_that_closes_after_its_response_is_healthy():
    w = exchange(GET, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", 0.1)
    w.pkt(CALLER, POD, F | A, 1001 + len(GET), 5100, dt=0.1)
    assert run(w.events, only=["downstream-disconnect", "upstream-timeout", "downstream-protocol-error"]) == []


# Envoy 1.40's own answers, as the lab's http10 pod gets them.
ENVOY_426 = (b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 16\r\ncontent-type: text/plain\r\n"
             b"date: Tue, 01 Dec 2026 11:29:09 GMT\r\nserver: istio-envoy\r\nconnection: close\r\n\r\n")
ENVOY_403 = (b"HTTP/1.1 403 Forbidden\r\ndate: Tue, 01 Dec 2026 11:29:09 GMT\r\nserver: istio-envoy\r\n"
             b"connection: close\r\ncontent-length: 0\r\n\r\n")
ENVOY_400 = (b"HTTP/1.1 400 Bad Request\r\ncontent-length: 11\r\ncontent-type: text/plain\r\n"
             b"date: Tue, 01 Dec 2026 11:29:09 GMT\r\nserver: istio-envoy\r\nconnection: close\r\n\r\n")
UPGRADE = b"GET /u HTTP/1.1\r\nHost: lab\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"


@pytest.mark.parametrize("request_bytes, response, kind", [
    (b"GET /http10 HTTP/1.0\r\nHost: lab\r\n\r\n", ENVOY_426, "http10"),
    (UPGRADE, ENVOY_403, "upgrade"),
    (b"GET /m HTTP/1.1\r\nHost: lab\r\nBad Header: space\r\n\r\n", ENVOY_400, "codec"),
])
def test_requests_the_sidecar_refuses_are_named_from_the_wire(request_bytes, response, kind):
    (f,) = run(exchange(request_bytes, response, 0.001).events, only=["downstream-protocol-error"])
    assert f.details["kind"] == kind and [e.frame for e in f.evidence] == [4, 5]
    assert f.envoy_flags == (() if kind == "upgrade" else ("DPE",))


def test_an_app_s_own_403_or_400_to_an_ordinary_request_is_not_a_protocol_error():
    for status in (b"403 Forbidden", b"400 Bad Request"):
        w = exchange(GET, b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n", 0.01)
        assert run(w.events, only=["downstream-protocol-error"]) == []


@pytest.mark.parametrize("response", [
    b"HTTP/1.1 403 Forbidden\r\ncontent-length: 9\r\nx-envoy-upstream-service-time: 2\r\nserver: istio-envoy\r\n\r\n",
    b"HTTP/1.1 403 Forbidden\r\ncontent-length: 19\r\ncontent-type: text/plain\r\nserver: istio-envoy\r\n\r\n",
], ids=["the app refuses the WebSocket", "an AuthorizationPolicy denies it (RBAC: access denied)"])
def test_a_403_to_an_upgrade_that_envoy_did_not_refuse_is_not_a_protocol_error(response):
    assert run(exchange(UPGRADE, response, 0.01).events, only=["downstream-protocol-error"]) == []


def test_a_caller_that_half_closes_right_after_its_request_is_told_so_and_given_no_timeout():
    (f,) = run(exchange(GET, None, 0.001, close_first=True).events, only=["downstream-disconnect"])
    assert "half-close" in f.explanation and "shutdown(SHUT_WR)" in f.remediation
    assert [x.name for x in f.fixes] == ["caller-no-half-close"] and "timeout:" not in f.remediation


def test_a_request_and_its_fin_in_one_segment_is_a_half_close():
    """A corked or coalesced send puts the caller's FIN on its request's own segment (seen in the lab)."""
    w = Wire(iface="eth0")
    w.handshake(CALLER, POD)
    w.pkt(CALLER, POD, F | P | A, 1001, 5001, http=GET)  # frame 4
    (f,) = run(w.events, only=["downstream-disconnect"])
    assert [e.frame for e in f.evidence] == [4] and "in the same segment" in f.evidence[0].what
    assert [x.name for x in f.fixes] == ["caller-no-half-close"] and "half-closed its connection" in f.title
    assert f.variant == "caller half-closed after its request"


def requested() -> Wire:
    """A caller's connection on eth0 with its GET sent (frame 4), waiting for an answer."""
    w = Wire(iface="eth0")
    w.handshake(CALLER, POD)
    w.pkt(CALLER, POD, P | A, 1001, 5001, http=GET)
    return w


def test_an_rst_soon_after_the_request_is_an_abort_not_a_half_close():
    w = requested()
    w.pkt(CALLER, POD, R | A, 1001 + len(GET), 5001, dt=0.01)
    (f,) = run(w.events, only=["downstream-disconnect"])
    assert [x.name for x in f.fixes] == ["caller-timeout"] and "gave up" in f.title


def test_a_fin_on_the_body_s_last_segment_is_a_half_close_however_long_the_upload_took():
    w = requested()
    w.pkt(CALLER, POD, F | P | A, 1001 + len(GET) + 5000, 5001, dt=1.0, payload_len=100)
    (f,) = run(w.events, only=["downstream-disconnect"])
    assert [x.name for x in f.fixes] == ["caller-no-half-close"] and "half-closed" in f.title


def test_a_100_continue_is_not_the_answer():
    w = requested()
    w.pkt(POD, CALLER, P | A, 5001, 1001 + len(GET), dt=0.01, http=b"HTTP/1.1 100 Continue\r\n\r\n")
    w.pkt(CALLER, POD, F | A, 1001 + len(GET), 5001 + 25, dt=0.5)
    (f,) = run(w.events, only=["downstream-disconnect"])
    assert "gave up" in f.title and "510 ms" in f.title  # from the request, not from the 100 Continue


def test_an_upload_closed_after_its_body_may_be_either_and_gets_both_fixes():
    """The body's segments are not read (only a request's first is), so the FIN's time after it is unknown."""
    w = requested()
    w.pkt(CALLER, POD, F | A, 1001 + len(GET) + 100000, 5001, dt=1.0)  # 100 kB more were sent before it
    (f,) = run(w.events, only=["downstream-disconnect"])
    assert [x.name for x in f.fixes] == ["caller-timeout", "caller-no-half-close"]
    assert "100000 bytes more" in f.explanation and "after 100000 bytes more" in f.title
    assert f.variant == "caller closed after its upload, before the answer"


def test_a_short_caller_timeout_gets_no_route_timeout_below_it():
    (f,) = run(exchange(GET, None, 0.4, close_first=True).events, only=["downstream-disconnect"])
    assert [x.name for x in f.fixes] == ["caller-timeout"]
    assert "VirtualService http.timeout" in f.remediation and "ms  # below the caller" not in f.remediation
    assert "cut ordinary requests short" in f.remediation
    (g,) = run(exchange(GET, None, 5.0, close_first=True).events, only=["downstream-disconnect"])
    assert "timeout: 4000ms" in g.remediation


def test_a_status_line_without_a_three_digit_code_is_no_answer():
    """`isdigit()` takes `²` for a digit, and int() then refused it: one such line ended the run."""
    for line in (b"HTTP/1.1 \xb2 Odd\r\n\r\n", b"HTTP/1.1 5040 Long\r\n\r\n", b"HTTP/1.1\r\n\r\n"):
        w = exchange(GET, line, 0.01)
        assert run(w.events, only=["downstream-protocol-error", "upstream-timeout"]) == []
