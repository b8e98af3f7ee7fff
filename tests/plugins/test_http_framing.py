import pytest

from kubectl_meshdoctor.core.events import HttpStart, PacketEvent, TcpFlags
from kubectl_meshdoctor.core.findings import Severity
from kubectl_meshdoctor.sources.http1 import parse_http_start
from kubectl_meshdoctor_plugins.http_framing import framing_violations

from ..helpers import A, P, Wire, run

SIDECAR, APP = "127.0.0.6:45000", "198.18.5.2:5000"


def response(head: str) -> HttpStart:
    msg = parse_http_start(head.encode("latin-1") + b"\r\n\r\n")
    assert msg is not None
    return msg


@pytest.mark.parametrize("head, needle", [
    ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: Chunked", "more than one Transfer-Encoding"),
    ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ntransfer-encoding: chunked", "more than one Transfer-Encoding"),
    ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5", "together with Content-Length"),
    ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6", "conflicting Content-Length"),
    ("HTTP/1.1 200 OK\r\nContent-Length: 5, 6", "conflicting Content-Length"),
    ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip", "chunked is not the final"),
    ("HTTP/1.1 200 OK\r\nX-Bad : 1\r\nContent-Length: 0", "invalid header name bytes"),
])
def test_rejected_framings(head, needle):
    problems = framing_violations(response(head))
    assert any(needle in p for p in problems), problems


@pytest.mark.parametrize("head", [
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked",
    "HTTP/1.1 200 OK\r\nContent-Length: 12",
    "HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Length: 12",
    "HTTP/1.1 204 No Content",
])
def test_valid_framings(head):
    assert framing_violations(response(head)) == []


def framed_wire(head: str, iface: str = "lo") -> Wire:
    w = Wire(iface=iface)
    w.handshake(SIDECAR, APP)
    w.pkt(SIDECAR, APP, P | A, 1001, 5001, payload_len=60)
    ev = w.pkt(APP, SIDECAR, P | A, 5001, 1061, payload_len=len(head) + 4)
    w.events[-1] = PacketEvent(ev.ts, ev.iface, ev.source, ev.frame, ev.src, ev.sport, ev.dst, ev.dport,
                               TcpFlags(ev.flags), ev.seq, ev.ack, ev.payload_len, response(head))
    return w


def test_duplicate_te_response_on_lo_is_upe_with_the_frame():
    w = framed_wire("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: Chunked")
    (f,) = run(w.events, only=["http-framing"])
    assert f.severity is Severity.ERROR and f.envoy_flags == ("UPE",)
    assert [e.frame for e in f.evidence] == [5]
    assert "Transfer-Encoding: chunked; Transfer-Encoding: Chunked" in f.evidence[0].what
    assert (f.flow.client, f.flow.server, f.flow.iface) == (SIDECAR, APP, "lo")
    assert "RFC 9112" in f.explanation


def test_sensitive_values_are_redacted_in_evidence():
    w = framed_wire("HTTP/1.1 200 OK\r\nSet-Cookie : session=s3cret\r\nContent-Length: 0")
    (f,) = run(w.events, only=["http-framing"])
    assert "s3cret" not in f.evidence[0].what and "<redacted>" in f.evidence[0].what


def test_requests_and_eth0_are_not_judged():
    assert run(framed_wire("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2", iface="eth0").events,
               only=["http-framing"]) == []


def test_no_redact_shows_the_value():
    from kubectl_meshdoctor.core.pipeline import Pipeline

    w = framed_wire("HTTP/1.1 200 OK\r\nSet-Cookie : session=s3cret\r\nContent-Length: 0")
    p = Pipeline.with_detectors(only=["http-framing"], redact=False)
    for ev in w.events:
        p.feed(ev)
    (f,) = p.finish()
    assert "s3cret" in f.evidence[0].what


def test_equal_header_lines_share_one_pair_but_credentials_and_long_lines_are_not_kept():
    """The parser reuses (name, value) pairs of repeated short lines; a credential or a long line is never
    held past its message by that cache."""
    from kubectl_meshdoctor.sources import http1

    one = parse_http_start(b"HTTP/1.1 200 OK\r\nServer: envoy\r\nContent-Length: 2\r\n\r\n")
    two = parse_http_start(b"HTTP/1.1 200 OK\r\nServer: envoy\r\nContent-Length: 2\r\n\r\n")
    assert one.headers == (("Server", "envoy"), ("Content-Length", "2")) and one.headers[0] is two.headers[0]
    before = len(http1._shared_field_line)
    msg = parse_http_start(b"GET / HTTP/1.1\r\nAuthorization: Bearer s3cret\r\nCookie: id=7\r\n"
                           b"X-Long: " + b"a" * 400 + b"\r\n\r\n")
    assert [n for n, _ in msg.headers] == ["Authorization", "Cookie", "X-Long"]
    assert len(http1._shared_field_line) == before


@pytest.mark.parametrize("head, rule, not_said", [
    ("HTTP/1.1 200 OK\r\nX-Bad : 1\r\nContent-Length: 0", "RFC 9112 section 5.1", "body length"),
    ("HTTP/1.1 200 OK\r\nX-Note: a\r\n  folded\r\nContent-Length: 0", "RFC 9112 section 5.2", "body length"),
    ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6", "body length is ambiguous", "section 5.1"),
])
def test_the_explanation_gives_the_rule_the_response_broke(head, rule, not_said):
    """Issue 32, item 6: an invalid header name is no ambiguous body length, and its evidence shows the name's
    bytes (the space before the colon) while its value is hidden."""
    (f,) = run(framed_wire(head).events, only=["http-framing"])
    assert rule in f.explanation and not_said not in f.explanation
    if "X-Bad" in head:
        assert "'X-Bad : <redacted>'" in f.evidence[0].what


def test_a_request_id_or_trace_context_line_is_parsed_but_not_kept():
    """Envoy's x-request-id and the propagated trace context are new in every request: the cache would only
    fill with them, so they are parsed like any line and never kept."""
    from kubectl_meshdoctor.sources import http1

    before = len(http1._shared_field_line)
    for i in range(3):
        msg = parse_http_start(f"GET / HTTP/1.1\r\nx-request-id: {i}-a\r\ntraceparent: 00-{i:032x}-{i:016x}-01\r\n"
                               f"x-b3-spanid: {i:016x}\r\n\r\n".encode())
        assert msg.headers == (("x-request-id", f"{i}-a"), ("traceparent", f"00-{i:032x}-{i:016x}-01"),
                               ("x-b3-spanid", f"{i:016x}"))
    assert len(http1._shared_field_line) == before
