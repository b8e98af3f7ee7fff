"""Our parsers against what real Envoy (tests/local_envoy.py) writes: the admin bodies and the access log in
Istio's TEXT and JSON formats. Envoy is the oracle; the reference samples (test_access_log.py) add the older
renderings no Envoy here can produce."""

from __future__ import annotations

import json
import uuid
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor.envoy.clusters import parse_clusters
from kubectl_meshdoctor.envoy.flags import parse_reset_details
from kubectl_meshdoctor.envoy.logging import parse_logging
from kubectl_meshdoctor.envoy.server_info import envoy_version
from kubectl_meshdoctor.envoy.stats import cluster_failures, parse_stats, split_cluster_stat
from meshdoctor_lab.bootstrap import ISTIO_JSON_FORMAT
from meshdoctor_lab.istio_proxy import ENVOY_VERSION

from ..local_envoy import CLUSTER, LocalEnvoy, free_port, local_envoy, ok_app
from .conftest import read

UF_DETAILS = "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}"


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    """An HTTP/1.1 app on loopback that answers 200 to every GET."""
    with ok_app() as port:
        yield port


@pytest.fixture(scope="module")
def refusing(tmp_path_factory) -> Iterator[LocalEnvoy]:
    """Envoy whose only upstream refuses: every request is a real 503 UF."""
    with local_envoy(tmp_path_factory.mktemp("envoy-uf"), free_port()) as envoy:
        yield envoy


@pytest.fixture(scope="module")
def serving(tmp_path_factory, upstream) -> Iterator[LocalEnvoy]:
    with local_envoy(tmp_path_factory.mktemp("envoy-ok"), upstream) as envoy:
        yield envoy


def test_server_info_names_the_pinned_version(refusing):
    status, body = refusing.admin("/server_info")
    assert status == 200 and envoy_version(body) == ENVOY_VERSION


def test_a_refused_upstream_reads_the_same_from_clusters_text_json_and_stats(refusing):
    before = parse_clusters(refusing.admin("/clusters")[1])[CLUSTER].hosts[0].cx_connect_fail
    assert [refusing.request(f"/uf/{i}") for i in range(2)] == [503, 503]
    text = parse_clusters(refusing.admin("/clusters")[1])
    doc = parse_clusters(refusing.admin("/clusters?format=json")[1])
    for clusters in (text, doc):
        (host,) = clusters[CLUSTER].hosts
        assert host.address == "127.0.0.1" and host.cx_connect_fail == before + 2 and host.rq_success == 0
    stats = parse_stats(refusing.admin("/stats")[1])
    assert split_cluster_stat(f"cluster.{CLUSTER};.upstream_cx_connect_fail") == (CLUSTER, "upstream_cx_connect_fail")
    assert cluster_failures(stats)[CLUSTER]["upstream_cx_connect_fail"] == before + 2


def test_logging_levels_as_envoy_reports_them(refusing):
    status, body = refusing.admin("/logging?connection=debug", "POST")
    try:
        levels = parse_logging(body)
        assert status == 200 and levels["connection"] == "debug" and levels["http"] == "warning"
        assert levels["misc"] == "error" and len(levels) > 50
    finally:
        refusing.admin("/logging?level=warning", "POST")
        refusing.admin("/logging?misc=error", "POST")


def test_a_real_uf_line_in_text_and_json(refusing):
    rid = str(uuid.uuid4())
    assert refusing.request("/uf-line", {"User-Agent": "meshdoctor-test/1", "X-Request-Id": rid}) == 503
    text, js = refusing.log_line(rid), refusing.log_line(rid, "JSON")
    t, j = parse_line(text), parse_line(js)
    assert t is not None and j is not None, (text, js)
    assert (t.method, t.path, t.code, t.flags, t.details) == ("GET", "/uf-line", 503, ("UF",), UF_DETAILS)
    assert t.upstream_failure == "delayed_connect_error:_Connection_refused" and t.upstream_local is None
    assert t.upstream_cluster == CLUSTER and t.user_agent == "meshdoctor-test/1" and t.request_id == rid
    assert parse_reset_details(t.details).flag == "UF"
    assert j == t.__class__(**{**t.__dict__, "raw": js})  # the same request, the same fields
    assert set(json.loads(js)) == set(ISTIO_JSON_FORMAT)


def test_the_json_keys_are_istios():
    """The lab's JSON encoding carries exactly the keys Istio's EnvoyJSONLogFormatIstio lists."""
    header = read("istio_access_log.txt").split("keys:", 1)[1].split("(EnvoyJSONLogFormatIstio")[0]
    assert set(ISTIO_JSON_FORMAT) == set(header.replace("#", " ").split())


_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e, blacklist_characters='"\\'), min_size=1,
                max_size=40).filter(lambda s: s.strip() == s and s != "-")
_path = st.from_regex(r"/[A-Za-z0-9/._~-]{0,30}", fullmatch=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=_path, agent=_text, forwarded=_text)
def test_whatever_a_client_sends_parses_back_from_both_encodings(serving, path, agent, forwarded):
    rid = str(uuid.uuid4())
    assert serving.request(path, {"User-Agent": agent, "X-Forwarded-For": forwarded, "X-Request-Id": rid}) == 200
    t, j = parse_line(serving.log_line(rid)), parse_line(serving.log_line(rid, "JSON"))
    assert t is not None and j is not None
    assert (t.path, t.user_agent, t.x_forwarded_for, t.code, t.flags) == (path, agent, forwarded, 200, ())
    assert t.details == "via_upstream" and t.upstream_host.startswith("127.0.0.1:")
    assert {k: v for k, v in t.__dict__.items() if k != "raw"} == {k: v for k, v in j.__dict__.items() if k != "raw"}


def test_a_prometheus_scrape_reads_as_the_stats_dump_does(refusing, tmp_path):
    """/stats/prometheus (a scrape of the sidecar, as many tickets hold it) names the same counters /stats does,
    by their /stats names, and analyze names the same class from it."""
    from kubectl_meshdoctor.envoy.stats import parse_stats

    from ..helpers import analyze_json

    _, text = refusing.admin("/stats")
    _, prom = refusing.admin("/stats/prometheus")
    a, b = parse_stats(text), parse_stats(prom)
    name = f"cluster.{CLUSTER};.upstream_cx_connect_fail"
    assert a[name] == b[name] >= 1
    assert abs(b["server.uptime"] - a["server.uptime"]) <= 1  # two requests a moment apart
    found = {}
    for kind, body in (("text", text), ("prometheus", prom)):
        path = tmp_path / f"stats.{kind}"
        path.write_text(body)
        code, report = analyze_json(path)
        assert code == 1
        found[kind] = {(f["detector"], tuple(sorted(f["counters"].items()))) for f in report["findings"]}
    assert found["prometheus"] == found["text"] and found["text"]


def test_istio_standard_metrics_in_prometheus_form_name_their_flags():
    """Istio's istio_requests_total as Prometheus shows it (its standard metrics' labels): the response_flags
    label reads as the /stats form does."""
    from kubectl_meshdoctor.envoy.stats import istio_requests, parse_stats

    body = ('# TYPE istio_requests_total counter\n'
            'istio_requests_total{reporter="destination",source_workload="orders",destination_workload="payments",'
            'request_protocol="http",response_code="503",grpc_response_status="",response_flags="UC",'
            'connection_security_policy="mutual_tls"} 41\n'
            'istio_requests_total{reporter="destination",response_code="200",response_flags="-"} 9000\n')
    assert istio_requests(parse_stats(body)) == {("destination", 503, "UC"): 41, ("destination", 200, "-"): 9000}
