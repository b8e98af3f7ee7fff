"""Envoy's component log: every shape Envoy and Istio print it in reads to the same entries, multi-line header
dumps are joined, and nothing raises on any text (docs/envoy-component-log.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.envoy.component_log import (
    BARE,
    ENVOY_DEFAULT,
    ISTIO_JSON,
    ISTIO_TEXT,
    parse_component_line,
    read_component_log,
)

from .component_shapes import SHAPES, render_log

DATA = Path(__file__).parent / "data" / "component_log"
LOGS = sorted(DATA.glob("*.log"))


def entries(lines: list[str]):
    return [e for _, e in read_component_log(lines)]


# Real lines as people pasted them in public issues (docs/envoy-component-log.md names each one's source).
PASTED = [
    # envoyproxy/envoy#14735: Envoy's default format, stream ids in brackets
    ("[2021-01-23 19:27:30.631][124][debug][router] [source/common/router/router.cc:425] "
     "[C23][S13529278531814971024] cluster 'post-retry' match for URL '/post-retry'",
     ENVOY_DEFAULT, "router", 23, 13529278531814971024, "cluster 'post-retry' match for URL '/post-retry'"),
    # Istio 1.9 - 1.16 TEXT shape (GitHub turned its TABs into spaces in the paste; here as Istio wrote them)
    ("2023-03-23T04:09:47.323855Z\tdebug\tenvoy pool\t[C9386] using existing fully connected connection",
     ISTIO_TEXT, "pool", 9386, None, "using existing fully connected connection"),
    # istio/istio#43238: Istio >= 1.17, external/envoy paths, thread suffix
    ("2023-02-09T18:53:51.382158Z\tdebug\tenvoy conn_handler external/envoy/source/extensions/listener_managers/"
     "listener_manager/active_tcp_listener.cc:147\t[C11059] new connection from 10.244.0.13:54033\tthread=41",
     ISTIO_TEXT, "conn_handler", 11059, None, "new connection from 10.244.0.13:54033"),
    # envoyproxy/envoy#5359 (2018): six-digit thread field
    ("[2018-12-05 10:50:37.716][000011][debug][connection] [source/common/network/connection_impl.cc:502] "
     "[C1] remote close", ENVOY_DEFAULT, "connection", 1, None, "remote close"),
    # Istio 1.4/1.5: the epoch prefix before Envoy's default format
    ("[Envoy (Epoch 0)] [2020-03-01 10:00:00.123][20][debug][pool] [external/envoy/source/common/http/http1/"
     "conn_pool.cc:97] [C5] using existing connection", ENVOY_DEFAULT, "pool", 5, None,
     "using existing connection"),
    # Istio 1.6: Envoy 1.14's location inside %v
    ("2020-06-01T10:00:00.000000Z\tdebug\tenvoy router\t[external/envoy/source/common/router/router.cc:1149] "
     "[C3][S77] upstream reset: reset reason connection termination", ISTIO_TEXT, "router", 3, 77,
     "upstream reset: reset reason connection termination"),
    # Istio 1.10 - 1.21 log_as_json: tags inside msg, JSON-escaped
    ('{"level":"debug","time":"2023-01-01T00:00:00.000000Z","scope":"envoy http","msg":"[Tags: '
     '\\"ConnectionId\\":\\"8\\"] new stream","caller":"source/common/http/conn_manager_impl.cc:329",'
     '"thread":25}', ISTIO_JSON, "http", 8, None, "new stream"),
    # HashiCorp Consul's hclog around Envoy (hashicorp/consul-k8s#2466)
    ("2023-06-03T00:02:37.601Z+00:00 [debug] envoy.pool(28) [C21] attaching to next stream", BARE, "pool", 21,
     None, "attaching to next stream"),
    # the message alone, as people quote it
    ("[C12] using existing connection", BARE, None, 12, None, "using existing connection"),
]


@pytest.mark.parametrize("line,shape,logger,conn,stream,message", PASTED)
def test_pasted_lines_of_every_shape_read(line, shape, logger, conn, stream, message):
    e = parse_component_line(line)
    assert e is not None, line
    assert (e.shape, e.logger, e.connection, e.stream, e.message) == (shape, logger, conn, stream, message)


@pytest.mark.parametrize("line", [
    '[2026-12-03T13:40:07.412Z] "GET /stale/2 HTTP/1.1" 503 UC upstream_reset_before_response_started'
    '{connection_termination} - "-" 0 95 201 - "-" "lab" "6b02" "198.18.1.2:5000" "198.18.1.2:5000" inbound|5000|| '
    '127.0.0.6:53940 198.18.1.2:5000 198.18.1.1:33144 - default',  # an access-log line
    "2022-08-17T14:15:58.216837Z\tinfo\txdsproxy\tconnected to upstream XDS server: istiod.istio-system.svc:15012",
    '{"level":"info","time":"2022-08-17T14:15:58.216837Z","scope":"sds","msg":"SDS server started"}',
    "':status', '503'", "", "[1] something", "plain text from an app",
])
def test_lines_that_are_not_envoys_component_log_are_not_read_as_it(line):
    assert parse_component_line(line) is None


def test_real_lines_read_with_header_dumps_joined():
    lines = (DATA / "stale-keepalive.log").read_text().splitlines()
    got = entries(lines)
    dumps = [e for e in got if e.message.startswith("encoding headers via codec")]
    assert dumps and all("\n':status', '" in e.message and e.thread is not None for e in dumps)
    assert not any(e.message.startswith("'") for e in got)  # no continuation line taken for an entry
    # every physical line is an entry's head, a continuation, or an access-log line
    heads = sum(1 for ln in lines if parse_component_line(ln) is not None)
    assert len(got) == heads


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tags", [True, False], ids=["tags", "C-S-ids"])
@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_every_shape_reads_back_to_the_same_entries(log, shape, tags):
    lines = log.read_text().splitlines()
    want = entries(lines)
    if shape == "bare":  # pasted alone, only the messages that name their connection are Envoy's to tell
        want = [e for e in want if e.connection is not None or parse_component_line(e.message) is not None]
    got = entries(render_log(lines, shape, tags))
    assert len(got) == len(want)
    for a, b in zip(want, got):
        assert (b.connection, b.stream, b.message) == (a.connection, a.stream, a.message)
        if shape != "bare":
            assert (b.level, b.logger) == (a.level, a.logger)
            assert abs(b.ts - a.ts) < 0.001


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_no_text_raises(text):
    for line in (text, "[" + text, "{" + text, "2026-01-01T00:00:00.000000Z\t" + text):
        parse_component_line(line)
    list(read_component_log(text.splitlines()))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_no_bytes_raise(data):
    list(read_component_log(data.decode("utf-8", "replace").splitlines()))


@pytest.mark.parametrize("printed", [
    "2026-12-03 13:40:08.211", "2026-12-03T13:40:08.211Z", "2026-12-03 13:40:08.211+00:00",
    "2026-12-03 15:40:08.211+02:00", "2026-12-03 15:40:08.211 +02:00", "2026-12-03 15:40:08.211 +0200",
    "2026-12-03T08:40:08.211-05:00", "2026-12-03 13:40:08,211",
])
def test_a_time_with_or_without_its_offset_is_the_same_instant(printed):
    """Envoy's default prints local time without a zone (UTC in a pod); a --log-format with spdlog's %z adds
    the offset, with or without a space before it."""
    for line in (f"[{printed}][15][debug][pool] [C12] using existing connection",
                 f"{printed}\tdebug\tenvoy pool\t[C12] using existing connection\tthread=15"):
        entry = parse_component_line(line)
        assert entry is not None and (entry.logger, entry.connection) == ("pool", 12), line
        assert entry.ts == pytest.approx(1796305208.211), line
