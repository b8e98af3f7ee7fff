"""The Envoy bootstrap of a lab pod's istio-proxy, shaped like the configuration Istio pushes to a sidecar.

Istio's istiod sends a sidecar its listeners and clusters over xDS; the lab has no istiod, so the same shapes
go into a static bootstrap (docs/lab-envoy.md says which Istio setting each part stands for):

- ``virtualInbound`` on 0.0.0.0:15006, where ISTIO_IN_REDIRECT sends every inbound TCP connection. Its
  ``original_dst`` listener filter restores the address the caller dialled (SO_ORIGINAL_DST), and one filter
  chain per pod port is matched on that ``destination_port``: HTTP ports through an ``http_connection_manager``
  (``server_name: istio-envoy``, stat prefix ``inbound_0.0.0.0_PORT;``), TCP ports through ``tcp_proxy``.
- clusters ``inbound|PORT||``: ``ORIGINAL_DST`` dialled from 127.0.0.6 (Istio >= 1.10, InboundPassthroughBindIpv4,
  which ISTIO_OUTPUT RETURNs on lo), or, for older meshes, ``STATIC`` to 127.0.0.1:PORT.
- ``virtualOutbound`` on 0.0.0.0:15001 (ISTIO_REDIRECT's target) with ``use_original_dst`` and a passthrough
  default chain, for the app's own calls.
- admin on 127.0.0.1:15000; the access log in Istio's default TEXT format (or its JSON format) to /dev/stdout,
  which the lab writes to the file served as the ``istio-proxy`` container log.

Stats: Istio's bootstrap keeps only an inclusion list of stats; the lab pods opt in to the cluster and HTTP
stats the detectors correlate with (``proxy.istio.io/config: proxyStatsMatcher``, see PROXY_STATS_PREFIXES),
and the lab's Pod objects carry that annotation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from meshdoctor_lab.netns import INBOUND_CAPTURE_PORT as INBOUND_PORT
from meshdoctor_lab.netns import INBOUND_PASSTHROUGH_SOURCE as INBOUND_SOURCE
from meshdoctor_lab.netns import TPROXY_MARK  # original_src's mark: routed back to Envoy (table 133)
from meshdoctor_lab.mesh_tls import MeshIdentity, inbound_chains, inspectors, static_secrets
from meshdoctor_lab.outbound import circuit_breakers, outbound_cluster_name, standin_cluster, vs_routes
from meshdoctor_lab.sidecar_settings import SidecarSettings

ADMIN_ADDRESS = "127.0.0.1"
ADMIN_PORT = 15000
OUTBOUND_PORT = 15001  # virtualOutbound, ISTIO_REDIRECT's target
LEGACY_INBOUND_HOST = "127.0.0.1"  # Istio < 1.10 dialled the app on localhost
ACCESS_LOG_PATH = "/dev/stdout"  # meshConfig.accessLogFile, as Istio's default profile sets it

# meshConfig.accessLogFormat default (EnvoyTextLogFormat in istio/istio pilot/pkg/model/telemetry_logging.go,
# Istio >= 1.24). The envoy/access_log.py parser reads exactly these fields.
ISTIO_TEXT_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
    '%RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% '
    '"%UPSTREAM_TRANSPORT_FAILURE_REASON%" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% '
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" '
    '"%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" %UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% '
    '%DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n'
)
# meshConfig.accessLogEncoding: JSON (EnvoyJSONLogFormatIstio, same file): the same operators under these keys.
ISTIO_JSON_FORMAT: dict[str, str] = {
    "start_time": "%START_TIME%",
    "route_name": "%ROUTE_NAME%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "protocol": "%PROTOCOL%",
    "response_code": "%RESPONSE_CODE%",
    "response_flags": "%RESPONSE_FLAGS%",
    "response_code_details": "%RESPONSE_CODE_DETAILS%",
    "connection_termination_details": "%CONNECTION_TERMINATION_DETAILS%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "duration": "%DURATION%",
    "upstream_service_time": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "x_forwarded_for": "%REQ(X-FORWARDED-FOR)%",
    "user_agent": "%REQ(USER-AGENT)%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "authority": "%REQ(:AUTHORITY)%",
    "upstream_host": "%UPSTREAM_HOST%",
    "upstream_cluster": "%UPSTREAM_CLUSTER_RAW%",
    "upstream_local_address": "%UPSTREAM_LOCAL_ADDRESS%",
    "downstream_local_address": "%DOWNSTREAM_LOCAL_ADDRESS%",
    "downstream_remote_address": "%DOWNSTREAM_REMOTE_ADDRESS%",
    "requested_server_name": "%REQUESTED_SERVER_NAME%",
    "upstream_transport_failure_reason": "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
}
# Envoy's own log lines (what `kubectl logs -c istio-proxy` shows besides the access log): the format Istio's
# bootstrap sets in application_log_config (older pilot-agents passed it as --log-format).
ENVOY_LOG_FORMAT = "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"

# What the lab pods add to Istio's stats inclusion list (proxyStatsMatcher.inclusionPrefixes), and the
# prefixes Istio's bootstrap always includes (pkg/bootstrap/config.go). `listener.`: every listener's own stats
# (virtualInbound's, and an outbound listener's such as a sniffed port's downstream_listener_filter_remote_close).
PROXY_STATS_PREFIXES = ("cluster.inbound", "http.inbound", "cluster.outbound", "http.outbound", "listener.")
ISTIO_DEFAULT_STATS_PREFIXES = ("reporter=", "cluster_manager", "listener_manager", "server", "cluster.xds-grpc",
                                "wasm", "component", "istio")

_T = "type.googleapis.com/"
_HCM = _T + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_TCP_PROXY = _T + "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
_HTTP_OPTIONS = _T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


@dataclass(frozen=True)
class BootstrapPod:
    """Who the sidecar belongs to: pod name, namespace, IP, its container ports (port -> "http"|"tcp") and
    certificate."""

    name: str
    namespace: str
    pod_ip: str
    ports: tuple[tuple[int, str], ...]
    # Its workload certificate (SDS secrets default and ROOTCA): needed for any mTLS setting, else None
    identity: MeshIdentity | None = None


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


def file_access_log(encoding: str, path: str = ACCESS_LOG_PATH) -> dict[str, Any]:
    """One Envoy file access logger writing Istio's TEXT format or its JSON encoding to ``path``."""
    if encoding == "JSON":
        log_format: dict[str, Any] = {"json_format": ISTIO_JSON_FORMAT}
    else:
        log_format = {"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}}
    return {"name": "envoy.access_loggers.file", "typed_config": {
        "@type": _T + "envoy.extensions.access_loggers.file.v3.FileAccessLog", "path": path,
        "log_format": log_format}}


def _access_log(settings: SidecarSettings) -> list[dict[str, Any]]:
    return [file_access_log(settings.access_log_encoding)]


def listener_access_log(settings: SidecarSettings) -> list[dict[str, Any]]:
    """A listener's own access log (accesslog.go setListenerAccessLog): the mesh's file log, filtered to NR, for
    connections no filter chain takes, which no filter would log."""
    return [{**file_access_log(settings.access_log_encoding),
             "filter": {"response_flag_filter": {"flags": ["NR"]}}}]


def tcp_proxy_filter(stat_prefix: str, cluster: str, settings: SidecarSettings) -> dict[str, Any]:
    """A tcp_proxy network filter to ``cluster`` with the mesh's access log."""
    return {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": _TCP_PROXY, "stat_prefix": stat_prefix, "cluster": cluster, "access_log": _access_log(settings)}}


def _inbound_route(pod: BootstrapPod, port: int, settings: SidecarSettings) -> dict[str, Any]:
    name = f"inbound|{port}||"
    cluster = outbound_cluster_name(pod.name, pod.namespace, port) if settings.outbound_standin else name
    route: dict[str, Any] = {"cluster": cluster}
    if settings.route_timeout_s is None:
        # Istio's default inbound route: no timeout, and a zero max_stream_duration.
        route.update(timeout="0s", max_stream_duration={"max_stream_duration": "0s", "grpc_timeout_header_max": "0s"})
    else:
        route.update(timeout=_duration(settings.route_timeout_s),
                     max_grpc_timeout=_duration(settings.route_timeout_s))
    if settings.route_retry_on:
        route["retry_policy"] = {"retry_on": settings.route_retry_on, "num_retries": settings.route_retries or 2}
        if "retriable-status-codes" in settings.route_retry_on:
            route["retry_policy"]["retriable_status_codes"] = [503]  # Istio's default list
    operation = f"{pod.name}.{pod.namespace}.svc.cluster.local:{port}/*"
    if settings.vs_prefixes:
        routes = vs_routes(cluster, route, operation, settings)
    else:
        routes = [{"name": "default", "match": {"prefix": "/"}, "route": route, "decorator": {"operation": operation}}]
    return {
        "name": name,
        "validate_clusters": False,
        "virtual_hosts": [{"name": f"inbound|http|{port}", "domains": ["*"], "routes": routes}],
    }


def hcm_filter(stat_prefix: str, route_config: dict[str, Any], settings: SidecarSettings) -> dict[str, Any]:
    """An http_connection_manager network filter as istiod renders an inbound one (buildHTTPConnectionManager),
    routing by the inline ``route_config``, with the mesh's access log."""
    hcm: dict[str, Any] = {
        "@type": _HCM,
        "stat_prefix": stat_prefix,
        "route_config": route_config,
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": _T + "envoy.extensions.filters.http.router.v3.Router"}}],
        "server_name": "istio-envoy",
        "use_remote_address": False,
        "forward_client_cert_details": "APPEND_FORWARD",
        "normalize_path": True,
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
        "request_id_extension": {"typed_config": {
            "@type": _T + "envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig",
            "use_request_id_for_trace_sampling": True}},
        "upgrade_configs": [{"upgrade_type": "websocket"}],
        "stream_idle_timeout": "0s",
        "access_log": _access_log(settings),
    }
    if settings.hcm_idle_timeout_s is not None:
        hcm["common_http_protocol_options"] = {"idle_timeout": _duration(settings.hcm_idle_timeout_s)}
    if settings.accept_http_10:
        hcm["http_protocol_options"] = {"accept_http_10": True}
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}


def _port_filters(pod: BootstrapPod, settings: SidecarSettings, port: int, kind: str) -> list[dict[str, Any]]:
    """The network filters of a pod port's inbound chain: an HCM for an HTTP port, a tcp_proxy for a TCP one."""
    if kind == "http":
        return [hcm_filter(f"inbound_0.0.0.0_{port};", _inbound_route(pod, port, settings), settings)]
    cluster = f"inbound|{port}||"
    return [tcp_proxy_filter(cluster, cluster, settings)]


def _passthrough_filters(settings: SidecarSettings, protocol: str) -> list[dict[str, Any]]:
    """The network filters of a passthrough chain (ports the pod does not declare) to InboundPassthroughCluster."""
    cluster = "InboundPassthroughCluster"
    if protocol == "tcp":
        return [tcp_proxy_filter(cluster, cluster, settings)]
    route = {"name": cluster, "validate_clusters": False, "virtual_hosts": [{
        "name": "inbound|http|0", "domains": ["*"], "routes": [{
            "name": "default", "match": {"prefix": "/"},
            "route": {"cluster": cluster, "timeout": "0s",
                      "max_stream_duration": {"max_stream_duration": "0s", "grpc_timeout_header_max": "0s"}}}]}]}
    return [hcm_filter(f"{cluster};", route, settings)]


def _plain_chain(pod: BootstrapPod, settings: SidecarSettings, port: int, kind: str) -> dict[str, Any]:
    return {"name": f"0.0.0.0_{port}", "filter_chain_match": {"destination_port": port},
            "filters": _port_filters(pod, settings, port, kind)}


def _inbound_cluster(port: int, kind: str, settings: SidecarSettings) -> dict[str, Any]:
    name = f"inbound|{port}||"
    cluster: dict[str, Any] = {
        "name": name,
        "alt_stat_name": f"{name};",  # Istio >= 1.23 delimits the cluster name in stat names with ';'
        "connect_timeout": "10s",
        "circuit_breakers": circuit_breakers(settings),
    }
    if settings.legacy_inbound:
        cluster.update(type="STATIC", load_assignment={"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": LEGACY_INBOUND_HOST, "port_value": port}}}}]}]})
    else:
        cluster.update(type="ORIGINAL_DST", lb_policy="CLUSTER_PROVIDED", cleanup_interval="60s",
                       upstream_bind_config={"source_address": {"address": INBOUND_SOURCE, "port_value": 0}})
    if kind == "http":
        cluster["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions":
                                                       http_options(settings)}
    return cluster


def http_options(settings: SidecarSettings) -> dict[str, Any]:
    """An HTTP cluster's HttpProtocolOptions: a DestinationRule's idle timeout and requests per connection, and
    the protocol to the app."""
    options: dict[str, Any] = {"@type": _HTTP_OPTIONS}
    common: dict[str, Any] = {}
    if settings.upstream_idle_timeout_s is not None:
        common["idle_timeout"] = _duration(settings.upstream_idle_timeout_s)
    if settings.upstream_max_requests_per_connection is not None:
        common["max_requests_per_connection"] = settings.upstream_max_requests_per_connection
    if common:
        options["common_http_protocol_options"] = common
    if settings.h2_upstream:
        options["explicit_http_config"] = {"http2_protocol_options": {}}
    else:
        options["use_downstream_protocol_config"] = {"http_protocol_options": {}, "http2_protocol_options": {}}
    return options


def _listener_address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "0.0.0.0", "port_value": port}}


def bootstrap(pod: BootstrapPod, settings: SidecarSettings = SidecarSettings()) -> dict[str, Any]:
    """The bootstrap (a JSON-ready dict, Envoy's v3 API) for `pod`'s istio-proxy.

    Raises ValueError when a port's kind is neither "http" nor "tcp", or an mTLS setting has no identity.
    """
    bad = [kind for _, kind in pod.ports if kind not in ("http", "tcp")]
    if bad:
        raise ValueError(f"port kind {bad[0]!r} is neither http nor tcp")
    needs_identity = settings.mtls_mode is not None or settings.upstream_tls_mode == "ISTIO_MUTUAL"
    if needs_identity and pod.identity is None:
        raise ValueError("an mTLS setting needs the pod's workload certificate (BootstrapPod.identity)")
    passthrough = {"name": "InboundPassthroughCluster", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                   "connect_timeout": "10s", "cleanup_interval": "60s",
                   "upstream_bind_config": {"source_address": {"address": INBOUND_SOURCE, "port_value": 0}}}
    inbound_filters = [{"name": "envoy.filters.listener.original_dst", "typed_config": {
        "@type": _T + "envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}]
    tproxy = settings.interception_mode == "TPROXY"
    if tproxy:
        inbound_filters.append({"name": "envoy.filters.listener.original_src", "typed_config": {
            "@type": _T + "envoy.extensions.filters.listener.original_src.v3.OriginalSrc", "mark": TPROXY_MARK}})
    blackhole = {"name": "virtualInbound-blackhole", "filter_chain_match": {"destination_port": INBOUND_PORT},
                 "filters": [tcp_proxy_filter("BlackHoleCluster", "BlackHoleCluster", settings)]}
    inbound: dict[str, Any] = {
        "name": "virtualInbound",
        "address": _listener_address(INBOUND_PORT),
        "traffic_direction": "INBOUND",
        **({"transparent": True} if tproxy else {}),
        "access_log": listener_access_log(settings),
    }
    if settings.mtls_mode is None:
        chains = [_plain_chain(pod, settings, port, kind) for port, kind in pod.ports]
        inbound.update(listener_filters=inbound_filters, filter_chains=[blackhole, *chains], default_filter_chain={
            "name": "InboundPassthroughFilterChain", "filters": _passthrough_filters(settings, "tcp")})
    else:  # istiod's chains for the PeerAuthentication, the passthrough ones among them: no default chain
        chains = [blackhole, *inbound_chains(pod.ports, settings, lambda p, k: _port_filters(pod, settings, p, k),
                                             lambda protocol: _passthrough_filters(settings, protocol))]
        inbound.update(listener_filters=inbound_filters + inspectors(chains), filter_chains=chains,
                       listener_filters_timeout="0s", continue_on_listener_filters_timeout=True)
    listeners = [inbound, virtual_outbound(settings)]
    clusters = [
        *(_inbound_cluster(port, kind, settings) for port, kind in pod.ports),
        *(standin_cluster(pod.name, pod.namespace, pod.pod_ip, port, settings, http_options(settings))
          for port, kind in pod.ports if kind == "http" and settings.outbound_standin),
        passthrough,
        *egress_clusters(),
    ]
    return sidecar_bootstrap(pod.name, pod.namespace, pod.pod_ip, settings, listeners, clusters, pod.identity)


def virtual_outbound(settings: SidecarSettings) -> dict[str, Any]:
    """Listener ``virtualOutbound`` on 0.0.0.0:15001 (ISTIO_REDIRECT's target): ``use_original_dst`` hands a
    connection to the listener of the address it was dialled at, and what none takes passes through."""
    return {
        "name": "virtualOutbound",
        "address": _listener_address(OUTBOUND_PORT),
        "traffic_direction": "OUTBOUND",
        **({"transparent": True} if settings.interception_mode == "TPROXY" else {}),
        "use_original_dst": True,
        "access_log": listener_access_log(settings),
        "filter_chains": [
            {"name": "virtualOutbound-blackhole", "filter_chain_match": {"destination_port": OUTBOUND_PORT},
             "filters": [tcp_proxy_filter("BlackHoleCluster", "BlackHoleCluster", settings)]},
        ],
        "default_filter_chain": {"name": "PassthroughFilterChain", "filters": [
            tcp_proxy_filter("PassthroughCluster", "PassthroughCluster", settings)]},
    }


def egress_clusters() -> list[dict[str, Any]]:
    """``PassthroughCluster`` (ALLOW_ANY: the address dialled) and ``BlackHoleCluster`` (no endpoint)."""
    return [{"name": "PassthroughCluster", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
             "connect_timeout": "10s", "cleanup_interval": "60s"},
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]


def sidecar_bootstrap(name: str, namespace: str, ip: str, settings: SidecarSettings, listeners: list[dict[str, Any]],
                      clusters: list[dict[str, Any]], identity: MeshIdentity | None) -> dict[str, Any]:
    """A sidecar's whole bootstrap around its ``listeners`` and ``clusters``: node (pod ``name`` in ``namespace``
    at ``ip``), Istio's log format, admin on 127.0.0.1:15000, the stats inclusion list, the SDS secrets of
    ``identity``."""
    stats_prefixes = ISTIO_DEFAULT_STATS_PREFIXES + PROXY_STATS_PREFIXES
    return {
        "node": {
            "id": f"sidecar~{ip}~{name}.{namespace}~{namespace}.svc.cluster.local",
            "cluster": f"{name}.{namespace}",
            "metadata": {"NAME": name, "NAMESPACE": namespace, "INSTANCE_IPS": ip,
                         "INTERCEPTION_MODE": settings.interception_mode,
                         "HTTP10": "1" if settings.accept_http_10 else "0"},
        },
        "application_log_config": {"log_format": {"text_format": ENVOY_LOG_FORMAT}},
        "admin": {"address": {"socket_address": {"address": ADMIN_ADDRESS, "port_value": ADMIN_PORT}}},
        "stats_config": {
            "use_all_default_tags": False,
            "stats_matcher": {"inclusion_list": {"patterns": [{"prefix": p} for p in stats_prefixes]}},
        },
        "static_resources": {"listeners": listeners, "clusters": clusters,
                             **({"secrets": static_secrets(identity)} if identity else {})},
        # Istio sets no limit on downstream connections; saying so keeps Envoy's start-up warning out of the log.
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {
                "@type": _T + "envoy.extensions.resource_monitors.downstream_connections.v3."
                              "DownstreamConnectionsConfig",
                "max_active_downstream_connections": 2147483647}}]},
    }


def bootstrap_text(pod: BootstrapPod, settings: SidecarSettings = SidecarSettings()) -> str:
    """The bootstrap as one line of JSON, for Envoy's ``--config-yaml`` (JSON is YAML)."""
    return json.dumps(bootstrap(pod, settings), separators=(",", ":"))
