"""The scenarios and what runs in each one's pod: the table lab.py builds pods from and the drivers go by."""

from __future__ import annotations

from dataclasses import dataclass

from meshdoctor_lab.bootstrap import SidecarSettings

SCENARIOS = (
    "collision", "remap", "healthy", "healthy-http", "framing", "stale-keepalive", "refused", "refused-localhost",
    "syn-drop", "load", "slow-app", "http10", "port-exhaustion", "downstream-idle", "goaway", "healthy-h2",
    "no-sidecar", "overflow", "outlier", "no-route", "mtls-strict", "tls-to-plaintext", "healthy-strict",
    "healthy-strict-h2", "healthy-short", "conntrack-invalid", "server-first", "outbound-stale",
)
# seconds: the stale-keepalive app closes idle keep-alive connections after this, and says so in each response
# (`Keep-Alive: timeout=1`, whole seconds as the header has them): what its printed idle-timeout fix is made from
STALE_IDLE_TIMEOUT = 1.0
# Seconds between the app's idle timer firing and its close(), with reading paused: a request that arrives then
# is answered RST (it is unread when the socket closes). Envoy drops a pooled connection as soon as it reads the
# app's FIN, so the race it loses is this window, before any FIN (or a request crossing the FIN on the wire).
STALE_CLOSE_DELAY = 0.4
# When the stale-keepalive driver sends its second request: after the first response, in the middle of the window.
STALE_REUSE_AFTER = STALE_IDLE_TIMEOUT + STALE_CLOSE_DELAY / 2
# slow-app: the route's timeout (a VirtualService timeout) and what its round asks of the app.
SLOW_ROUTE_TIMEOUT = 1.0
SLOW_IN_TIME = 0.3  # seconds the app takes for the request that is answered in time
# seconds the app would take for the request the route times out: under twice the route's timeout, so that the
# printed fix (a route timeout of twice what Envoy waited) serves it
SLOW_TOO_LONG = 1.5
SLOW_CALLER_GIVES_UP = 0.4  # seconds the impatient caller waits before it closes its connection
# seconds the app takes for the request the impatient caller abandons: longer than its patience, within the
# route's timeout, so that a caller who waits longer (its printed fix) is answered
SLOW_ABANDONED = 0.7
# A caller that half-closes its connection (shutdown(SHUT_WR)) once this request is out: Envoy drops it (0 DC).
SLOW_HALF_CLOSED = "/half-closed"
# slow-app's caller-side fixes: the impatient caller waits as long as an ordinary client does (longer than the
# route's timeout), the half-closing one keeps its write side open.
CALLER_TIMEOUT_FIX = "caller-timeout"
CALLER_NO_HALF_CLOSE_FIX = "caller-no-half-close"
# port-exhaustion: the pod's sidecar may dial the app from this few source ports, and closes every upstream
# connection after one request (no keep-alive): each port then sits in TIME_WAIT for 60 s.
EXHAUSTION_PORTS = (40100, 40103)
EXHAUSTION_REQUESTS = 8  # more requests than ports, one after another
# downstream-idle: the pod's sidecar starts closing idle downstream connections after DOWNSTREAM_IDLE_TIMEOUT s
# (its HCM idle_timeout). On HTTP/1 that is Envoy's drain sequence: a `connection: close` on any next response,
# and the FIN only after the drain timeout (5 s by default), seen in the lab. The caller writes its next request
# as soon as that FIN has arrived, as a pool that has not noticed it would.
DOWNSTREAM_IDLE_TIMEOUT = 0.5
DOWNSTREAM_FIN_WITHIN = 10.0  # seconds the round waits for the sidecar's FIN
# Through a caller sidecar the pod's sidecar closes the caller's pooled connection instead: drain_timeout (5 s) after
# its idle timeout it closes with flush-and-delay, reading nothing for delayed_close_timeout (1 s) before the TLS
# close_notify and FIN. The round's second request, on a new client connection, is sent in the middle of that
# second: the caller writes it on its pooled connection, and the pod's sidecar never reads it.
ENVOY_DRAIN_TIMEOUT = 5.0  # the HCM's drain_timeout, Envoy's default (Istio sets none)
ENVOY_DELAYED_CLOSE_TIMEOUT = 1.0  # the HCM's delayed_close_timeout, Envoy's default
CALLER_IDLE_REUSE_AFTER = DOWNSTREAM_IDLE_TIMEOUT + ENVOY_DRAIN_TIMEOUT + ENVOY_DELAYED_CLOSE_TIMEOUT / 2
GOAWAY_REFUSE_EVERY = 3
GOAWAY_REQUESTS = 9  # requests in a goaway round (and in a healthy-h2 one)
# The collision's client-side fix (a lab fix by this name, lab/fixes.py): the round's second connection gets its
# source port from the kernel instead of sharing the live connection's.
CLIENT_PORT_FIX = "client-port"
# downstream-idle's caller-side fix: the caller's pool lets an idle connection go after CALLER_IDLE_TIMEOUT s,
# before the sidecar's DOWNSTREAM_IDLE_TIMEOUT, and opens a new one for its next request.
CALLER_IDLE_FIX = "caller-idle-timeout"
CALLER_IDLE_TIMEOUT = 0.3
# http10's caller-side fixes: its round sends that one request the right way (the other two as before).
CALLER_HTTP11_FIX = "caller-http11"
CALLER_NO_UPGRADE_FIX = "caller-no-upgrade"
CALLER_VALID_REQUEST_FIX = "caller-valid-request"
# overflow: a DestinationRule connectionPool of one connection and one pending request, which istiod also puts on
# the pod's inbound cluster. The round holds the connection with a slow request, queues a second behind it, and
# a third overflows the pending queue: Envoy answers it 503 UO without dialling the app.
OVERFLOW_MAX_CONNECTIONS = 1
OVERFLOW_MAX_PENDING = 1
OVERFLOW_SLOW = 1.0  # seconds the app takes for each of the two requests that hold and queue for the connection
POOL_LIMITS_FIX = "pool-limits"
POOL_LIMITS_SETTINGS = (("DestinationRule.trafficPolicy.connectionPool.tcp.maxConnections", "100"),
                        ("DestinationRule.trafficPolicy.connectionPool.http.http1MaxPendingRequests", "100"))
# outlier: a DestinationRule outlierDetection that may eject every endpoint (maxEjectionPercent 100) with panic
# routing off (no minHealthPercent). The app answers a burst of 500s (/status/500), the only endpoint is ejected,
# and the requests after it get 503 UH until the ejection ends (OUTLIER_BASE_EJECTION, longer each time).
OUTLIER_CONSECUTIVE_5XX = 5
OUTLIER_INTERVAL = 1.0  # seconds between Envoy's outlier sweeps (which also end ejections)
OUTLIER_BASE_EJECTION = 2.0  # seconds
OUTLIER_AFTER = 2  # requests the round sends once the endpoint is ejected
OUTLIER_RECOVERY_WITHIN = 30.0  # seconds a round waits for a former ejection to end before its burst
MIN_HEALTH_FIX = "min-health-percent"  # below 50 % healthy endpoints Envoy routes to all of them (panic)
MIN_HEALTH_SETTINGS = (("DestinationRule.trafficPolicy.outlierDetection.minHealthPercent", "50"),)
MAX_EJECTION_FIX = "max-ejection-percent"  # at most half the endpoints ejected: never the only one
MAX_EJECTION_SETTINGS = (("DestinationRule.trafficPolicy.outlierDetection.maxEjectionPercent", "50"),)
# no-route: a VirtualService whose http routes match these URI prefixes only; its fix adds a route without match.
NO_ROUTE_PREFIXES = ("/v1",)
DEFAULT_ROUTE_FIX = "default-route"
# mtls-strict: a PeerAuthentication mtls STRICT on the pod; the round's plaintext caller finds no filter chain,
# its mesh caller (the lab CA's certificate, Istio's ALPN) is served. The fix: PERMISSIVE on the app's port.
PERMISSIVE_MTLS_FIX = "permissive-mtls"
PERMISSIVE_MTLS_SETTINGS = (("PeerAuthentication.portLevelMtls[5000].mode", "PERMISSIVE"),)
# tls-to-plaintext: a DestinationRule tls.mode ISTIO_MUTUAL towards an app with no sidecar: the sidecar's
# ClientHello is answered by the app's plaintext 400. The fix: tls.mode DISABLE.
TLS_DISABLE_FIX = "tls-disable"
TLS_DISABLE_SETTINGS = (("DestinationRule.trafficPolicy.tls.mode", "DISABLE"),)

# server-first: the :5002 port's name, no protocol prefix (Istio sniffs it); the fix names it tcp-greeting.
SERVER_FIRST_PORT_NAME = "greeting"
SERVER_FIRST_WAIT = 3.0  # seconds the round's client waits for the greeting before it gives up and closes
TCP_PORT_NAME_FIX = "tcp-port-name"
APP_PROTOCOL_TCP_FIX = "app-protocol-tcp"


@dataclass(frozen=True)
class PodSetup:
    """The processes of a scenario's pod: extra args of `apps http` (None: nothing listens on :5000) and the
    Istio settings its Envoy runs with."""

    app_http: tuple[str, ...] | None = ()
    app_kind: str = "http"  # the app on :5000: `apps http`, or `apps h2c` (HTTP/2, for an h2_upstream sidecar)
    sidecar: SidecarSettings = SidecarSettings()
    # The pod namespace's net.ipv4.ip_local_port_range (lowest, highest): the source ports its sidecar dials from.
    local_ports: tuple[int, int] | None = None
    # Pod template labels the injector reads (lab/fixes.py injected): sidecar.istio.io/inject "false" opts out.
    labels: tuple[tuple[str, str], ...] = ()
    # Under `lab up --caller sidecar`, where the story needs them on that side: the pod's labels (None: ``labels``)
    # and the callers' DestinationRule tls.mode (None: auto mTLS), unless a fix sets one.
    called_labels: tuple[tuple[str, str], ...] | None = None
    callers_tls_mode: str | None = None
    # The pod namespace's net.netfilter.nf_conntrack_tcp_be_liberal (the conntrack-be-liberal fix): conntrack
    # keeps out-of-window segments tracked, so the nat REDIRECT still takes them.
    conntrack_be_liberal: bool = False
    # The app on :5002 (`apps tcp-echo` or `apps server-first`) and that container port's name: its protocol
    # prefix is how Istio reads the port's protocol (lab.port_kind); a name without one is sniffed.
    tcp_app: str = "tcp-echo"
    tcp_port_name: str = "tcp-echo"


SETUPS: dict[str, PodSetup] = {
    "collision": PodSetup(),
    "remap": PodSetup(),
    "healthy": PodSetup(),
    "healthy-http": PodSetup(),
    "framing": PodSetup(app_http=("--broken-framing",)),
    "stale-keepalive": PodSetup(app_http=("--idle-timeout", str(STALE_IDLE_TIMEOUT),
                                          "--close-delay", str(STALE_CLOSE_DELAY))),
    "refused": PodSetup(app_http=None),
    "refused-localhost": PodSetup(app_http=("--bind", "127.0.0.1")),
    "syn-drop": PodSetup(),
    "load": PodSetup(app_http=("--fast", "--also-port", "15020")),  # 15020: LOAD_DIRECT_PORT
    "slow-app": PodSetup(sidecar=SidecarSettings(route_timeout_s=SLOW_ROUTE_TIMEOUT)),
    "http10": PodSetup(),  # Istio's default: no ISTIO_META_HTTP10, so Envoy refuses HTTP/1.0
    # The sidecar talks HTTP/2 to the app (appProtocol: http2). goaway's app refuses every third stream and
    # rotates each connection after 4 streams with a GOAWAY; healthy-h2's does neither.
    "goaway": PodSetup(app_http=("--refuse-every", str(GOAWAY_REFUSE_EVERY), "--goaway-after", "4"),
                       app_kind="h2c", sidecar=SidecarSettings(h2_upstream=True)),
    "healthy-h2": PodSetup(app_kind="h2c", sidecar=SidecarSettings(h2_upstream=True)),
    "downstream-idle": PodSetup(sidecar=SidecarSettings(hcm_idle_timeout_s=DOWNSTREAM_IDLE_TIMEOUT)),
    "port-exhaustion": PodSetup(sidecar=SidecarSettings(upstream_max_requests_per_connection=1),
                                local_ports=EXHAUSTION_PORTS),
    # A pod that opts out of injection: no istio-proxy, no istio-init rules, the app reached directly.
    "no-sidecar": PodSetup(labels=(("sidecar.istio.io/inject", "false"),)),
    "overflow": PodSetup(sidecar=SidecarSettings(pool_max_connections=OVERFLOW_MAX_CONNECTIONS,
                                                 pool_max_pending_requests=OVERFLOW_MAX_PENDING)),
    "outlier": PodSetup(sidecar=SidecarSettings(
        outlier_consecutive_5xx=OUTLIER_CONSECUTIVE_5XX, outlier_interval_s=OUTLIER_INTERVAL,
        outlier_base_ejection_s=OUTLIER_BASE_EJECTION, outlier_max_ejection_percent=100)),
    "no-route": PodSetup(sidecar=SidecarSettings(vs_prefixes=NO_ROUTE_PREFIXES)),
    # Through a caller sidecar: the plaintext caller is a sidecar whose DestinationRule says tls DISABLE, and the app
    # the caller's mTLS meets has no sidecar (its pod opts out of injection).
    "mtls-strict": PodSetup(sidecar=SidecarSettings(mtls_mode="STRICT"), callers_tls_mode="DISABLE"),
    "tls-to-plaintext": PodSetup(sidecar=SidecarSettings(upstream_tls_mode="ISTIO_MUTUAL"),
                                 called_labels=(("sidecar.istio.io/inject", "false"),)),
    # The healthy mesh, each with healthy_rounds.py's round (keep-alive, `Connection: close`, TCP echo). A
    # PeerAuthentication mtls STRICT (filterchain_options.go: the ports' chains on transport_protocol tls only):
    # through a caller sidecar its auto mTLS is served (the endpoint's tlsMode istio), called without one the
    # round speaks mTLS itself. -h2: the port speaks HTTP/2 too (appProtocol http2: the caller's cluster h2 with
    # ALPN istio-h2, the pod's HCM picking h2 by it, h2c to the app).
    "healthy-strict": PodSetup(sidecar=SidecarSettings(mtls_mode="STRICT")),
    "healthy-strict-h2": PodSetup(app_kind="h2c", sidecar=SidecarSettings(mtls_mode="STRICT", h2_upstream=True)),
    # A DestinationRule connectionPool.http.maxRequestsPerConnection 1, which istiod renders as the cluster's
    # max_requests_per_connection on the callers' outbound cluster and on this pod's inbound one alike
    # (cluster_traffic_policy.go applyConnectionPool; cluster_builder.go buildInboundCluster): no keep-alive on
    # any hop, every request its own mTLS connection between the sidecars and its own connection to the app.
    "healthy-short": PodSetup(sidecar=SidecarSettings(upstream_max_requests_per_connection=1)),
    # An upload into which the round writes one out-of-window segment (invalid_rounds.py): conntrack marks it
    # INVALID, it skips the REDIRECT and the app's port resets the caller's connection.
    "conntrack-invalid": PodSetup(),
    # A server-first app (it writes a greeting on accept) on a port whose name declares no protocol: the callers'
    # sidecars sniff it (http_inspector), waiting for the client's first bytes, which the client never sends.
    "server-first": PodSetup(tcp_app="server-first", tcp_port_name=SERVER_FIRST_PORT_NAME),
    # The app reconnects from its source port while the caller sidecar still holds that port's earlier connection
    # half-closed on 127.0.0.1:15001 (outbound_stale.py; needs --caller sidecar). The pod itself is healthy-http's.
    "outbound-stale": PodSetup(),
}
