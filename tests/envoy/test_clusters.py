import dataclasses
import json

import pytest

from kubectl_meshdoctor.envoy.clusters import (
    FormatError,
    Host,
    Thresholds,
    parse_clusters,
    parse_clusters_json,
    parse_clusters_text,
)

from .conftest import read

HTTPBIN = "outbound|80||httpbin.default.svc.cluster.local"
PAYMENTS = "outbound|8080||payments.shop.svc.cluster.local"
UNLIMITED = 4294967295


@pytest.fixture(scope="module")
def text():
    return parse_clusters(read("clusters.txt"))


@pytest.fixture(scope="module")
def as_json():
    return parse_clusters(read("clusters.json"))


def test_every_cluster_of_the_text_sample_in_body_order(text):
    assert list(text) == [
        HTTPBIN, "xds-grpc", "inbound|5000||", "BlackHoleCluster", PAYMENTS, "agent", "PassthroughCluster",
        "inbound|5002||", "sds-grpc", "InboundPassthroughCluster", "prometheus_stats"]
    for name, cluster in text.items():
        assert cluster.name == name
        assert cluster.observability_name == name + ";"  # Istio >= 1.23 alt_stat_name
        assert cluster.stat_name == name
        assert cluster.high_priority == Thresholds("high", 1024 if name != "xds-grpc" else 100000,
                                                   1024 if name != "xds-grpc" else 100000,
                                                   1024 if name != "xds-grpc" else 100000, 3)
    assert [len(c.hosts) for c in text.values()] == [2, 1, 1, 0, 2, 1, 1, 0, 1, 0, 1]


def test_text_cluster_settings(text):
    httpbin = text[HTTPBIN]
    assert httpbin.added_via_api is True
    assert httpbin.eds_service_name == HTTPBIN
    assert httpbin.default_priority == Thresholds("default", 100, 50, UNLIMITED, UNLIMITED)
    # outlier lines present (DestinationRule outlierDetection set), all -1 = not enough data
    assert httpbin.outlier is not None and dataclasses.astuple(httpbin.outlier) == (None, None, None, None)
    inbound = text["inbound|5000||"]
    assert inbound.default_priority == Thresholds("default", UNLIMITED, UNLIMITED, UNLIMITED, UNLIMITED)
    assert inbound.eds_service_name is None and inbound.outlier is None
    for static in ("xds-grpc", "agent", "sds-grpc", "prometheus_stats"):
        assert text[static].added_via_api is False
    assert text["xds-grpc"].default_priority == Thresholds("default", 100000, 100000, 100000, 3)


def test_text_hosts(text):
    good, ejected = text[HTTPBIN].hosts
    assert good == Host(address="10.244.2.15", port=8080, cx_active=2, cx_connect_fail=0, cx_total=14,
                        rq_active=0, rq_error=3, rq_success=212, rq_timeout=0, rq_total=215, health_flags=(),
                        hostname="", weight=1, region="us-east-1", zone="us-east-1b", sub_zone="", canary=False,
                        priority=0, success_rate=None, local_origin_success_rate=None)
    assert ejected.endpoint == "10.244.3.9:8080"
    assert (ejected.cx_connect_fail, ejected.cx_total, ejected.rq_error, ejected.rq_total) == (7, 9, 12, 46)
    assert ejected.health_flags == ("failed_outlier_check",) and not ejected.healthy
    assert ejected.zone == "us-east-1c"
    assert text[HTTPBIN].host("10.244.3.9:8080") is ejected and text[HTTPBIN].host("1.2.3.4:1") is None
    inbound = text["inbound|5000||"].hosts[0]
    assert (inbound.address, inbound.port, inbound.cx_active, inbound.rq_active, inbound.rq_success) == \
        ("10.244.1.23", 5000, 3, 1, 845)
    timeout = text[PAYMENTS].host("10.244.2.31:8080")
    assert (timeout.rq_timeout, timeout.rq_total, timeout.zone) == (1, 1193, "us-east-1b")
    assert text["agent"].hosts[0].rq_success == 4312
    assert text["PassthroughCluster"].hosts[0].endpoint == "93.184.215.14:443"


def test_text_pipe_hosts(text):
    xds = text["xds-grpc"].hosts[0]
    assert (xds.address, xds.port, xds.endpoint) == ("./etc/istio/proxy/XDS", None, "./etc/istio/proxy/XDS")
    assert (xds.cx_active, xds.cx_total, xds.rq_active, xds.rq_total) == (1, 1, 1, 1)
    sds = text["sds-grpc"].hosts[0]
    assert sds.address == "./var/run/secrets/workload-spiffe-uds/socket" and sds.port is None


def test_legacy_text_shape():
    legacy = parse_clusters_text(read("clusters_legacy.txt"))
    name = "outbound|9080||reviews.default.svc.cluster.local"
    reviews = legacy[name]
    assert list(legacy) == [name]
    assert reviews.observability_name == name and reviews.stat_name == name  # no ';' before Istio 1.23
    assert reviews.eds_service_name is None  # older Envoy: no eds_service_name line
    a, b = reviews.hosts
    assert (a.endpoint, a.cx_total, a.rq_success, a.success_rate) == ("10.244.0.15:9080", 45, 89, None)  # -1.0
    assert (b.endpoint, b.cx_connect_fail, b.rq_error, b.health_flags) == \
        ("10.244.0.16:9080", 3, 9, ("failed_outlier_check",))


def test_json_sample(as_json):
    assert list(as_json) == [HTTPBIN, "inbound|5000||", "BlackHoleCluster", "xds-grpc"]
    httpbin = as_json[HTTPBIN]
    assert httpbin.observability_name == HTTPBIN + ";" and httpbin.eds_service_name == HTTPBIN
    assert httpbin.default_priority == Thresholds("default", 100, 50, UNLIMITED, UNLIMITED)
    assert httpbin.high_priority == Thresholds("high", 1024, 1024, 1024, 3)
    ejected = httpbin.host("10.244.3.9:8080")
    assert (ejected.cx_connect_fail, ejected.cx_active, ejected.rq_timeout) == (7, 0, 0)  # zeros omitted in JSON
    assert ejected.health_flags == ("failed_outlier_check",)
    assert as_json["xds-grpc"].added_via_api is False  # default false omitted
    assert as_json["xds-grpc"].hosts[0].address == "./etc/istio/proxy/XDS"
    assert as_json["BlackHoleCluster"].hosts == ()


def test_json_and_text_give_the_same_clusters(text, as_json):
    for name, cluster in as_json.items():
        # The JSON format cannot show an outlier detector that has no data yet; the text format can.
        assert dataclasses.replace(text[name], outlier=None) == cluster


def test_json_camel_case_from_istioctl(as_json):
    def camel(value):
        if isinstance(value, dict):
            return {k.split("_")[0] + "".join(p.title() for p in k.split("_")[1:]): camel(v) for k, v in value.items()}
        if isinstance(value, list):
            return [camel(v) for v in value]
        return value
    body = json.dumps(camel(json.loads(read("clusters.json"))))
    assert "hostStatuses" in body and "portValue" in body
    assert parse_clusters(body) == as_json


def test_ipv6_hosts_text_and_json():
    body = "\n".join([
        "outbound|8080||v6.shop.svc.cluster.local::observability_name::outbound|8080||v6.shop.svc.cluster.local;",
        "outbound|8080||v6.shop.svc.cluster.local::[fd00::1]:8080::cx_connect_fail::4",
        "outbound|8080||v6.shop.svc.cluster.local::[fd00::1]:8080::rq_total::9",
        "outbound|8080||v6.shop.svc.cluster.local::[fd00::1]:8080::hostname::a::b",
        "outbound|8080||v6.shop.svc.cluster.local::[fd00::1]:8080::health_flags::"
        "/failed_active_hc/failed_outlier_check",
        "outbound|8080||v6.shop.svc.cluster.local::[::1]:9090::cx_total::1",
        "outbound|8080||v6.shop.svc.cluster.local::[fd00::1]:8080::some_future_stat::1",
    ])
    cluster = parse_clusters(body)["outbound|8080||v6.shop.svc.cluster.local"]
    v6, loopback = cluster.hosts
    assert (v6.address, v6.port, v6.cx_connect_fail, v6.rq_total) == ("fd00::1", 8080, 4, 9)
    assert v6.endpoint == "[fd00::1]:8080"
    assert v6.hostname == "a::b"  # values may hold '::'
    assert v6.health_flags == ("failed_active_hc", "failed_outlier_check")
    assert (loopback.address, loopback.port, loopback.cx_total) == ("::1", 9090, 1)
    as_json = parse_clusters_json(json.dumps({"cluster_statuses": [{"name": "c", "host_statuses": [
        {"address": {"socket_address": {"address": "fd00::1", "port_value": 8080}},
         "stats": [{"name": "cx_connect_fail", "value": "4"}, {"name": "rq_total", "value": "9"}],
         "health_status": {"failed_active_health_check": True, "failed_outlier_check": True,
                           "eds_health_status": "HEALTHY"}}]}]}))
    host = as_json["c"].hosts[0]
    assert (host.address, host.port, host.endpoint, host.cx_connect_fail) == ("fd00::1", 8080, "[fd00::1]:8080", 4)
    assert host.health_flags == v6.health_flags


def test_json_eds_status_and_success_rate():
    body = json.dumps({"cluster_statuses": [{
        "name": "c", "success_rate_ejection_threshold": {"value": 80.5},
        "host_statuses": [{"address": {"socket_address": {"address": "10.0.0.1", "port_value": 80}},
                           "health_status": {"eds_health_status": "DRAINING"}, "success_rate": {"value": 43.2},
                           "priority": 1, "hostname": "pod-a", "locality": {"sub_zone": "rack1"}}]}]})
    cluster = parse_clusters(body)["c"]
    assert cluster.outlier.success_rate_ejection_threshold == 80.5
    host = cluster.hosts[0]
    assert host.health_flags == ("eds_status_draining",)
    assert (host.success_rate, host.priority, host.hostname, host.sub_zone) == (43.2, 1, "pod-a", "rack1")


def test_unknown_lines_and_keys_are_ignored():
    body = read("clusters_legacy.txt") + "\nsomething new\nx::y::z::w::v\n"
    assert parse_clusters(body) == parse_clusters(read("clusters_legacy.txt"))
    assert parse_clusters(read("clusters.json").replace('"weight"', '"new_field": 1, "weight"')) == \
        parse_clusters(read("clusters.json"))


def test_empty_bodies_mean_no_clusters():
    assert parse_clusters("") == {} and parse_clusters("{}") == {}


@pytest.mark.parametrize("body", [
    "<html><body>404 Not Found</body></html>",
    "no such cluster",
    "Method GET not allowed, POST required.",
    "cluster.outbound|80||httpbin.default.svc.cluster.local;.upstream_cx_total: 30",  # a /stats body
    '{"configs": []}',  # a /config_dump body
    "[1, 2]",
    "{not json",
])
def test_garbage_raises_format_error_in_one_line(body):
    with pytest.raises(FormatError) as info:
        parse_clusters(body)
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)
