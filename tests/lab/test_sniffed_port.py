"""A port without a declared protocol (lab scenario `server-first`): how the lab reads its name (lab.port_kind), the
callers' sniffed listener as istiod renders it (pilot/pkg/networking/core listener.go, ListenerProtocolAuto), and
real Envoy accepting it (`--mode validate`, no root). Its behaviour is measured in test_server_first_lab.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace

import pytest

from meshdoctor_lab import pki
from meshdoctor_lab.caller_sidecar import SNIFFED_HTTP_ALPNS, CallerPod, caller_bootstrap, caller_bootstrap_text
from meshdoctor_lab.istio_proxy import envoy_binary
from meshdoctor_lab.lab import inbound_kind, port_kind
from meshdoctor_lab.mesh_tls import MeshIdentity
from meshdoctor_lab.sidecar_settings import SidecarSettings

IDENTITY = MeshIdentity("spiffe://cluster.local/ns/shop/sa/default", "CERT", "ROOT", "KEY_VAR")
CALLER = CallerPod("db-caller", "shop", "198.18.1.1", "db", "198.18.1.2", ((5000, "http"), (5002, "auto")), IDENTITY)
HTTP_INSPECTOR = "envoy.filters.listener.http_inspector"


@pytest.mark.parametrize(("name", "kind"), [("http", "http"), ("http-web", "http"), ("grpc-web", "http"),
                                            ("tcp-echo", "tcp"), ("mysql", "tcp"), ("tls-db", "tcp"),
                                            ("greeting", "auto"), ("db", "auto")])
def test_a_port_name_without_a_protocol_prefix_is_sniffed(name, kind):
    assert port_kind(name) == kind
    assert inbound_kind(name) == ("tcp" if kind == "auto" else kind)  # the pod's own sidecar: TCP


def test_the_sniffed_listener_waits_for_the_clients_bytes_without_timeout():
    config = caller_bootstrap(CALLER, SidecarSettings())
    (listener,) = [x for x in config["static_resources"]["listeners"] if x["name"] == "198.18.1.2_5002"]
    assert [f["name"] for f in listener["listener_filters"]] == [HTTP_INSPECTOR]
    assert listener["listener_filters_timeout"] == "0s" and listener["continue_on_listener_filters_timeout"]
    assert listener["bind_to_port"] is False and listener["address"]["socket_address"]["address"] == "198.18.1.2"
    (http_chain,) = listener["filter_chains"]
    match = http_chain["filter_chain_match"]
    assert match == {"transport_protocol": "raw_buffer", "application_protocols": list(SNIFFED_HTTP_ALPNS)}
    hcm = http_chain["filters"][0]["typed_config"]
    assert hcm["stat_prefix"] == "outbound_198.18.1.2_5002;"
    assert hcm["route_config"]["name"] == "db.shop.svc.cluster.local:5002"
    (tcp,) = listener["default_filter_chain"]["filters"]
    assert tcp["typed_config"]["cluster"] == "outbound|5002||db.shop.svc.cluster.local"
    # a declared HTTP port keeps the lab's own listener (no inspector: docs/lab-envoy.md says what differs)
    (http,) = [x for x in config["static_resources"]["listeners"] if x["name"] == "0.0.0.0_5000"]
    assert "listener_filters" not in http


def test_envoy_accepts_the_sniffed_listener(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl (the lab's certificates)")
    pki.pod_certificates(tmp_path / "ca", tmp_path / "pod", IDENTITY.spiffe)
    caller = pki.caller(tmp_path / "pod", IDENTITY.spiffe)
    pod = replace(CALLER, identity=caller.identity())
    done = subprocess.run([envoy_binary(), "--mode", "validate", "--config-yaml",
                           caller_bootstrap_text(pod, SidecarSettings()), "-l", "error"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, pki.KEY_ENV: caller.key.read_text()})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
