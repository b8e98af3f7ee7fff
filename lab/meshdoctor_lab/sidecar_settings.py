"""The Istio settings a lab pod's sidecar runs with (SidecarSettings), as Envoy sees them once istiod has
rendered them; bootstrap.py, outbound.py and mesh_tls.py render them, docs/lab-envoy.md says what each stands
for."""

from __future__ import annotations

from dataclasses import dataclass

ACCESS_LOG_ENCODINGS = ("TEXT", "JSON")
INTERCEPTION_MODES = ("REDIRECT", "TPROXY")
MTLS_MODES = ("STRICT", "PERMISSIVE", "DISABLE")  # PeerAuthentication mtls.mode (UNSET is the mesh's, PERMISSIVE)
UPSTREAM_TLS_MODES = ("ISTIO_MUTUAL", "DISABLE")  # DestinationRule trafficPolicy.tls.mode the lab renders


@dataclass(frozen=True)
class SidecarSettings:
    """The Istio settings a lab scenario may turn, as Envoy sees them. Durations in seconds; None = Istio's
    default.

    - ``legacy_inbound``: dial the app on 127.0.0.1 (Istio < 1.10) instead of the pod IP from 127.0.0.6.
    - ``hcm_idle_timeout_s``: the inbound HCM's ``common_http_protocol_options.idle_timeout`` (Istio default
      1 h; a Sidecar's ``inboundConnectionPool.http.idleTimeout``).
    - ``upstream_idle_timeout_s``: the inbound cluster's idle timeout for pooled upstream connections
      (DestinationRule ``connectionPool.http.idleTimeout``; Envoy default 1 h).
    - ``upstream_max_requests_per_connection``: requests on one pooled connection to the app before Envoy closes
      it (DestinationRule ``connectionPool.http.maxRequestsPerConnection``; 1 disables keep-alive).
    - ``route_timeout_s``: a VirtualService ``timeout``, on the inbound route standing in for the caller's
      (Istio renders ``timeout`` and ``max_grpc_timeout``, and no ``max_stream_duration``, which would make
      Envoy ignore ``timeout``).
    - ``accept_http_10``: ``ISTIO_META_HTTP10=1``.
    - ``h2_upstream``: talk HTTP/2 to the app (``appProtocol: http2`` / DestinationRule ``h2UpgradePolicy``).
    - ``access_log_encoding``: ``TEXT`` or ``JSON`` (meshConfig.accessLogEncoding).
    - ``route_retry_on``, ``route_retries``: a VirtualService's ``retries.retryOn`` and ``retries.attempts``
      (Envoy's ``retry_policy``). istiod puts a VirtualService's timeout and retries on the callers' outbound
      routes; the lab has no caller sidecar, so this pod's inbound route stands in for the caller's hop (as
      ``route_timeout_s`` does).
    - ``interception_mode``: ``REDIRECT`` or ``TPROXY`` (``sidecar.istio.io/interceptionMode``): under TPROXY
      the capture listeners are transparent and virtualInbound copies the client's address to the upstream leg
      (``original_src`` with mark 1337), as istiod renders them (pilot/pkg/networking/core listener builder).
    - ``pool_max_connections``, ``pool_max_pending_requests``, ``pool_max_requests``: a DestinationRule's
      ``connectionPool.tcp.maxConnections``, ``connectionPool.http.http1MaxPendingRequests`` and
      ``http2MaxRequests``, which istiod renders as the cluster's ``circuit_breakers`` thresholds
      (``max_connections``, ``max_pending_requests``, ``max_requests``; the others stay at 2^32-1) on the
      callers' outbound cluster and on this pod's inbound cluster alike (cluster_traffic_policy.go
      applyConnectionPool; cluster_builder.go buildInboundCluster: "set on the receiver end ... as well").
    - ``outlier_consecutive_5xx``, ``outlier_interval_s``, ``outlier_base_ejection_s``,
      ``outlier_max_ejection_percent``, ``outlier_min_health_percent``: a DestinationRule's ``outlierDetection``
      (``consecutive5xxErrors``, ``interval``, ``baseEjectionTime``, ``maxEjectionPercent``,
      ``minHealthPercent``). istiod renders it on outbound clusters only (applyOutlierDetection), with
      ``healthy_panic_threshold`` set to ``minHealthPercent``, 0 unless given: no panic routing.
    - ``upstream_tls_mode``: a DestinationRule's ``trafficPolicy.tls.mode`` (``ISTIO_MUTUAL``: the caller
      originates Istio mTLS; ``DISABLE``: plaintext).
      With any outlierDetection or tls mode set, this pod's inbound route sends to a stand-in for the callers'
      outbound cluster (outbound.py), as istiod renders it for that DestinationRule.
    - ``vs_prefixes``, ``vs_catch_all``: a VirtualService whose ``http`` routes match these URI prefixes
      (istiod: one route each, ``match.prefix``), and whether it ends with a route without ``match`` (the
      catch-all; without it a request outside the prefixes matches no route). On the inbound route, standing
      in for the caller's.
    - ``mtls_mode``, ``port_mtls``: the workload's PeerAuthentication ``mtls.mode`` and its ``portLevelMtls``
      (port, mode). None: the lab's plaintext inbound chains and default passthrough chain; set, virtualInbound
      gets istiod's filter chains for that mode (mesh_tls.py: ``tls_inspector``, chains on ``transport_protocol``
      and Istio's ALPN, a DownstreamTlsContext requiring a client certificate, no plaintext chain under STRICT).
    """

    legacy_inbound: bool = False
    hcm_idle_timeout_s: float | None = None
    upstream_idle_timeout_s: float | None = None
    upstream_max_requests_per_connection: int | None = None
    route_timeout_s: float | None = None
    accept_http_10: bool = False
    h2_upstream: bool = False
    access_log_encoding: str = "TEXT"
    interception_mode: str = "REDIRECT"
    route_retry_on: str | None = None
    route_retries: int | None = None
    pool_max_connections: int | None = None
    pool_max_pending_requests: int | None = None
    pool_max_requests: int | None = None
    outlier_consecutive_5xx: int | None = None
    outlier_interval_s: float | None = None
    outlier_base_ejection_s: float | None = None
    outlier_max_ejection_percent: int | None = None
    outlier_min_health_percent: int = 0
    upstream_tls_mode: str | None = None
    vs_prefixes: tuple[str, ...] = ()
    vs_catch_all: bool = False
    mtls_mode: str | None = None
    port_mtls: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        if self.interception_mode not in INTERCEPTION_MODES:
            raise ValueError(f"interception mode {self.interception_mode!r} is not one of "
                             f"{', '.join(INTERCEPTION_MODES)}")
        if self.access_log_encoding not in ACCESS_LOG_ENCODINGS:
            raise ValueError(f"access log encoding {self.access_log_encoding!r} is not one of "
                             f"{', '.join(ACCESS_LOG_ENCODINGS)}")
        for name in ("hcm_idle_timeout_s", "upstream_idle_timeout_s", "route_timeout_s", "outlier_interval_s",
                     "outlier_base_ejection_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        for name in ("upstream_max_requests_per_connection", "pool_max_connections", "pool_max_pending_requests",
                     "pool_max_requests", "outlier_consecutive_5xx"):
            n = getattr(self, name)
            if n is not None and not (isinstance(n, int) and n >= 1):
                raise ValueError(f"{name} must be a whole number from 1, not {n!r}")
        for name in ("outlier_max_ejection_percent", "outlier_min_health_percent"):
            n = getattr(self, name)
            if n is not None and not (isinstance(n, int) and 0 <= n <= 100):
                raise ValueError(f"{name} must be a whole percentage (0 to 100), not {n!r}")
        if self.upstream_tls_mode is not None and self.upstream_tls_mode not in UPSTREAM_TLS_MODES:
            raise ValueError(f"tls mode {self.upstream_tls_mode!r} is not one the lab renders "
                             f"({', '.join(UPSTREAM_TLS_MODES)})")
        modes = [self.mtls_mode, *(mode for _, mode in self.port_mtls)]
        bad = [m for m in modes if m is not None and m not in MTLS_MODES]
        if bad:
            raise ValueError(f"mTLS mode {bad[0]!r} is not one of {', '.join(MTLS_MODES)}")
        if self.port_mtls and self.mtls_mode is None:
            raise ValueError("portLevelMtls needs the workload's mtls mode too (mtls_mode)")
        bad_prefix = [p for p in self.vs_prefixes if not p.startswith("/")]
        if bad_prefix:
            raise ValueError(f"a VirtualService URI prefix starts with /, not {bad_prefix[0]!r}")

    @property
    def outbound_standin(self) -> bool:
        """Whether the inbound route sends to a stand-in for the callers' outbound cluster: only an outbound
        cluster carries outlierDetection and a DestinationRule's tls."""
        outlier = (self.outlier_consecutive_5xx, self.outlier_interval_s, self.outlier_base_ejection_s,
                   self.outlier_max_ejection_percent)
        return any(v is not None for v in outlier) or self.upstream_tls_mode is not None

    def port_mode(self, port: int) -> str | None:
        """The PeerAuthentication mode of ``port`` (its portLevelMtls, else the workload's), None when unset."""
        return dict(self.port_mtls).get(port, self.mtls_mode)
