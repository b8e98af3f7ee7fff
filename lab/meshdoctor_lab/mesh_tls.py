"""Istio's mutual TLS as istiod renders it into a sidecar: virtualInbound's filter chains for a PeerAuthentication
mode, the DownstreamTlsContext they terminate with, the UpstreamTlsContext a DestinationRule's ``ISTIO_MUTUAL``
gives an outbound cluster, and the certificates (SDS secrets ``default`` and ``ROOTCA``).

Sources (istio/istio): pilot/pkg/networking/core/filterchain_options.go (which chains a mode and a port's protocol
get), listener_inbound.go (passthrough chains, ``populateListenerFilters``, ``buildTLSInspector``),
pilot/pkg/security/authn/utils/utils.go ``BuildInboundTLS`` (the DownstreamTlsContext), cluster_tls.go
``buildUpstreamClusterTLSContext`` (the UpstreamTlsContext), pilot/pkg/networking/util/util.go (the ALPN lists).

A real sidecar fetches ``default`` (its workload certificate) and ``ROOTCA`` from pilot-agent over SDS; the lab has
no pilot-agent, so they are static secrets of the same names in the bootstrap, the certificate inline and the
private key read from the environment of Envoy's process (lab/pki.py makes both).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshdoctor_lab.sidecar_settings import SidecarSettings

_T = "type.googleapis.com/"
_TLS_SOCKET = "envoy.transport_sockets.tls"
_DOWNSTREAM_TLS = _T + "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
_UPSTREAM_TLS = _T + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"

# pilot/pkg/networking/core/listener.go and pilot/pkg/networking/util/util.go
MTLS_HTTP_ALPNS = ("istio-http/1.0", "istio-http/1.1", "istio-h2")
ALL_ISTIO_MTLS_ALPNS = ("istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2")
MTLS_TCP_WITH_MXC_ALPNS = ("istio-peer-exchange", "istio")
PLAINTEXT_HTTP_ALPNS = ("http/1.1", "h2c")  # without ISTIO_META_HTTP10 (features.HTTP10)
ALPN_HTTP = ("h2", "http/1.1")  # what the server side's TLS context offers for HTTP
ALPN_DOWNSTREAM_WITH_MXC = ("istio-peer-exchange", "h2", "http/1.1")  # ... and for TCP
ALPN_IN_MESH_WITH_MXC = ("istio-peer-exchange", "istio")  # what an ISTIO_MUTUAL client offers (HTTP/1 cluster)
# What istio/proxy's `istio.alpn` HTTP filter (pilot/pkg/xds/filters/filters.go Alpn, mtlsHTTP11ALPN) makes an
# outbound HTTP/1.1 request's mTLS connection offer instead: the filter is Istio's own, not in upstream Envoy.
ALPN_ISTIO_HTTP11 = ("istio-http/1.1", "istio", "http/1.1")
ALPN_ISTIO_H2 = ("istio-h2", "istio", "h2")  # ... and an HTTP/2 one's (mtlsHTTP2ALPN)
# BuildInboundTLS's SupportedCiphers
SUPPORTED_CIPHERS = ("ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256",
                     "ECDHE-RSA-AES128-GCM-SHA256", "AES256-GCM-SHA384", "AES128-GCM-SHA256")
SDS_DEFAULT = "default"
SDS_ROOT = "ROOTCA"
PASSTHROUGH_HTTP_CHAIN = "virtualInbound-catchall-http"  # model.VirtualInboundCatchAllHTTPFilterChainName
PASSTHROUGH_TCP_CHAIN = "virtualInbound"


@dataclass(frozen=True)
class MeshIdentity:
    """The workload certificate a sidecar holds: its SPIFFE id, the certificate chain and root (PEM text), and
    the name of the environment variable Envoy reads the private key from."""

    spiffe: str
    cert_chain_pem: str
    root_pem: str
    key_env: str


@dataclass(frozen=True)
class _Option:
    """One FilterChainMatchOptions of filterchain_options.go: what a chain matches and whether it terminates TLS."""

    protocol: str  # "http" or "tcp": an http_connection_manager or a tcp_proxy chain
    transport: str  # "tls" or "raw_buffer"
    alpns: tuple[str, ...] = ()
    tls: bool = False


_H, _TC = "http", "tcp"
# (listener protocol, mode) -> the options istiod builds chains from (getFilterChainMatchOptions)
_OPTIONS: dict[tuple[str, str], tuple[_Option, ...]] = {
    ("http", "STRICT"): (_Option(_H, "tls", tls=True),),
    ("http", "PERMISSIVE"): (_Option(_H, "tls", ALL_ISTIO_MTLS_ALPNS, tls=True), _Option(_H, "raw_buffer")),
    ("http", "DISABLE"): (_Option(_H, "raw_buffer"),),
    ("tcp", "STRICT"): (_Option(_TC, "tls", tls=True),),
    ("tcp", "PERMISSIVE"): (_Option(_TC, "tls", ALL_ISTIO_MTLS_ALPNS, tls=True), _Option(_TC, "tls"),
                            _Option(_TC, "raw_buffer")),
    ("tcp", "DISABLE"): (_Option(_TC, "raw_buffer"),),
    ("auto", "STRICT"): (_Option(_H, "tls", MTLS_HTTP_ALPNS, tls=True), _Option(_TC, "tls", tls=True)),
    ("auto", "PERMISSIVE"): (_Option(_H, "tls", MTLS_HTTP_ALPNS, tls=True), _Option(_H, "raw_buffer",
                                                                                   PLAINTEXT_HTTP_ALPNS),
                             _Option(_TC, "tls", MTLS_TCP_WITH_MXC_ALPNS, tls=True), _Option(_TC, "raw_buffer"),
                             _Option(_TC, "tls")),
    ("auto", "DISABLE"): (_Option(_H, "raw_buffer", PLAINTEXT_HTTP_ALPNS), _Option(_TC, "raw_buffer")),
}


def static_secrets(identity: MeshIdentity) -> list[dict[str, Any]]:
    """The SDS secrets ``default`` and ``ROOTCA`` as static bootstrap secrets."""
    return [
        {"name": SDS_DEFAULT, "tls_certificate": {
            "certificate_chain": {"inline_string": identity.cert_chain_pem},
            "private_key": {"environment_variable": identity.key_env}}},
        {"name": SDS_ROOT, "validation_context": {"trusted_ca": {"inline_string": identity.root_pem}}},
    ]


def _common_context(alpns: tuple[str, ...], sans: tuple[str, ...], tls_params: dict[str, Any]) -> dict[str, Any]:
    return {
        "alpn_protocols": list(alpns),
        "tls_params": tls_params,
        "tls_certificate_sds_secret_configs": [{"name": SDS_DEFAULT}],
        "combined_validation_context": {
            "default_validation_context": ({"match_subject_alt_names": [{"exact": s} for s in sans]} if sans else {}),
            "validation_context_sds_secret_config": {"name": SDS_ROOT}},
    }


def downstream_tls(protocol: str) -> dict[str, Any]:
    """The transport socket of an mTLS inbound chain (BuildInboundTLS): a client certificate required and checked
    against ROOTCA (no SAN match), TLS 1.2 to 1.3 with Istio's ciphers; ALPN h2, http/1.1 (and
    istio-peer-exchange first for a TCP chain)."""
    alpns = ALPN_HTTP if protocol == "http" else ALPN_DOWNSTREAM_WITH_MXC
    params = {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3",
              "cipher_suites": list(SUPPORTED_CIPHERS)}
    return {"name": _TLS_SOCKET, "typed_config": {
        "@type": _DOWNSTREAM_TLS, "common_tls_context": _common_context(alpns, (), params),
        "require_client_certificate": True}}


def upstream_istio_mutual(sni: str, sans: tuple[str, ...],
                          alpns: tuple[str, ...] = ALPN_IN_MESH_WITH_MXC) -> dict[str, Any]:
    """The transport socket a DestinationRule ``tls.mode: ISTIO_MUTUAL`` (or auto mTLS) gives an outbound cluster:
    the workload certificate, the server's SPIFFE id checked against ROOTCA, Istio's SNI and ``alpns`` (a TCP or
    HTTP/1 cluster's by default)."""
    params = {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"}
    return {"name": _TLS_SOCKET, "typed_config": {
        "@type": _UPSTREAM_TLS, "common_tls_context": _common_context(alpns, sans, params),
        "sni": sni}}


def _chain(name: str, port: int | None, option: _Option, filters: list[dict[str, Any]]) -> dict[str, Any]:
    match: dict[str, Any] = {"transport_protocol": option.transport}
    if port is not None:
        match["destination_port"] = port
    if option.alpns:
        match["application_protocols"] = list(option.alpns)
    chain: dict[str, Any] = {"name": name, "filter_chain_match": match, "filters": copy.deepcopy(filters)}
    if option.tls:
        chain["transport_socket"] = downstream_tls(option.protocol)
        for f in chain["filters"]:
            if f["name"] == "envoy.filters.network.http_connection_manager":
                # istiod's inbound HCM: the caller's identity from its certificate goes to the app in XFCC
                f["typed_config"]["set_current_client_cert_details"] = {"subject": True, "dns": True, "uri": True}
    return chain


FilterMaker = Callable[[str], list[dict[str, Any]]]  # chain protocol ("http"|"tcp") -> that chain's filters


def inbound_chains(ports: tuple[tuple[int, str], ...], settings: SidecarSettings,
                   port_filters: Callable[[int, str], list[dict[str, Any]]],
                   passthrough_filters: FilterMaker) -> list[dict[str, Any]]:
    """virtualInbound's chains under ``settings.mtls_mode``: each pod port's (port -> "http"|"tcp", named
    ``0.0.0.0_PORT``), then the passthrough chains (no destination port) for the workload's mode.
    ``port_filters(port, kind)`` and ``passthrough_filters(protocol)`` give the chains' network filters.

    Raises ValueError when the settings set no mTLS mode.
    """
    if settings.mtls_mode is None:
        raise ValueError("inbound_chains renders a PeerAuthentication mode; none is set")
    chains = []
    for port, kind in ports:
        mode = settings.port_mode(port) or settings.mtls_mode
        chains += [_chain(f"0.0.0.0_{port}", port, option, port_filters(port, kind))
                   for option in _OPTIONS[kind, mode]]
    for option in _OPTIONS["auto", settings.mtls_mode]:
        name = PASSTHROUGH_HTTP_CHAIN if option.protocol == "http" else PASSTHROUGH_TCP_CHAIN
        chains.append(_chain(name, None, option, passthrough_filters(option.protocol)))
    return chains


def inspectors(chains: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The TLS and HTTP inspectors istiod puts after original_dst for these chains (populateListenerFilters):
    each enabled where some chain needs it, disabled on the ports (destination port ranges) where none does."""
    needs: dict[int, tuple[bool, bool]] = {}  # port (0: no destination port) -> (TLS, HTTP)
    for chain in chains:
        match = chain.get("filter_chain_match", {})
        port = match.get("destination_port", 0)
        tls = match.get("transport_protocol") == "tls"
        http = any(a in ("http/1.1", "h2c") for a in match.get("application_protocols", ()))
        old = needs.get(port, (False, False))
        needs[port] = (old[0] or tls, old[1] or http)
    out = []
    if any(tls for tls, _ in needs.values()):
        tls_filter = {"name": "envoy.filters.listener.tls_inspector", "typed_config": {
            "@type": _T + "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
            "initial_read_buffer_size": 512}}
        if needs.get(0, (False, False))[0]:
            off = sorted(p for p, (tls, _) in needs.items() if p and not tls)
            if off:
                tls_filter["filter_disabled"] = _ports_predicate(off)
        else:
            on = sorted(p for p, (tls, _) in needs.items() if p and tls)
            tls_filter["filter_disabled"] = {"not_match": _ports_predicate(on)}
        out.append(tls_filter)
    if any(http for _, http in needs.values()):
        http_filter = {"name": "envoy.filters.listener.http_inspector", "typed_config": {
            "@type": _T + "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector"}}
        off = sorted(p for p, (_, http) in needs.items() if not http)
        if off:
            http_filter["filter_disabled"] = _ports_predicate(off)
        out.append(http_filter)
    return out


def _ports_predicate(ports: list[int]) -> dict[str, Any]:
    """A ListenerFilterChainMatchPredicate matching these destination ports ([start, end) ranges)."""
    rules = [{"destination_port_range": {"start": p, "end": p + 1}} for p in ports]
    return rules[0] if len(rules) == 1 else {"or_match": {"rules": rules}}
