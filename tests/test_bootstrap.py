"""The lab's Envoy bootstrap: every setting a scenario or the mesh may turn is accepted by real Envoy (its own
`--mode validate`, no root, nothing bound), and is rendered the way Istio renders it."""

from __future__ import annotations

import json
import subprocess

import pytest

from kubectl_meshdoctor.lab.bootstrap import BootstrapPod, SidecarSettings, bootstrap, bootstrap_text
from kubectl_meshdoctor.lab.istio_proxy import envoy_binary

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
}


@pytest.mark.parametrize("settings", VARIANTS.values(), ids=VARIANTS.keys())
def test_envoy_accepts_the_bootstrap(settings, tmp_path):
    done = subprocess.run([envoy_binary(), "--mode", "validate", "--config-yaml", bootstrap_text(POD, settings),
                           "-l", "error"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def _inbound(config: dict) -> dict:
    (listener,) = [x for x in config["static_resources"]["listeners"] if x["name"] == "virtualInbound"]
    return listener


def _hcm(config: dict) -> dict:
    chain = next(c for c in _inbound(config)["filter_chains"] if c["filter_chain_match"]["destination_port"] == 5000)
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
