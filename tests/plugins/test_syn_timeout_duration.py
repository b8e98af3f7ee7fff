"""syn-timeout from a UF line that names no reason (a TCP proxy's line, Envoy before response_code_details): its
duration against Envoy's connect timeout (plugins/syn_timeout.py: CONNECT_TIMEOUTS_MS), in Istio's TEXT and JSON
formats as its sidecars write them."""

import json

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor_plugins.syn_timeout import timed_out_by_duration, unanswered

# Istio's default TEXT format (1.5 on), a TCP line; the duration is the 11th field.
TCP = ('[2025-05-19T13:09:04.747Z] "- - -" 0 {flags} {details} - "-" 0 0 {ms} - "-" "-" "-" "-" "4.208.26.200:443" '
       'PassthroughCluster - 4.208.26.200:443 172.17.0.2:55322 api.github.com -')
HTTP = ('[2026-12-04T05:46:44.705Z] "GET /a HTTP/1.1" {code} {flags} {details} - "-" 0 91 {ms} - "-" "curl/8" '
        '"5b5c" "svc:80" "-" outbound|80||svc.ns.svc.cluster.local - 198.18.2.2:80 198.18.2.1:39884 - default')


def tcp(ms: int, flags: str = "UF,URX", details: str = "-"):
    return parse_line(TCP.format(flags=flags, details=details, ms=ms))


# one 10 s or 5 s timeout, either side of it by Envoy's timer; or up to three attempts, back-offs between
@pytest.mark.parametrize("ms", [9_994, 10_001, 10_090, 4_990, 5_040, 10_200, 15_600, 20_003, 30_450, 999, 2_150])
def test_a_uf_that_lasted_the_connect_timeout_timed_out(ms):
    why = timed_out_by_duration(tcp(ms))
    assert why is not None and f"{ms} ms" in why and "connect timeout fired" in why
    assert unanswered(tcp(ms)) == why


@pytest.mark.parametrize("ms", [0, 3, 250, 1_500, 7_000, 9_800, 10_500, 16_000, 45_000])
def test_a_uf_of_any_other_length_is_not_called_a_timeout(ms):
    assert timed_out_by_duration(tcp(ms)) is None


def test_a_line_with_a_reason_of_its_own_is_read_by_that_reason():
    """A refusal that happened to last 10 s (retries of a refused connect) says so in its details: never a timeout
    by the clock."""
    refused = tcp(10_000, details="upstream_reset_before_response_started{connection_failure}")
    assert timed_out_by_duration(refused) is None and unanswered(refused) is None
    assert timed_out_by_duration(tcp(10_000, flags="UC")) is None  # not a connect failure


def test_the_http_and_json_shapes_read_the_same():
    line = parse_line(HTTP.format(code=503, flags="UF,URX", details="-", ms=30_120))
    assert line is not None and "3 attempts" in timed_out_by_duration(line)
    # Istio 1.3's JSON (istio/istio#17139): every value a string
    js = parse_line(json.dumps({"response_flags": "UF,URX", "duration": "10001", "response_code": "0",
                                "upstream_host": "10.0.0.1:7600", "start_time": "2019-09-17T08:33:45.970Z",
                                "upstream_cluster": "outbound|7600||kc.ns.svc.cluster.local",
                                "downstream_remote_address": "10.0.0.2:45225", "method": "-", "path": "-",
                                "protocol": "-"}))
    assert js is not None and "Istio's default connectTimeout" in timed_out_by_duration(js)
