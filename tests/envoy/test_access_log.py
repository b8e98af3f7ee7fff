import dataclasses
import json
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry, parse_line, parse_lines
from kubectl_meshdoctor.envoy.flags import parse_reset_details

from .conftest import access_log_lines

LINES = access_log_lines()


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def test_every_sample_line_parses_and_keeps_its_raw_text():
    assert len(LINES) == 13
    for line in LINES:
        entry = parse_line(line)
        assert entry is not None, line
        assert entry.raw == line


def test_normal_200():
    e = parse_line(LINES[0])
    assert e.ts == ts("2025-06-12T08:14:01.207") == 1749716041.207
    assert (e.method, e.path, e.protocol, e.code, e.flags) == ("POST", "/v1/charges", "HTTP/1.1", 200, ())
    assert (e.details, e.termination_details, e.upstream_failure) == ("via_upstream", None, None)
    assert (e.bytes_received, e.bytes_sent, e.duration_ms, e.upstream_service_time) == (412, 96, 18, 17)
    assert (e.user_agent, e.request_id, e.authority) == (
        "python-requests/2.32.3", "5b0c6a8e-2f0e-9d51-8a47-0f4f6d0e2c11", "payments.shop.svc.cluster.local:8080")
    assert (e.upstream_host, e.upstream_cluster, e.upstream_local) == (
        "10.244.2.31:8080", "outbound|8080||payments.shop.svc.cluster.local", "10.244.1.23:52118")
    assert (e.downstream_local, e.downstream_remote, e.requested_server_name, e.route_name) == (
        "10.96.88.12:8080", "10.244.1.23:40318", None, "default")
    assert e.x_forwarded_for is None and not e.is_tcp and not e.inbound


def test_uc_line():
    e = parse_line(LINES[1])
    assert (e.code, e.flags) == (503, ("UC",))
    assert e.details == "upstream_reset_before_response_started{connection_termination}"
    assert (e.bytes_sent, e.duration_ms, e.upstream_service_time) == (95, 2, None)
    assert e.upstream_host == "10.244.2.31:8080" and e.downstream_remote == "10.244.1.23:40322"
    assert parse_reset_details(e.details).flag == "UC"
    assert [f.long for f in e.response_flags] == ["UpstreamConnectionTermination"]


def test_urx_uf_line():
    e = parse_line(LINES[2])
    assert (e.code, e.flags, e.bytes_sent, e.duration_ms) == (503, ("URX", "UF"), 190, 63)
    assert e.upstream_failure == "delayed_connect_error:_Connection_refused"
    reset = parse_reset_details(e.details)
    assert (reset.reason, reset.errno, reset.flag) == ("remote_connection_failure", 111, "UF")
    assert e.upstream_local is None and e.upstream_host == "10.244.3.9:8080"


def test_inbound_uf_and_the_callers_urx():
    inbound, caller = parse_line(LINES[3]), parse_line(LINES[4])
    assert inbound.inbound and inbound.upstream_cluster == "inbound|5002||"
    assert (inbound.code, inbound.flags, inbound.bytes_sent) == (503, ("UF",), 167)
    assert inbound.upstream_host == "10.244.1.23:5002"
    assert inbound.requested_server_name == "outbound_.5002_._.orders.shop.svc.cluster.local"
    assert inbound.downstream_remote == "10.244.2.7:51930"
    assert (caller.flags, caller.details, caller.upstream_service_time) == (("URX",), "via_upstream", 4)
    assert caller.request_id == inbound.request_id


def test_upe_uo_ut_dc_lines():
    upe, uo, ut, dc = (parse_line(line) for line in LINES[5:9])
    assert (upe.code, upe.flags, upe.bytes_sent) == (502, ("UPE",), 87)
    assert parse_reset_details(upe.details).reason == "protocol_error"
    assert upe.upstream_local == "127.0.0.6:44336"
    assert (uo.code, uo.flags, uo.upstream_host, uo.bytes_sent) == (503, ("UO",), None, 81)
    assert (ut.code, ut.flags, ut.details, ut.duration_ms) == (504, ("UT",), "response_timeout", 15001)
    assert (dc.code, dc.flags, dc.details, dc.bytes_received) == (0, ("DC",), "downstream_remote_disconnect", 512)


def test_tcp_line():
    e = parse_line(LINES[9])
    assert e.is_tcp and (e.method, e.path, e.protocol) == (None, None, None)
    assert (e.code, e.flags, e.details) == (0, ("NR",), "filter_chain_not_found")
    assert (e.upstream_host, e.upstream_cluster, e.user_agent, e.route_name) == (None, None, None, None)
    assert (e.downstream_local, e.downstream_remote) == ("10.244.1.23:5000", "10.244.4.12:45690")


def test_legacy_lines():
    comma, generic, enum_order = (parse_line(line) for line in LINES[10:])
    assert comma.ts == ts("2024-05-12T01:56:17.634")
    assert (comma.x_forwarded_for, comma.downstream_remote, comma.bytes_sent) == ("10.244.0.1", "10.244.0.1:0", 152)
    assert parse_reset_details(comma.details).transport == "delayed_connect_error:_111"
    assert parse_reset_details(generic.details).reason == "connection_failure"
    assert (generic.user_agent, generic.upstream_host) == ("curl/7.87.0-DEV", "10.1.2.31:5000")
    assert enum_order.flags == ("UF", "URX")
    assert {f.short for f in enum_order.response_flags} == {f.short for f in parse_line(LINES[2]).response_flags}


@pytest.mark.parametrize("line", [
    # Envoy's own log lines in istio-proxy (Istio bootstrap format, tab-separated) and older formats
    '2025-06-12T08:14:03.512345Z\tdebug\tenvoy router external/envoy/source/common/router/router.cc:1234\t'
    '[Tags: "ConnectionId":"412","StreamId":"9876543210"] upstream reset: reset reason: connection termination, '
    'transport failure reason: \tthread=24',
    "2024-01-02T03:04:05.678901Z\twarning\tenvoy config external/envoy/source/extensions/config_subscription/grpc/"
    "grpc_stream.h:193\tStreamAggregatedResources gRPC config stream to xds-grpc closed since 1s ago: 14, "
    "connection error",
    "2025-06-12T08:10:44.000000Z\tinfo\tpilot-agent\tReadiness succeeded in 1.2s",
    "[2024-01-02 03:04:05.678][15][warning][config] [source/common/config/grpc_stream.h:160] gRPC config stream closed",
    '[2025-06-12T08:14:01.207Z] "POST /v1/charges HTTP/1.1" 200',  # truncated
    '[not-a-time] "GET / HTTP/1.1" 200 - via_upstream - "-" 0 0 1 - "-" "-" "-" "-" "-" - - - - - -',
    '{"level":"info","time":"2025-06-12T08:14:01Z","msg":"hello"}',
    '{"start_time": "2025-06-12T08:14:01.207Z", "response_code": "abc"}',
    "{broken json",
    "", "   ", "-",
])
def test_other_lines_return_none(line):
    assert parse_line(line) is None


def test_parse_lines_skips_envoy_log_lines():
    log = "\n".join(["2025-06-12T08:14:03.512345Z\tdebug\tenvoy router x.cc:1\tupstream reset\tthread=24", *LINES, ""])
    assert [e.raw for e in parse_lines(log)] == LINES


def test_kubectl_logs_timestamps_prefix_is_skipped():
    entry = parse_line("2025-06-12T08:14:01.208123456Z " + LINES[1])
    assert entry == parse_line(LINES[1])


def _json_doc(line: str) -> dict:
    """A sample line as Istio's JSON encoding writes it (typed numbers, null for missing; the keys of
    EnvoyJSONLogFormatIstio). Real Envoy's JSON lines are checked in test_real_envoy.py."""
    e = parse_line(line)
    return {
        "start_time": line[1:25], "route_name": e.route_name, "method": e.method, "path": e.path,
        "protocol": e.protocol, "response_code": e.code, "response_flags": ",".join(e.flags) or None,
        "response_code_details": e.details, "connection_termination_details": e.termination_details,
        "bytes_received": e.bytes_received, "bytes_sent": e.bytes_sent, "duration": e.duration_ms,
        "upstream_service_time": None if e.upstream_service_time is None else str(e.upstream_service_time),
        "x_forwarded_for": e.x_forwarded_for, "user_agent": e.user_agent, "request_id": e.request_id,
        "authority": e.authority, "upstream_host": e.upstream_host, "upstream_cluster": e.upstream_cluster,
        "upstream_local_address": e.upstream_local, "downstream_local_address": e.downstream_local,
        "downstream_remote_address": e.downstream_remote, "requested_server_name": e.requested_server_name,
        "upstream_transport_failure_reason": e.upstream_failure,
    }


def test_every_sample_line_parses_the_same_from_json():
    for line in LINES:
        json_line = json.dumps(_json_doc(line))
        json_entry = parse_line(json_line)
        assert json_entry == dataclasses.replace(parse_line(line), raw=json_line)


def test_json_with_string_numbers_and_dashes():
    doc = _json_doc(LINES[9])  # the TCP line
    doc.update(response_code="0", bytes_received="0", duration="0", method="-", upstream_host="-")
    entry = parse_line(json.dumps(doc))
    assert entry.is_tcp and entry.code == 0 and entry.upstream_host is None and entry.flags == ("NR",)


@given(st.text(max_size=200))
def test_never_raises(line):
    result = parse_line(line)
    assert result is None or isinstance(result, AccessLogEntry)


def test_entries_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse_line(LINES[0]).code = 1


def test_a_line_no_envoy_wrote_never_raises():
    """parse_line's contract is None, not an exception, whatever the line (one bad line must not lose a run)."""
    base = '{"start_time": "2026-12-01T10:00:00Z", "response_code": 200, "duration": %s}'
    assert parse_line(base % "1e400") is None  # int(inf): OverflowError
    assert parse_line(base % ("[" * 100_000 + "]" * 100_000)) is None  # RecursionError in json
    assert parse_line(base % "12") is not None
