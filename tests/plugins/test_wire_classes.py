"""The log-visible classes that the wire shows too, found from packets alone on eth0: Envoy's own 504 (UT), a
caller that closes before its response (DC), and the requests the sidecar's codec refuses (DPE)."""

from __future__ import annotations

import pytest

from ..helpers import A, F, P, Wire, run

CALLER, POD = "198.18.6.1:40500", "198.18.6.2:5000"
ENVOY_504 = (b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 24\r\ncontent-type: text/plain\r\n"
             b"date: Tue, 01 Dec 2026 10:54:35 GMT\r\nserver: istio-envoy\r\n\r\n")
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


def test_the_app_s_own_504_is_not_a_route_timeout():
    assert run(exchange(GET, APP_504, 1.0).events, only=["upstream-timeout"]) == []


def test_a_caller_that_closes_before_its_response_is_a_downstream_disconnect():
    (f,) = run(exchange(GET, None, 0.4, close_first=True).events, only=["downstream-disconnect"])
    assert f.envoy_flags == ("DC",) and [e.frame for e in f.evidence] == [4, 5] and "400 ms" in f.title


def test_a_caller_that_closes_after_its_response_is_healthy():
    w = exchange(GET, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", 0.1)
    w.pkt(CALLER, POD, F | A, 1001 + len(GET), 5100, dt=0.1)
    assert run(w.events, only=["downstream-disconnect", "upstream-timeout", "downstream-protocol-error"]) == []


@pytest.mark.parametrize("request_bytes, response, kind", [
    (b"GET /http10 HTTP/1.0\r\nHost: lab\r\n\r\n", b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 16\r\n\r\n",
     "http10"),
    (b"GET /u HTTP/1.1\r\nHost: lab\r\nConnection: Upgrade\r\nUpgrade: meshdoctor-lab/1\r\n\r\n",
     b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n", "upgrade"),
    (b"GET /m HTTP/1.1\r\nHost: lab\r\nBad Header: space\r\n\r\n",
     b"HTTP/1.1 400 Bad Request\r\ncontent-length: 11\r\nconnection: close\r\n\r\n", "codec"),
])
def test_requests_the_sidecar_refuses_are_named_from_the_wire(request_bytes, response, kind):
    (f,) = run(exchange(request_bytes, response, 0.001).events, only=["downstream-protocol-error"])
    assert f.details["kind"] == kind and [e.frame for e in f.evidence] == [4, 5]
    assert f.envoy_flags == (() if kind == "upgrade" else ("DPE",))


def test_an_app_s_own_403_or_400_to_an_ordinary_request_is_not_a_protocol_error():
    for status in (b"403 Forbidden", b"400 Bad Request"):
        w = exchange(GET, b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n", 0.01)
        assert run(w.events, only=["downstream-protocol-error"]) == []
