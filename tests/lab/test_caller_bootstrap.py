"""The caller sidecar's bootstrap (lab/caller_sidecar.py): accepted by real Envoy (`--mode validate`, no root),
and shaped as istiod renders a sidecar's outbound side for one service (istio/istio pilot/pkg/networking/core)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace

import pytest

from meshdoctor_lab import netns, pki
from meshdoctor_lab.caller_sidecar import CallerPod, caller_bootstrap, caller_bootstrap_text
from meshdoctor_lab.istio_proxy import envoy_binary
from meshdoctor_lab.mesh_tls import MeshIdentity
from meshdoctor_lab.sidecar_settings import SidecarSettings
from meshdoctor_lab.state import MeshOptions

IDENTITY = MeshIdentity("spiffe://cluster.local/ns/shop/sa/default", "CERT", "ROOT", "KEY_VAR")
CALLER = CallerPod("reviews-caller", "shop", "198.18.1.1", "reviews", "198.18.1.2", ((5000, "http"), (5002, "tcp")),
                   IDENTITY)
VARIANTS = {
    "istio >= 1.24 default": (False, SidecarSettings()),
    "istio < 1.24 default (503 retried)": (True, SidecarSettings()),
    "a VirtualService timeout and retries": (False, SidecarSettings(route_timeout_s=1.0, route_retry_on="reset",
                                                                    route_retries=3)),
    "connectionPool limits and JSON log": (False, SidecarSettings(pool_max_connections=1, access_log_encoding="JSON")),
    "HTTP/2 between the sidecars": (False, SidecarSettings(h2_upstream=True)),
}


def _listener(config: dict, name: str) -> dict:
    (listener,) = [x for x in config["static_resources"]["listeners"] if x["name"] == name]
    return listener


def _cluster(config: dict, name: str) -> dict:
    (cluster,) = [x for x in config["static_resources"]["clusters"] if x["name"] == name]
    return cluster


def _route(config: dict) -> dict:
    hcm = _listener(config, "0.0.0.0_5000")["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm["route_config"]


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_envoy_accepts_the_caller_bootstrap(variant, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl (the lab's certificates)")
    retry_503, settings = variant
    issued = pki.pod_certificates(tmp_path / "ca", tmp_path / "pod", IDENTITY.spiffe)
    caller = pki.caller(tmp_path / "pod", IDENTITY.spiffe)
    pod = replace(CALLER, identity=caller.identity(), retry_503=retry_503)
    done = subprocess.run([envoy_binary(), "--mode", "validate", "--config-yaml", caller_bootstrap_text(pod, settings),
                           "-l", "error"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, pki.KEY_ENV: caller.key.read_text()})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert issued.spiffe == caller.spiffe


def test_listeners_are_istiods_outbound_ones():
    config = caller_bootstrap(CALLER, SidecarSettings())
    names = [x["name"] for x in config["static_resources"]["listeners"]]
    assert names == ["virtualOutbound", "0.0.0.0_5000", "198.18.1.2_5002"]
    outbound = _listener(config, "virtualOutbound")
    assert outbound["use_original_dst"] is True
    assert outbound["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 15001}
    for name in names[1:]:  # handed connections by virtualOutbound, never bound themselves
        assert _listener(config, name)["bind_to_port"] is False
    hcm = _listener(config, "0.0.0.0_5000")["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["stat_prefix"] == "outbound_0.0.0.0_5000;"
    assert "forward_client_cert_details" not in hcm  # XFCC is the inbound HCM's
    tcp = _listener(config, "198.18.1.2_5002")["filter_chains"][0]["filters"][0]["typed_config"]
    assert tcp["cluster"] == "outbound|5002||reviews.shop.svc.cluster.local"


def test_the_route_has_istios_default_retries_and_no_timeout():
    route_config = _route(caller_bootstrap(CALLER, SidecarSettings()))
    assert route_config["name"] == "5000" and route_config["ignore_port_in_host_matching"] is True
    service, allow_any = route_config["virtual_hosts"]
    assert service["name"] == "reviews.shop.svc.cluster.local:5000"
    assert service["domains"] == ["reviews.shop.svc.cluster.local", "reviews.shop.svc", "reviews.shop", "reviews",
                                  "198.18.1.2"]
    (route,) = service["routes"]
    action = route["route"]
    assert action["timeout"] == "0s" and action["max_grpc_timeout"] == "0s"
    policy = action["retry_policy"]
    assert policy["retry_on"] == "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
    assert policy["num_retries"] == 2
    assert [p["name"] for p in policy["retry_host_predicate"]] == ["envoy.retry_host_predicates.previous_hosts"]
    assert "retriable_status_codes" not in policy  # Istio >= 1.24: 503 is not retried by default
    assert allow_any["domains"] == ["*"] and allow_any["routes"][0]["route"]["cluster"] == "PassthroughCluster"


def test_istio_before_1_24_also_retries_503_and_a_virtualservice_sets_the_timeout():
    old = _route(caller_bootstrap(replace(CALLER, retry_503=True), SidecarSettings()))
    assert old["virtual_hosts"][0]["routes"][0]["route"]["retry_policy"]["retriable_status_codes"] == [503]
    timed = _route(caller_bootstrap(CALLER, SidecarSettings(route_timeout_s=1.0, route_retry_on="reset",
                                                            route_retries=3)))
    action = timed["virtual_hosts"][0]["routes"][0]["route"]
    assert action["timeout"] == "1.000s" and action["max_grpc_timeout"] == "1.000s"
    assert action["retry_policy"]["retry_on"] == "reset" and action["retry_policy"]["num_retries"] == 3
    assert "retriable_status_codes" not in action["retry_policy"]


def test_the_cluster_speaks_istio_mtls_to_endpoints_labelled_istio():
    cluster = _cluster(caller_bootstrap(CALLER, SidecarSettings()), "outbound|5000||reviews.shop.svc.cluster.local")
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert endpoint["endpoint"]["address"]["socket_address"] == {"address": "198.18.1.2", "port_value": 5000}
    assert endpoint["metadata"]["filter_metadata"]["envoy.transport_socket_match"] == {"tlsMode": "istio"}
    istio, disabled = cluster["transport_socket_matches"]
    assert (istio["name"], istio["match"]) == ("tlsMode-istio", {"tlsMode": "istio"})
    assert (disabled["name"], disabled["match"]) == ("tlsMode-disabled", {})
    assert disabled["transport_socket"]["name"] == "envoy.transport_sockets.raw_buffer"
    tls = istio["transport_socket"]["typed_config"]
    assert tls["sni"] == "outbound_.5000_._.reviews.shop.svc.cluster.local"
    common = tls["common_tls_context"]
    assert common["alpn_protocols"] == ["istio-http/1.1", "istio", "http/1.1"]
    assert common["combined_validation_context"]["default_validation_context"]["match_subject_alt_names"] == [
        {"exact": "spiffe://cluster.local/ns/shop/sa/default"}]
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert options["explicit_http_config"] == {"http_protocol_options": {}}
    tcp = _cluster(caller_bootstrap(CALLER, SidecarSettings()), "outbound|5002||reviews.shop.svc.cluster.local")
    tcp_tls = tcp["transport_socket_matches"][0]["transport_socket"]["typed_config"]
    assert tcp_tls["common_tls_context"]["alpn_protocols"] == ["istio-peer-exchange", "istio"]
    assert "typed_extension_protocol_options" not in tcp


def test_a_pod_without_a_sidecar_gets_an_endpoint_without_tls_mode():
    """Auto mTLS: no ``tlsMode: istio`` on the endpoint, so transport_socket_matches falls to tlsMode-disabled."""
    cluster = _cluster(caller_bootstrap(replace(CALLER, target_in_mesh=False), SidecarSettings()),
                       "outbound|5000||reviews.shop.svc.cluster.local")
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert "metadata" not in endpoint
    assert [m["name"] for m in cluster["transport_socket_matches"]] == ["tlsMode-istio", "tlsMode-disabled"]


def test_an_http2_port_is_h2_with_istio_h2_alpn():
    """goaway's port speaks HTTP/2 (h2_upstream): the caller's cluster too, offering istio-h2 first, so the pod's
    HCM (codec AUTO) picks h2 by the negotiated ALPN. An HTTP/1.1 ALPN with an h2 cluster made the pod's sidecar
    answer every request 400 DPE http1.codec_error (seen in the lab)."""
    cluster = _cluster(caller_bootstrap(CALLER, SidecarSettings(h2_upstream=True)),
                       "outbound|5000||reviews.shop.svc.cluster.local")
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert options["explicit_http_config"] == {"http2_protocol_options": {}}
    tls = cluster["transport_socket_matches"][0]["transport_socket"]["typed_config"]
    assert tls["common_tls_context"]["alpn_protocols"] == ["istio-h2", "istio", "h2"]


def test_only_what_reaches_a_caller_is_rendered_on_it():
    """A Sidecar's inbound idle timeout and ISTIO_META_HTTP10 are the pod's own: the caller's HCM has neither
    (downstream-idle's 0.5 s idle timeout on the caller closed the client's connection instead of the pod's)."""
    pod = SidecarSettings(hcm_idle_timeout_s=0.5, accept_http_10=True, upstream_max_requests_per_connection=1,
                          pool_max_connections=1, access_log_encoding="JSON")
    config = caller_bootstrap(CALLER, pod)
    hcm = _listener(config, "0.0.0.0_5000")["filter_chains"][0]["filters"][0]["typed_config"]
    assert "common_http_protocol_options" not in hcm and "http_protocol_options" not in hcm
    assert "json_format" in hcm["access_log"][0]["typed_config"]["log_format"]
    cluster = _cluster(config, "outbound|5000||reviews.shop.svc.cluster.local")
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert options["common_http_protocol_options"] == {"max_requests_per_connection": 1}
    assert cluster["circuit_breakers"]["thresholds"][0]["max_connections"] == 1
    assert config["node"]["metadata"]["HTTP10"] == "0"


def test_the_caller_namespace_gets_istio_init_outbound_rules_only():
    rules = netns.istio_outbound_rules()
    assert "-A PREROUTING" not in rules  # nothing calls the caller: no inbound capture
    assert "-A OUTPUT -j ISTIO_OUTPUT\n" in rules and "-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN\n" in rules
    assert rules.rstrip().endswith("-A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT")


@pytest.mark.parametrize(("name", "prefix"), [("meshdoctor-lab", "mdlab"), ("mesh31a", "mesh31a"),
                                              ("mdtest-j1a2b", None), ("averyverylongname", None)])
def test_a_short_lab_name_is_its_namespaces_prefix(name, prefix):
    got = netns.netns_prefix(name)
    if prefix is not None:
        assert got == prefix
    else:
        assert got.startswith("md") and len(got) == 8 and got != name


def test_the_caller_option_is_kept_in_the_state_and_older_states_have_none():
    mesh = MeshOptions(caller="sidecar", caller_retry_503=True)
    assert MeshOptions.from_json(mesh.to_json()) == mesh and mesh.caller_sidecar
    old = MeshOptions.from_json({"access_log_encoding": "TEXT", "legacy_inbound": False})  # before the option
    assert old.caller == "none" and not old.caller_sidecar and not old.caller_retry_503
    with pytest.raises(ValueError, match="caller 'ambient'"):
        MeshOptions(caller="ambient")
