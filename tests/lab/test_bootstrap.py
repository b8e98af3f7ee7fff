"""The lab's Envoy bootstrap: every setting a scenario or the mesh may turn is accepted by real Envoy (its own
`--mode validate`, no root, nothing bound), and is rendered the way Istio renders it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace

import pytest

from meshdoctor_lab import pki
from meshdoctor_lab.bootstrap import BootstrapPod, SidecarSettings, bootstrap, bootstrap_text
from meshdoctor_lab.istio_proxy import envoy_binary
from meshdoctor_lab.mesh_tls import MeshIdentity

POD = BootstrapPod("reviews", "shop", "198.18.1.2", ((5000, "http"), (5002, "tcp")))
VARIANTS = {
    "istio default": SidecarSettings(),
    "istio < 1.10": SidecarSettings(legacy_inbound=True),
    "JSON access log": SidecarSettings(access_log_encoding="JSON"),
    "timeouts": SidecarSettings(hcm_idle_timeout_s=2.5, upstream_idle_timeout_s=1.0, route_timeout_s=0.5),
    "no keep-alive to the app": SidecarSettings(upstream_max_requests_per_connection=1, upstream_idle_timeout_s=2.0),
    "HTTP/1.0 and h2 to the app": SidecarSettings(accept_http_10=True, h2_upstream=True),
    "TPROXY interception": SidecarSettings(interception_mode="TPROXY"),
    "retries on the route": SidecarSettings(route_retry_on="refused-stream,connect-failure,reset", route_retries=3),
    "connectionPool limits": SidecarSettings(pool_max_connections=1, pool_max_pending_requests=1, pool_max_requests=2),
    "outlierDetection": SidecarSettings(outlier_consecutive_5xx=5, outlier_interval_s=1.0, outlier_base_ejection_s=2.0,
                                        outlier_max_ejection_percent=100),
    "VirtualService without a default route": SidecarSettings(vs_prefixes=("/v1", "/v2")),
    "DestinationRule ISTIO_MUTUAL": SidecarSettings(upstream_tls_mode="ISTIO_MUTUAL"),
    "PeerAuthentication STRICT": SidecarSettings(mtls_mode="STRICT"),
    "STRICT with a PERMISSIVE port": SidecarSettings(mtls_mode="STRICT", port_mtls=((5000, "PERMISSIVE"),)),
    "PERMISSIVE with a DISABLE port": SidecarSettings(mtls_mode="PERMISSIVE", port_mtls=((5002, "DISABLE"),)),
}


@pytest.fixture(scope="module")
def issued(tmp_path_factory) -> pki.Issued:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl (the lab's certificates)")
    base = tmp_path_factory.mktemp("pki")
    return pki.pod_certificates(base / "ca", base / "pod", "spiffe://cluster.local/ns/shop/sa/default")


@pytest.mark.parametrize("settings", VARIANTS.values(), ids=VARIANTS.keys())
def test_envoy_accepts_the_bootstrap(settings, issued, tmp_path):
    pod = replace(POD, identity=issued.identity())
    done = subprocess.run([envoy_binary(), "--mode", "validate", "--config-yaml", bootstrap_text(pod, settings),
                           "-l", "error"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, pki.KEY_ENV: issued.key.read_text()})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def _inbound(config: dict) -> dict:
    (listener,) = [x for x in config["static_resources"]["listeners"] if x["name"] == "virtualInbound"]
    return listener


def _hcm(config: dict) -> dict:
    chain = next(c for c in _inbound(config)["filter_chains"]
                 if c["filter_chain_match"].get("destination_port") == 5000)
    return chain["filters"][0]["typed_config"]


def _cluster(config: dict, name: str) -> dict:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == name)


def test_the_default_is_istios_inbound_shape():
    config = bootstrap(POD)
    inbound = _inbound(config)
    assert inbound["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 15006}
    assert [f["name"] for f in inbound["listener_filters"]] == ["envoy.filters.listener.original_dst"]
    ports = {c["filter_chain_match"]["destination_port"]: c["filters"][0]["name"] for c in inbound["filter_chains"]}
    assert ports == {15006: "envoy.filters.network.tcp_proxy", 5000: "envoy.filters.network.http_connection_manager",
                     5002: "envoy.filters.network.tcp_proxy"}
    hcm = _hcm(config)
    assert hcm["server_name"] == "istio-envoy" and hcm["stat_prefix"] == "inbound_0.0.0.0_5000;"
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route == {"cluster": "inbound|5000||", "timeout": "0s",
                     "max_stream_duration": {"max_stream_duration": "0s", "grpc_timeout_header_max": "0s"}}
    cluster = _cluster(config, "inbound|5000||")
    assert (cluster["type"], cluster["lb_policy"]) == ("ORIGINAL_DST", "CLUSTER_PROVIDED")
    assert cluster["upstream_bind_config"]["source_address"]["address"] == "127.0.0.6"
    assert config["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 15000}
    log = hcm["access_log"][0]["typed_config"]
    assert log["path"] == "/dev/stdout" and "text_format_source" in log["log_format"]


def test_settings_are_rendered_as_istio_renders_them():
    legacy = _cluster(bootstrap(POD, VARIANTS["istio < 1.10"]), "inbound|5000||")
    assert legacy["type"] == "STATIC" and "upstream_bind_config" not in legacy
    endpoint = legacy["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert endpoint == {"address": "127.0.0.1", "port_value": 5000}
    timed = bootstrap(POD, VARIANTS["timeouts"])
    route = _hcm(timed)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    # A VirtualService timeout: timeout and max_grpc_timeout, no max_stream_duration (it would override).
    assert route == {"cluster": "inbound|5000||", "timeout": "0.500s", "max_grpc_timeout": "0.500s"}
    assert _hcm(timed)["common_http_protocol_options"] == {"idle_timeout": "2.500s"}
    options = _cluster(timed, "inbound|5000||")["typed_extension_protocol_options"]
    assert json.dumps(options).count('"idle_timeout": "1.000s"') == 1
    h2 = bootstrap(POD, VARIANTS["HTTP/1.0 and h2 to the app"])
    assert _hcm(h2)["http_protocol_options"] == {"accept_http_10": True}
    assert "explicit_http_config" in json.dumps(_cluster(h2, "inbound|5000||"))
    json_log = _hcm(bootstrap(POD, VARIANTS["JSON access log"]))["access_log"][0]["typed_config"]["log_format"]
    assert "json_format" in json_log


def test_tproxy_listeners_are_transparent_and_keep_the_client_address():
    tproxy = bootstrap(POD, VARIANTS["TPROXY interception"])
    inbound = _inbound(tproxy)
    assert inbound["transparent"] is True
    filters = [f["name"] for f in inbound["listener_filters"]]
    assert filters == ["envoy.filters.listener.original_dst", "envoy.filters.listener.original_src"]
    assert inbound["listener_filters"][1]["typed_config"]["mark"] == 1337  # istio-iptables routes it to table 133
    (outbound,) = [x for x in tproxy["static_resources"]["listeners"] if x["name"] == "virtualOutbound"]
    assert outbound["transparent"] is True
    assert tproxy["node"]["metadata"]["INTERCEPTION_MODE"] == "TPROXY"
    default = bootstrap(POD)
    assert "transparent" not in _inbound(default) and len(_inbound(default)["listener_filters"]) == 1


@pytest.mark.parametrize("bad", [dict(access_log_encoding="XML"), dict(route_timeout_s=0), dict(hcm_idle_timeout_s=-1),
                                 dict(upstream_max_requests_per_connection=0), dict(interception_mode="NONE")])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SidecarSettings(**bad)


IDENTITY = MeshIdentity("spiffe://cluster.local/ns/shop/sa/default", "CHAIN", "ROOT", "KEY_VAR")
MTLS_POD = replace(POD, identity=IDENTITY)


def _routes(config: dict) -> list[dict]:
    return _hcm(config)["route_config"]["virtual_hosts"][0]["routes"]


def test_a_connection_pool_is_the_clusters_circuit_breaker_inbound_too():
    limited = bootstrap(POD, VARIANTS["connectionPool limits"])
    (threshold,) = _cluster(limited, "inbound|5000||")["circuit_breakers"]["thresholds"]
    assert threshold == {"max_connections": 1, "max_pending_requests": 1, "max_requests": 2,
                         "max_retries": 4294967295, "track_remaining": True}
    (default,) = _cluster(bootstrap(POD), "inbound|5000||")["circuit_breakers"]["thresholds"]
    assert set(default.values()) == {4294967295, True}


def test_outlier_detection_goes_on_a_standin_for_the_callers_outbound_cluster():
    config = bootstrap(POD, VARIANTS["outlierDetection"])
    name = "outbound|5000||reviews.shop.svc.cluster.local"
    assert _routes(config)[0]["route"]["cluster"] == name
    cluster = _cluster(config, name)
    assert cluster["outlier_detection"] == {"enforcing_success_rate": 0, "consecutive_5xx": 5,
                                            "enforcing_consecutive_5xx": 100, "interval": "1.000s",
                                            "base_ejection_time": "2.000s", "max_ejection_percent": 100}
    # istiod: minHealthPercent unset is 0, which turns panic routing off
    assert cluster["common_lb_config"] == {"healthy_panic_threshold": {"value": 0}}
    assert cluster["type"] == "STATIC" and cluster["lb_policy"] == "LEAST_REQUEST"
    assert cluster["upstream_bind_config"]["source_address"]["address"] == "127.0.0.6"
    panic = bootstrap(POD, SidecarSettings(outlier_consecutive_5xx=5, outlier_min_health_percent=50))
    assert _cluster(panic, name)["common_lb_config"] == {"healthy_panic_threshold": {"value": 50}}
    assert "max_ejection_percent" not in _cluster(panic, name)["outlier_detection"]  # Envoy's default, 10


def test_a_virtualservice_without_a_catch_all_routes_only_its_prefixes():
    routes = _routes(bootstrap(POD, VARIANTS["VirtualService without a default route"]))
    assert [r["match"] for r in routes] == [{"prefix": "/v1", "case_sensitive": True},
                                            {"prefix": "/v2", "case_sensitive": True}]
    fixed = _routes(bootstrap(POD, SidecarSettings(vs_prefixes=("/v1",), vs_catch_all=True)))
    assert fixed[-1]["match"] == {"prefix": "/", "case_sensitive": True}


def test_istio_mutual_originates_mtls_with_istios_sni_alpn_and_secrets():
    config = bootstrap(MTLS_POD, VARIANTS["DestinationRule ISTIO_MUTUAL"])
    cluster = _cluster(config, "outbound|5000||reviews.shop.svc.cluster.local")
    tls = cluster["transport_socket"]["typed_config"]
    assert tls["sni"] == "outbound_.5000_._.reviews.shop.svc.cluster.local"
    common = tls["common_tls_context"]
    assert common["alpn_protocols"] == ["istio-peer-exchange", "istio"]
    assert common["tls_certificate_sds_secret_configs"] == [{"name": "default"}]
    validation = common["combined_validation_context"]
    assert validation["default_validation_context"]["match_subject_alt_names"] == [{"exact": IDENTITY.spiffe}]
    assert validation["validation_context_sds_secret_config"] == {"name": "ROOTCA"}
    secrets = {s["name"]: s for s in config["static_resources"]["secrets"]}
    assert secrets["default"]["tls_certificate"]["private_key"] == {"environment_variable": "KEY_VAR"}
    disabled = bootstrap(POD, SidecarSettings(upstream_tls_mode="DISABLE"))
    assert "transport_socket" not in _cluster(disabled, "outbound|5000||reviews.shop.svc.cluster.local")
    with pytest.raises(ValueError, match="certificate"):
        bootstrap(POD, VARIANTS["DestinationRule ISTIO_MUTUAL"])


def test_strict_mtls_leaves_no_plaintext_chain():
    inbound = _inbound(bootstrap(MTLS_POD, VARIANTS["PeerAuthentication STRICT"]))
    assert "default_filter_chain" not in inbound
    assert [f["name"] for f in inbound["listener_filters"]] == ["envoy.filters.listener.original_dst",
                                                                "envoy.filters.listener.tls_inspector"]
    tls_inspector = inbound["listener_filters"][1]
    assert tls_inspector["filter_disabled"] == {"destination_port_range": {"start": 15006, "end": 15007}}
    matches = [(c["name"], c["filter_chain_match"]) for c in inbound["filter_chains"]]
    assert ("0.0.0.0_5000", {"transport_protocol": "tls", "destination_port": 5000}) in matches
    assert ("virtualInbound-catchall-http", {"transport_protocol": "tls", "application_protocols": [
        "istio-http/1.0", "istio-http/1.1", "istio-h2"]}) in matches
    assert not [m for _, m in matches if m.get("transport_protocol") == "raw_buffer"]
    chain = next(c for c in inbound["filter_chains"] if c["name"] == "0.0.0.0_5000")
    downstream = chain["transport_socket"]["typed_config"]
    assert downstream["require_client_certificate"] is True
    assert downstream["common_tls_context"]["alpn_protocols"] == ["h2", "http/1.1"]
    # the listener's own log keeps the connections no chain takes (Istio's listener access log: NR only)
    assert inbound["access_log"][0]["filter"] == {"response_flag_filter": {"flags": ["NR"]}}


def test_a_permissive_port_takes_plaintext_beside_mtls():
    inbound = _inbound(bootstrap(MTLS_POD, VARIANTS["STRICT with a PERMISSIVE port"]))
    port = [c["filter_chain_match"] for c in inbound["filter_chains"] if c["name"] == "0.0.0.0_5000"]
    assert port == [{"transport_protocol": "tls", "destination_port": 5000, "application_protocols": [
        "istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"]},
                    {"transport_protocol": "raw_buffer", "destination_port": 5000}]
    permissive = _inbound(bootstrap(MTLS_POD, VARIANTS["PERMISSIVE with a DISABLE port"]))
    names = [f["name"] for f in permissive["listener_filters"]]
    assert names[-1] == "envoy.filters.listener.http_inspector"  # the passthrough's plaintext HTTP ALPNs


@pytest.mark.parametrize("bad", [dict(pool_max_connections=0), dict(outlier_max_ejection_percent=101),
                                 dict(upstream_tls_mode="SIMPLE"), dict(mtls_mode="UNSET"),
                                 dict(port_mtls=((5000, "STRICT"),)), dict(vs_prefixes=("v1",))])
def test_bad_policy_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SidecarSettings(**bad)
