"""A caller's sidecar relaying the next hop's 5xx (details via_upstream on an outbound cluster) is named as the
next hop's answer, with the commands to read that pod; the sidecar's own failures and an app's answer at the
inbound cluster are not. The lines are rendered by Istio's TEXT and JSON formats (envoy/istio_formats.py)."""

from __future__ import annotations

import pytest

from kubectl_meshdoctor.envoy.istio_cluster import parse_istio_cluster
from kubectl_meshdoctor.envoy.istio_formats import JSON_FORMATS, TEXT_FORMATS

from ..envoy.render import render_json, render_text
from ..helpers import analyze_json

OUTBOUND = "outbound|9080||reviews.default.svc.cluster.local"
SERVER = "10.244.1.17:9080"


def line(code: int, flags: tuple[str, ...], details: str, cluster: str = OUTBOUND, fmt: str = "text") -> str:
    entry = {"ts": 1764770498.768, "method": "GET", "path": "/productpage", "protocol": "HTTP/1.1", "code": code,
             "flags": flags, "details": details, "bytes_received": 0, "bytes_sent": 91, "duration_ms": 12,
             "upstream_host": SERVER, "upstream_cluster": cluster, "upstream_local": "10.244.2.5:51234",
             "downstream_local": "10.96.14.2:9080", "downstream_remote": "10.244.2.5:40100",
             "request_id": "e35e51c0-8b8a-41ae-a241-a03d2e184a2e"}
    if fmt == "text":
        return render_text(TEXT_FORMATS[0].format, entry)
    return render_json(JSON_FORMATS[0].format, entry)


def run(tmp_path, *lines: str) -> tuple[int, list[dict]]:
    log = tmp_path / "caller-istio-proxy.log"
    log.write_text("\n".join(lines) + "\n")
    code, report = analyze_json(log)
    return code, report["findings"]


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("code, flags", [(503, ("URX",)), (502, ()), (504, ())])
def test_a_relayed_5xx_is_the_next_hops_answer(tmp_path, fmt, code, flags):
    rc, found = run(tmp_path, line(code, flags, "via_upstream", fmt=fmt), line(200, (), "via_upstream", fmt=fmt))
    assert rc == 1
    assert [f["detector"] for f in found] == ["next-hop"]
    f = found[0]
    assert f["severity"] == "error" and f["response_code_details"] == "via_upstream"
    assert SERVER in f["title"] and str(code) in f["title"]
    # the hop's own connection: the caller sidecar's upstream four-tuple, as the server pod's eth0 sees it
    assert (f["flow"]["client"], f["flow"]["server"]) == ("10.244.2.5:51234", SERVER)
    assert "--field-selector status.podIP=10.244.1.17" in f["remediation"]
    assert "kubectl meshdoctor watch -n default pod/" in f["remediation"]
    assert f["details"]["retries_spent"] is ("URX" in flags)
    assert ("retries were spent" in f["explanation"]) is ("URX" in flags)


def test_the_apps_own_answer_at_the_inbound_cluster_and_a_200_are_not_a_hop_failure(tmp_path):
    rc, found = run(tmp_path, line(502, (), "via_upstream", cluster="inbound|9080||"),
                    line(200, (), "via_upstream"), line(500, (), "via_upstream"))  # a relayed 500: the app's
    # the inbound 502 is the app's answer, told as such (app-5xx, info); none is the next hop's failure
    assert rc == 0 and [(f["detector"], f["severity"]) for f in found] == [("app-5xx", "info")]


def test_the_callers_own_failure_is_not_the_next_hops(tmp_path):
    rc, found = run(tmp_path, line(503, ("UF", "URX"),
                                   "upstream_reset_before_response_started{remote_connection_failure}"))
    assert rc == 1 and found and all(f["detector"] != "next-hop" for f in found)


@pytest.mark.parametrize("name, want", [
    ("outbound|9080|v1|reviews.default.svc.cluster.local", ("outbound", 9080, "v1", "reviews", "default")),
    ("outbound|80||httpbin.org", ("outbound", 80, "", None, None)),
    ("inbound|5000||", ("inbound", 5000, "", None, None)),
    ("inbound|9080|http|reviews.bookinfo.svc.cluster.local", ("inbound", 9080, "http", "reviews", "bookinfo")),
])
def test_istios_cluster_names_read(name, want):
    c = parse_istio_cluster(name)
    assert (c.direction, c.port, c.subset, c.service, c.namespace) == want


@pytest.mark.parametrize("name", [None, "", "PassthroughCluster", "BlackHoleCluster", "my-cluster",
                                  "outbound|x||h", "inbound|5000|"])
def test_other_cluster_names_are_not_istios(name):
    assert parse_istio_cluster(name) is None


def _caller_stats(path, success: int, retries: int, uptime: int) -> None:
    """A caller sidecar's /stats text (Envoy's `name: value` lines) for one outbound and one inbound cluster."""
    out = "outbound|9080||reviews.default.svc.cluster.local"
    path.write_text(
        f"cluster.{out}.upstream_rq_retry: {retries}\n"
        f"cluster.{out}.upstream_rq_retry_success: {success}\n"
        f"cluster.{out}.upstream_rq_total: {100 + retries}\n"
        "cluster.inbound|9080||.upstream_rq_retry_success: 7\n"
        f"server.uptime: {uptime}\n")


def test_retries_that_hid_the_next_hops_failures_are_a_warning(tmp_path):
    before, after = tmp_path / "stats-before.txt", tmp_path / "stats-after.txt"
    _caller_stats(before, success=2, retries=2, uptime=3600)
    _caller_stats(after, success=9, retries=10, uptime=3700)
    rc, report = analyze_json(before, after)
    hid = [f for f in report["findings"] if f["detector"] == "next-hop"]
    assert rc == 0 and len(hid) == 1 and hid[0]["severity"] == "warning"
    assert hid[0]["counters"] == {"cluster.outbound|9080||reviews.default.svc.cluster.local."
                                  "upstream_rq_retry_success": 7}
    assert "Retries hid failures" in hid[0]["title"]


def test_no_retry_answered_and_an_inbound_clusters_retries_are_no_hidden_failure(tmp_path):
    before, after = tmp_path / "stats-before.txt", tmp_path / "stats-after.txt"
    _caller_stats(before, success=2, retries=2, uptime=3600)
    _caller_stats(after, success=2, retries=2, uptime=3700)
    rc, report = analyze_json(before, after)
    assert rc == 0 and not [f for f in report["findings"] if f["detector"] == "next-hop"]
