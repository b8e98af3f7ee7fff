"""The sidecar stand-in's HTTP/1 side without namespaces: strict framing, Envoy's reply texts, the counters.

In-process and root-free: the real lab app (apps.HttpApp) listens on 127.0.0.1, the sidecar's proxy path is
driven directly with that address as the original destination (SO_ORIGINAL_DST needs the lab's REDIRECT).
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from kubectl_meshdoctor.lab.apps import FRAMING_VARIANTS, HttpAppConfig
from kubectl_meshdoctor.lab.sidecar import (
    CONNECTION_TERMINATION,
    PROTOCOL_ERROR,
    FramingError,
    InboundSidecar,
    UpstreamConnector,
    body_framing,
    connect_failure,
    parse_request_head,
    parse_response_head,
)

from .local_servers import free_port, serve_app


def _head(*fields: str) -> bytes:
    return ("\r\n".join(("HTTP/1.1 200 OK", *fields)) + "\r\n\r\n").encode()


@pytest.mark.parametrize("path", list(FRAMING_VARIANTS))
def test_every_broken_framing_of_the_app_is_rejected(path: str) -> None:
    with pytest.raises(FramingError):
        body_framing(parse_response_head(_head(*FRAMING_VARIANTS[path])), response_to="GET")


@pytest.mark.parametrize(("fields", "framing"), [
    (("Transfer-Encoding: chunked",), ("chunked", 0)),
    (("transfer-encoding: CHUNKED",), ("chunked", 0)),  # coding names are case-insensitive
    (("Content-Length: 5",), ("length", 5)),
    (("Content-Length: 5", "Content-Length: 5"), ("length", 5)),  # identical repeats: RFC 9110 8.6
    ((), ("close", 0)),
])
def test_valid_framings_are_accepted(fields: tuple[str, ...], framing: tuple[str, int]) -> None:
    assert body_framing(parse_response_head(_head(*fields)), response_to="GET") == framing


def test_request_heads_and_no_body_statuses() -> None:
    request = parse_request_head(b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Close\r\n\r\n")
    assert request.start == ("GET", "/x", "HTTP/1.1") and request.tokens("connection") == ["keep-alive", "close"]
    assert body_framing(request) == ("none", 0)
    assert body_framing(parse_response_head(_head("Content-Length: 9")), response_to="HEAD") == ("none", 0)
    with pytest.raises(FramingError):
        parse_request_head(b"GET /x HTTP/1.1\r\n Folded: value\r\n\r\n")


def test_local_reply_bodies_and_details_match_envoy() -> None:
    # Byte counts from ../shared/reference/envoy/response_flags.md (the %BYTES_SENT% of Envoy's local replies).
    assert len(PROTOCOL_ERROR.body) == 87 and PROTOCOL_ERROR.details.endswith("{protocol_error}")
    assert len(CONNECTION_TERMINATION.body) == 95
    assert CONNECTION_TERMINATION.details == "upstream_reset_before_response_started{connection_termination}"
    refused = ConnectionRefusedError(111, "Connection refused")
    by_style = {style: connect_failure(refused, style) for style in ("2025", "2024", "2022")}
    assert [len(f.body) for f in by_style.values()] == [167, 152, 145]
    assert by_style["2025"].details == ("upstream_reset_before_response_started{remote_connection_failure|"
                                        "delayed_connect_error:_Connection_refused}")
    assert by_style["2024"].details == ("upstream_reset_before_response_started{remote_connection_failure,"
                                        "delayed_connect_error:_111}")
    assert by_style["2022"].details == "upstream_reset_before_response_started{connection_failure,delayed_connect_error:_111}"
    assert {f.flag for f in by_style.values()} == {"UF"} and by_style["2022"].transport_field == "delayed_connect_error:_111"


def _fin_queued(transport_socket: object) -> bool:
    """True when the peer's FIN waits in the receive queue (peek returns EOF) and nothing else does."""
    with socket.fromfd(transport_socket.fileno(), socket.AF_INET, socket.SOCK_STREAM) as dup:
        try:
            return dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False


async def _get(sidecar: InboundSidecar, orig: tuple[str, int], path: str) -> tuple[bytes, object]:
    request = parse_request_head(f"GET {path} HTTP/1.1\r\nHost: lab\r\n\r\n".encode())
    return await sidecar._proxy(request, b"", orig, "rid", close=False)


async def test_counters_for_upe_uc_uf_and_success() -> None:
    orig = ("127.0.0.1", free_port())
    sidecar = InboundSidecar(UpstreamConnector("127.0.0.1"), fin_race=True)
    cluster = sidecar.stats.cluster(f"inbound|{orig[1]}||")

    # Nothing listens yet: UF.
    response, ex = await _get(sidecar, orig, "/")
    assert response.startswith(b"HTTP/1.1 503 ") and ex.flags == "UF"
    assert (cluster.upstream_cx_connect_fail, cluster.upstream_rq_pending_failure_eject) == (1, 1)
    assert cluster.host(f"{orig[0]}:{orig[1]}").cx_connect_fail == 1

    app = await serve_app(HttpAppConfig(bind=orig[0], port=orig[1], idle_timeout=0.2))
    try:
        response, ex = await _get(sidecar, orig, "/ok")
        assert response.startswith(b"HTTP/1.1 200 OK\r\n") and ex.details == "via_upstream"
        assert cluster.upstream_cx_active == 1 and cluster.upstream_rq_code[200] == 1
        # The app closes the idle connection after 0.2 s; the racing pool does not notice (reading paused).
        (pooled,) = sidecar._pool._idle[orig]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not _fin_queued(pooled.writer.get_extra_info("socket")):
            assert loop.time() < deadline, "the app's FIN never arrived"
            await asyncio.sleep(0.01)
        response, ex = await _get(sidecar, orig, "/again")
        assert response.startswith(b"HTTP/1.1 503 ") and ex.flags == "UC"
        assert cluster.upstream_cx_destroy_remote_with_active_rq == 1 and cluster.upstream_cx_active == 0
    finally:
        app.cancel()

    broken_port = free_port()
    broken = await serve_app(HttpAppConfig(bind="127.0.0.1", port=broken_port, broken_framing=True))
    try:
        response, ex = await _get(sidecar, ("127.0.0.1", broken_port), "/dup-te")
        assert response.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and ex.flags == "UPE"
        broken_cluster = sidecar.stats.cluster(f"inbound|{broken_port}||")
        assert broken_cluster.upstream_cx_protocol_error == 1
        assert broken_cluster.upstream_cx_destroy_local_with_active_rq == 1
    finally:
        broken.cancel()
    flat = dict(sidecar.stats.flat())
    assert flat[f"cluster.inbound|{orig[1]}||.upstream_rq_5xx"] == 2
    assert flat[f"cluster.inbound|{broken_port}||.upstream_rq_502"] == 1
