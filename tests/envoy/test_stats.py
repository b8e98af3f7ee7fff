import pytest

from kubectl_meshdoctor.envoy.clusters import FormatError
from kubectl_meshdoctor.envoy.stats import (
    by_cluster,
    cluster_failures,
    cluster_stats_visible,
    delta,
    histograms,
    istio_requests,
    listener_failures,
    parse_stats,
    split_cluster_stat,
    split_listener_stat,
)

from .conftest import read

HTTPBIN = "outbound|80||httpbin.default.svc.cluster.local"
PAYMENTS = "outbound|8080||payments.shop.svc.cluster.local"


@pytest.fixture(scope="module")
def stats():
    return parse_stats(read("stats_sample.txt"))


@pytest.fixture(scope="module")
def legacy():
    return parse_stats(read("stats_sample_legacy.txt"))


def test_every_line_of_the_sample_parses(stats):
    assert len(stats) == len(read("stats_sample.txt").splitlines()) == 474
    assert stats[f"cluster.{HTTPBIN};.upstream_cx_connect_fail"] == 7
    assert stats["cluster.inbound|5000||;.circuit_breakers.default.remaining_cx_pools"] == 18446744073709551614
    assert stats[f"cluster.{HTTPBIN};.version"] == 16142930188725466417
    assert stats["cluster.inbound|5000||;.version_text"] == "2025-06-12T08:10:44Z/37"  # text readout, unquoted
    assert stats["cluster.inbound|5000||;.upstream_rq_time"] == "No recorded values"
    assert stats[f"cluster.{PAYMENTS};.upstream_rq_time"].startswith("P0(nan,2) P25(nan,9.0125)")
    assert set(histograms(stats)) == {
        "cluster.inbound|5000||;.upstream_rq_time", f"cluster.{PAYMENTS};.upstream_rq_time",
        f"cluster.{HTTPBIN};.upstream_cx_connect_ms", f"cluster.{HTTPBIN};.upstream_cx_length_ms",
        f"cluster.{HTTPBIN};.upstream_rq_time"}


def test_legacy_sample_parses(legacy):
    assert len(legacy) == 13
    assert legacy["cluster.outbound|8000||httpbin.default.svc.cluster.local.upstream_rq_pending_overflow"] == 21
    assert legacy["http.inbound_0.0.0.0_8000.downstream_cx_protocol_error"] == 0


@pytest.mark.parametrize("name, expected", [
    ("cluster.inbound|5000||;.upstream_cx_total", ("inbound|5000||", "upstream_cx_total")),
    ("cluster.inbound|5000||.upstream_cx_total", ("inbound|5000||", "upstream_cx_total")),
    ("cluster.outbound|9080||reviews.default.svc.cluster.local.upstream_cx_total",
     ("outbound|9080||reviews.default.svc.cluster.local", "upstream_cx_total")),
    (f"cluster.{HTTPBIN}.circuit_breakers.default.rq_pending_open",
     (HTTPBIN, "circuit_breakers.default.rq_pending_open")),
    (f"cluster.{HTTPBIN}.default.total_match_count", (HTTPBIN, "default.total_match_count")),
    (f"cluster.{HTTPBIN}.tlsMode-istio.total_match_count", (HTTPBIN, "tlsMode-istio.total_match_count")),
    (f"cluster.{HTTPBIN}.ssl.versions.TLSv1.3", (HTTPBIN, "ssl.versions.TLSv1.3")),
    (f"cluster.{HTTPBIN}.retry.upstream_rq_503", (HTTPBIN, "retry.upstream_rq_503")),
    (f"cluster.{HTTPBIN}.http1.response_flood", (HTTPBIN, "http1.response_flood")),
    (f"cluster.{HTTPBIN}.outlier_detection.ejections_active", (HTTPBIN, "outlier_detection.ejections_active")),
    ("cluster.xds-grpc;.upstream_cx_active", ("xds-grpc", "upstream_cx_active")),
    ("cluster.xds-grpc.upstream_cx_active", ("xds-grpc", "upstream_cx_active")),
    ("cluster_manager.cds.update_success", None),
    ("http.inbound_0.0.0.0_5000;.rq_total", None),
])
def test_split_cluster_stat(name, expected):
    assert split_cluster_stat(name) == expected


def test_split_listener_stat():
    assert split_listener_stat("http.inbound_0.0.0.0_5000;.downstream_cx_protocol_error") == \
        ("inbound_0.0.0.0_5000", "downstream_cx_protocol_error")
    assert split_listener_stat("http.inbound_0.0.0.0_8000.downstream_cx_protocol_error") == \
        ("inbound_0.0.0.0_8000", "downstream_cx_protocol_error")
    assert split_listener_stat("cluster.xds-grpc;.upstream_cx_active") is None


def test_both_namings_group_the_same(stats):
    grouped = by_cluster(stats)
    assert list(grouped) == ["inbound|5000||", PAYMENTS, HTTPBIN, "xds-grpc"]
    assert len(grouped[HTTPBIN]) == 170
    # Istio <= 1.22 names have no ';' delimiter: the cluster must come out the same from the stat names.
    old = {name.replace(";.", "."): value for name, value in stats.items()}
    assert by_cluster(old) == grouped
    assert cluster_failures(old) == cluster_failures(stats)
    assert listener_failures(old) == listener_failures(stats)


def test_cluster_failures(stats):
    failures = cluster_failures(stats)
    httpbin = failures[HTTPBIN]
    assert httpbin["upstream_cx_connect_fail"] == 7
    assert httpbin["upstream_cx_destroy_remote_with_active_rq"] == 3
    assert httpbin["upstream_cx_destroy_local_with_active_rq"] == 0
    assert httpbin["upstream_rq_pending_failure_eject"] == 10
    assert httpbin["upstream_rq_pending_overflow"] == 4
    assert (httpbin["upstream_rq_retry"], httpbin["upstream_rq_retry_success"],
            httpbin["upstream_rq_retry_limit_exceeded"],
            httpbin["upstream_rq_retry_backoff_exponential"]) == (12, 5, 4, 12)
    assert (httpbin["upstream_rq_503"], httpbin["upstream_rq_504"], httpbin["upstream_rq_5xx"]) == (14, 1, 15)
    assert httpbin["retry.upstream_rq_503"] == 2 and httpbin["internal.upstream_rq_5xx"] == 15
    assert httpbin["outlier_detection.ejections_active"] == 1
    assert httpbin["outlier_detection.ejections_enforced_consecutive_5xx"] == 2
    assert httpbin["http1.response_flood"] == 0
    assert httpbin["circuit_breakers.default.rq_pending_open"] == 0
    assert (httpbin["membership_healthy"], httpbin["membership_total"]) == (1, 2)
    assert "upstream_cx_rx_bytes_total" not in httpbin and "lb_healthy_panic" not in httpbin
    assert "upstream_rq_200" not in httpbin and "ssl.handshake" not in httpbin
    inbound = failures["inbound|5000||"]
    assert (inbound["upstream_cx_protocol_error"], inbound["upstream_cx_destroy_local_with_active_rq"],
            inbound["upstream_rq_502"], inbound["upstream_rq_tx_reset"]) == (1, 1, 1, 1)
    assert failures[PAYMENTS]["upstream_cx_destroy_remote_with_active_rq"] == 5
    assert failures["xds-grpc"]["upstream_cx_connect_fail"] == 0


def test_listener_failures(stats, legacy):
    inbound = listener_failures(stats)["inbound_0.0.0.0_5000"]
    assert (inbound["downstream_cx_protocol_error"], inbound["downstream_rq_rx_reset"],
            inbound["downstream_rq_tx_reset"], inbound["downstream_cx_destroy_remote_active_rq"]) == (1, 2, 1, 3)
    assert "downstream_rq_2xx" not in inbound
    assert listener_failures(stats)["outbound_0.0.0.0_80"]["downstream_rq_5xx"] == 20
    assert listener_failures(legacy) == {"inbound_0.0.0.0_8000": {"downstream_cx_protocol_error": 0}}


def test_legacy_groups(legacy):
    cluster = cluster_failures(legacy)["outbound|8000||httpbin.default.svc.cluster.local"]
    assert cluster == {
        "circuit_breakers.default.rq_pending_open": 0, "circuit_breakers.high.rq_pending_open": 0,
        "upstream_cx_connect_fail": 0, "upstream_cx_destroy_remote_with_active_rq": 2,
        "upstream_cx_protocol_error": 0, "upstream_rq_pending_failure_eject": 0,
        "upstream_rq_pending_overflow": 21, "upstream_rq_retry": 3}
    assert by_cluster(legacy)["outbound|8000||httpbin.default.svc.cluster.local"][
        "circuit_breakers.default.remaining_pending"] == 1


def test_istio_requests_by_flags_in_both_namings(stats, legacy):
    assert istio_requests(stats) == {("source", 200, "-"): 1790, ("source", 503, "UC"): 5}
    assert istio_requests(legacy) == {("destination", 503, "UC"): 2}


def test_cluster_stats_visibility(stats):
    assert cluster_stats_visible(stats)
    default_istio = {k: v for k, v in stats.items() if not k.startswith(("cluster.outbound", "cluster.inbound"))}
    assert not cluster_stats_visible(default_istio)


def test_delta_reports_what_moved(stats):
    after = dict(stats)
    after[f"cluster.{HTTPBIN};.upstream_cx_connect_fail"] += 3
    after[f"cluster.{HTTPBIN};.upstream_cx_active"] -= 1  # a gauge going down
    after[f"cluster.{HTTPBIN};.upstream_rq_502"] = 2  # created lazily between the two reads
    after["cluster.inbound|5000||;.version_text"] = "2025-06-12T08:20:00Z/38"  # text: not a counter
    moved = delta(stats, after)
    assert moved == {f"cluster.{HTTPBIN};.upstream_cx_connect_fail": 3, f"cluster.{HTTPBIN};.upstream_cx_active": -1,
                     f"cluster.{HTTPBIN};.upstream_rq_502": 2}
    assert cluster_failures(moved) == {HTTPBIN: {"upstream_cx_connect_fail": 3, "upstream_rq_502": 2}}
    assert delta(stats, stats) == {}


@pytest.mark.parametrize("body", ["<html>nope</html>", "Method GET not allowed", '{"stats": []}'])
def test_garbage_raises_format_error(body):
    with pytest.raises(FormatError) as info:
        parse_stats(body)
    assert "\n" not in str(info.value)


def test_empty_body_is_no_stats():
    assert parse_stats("") == {}
