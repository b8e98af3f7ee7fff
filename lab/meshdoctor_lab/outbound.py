"""What istiod renders for a DestinationRule's connectionPool, outlierDetection and tls, and for a VirtualService's
http match rules, as a lab pod's Envoy is given them.

A DestinationRule and a VirtualService shape the *callers'* outbound cluster and route. With a caller sidecar
(``lab up --caller sidecar``) caller_sidecar.py renders them there. Without one (as for a VirtualService's timeout,
SidecarSettings) this pod's inbound route stands in for the caller's, and, when the DestinationRule sets what only
an outbound cluster carries (outlierDetection, tls), the route sends to a stand-in for the caller's outbound
cluster ``outbound|PORT||POD.NAMESPACE.svc.cluster.local``: what istiod builds for that service (cluster_builder.go
buildCluster, cluster_traffic_policy.go applyTrafficPolicy: LEAST_REQUEST, the circuit breakers,
``outlier_detection`` with ``healthy_panic_threshold`` from ``minHealthPercent``, the ISTIO_MUTUAL transport
socket), except that its one endpoint, the pod's IP and port, is static instead of EDS, and it dials from 127.0.0.6
as the inbound cluster does: Envoy's own connection to the pod IP on lo would otherwise be REDIRECTed back to 15006
by ISTIO_OUTPUT.
"""

from __future__ import annotations

from typing import Any

from meshdoctor_lab.mesh_tls import upstream_istio_mutual
from meshdoctor_lab.netns import INBOUND_PASSTHROUGH_SOURCE
from meshdoctor_lab.sidecar_settings import SidecarSettings

_UNLIMITED = 4294967295  # istiod's default for every threshold (getDefaultCircuitBreakerThresholds)
TRUST_DOMAIN = "cluster.local"


def service_host(pod: str, namespace: str) -> str:
    """The Kubernetes service name a lab pod stands for (one service a pod, named like it)."""
    return f"{pod}.{namespace}.svc.{TRUST_DOMAIN}"


def outbound_cluster_name(pod: str, namespace: str, port: int) -> str:
    """``outbound|PORT||HOST``: istiod's name for the callers' cluster of that service port."""
    return f"outbound|{port}||{service_host(pod, namespace)}"


def spiffe_id(namespace: str, service_account: str = "default") -> str:
    """The SPIFFE id istiod's CA writes into a workload certificate's URI SAN."""
    return f"spiffe://{TRUST_DOMAIN}/ns/{namespace}/sa/{service_account}"


def circuit_breakers(settings: SidecarSettings) -> dict[str, Any]:
    """The cluster's ``circuit_breakers``: istiod's defaults (2^32-1 everywhere, remaining counts tracked) with a
    DestinationRule connectionPool's limits over them (applyConnectionPool)."""
    threshold = {"max_connections": settings.pool_max_connections or _UNLIMITED,
                 "max_pending_requests": settings.pool_max_pending_requests or _UNLIMITED,
                 "max_requests": settings.pool_max_requests or _UNLIMITED,
                 "max_retries": _UNLIMITED, "track_remaining": True}
    return {"thresholds": [threshold]}


def outlier_detection(settings: SidecarSettings) -> dict[str, Any] | None:
    """``outlier_detection`` as applyOutlierDetection renders a DestinationRule's outlierDetection (None when it
    sets none): success-rate ejection off, consecutive 5xx enforced at 100 %, and only the fields it sets."""
    if settings.outlier_consecutive_5xx is None and settings.outlier_interval_s is None \
            and settings.outlier_base_ejection_s is None and settings.outlier_max_ejection_percent is None:
        return None
    out: dict[str, Any] = {"enforcing_success_rate": 0}
    if settings.outlier_consecutive_5xx is not None:
        out.update(consecutive_5xx=settings.outlier_consecutive_5xx, enforcing_consecutive_5xx=100)
    if settings.outlier_interval_s is not None:
        out["interval"] = f"{settings.outlier_interval_s:.3f}s"
    if settings.outlier_base_ejection_s is not None:
        out["base_ejection_time"] = f"{settings.outlier_base_ejection_s:.3f}s"
    if settings.outlier_max_ejection_percent:  # istiod sets it only when above 0 (Envoy's default is 10)
        out["max_ejection_percent"] = settings.outlier_max_ejection_percent
    return out


def static_outbound_cluster(name: str, ip: str, port: int, settings: SidecarSettings,
                            endpoint_metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """What istiod builds for a service port's outbound cluster ``name`` (cluster_builder.go buildCluster,
    cluster_traffic_policy.go applyTrafficPolicy: LEAST_REQUEST, the circuit breakers, and for outlierDetection
    ``outlier_detection`` with ``healthy_panic_threshold`` from ``minHealthPercent``), with one static endpoint
    ``ip:port`` (EDS in Istio) carrying ``endpoint_metadata`` when given. The caller sidecar's cluster and the pod's
    stand-in for it both start from this."""
    endpoint: dict[str, Any] = {"endpoint": {"address": {"socket_address": {"address": ip, "port_value": port}}}}
    if endpoint_metadata:
        endpoint["metadata"] = endpoint_metadata
    cluster: dict[str, Any] = {
        "name": name,
        "alt_stat_name": f"{name};",
        "type": "STATIC",
        "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint]}]},
        "circuit_breakers": circuit_breakers(settings),
        "common_lb_config": {},
    }
    detection = outlier_detection(settings)
    if detection is not None:
        cluster["outlier_detection"] = detection
        # "Disable panic threshold by default": healthy_panic_threshold is minHealthPercent, 0 unless set
        cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": settings.outlier_min_health_percent}}
    return cluster


def standin_cluster(pod: str, namespace: str, pod_ip: str, port: int, settings: SidecarSettings,
                    http_options: dict[str, Any]) -> dict[str, Any]:
    """The stand-in for the callers' outbound cluster of the pod's ``port`` (module docstring)."""
    cluster = static_outbound_cluster(outbound_cluster_name(pod, namespace, port), pod_ip, port, settings)
    cluster["upstream_bind_config"] = {"source_address": {"address": INBOUND_PASSTHROUGH_SOURCE, "port_value": 0}}
    cluster["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions":
                                                   http_options}
    if settings.upstream_tls_mode == "ISTIO_MUTUAL":
        sni = f"outbound_.{port}_._.{service_host(pod, namespace)}"  # model.BuildDNSSrvSubsetKey
        cluster["transport_socket"] = upstream_istio_mutual(sni, (spiffe_id(namespace),))
    return cluster


def vs_routes(cluster: str, route_action: dict[str, Any], operation: str,
              settings: SidecarSettings) -> list[dict[str, Any]]:
    """The routes of a VirtualService with ``http`` match rules on ``settings.vs_prefixes`` (each
    TranslateRouteMatch: ``prefix``, ``case_sensitive``), then its route without match when ``vs_catch_all``
    (``prefix: /``). No catch-all: a request outside the prefixes matches no route."""
    routes = [{"match": {"prefix": prefix, "case_sensitive": True}, "route": {**route_action, "cluster": cluster},
               "decorator": {"operation": operation}} for prefix in settings.vs_prefixes]
    if settings.vs_catch_all:
        routes.append({"match": {"prefix": "/", "case_sensitive": True}, "route": {**route_action, "cluster": cluster},
                       "decorator": {"operation": operation}})
    return routes
