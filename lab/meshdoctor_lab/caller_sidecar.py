"""The caller's sidecar: the Envoy a lab pod's callers go through (`lab up --caller sidecar`), rendered as istiod
renders a sidecar's outbound side for one Kubernetes service, the lab pod's.

Sources (istio/istio, pilot/pkg/networking/core): listener.go ``buildSidecarOutboundHTTPListenerOpts`` (listener
``0.0.0.0_PORT``, HCM stat prefix ``outbound_0.0.0.0_PORT;``, route config named by the port), httproute.go
(virtual host ``HOST:PORT`` with the service's host names and VIP as domains, ``ignore_port_in_host_matching``,
the ``allow_any`` virtual host to PassthroughCluster last), route/route.go ``BuildDefaultHTTPOutboundRoute`` and
``setTimeout`` (route ``default``: timeout 0s or a VirtualService's, ``max_grpc_timeout`` the same),
route/retry/retry.go (the default retry policy), cluster_builder.go and cluster_tls.go (``outbound|PORT||HOST``,
auto mTLS as ``transport_socket_matches`` on the endpoint's ``tlsMode``), a TCP port's ``VIP_PORT`` listener
with a tcp_proxy, a port of no declared protocol's sniffed ``VIP_PORT`` listener (``sniffed_listener``).

What differs, and why: the endpoint is static (no EDS: the lab has no istiod) and the pod IP stands in for the
service's ClusterIP; the HTTP mTLS connection offers what istio/proxy's ``istio.alpn`` filter would set
(``istio-http/1.1``, ``istio``, ``http/1.1``) from the cluster's own TLS context, since upstream Envoy has no
such filter; no metadata exchange or stats filters (Istio's own extensions). docs/lab-envoy.md has the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from meshdoctor_lab.bootstrap import (
    egress_clusters,
    hcm_filter,
    http_options,
    sidecar_bootstrap,
    tcp_proxy_filter,
    virtual_outbound,
)
from meshdoctor_lab.mesh_tls import (
    ALPN_IN_MESH_WITH_MXC,
    ALPN_ISTIO_H2,
    ALPN_ISTIO_HTTP11,
    MeshIdentity,
    upstream_istio_mutual,
)
from meshdoctor_lab.outbound import (
    outbound_cluster_name,
    service_host,
    spiffe_id,
    static_outbound_cluster,
    vs_routes,
)
from meshdoctor_lab.sidecar_settings import SidecarSettings

# route/retry/retry.go: the default policy of every outbound route no VirtualService retries block replaces
RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
DEFAULT_RETRIES = 2
# Istio < 1.24 also retried 503 (RetriableStatusCodes [503]); 1.24 left it out unless
# EXCLUDE_UNSAFE_503_FROM_DEFAULT_RETRY=false, and 1.27 removed that switch (commits 65aaaf4f8c5, 748c90d41d4).
RETRIABLE_503 = (503,)
# listener.go plaintextHTTPALPNs: what the http_inspector's verdict must be for the sniffed port's HCM chain
SNIFFED_HTTP_ALPNS = ("http/1.1", "h2c")
PROTOCOL_DETECTION_TIMEOUT = "0s"  # meshConfig.protocolDetectionTimeout's default (pkg/config/mesh/mesh.go)
TLS_MODE_METADATA = "envoy.transport_socket_match"  # the endpoint metadata transport_socket_matches look at


@dataclass(frozen=True)
class CallerPod:
    """A caller and the one service it calls: the caller pod's ``name``, ``namespace`` and ``ip``; the called
    pod's ``target`` name, ``target_ip`` (standing in for its service's ClusterIP) and ``ports`` (port ->
    "http"|"tcp"|"auto", the last sniffed); the caller's workload certificate; ``retry_503``: Istio < 1.24's
    default retry policy; ``target_in_mesh``: the called pod has a sidecar (its endpoint carries ``tlsMode: istio``, so auto mTLS
    picks Istio mTLS; without it, plaintext)."""

    name: str
    namespace: str
    ip: str
    target: str
    target_ip: str
    ports: tuple[tuple[int, str], ...]
    identity: MeshIdentity
    retry_503: bool = False
    target_in_mesh: bool = True


def caller_settings(pod: SidecarSettings) -> SidecarSettings:
    """What of the called pod's Istio settings reaches its callers' sidecars: the mesh's access-log encoding, a
    VirtualService's timeout, retries and http match prefixes (the callers' route), a DestinationRule's
    connectionPool, outlierDetection and tls mode (the callers' outbound cluster), and the port's protocol
    (HTTP/2 or not). The rest is the pod's own sidecar's (a Sidecar's inbound idle timeout, ISTIO_META_HTTP10,
    interception, PeerAuthentication): Istio's defaults here."""
    return SidecarSettings(
        access_log_encoding=pod.access_log_encoding, route_timeout_s=pod.route_timeout_s,
        route_retry_on=pod.route_retry_on, route_retries=pod.route_retries,
        pool_max_connections=pod.pool_max_connections, pool_max_pending_requests=pod.pool_max_pending_requests,
        pool_max_requests=pod.pool_max_requests, upstream_idle_timeout_s=pod.upstream_idle_timeout_s,
        upstream_max_requests_per_connection=pod.upstream_max_requests_per_connection, h2_upstream=pod.h2_upstream,
        outlier_consecutive_5xx=pod.outlier_consecutive_5xx, outlier_interval_s=pod.outlier_interval_s,
        outlier_base_ejection_s=pod.outlier_base_ejection_s,
        outlier_max_ejection_percent=pod.outlier_max_ejection_percent,
        outlier_min_health_percent=pod.outlier_min_health_percent, upstream_tls_mode=pod.upstream_tls_mode,
        vs_prefixes=pod.vs_prefixes, vs_catch_all=pod.vs_catch_all)


def retry_policy(retry_503: bool, settings: SidecarSettings) -> dict[str, Any]:
    """The outbound route's ``retry_policy``: a VirtualService's ``retries`` (``settings.route_retry_on``, its
    attempts) or Istio's default, which retries 503 only when ``retry_503``."""
    policy: dict[str, Any] = {
        "retry_on": settings.route_retry_on or RETRY_ON,
        "num_retries": settings.route_retries or DEFAULT_RETRIES,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": "5",
    }
    if settings.route_retry_on:  # a VirtualService's retryOn: its status codes (the lab's scenarios give 503)
        if "retriable-status-codes" in settings.route_retry_on:
            policy["retriable_status_codes"] = list(RETRIABLE_503)
    elif retry_503:
        policy["retriable_status_codes"] = list(RETRIABLE_503)
    return policy


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


def outbound_route_config(caller: CallerPod, port: int, settings: SidecarSettings) -> dict[str, Any]:
    """Route configuration ``PORT``: the service's virtual host, then ``allow_any``. Without a VirtualService
    match its one route ``default`` to ``outbound|PORT||HOST`` (a VirtualService timeout from
    ``settings.route_timeout_s``); with ``settings.vs_prefixes`` one route a prefix (route/route.go
    ``TranslateRoute``, unnamed when the VirtualService's http route is), so that a path outside them matches
    the virtual host but no route: the caller answers 404 NR."""
    host = service_host(caller.target, caller.namespace)
    timeout = _duration(settings.route_timeout_s) if settings.route_timeout_s is not None else "0s"
    short = host.split(".svc.", 1)[0]  # POD.NS: the caller is in the same namespace, so POD and POD.NS resolve
    domains = [host, f"{short}.svc", short, caller.target, caller.target_ip]
    cluster = outbound_cluster_name(caller.target, caller.namespace, port)
    action = {"cluster": cluster, "timeout": timeout, "retry_policy": retry_policy(caller.retry_503, settings),
              "max_grpc_timeout": timeout}
    operation = f"{host}:{port}/*"
    if settings.vs_prefixes:
        routes = vs_routes(cluster, action, operation, settings)
    else:
        routes = [{"name": "default", "match": {"prefix": "/"}, "route": action, "decorator": {"operation": operation}}]
    allow_any = {"name": "allow_any", "domains": ["*"], "include_request_attempt_count": True, "routes": [{
        "name": "allow_any", "match": {"prefix": "/"},
        "route": {"cluster": "PassthroughCluster", "timeout": "0s", "max_grpc_timeout": "0s"}}]}
    return {"name": str(port), "virtual_hosts": [
        {"name": f"{host}:{port}", "domains": domains, "routes": routes, "include_request_attempt_count": True},
        allow_any], "validate_clusters": False, "max_direct_response_body_size_bytes": 1048576,
        "ignore_port_in_host_matching": True}


def outbound_listener(caller: CallerPod, port: int, kind: str, settings: SidecarSettings) -> dict[str, Any]:
    """``0.0.0.0_PORT`` (an HTTP port: an outbound HCM) or ``VIP_PORT`` (a TCP port: a tcp_proxy), not bound:
    virtualOutbound hands them the connections dialled at that port (or address and port)."""
    cluster = outbound_cluster_name(caller.target, caller.namespace, port)
    if kind == "auto":
        return sniffed_listener(caller, port, settings)
    if kind == "http":
        hcm = hcm_filter(f"outbound_0.0.0.0_{port};", outbound_route_config(caller, port, settings), settings)
        # istiod sets the client certificate details (APPEND_FORWARD, XFCC) on inbound HCMs only
        del hcm["typed_config"]["forward_client_cert_details"]
        name, address, filters = f"0.0.0.0_{port}", "0.0.0.0", [hcm]
    else:
        name, address = f"{caller.target_ip}_{port}", caller.target_ip
        filters = [tcp_proxy_filter(cluster, cluster, settings)]
    return {"name": name, "address": {"socket_address": {"address": address, "port_value": port}},
            "traffic_direction": "OUTBOUND", "bind_to_port": False,
            "filter_chains": [{"filters": filters}]}


def sniffed_listener(caller: CallerPod, port: int, settings: SidecarSettings) -> dict[str, Any]:
    """``VIP_PORT`` for a port of no declared protocol (a name without a protocol prefix, no appProtocol), as
    istiod renders it (listener.go buildSidecarOutboundListener, ListenerProtocolAuto, and
    buildListenerFromEntry): the ``http_inspector`` listener filter sniffs the first bytes the client sends; the
    HCM chain (stat prefix ``outbound_VIP_PORT;``, route config ``HOST:PORT``) matches its application
    protocols ``http/1.1``/``h2c`` on raw_buffer, the tcp_proxy chain is the default. ``listener_filters_timeout``
    is meshConfig.protocolDetectionTimeout, 0s (no timeout) since Istio 1.8 (commit 47a5927bdc7), with
    ``continue_on_listener_filters_timeout``: so a client that sends nothing first waits for ever."""
    cluster = outbound_cluster_name(caller.target, caller.namespace, port)
    host = service_host(caller.target, caller.namespace)
    name = f"{caller.target_ip}_{port}"
    route = {**outbound_route_config(caller, port, settings), "name": f"{host}:{port}"}
    hcm = hcm_filter(f"outbound_{name};", route, settings)
    del hcm["typed_config"]["forward_client_cert_details"]
    http_chain = {"filter_chain_match": {"transport_protocol": "raw_buffer",
                                         "application_protocols": list(SNIFFED_HTTP_ALPNS)}, "filters": [hcm]}
    tcp_chain = {"filters": [tcp_proxy_filter(cluster, cluster, settings)]}
    return {"name": name, "address": {"socket_address": {"address": caller.target_ip, "port_value": port}},
            "traffic_direction": "OUTBOUND", "bind_to_port": False,
            "listener_filters": [{"name": "envoy.filters.listener.http_inspector", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.listener.http_inspector.v3.HttpInspector"}}],
            "listener_filters_timeout": PROTOCOL_DETECTION_TIMEOUT,
            "continue_on_listener_filters_timeout": True,
            "filter_chains": [http_chain], "default_filter_chain": tcp_chain}


def outbound_cluster(caller: CallerPod, port: int, kind: str, settings: SidecarSettings) -> dict[str, Any]:
    """``outbound|PORT||HOST``: one static endpoint, labelled ``tlsMode: istio`` when the pod has a sidecar, and
    auto mTLS: to such an endpoint Istio's SNI, the server's SPIFFE id, the ALPN of the port's protocol; to another
    plaintext (``tlsMode-disabled``). A DestinationRule's tls mode replaces auto mTLS (cluster_tls.go
    applyUpstreamTLSSettings: ISTIO_MUTUAL is one ``transport_socket`` whatever the endpoint, DISABLE none), and
    its outlierDetection is the cluster's ``outlier_detection`` with ``healthy_panic_threshold`` from
    ``minHealthPercent`` (cluster_traffic_policy.go applyOutlierDetection)."""
    name = outbound_cluster_name(caller.target, caller.namespace, port)
    if kind != "http":
        alpns = ALPN_IN_MESH_WITH_MXC
    else:  # HTTP/2 when the port is (appProtocol http2, h2UpgradePolicy): the server's HCM picks h2 by ALPN
        alpns = ALPN_ISTIO_H2 if settings.h2_upstream else ALPN_ISTIO_HTTP11
    tls = upstream_istio_mutual(f"outbound_.{port}_._.{service_host(caller.target, caller.namespace)}",
                                (spiffe_id(caller.namespace),), alpns)
    in_mesh = {"filter_metadata": {TLS_MODE_METADATA: {"tlsMode": "istio"}}} if caller.target_in_mesh else None
    cluster = static_outbound_cluster(name, caller.target_ip, port, settings, in_mesh)
    if settings.upstream_tls_mode == "ISTIO_MUTUAL":
        cluster["transport_socket"] = tls
    elif settings.upstream_tls_mode is None:
        cluster["transport_socket_matches"] = [
            {"name": "tlsMode-istio", "match": {"tlsMode": "istio"}, "transport_socket": tls},
            {"name": "tlsMode-disabled", "match": {}, "transport_socket": {
                "name": "envoy.transport_sockets.raw_buffer", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"}}},
        ]
    if kind == "http":
        options = http_options(settings)
        options.pop("use_downstream_protocol_config", None)
        # an `http` port's cluster speaks HTTP/1.1, an `http2` one (h2_upstream) h2: explicit, as istiod renders it
        options.setdefault("explicit_http_config", {"http_protocol_options": {}})
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": options}
    return cluster


def caller_bootstrap(caller: CallerPod, settings: SidecarSettings) -> dict[str, Any]:
    """The caller sidecar's bootstrap. ``settings`` are the called pod's Istio settings, of which it takes what
    reaches a caller (caller_settings)."""
    settings = caller_settings(settings)
    listeners = [virtual_outbound(settings),
                 *(outbound_listener(caller, port, kind, settings) for port, kind in caller.ports)]
    clusters = [*(outbound_cluster(caller, port, kind, settings) for port, kind in caller.ports),
                *egress_clusters()]
    return sidecar_bootstrap(caller.name, caller.namespace, caller.ip, settings, listeners, clusters,
                             caller.identity)


def caller_bootstrap_text(caller: CallerPod, settings: SidecarSettings) -> str:
    """The bootstrap as one line of JSON, for Envoy's ``--config-yaml``."""
    return json.dumps(caller_bootstrap(caller, settings), separators=(",", ":"))

