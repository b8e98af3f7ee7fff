"""Istio resources that findings recommend, as YAML to paste (networking.istio.io/v1), and the fixes more than
one detector prints. One writer for each kind, so every detector's fix reads the same way; ``<service>`` and
``<namespace>`` are for the user to fill in."""

from __future__ import annotations

import math

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.istio_cluster import IstioCluster, parse_istio_cluster

from .fixes import Fix
from .hop_pairs import caller_side
from .upstream_pod import ip_of

INTERCEPTION_MODE = "sidecar.istio.io/interceptionMode"
EXCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/excludeInboundPorts"


def tproxy_interception() -> Fix:
    """Inbound capture by TPROXY instead of REDIRECT: the fix of a four-tuple collision that keeps the mesh.
    Istio's Sidecar resource changes no iptables rule (its captureMode "dictates how traffic to the listener is
    expected to be captured", istio/api networking/v1alpha3/sidecar.proto): only the pod's annotations do."""
    return Fix(
        "tproxy", "intercept inbound traffic with TPROXY instead of REDIRECT",
        "every port stays in the mesh (mTLS, AuthorizationPolicy, telemetry); under TPROXY the accepted socket "
        "keeps the port the client dialled, so two connections no longer share a four-tuple, and the app sees "
        "the client's own address",
        "the injector runs istio-proxy as root (runAsUser 0) with NET_ADMIN, which the baseline and restricted "
        "Pod Security levels refuse, and the node's kernel needs the TPROXY target (xt_TPROXY); the sidecar dials "
        "the app from the client's address, so an app reached on 127.0.0.1 (a Sidecar defaultEndpoint "
        "127.0.0.1, Istio < 1.10's dialling) is unreachable under it; the pods restart to apply it",
        annotations=((INTERCEPTION_MODE, "TPROXY"),))


def exclude_inbound_ports(value: str, moved: str) -> Fix:
    """``moved`` (a port list) out of inbound capture: the annotation's whole ``value`` (the ports it already
    lists, with them)."""
    return Fix(
        "exclude-port", f"take {moved} out of inbound capture (the annotation lists every excluded port)",
        f"Envoy on the pod's other ports; {moved} keeps a four-tuple of its own",
        f"traffic to {moved} bypasses Envoy: no mTLS termination, AuthorizationPolicy or telemetry there",
        annotations=((EXCLUDE_INBOUND_PORTS, value),))

_VIRTUAL_SERVICE = """\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: <service>
spec:
  hosts: [<service>]
  http:
  - route:
    - destination:
        host: <service>
"""


def virtual_service_retries(attempts: int, retry_on: str, per_try_timeout: str | None = None) -> str:
    """A VirtualService that retries the route ``attempts`` times on ``retry_on`` (Envoy's x-envoy-retry-on)."""
    per_try = f"\n      perTryTimeout: {per_try_timeout}" if per_try_timeout else ""
    return _VIRTUAL_SERVICE + f"    retries:\n      attempts: {attempts}\n      retryOn: {retry_on}{per_try}"


def virtual_service_timeout(timeout: str, per_try_timeout: str | None = None, comment: str = "") -> str:
    """A VirtualService whose route waits ``timeout`` for the app (Envoy's route timeout; Istio's default is
    none), optionally retrying with ``per_try_timeout`` per attempt."""
    note = f"  # {comment}" if comment else ""
    retries = f"\n    retries:\n      attempts: 2\n      perTryTimeout: {per_try_timeout}" if per_try_timeout else ""
    return _VIRTUAL_SERVICE + f"    timeout: {timeout}{note}{retries}"


def destination_rule(traffic_policy: str) -> str:
    """A DestinationRule for the service with ``traffic_policy``: the YAML under ``trafficPolicy:``, indented by
    four spaces."""
    return f"""\
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: <service>
spec:
  host: <service>.<namespace>.svc.cluster.local
  trafficPolicy:
{traffic_policy}"""


def destination_rule_pool(protocol: str, setting: str, value: str, comment: str = "") -> str:
    """A DestinationRule setting one connection-pool field, e.g. ("http", "idleTimeout", "50s")."""
    note = f"          # {comment}" if comment else ""
    return destination_rule(f"    connectionPool:\n      {protocol}:\n        {setting}: {value}{note}")


def sidecar_ingress(port: int, protocol: str, default_endpoint: str) -> str:
    """A Sidecar whose ingress listener on ``port`` forwards to ``default_endpoint`` (e.g. ``127.0.0.1:5000``),
    for the workload ``<app>``. Istio renders its inbound cluster with that endpoint instead of the pod IP."""
    return f"""\
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: <app>
  namespace: <namespace>
spec:
  workloadSelector:
    labels:
      app: <app>
  ingress:
  - port:
      number: {port}
      protocol: {protocol}
      name: {protocol.lower()}-{port}
    defaultEndpoint: {default_endpoint}"""


PROXY_CONFIG = "proxy.istio.io/config"
NATIVE_SIDECAR = "sidecar.istio.io/nativeSidecar"
SIDECAR_CONTAINER = "istio-proxy"


def hold_application(proxy_config: str = "holdApplicationUntilProxyStarts: true", replaces_invalid: bool = False
                     ) -> Fix:
    """holdApplicationUntilProxyStarts: the injector puts istio-proxy first with a postStart ``pilot-agent wait``
    (istio/istio injection-template.yaml), so the kubelet starts the app only once Envoy is ready.
    ``proxy_config``: the whole ``proxy.istio.io/config`` value to write (the pod's other ProxyConfig fields kept,
    as YAML); ``replaces_invalid``: the pod's current value is not a ProxyConfig mapping."""
    body = "\n".join("      " + line if line else line for line in proxy_config.splitlines())
    return Fix(
        "hold-application", f"start the app only once {SIDECAR_CONTAINER} is ready",
        "the whole mesh",
        "the app starts a second or two later (once Envoy has its configuration); the pods are recreated to "
        "apply it (mesh-wide instead: meshConfig.defaultConfig.holdApplicationUntilProxyStarts: true)"
        + ("; the annotation's current value is not a ProxyConfig mapping (the injector refuses such a pod), so "
           "this replaces it: write back what it meant" if replaces_invalid else ""),
        yaml=f"# pod template annotation (the pod's other proxy settings kept):\nmetadata:\n  annotations:\n"
             f"    {PROXY_CONFIG}: |-\n{body}",  # |-: the value as the lab applies it
        annotations=((PROXY_CONFIG, proxy_config),))


def native_sidecar() -> Fix:
    """The sidecar as a Kubernetes native sidecar: an init container with restartPolicy Always, which the
    kubelet starts, and whose startupProbe it waits on, before any app container (KEP-753; stable in Kubernetes
    1.33). Istio's per-pod switch is the ``sidecar.istio.io/nativeSidecar`` annotation (Istio >= 1.24, over
    istiod's ENABLE_NATIVE_SIDECARS)."""
    return Fix(
        "native-sidecar", f"inject {SIDECAR_CONTAINER} as a native sidecar, started and probed before the app",
        "the whole mesh; the sidecar also outlives the app at shutdown",
        "Kubernetes >= 1.29 (native sidecars on by default; stable in 1.33) and Istio >= 1.24 for the per-pod "
        "annotation; the pods are recreated to apply it",
        annotations=((NATIVE_SIDECAR, "true"),))


def _service_port(port: int, lines: str) -> str:
    return f"""\
apiVersion: v1
kind: Service
metadata:
  name: <service>
  namespace: <namespace>
spec:
  ports:
  - port: {port}
{lines}"""


def tcp_service_port(port: int) -> tuple[Fix, ...]:
    """Declare the Service's ``port`` TCP, so that istiod renders its callers' outbound listener as a tcp_proxy
    with no ``http_inspector``: ``appProtocol: tcp`` (read first), or a port name with the ``tcp-`` prefix
    (Istio's protocol selection, istio.io "Protocol Selection"; pilot/pkg/networking/core listener.go
    ListenerProtocolTCP). The fix of a server-first protocol on a sniffed or HTTP port: the sidecar then dials
    the server at once and relays what it writes first."""
    keeps = ("mTLS, AuthorizationPolicy (its TCP fields) and TCP telemetry; the callers' sidecars connect to the "
             "server as soon as the client connects and relay its greeting")
    costs = ("no HTTP routing, retries or HTTP metrics on this port (a server-first protocol is not HTTP); the "
             "callers' sidecars get the new listener when istiod pushes it, and connections already open stay as "
             "they are")
    return (
        Fix("app-protocol-tcp", f"declare the Service's port {port} TCP with appProtocol: tcp", keeps, costs,
            yaml=_service_port(port, "    appProtocol: tcp   # Istio reads appProtocol before the port's name")),
        Fix("tcp-port-name", f"name the Service's port {port} with Istio's tcp- prefix (e.g. tcp-<name>)", keeps,
            costs + "; clients that look the port up by name need the new one",
            yaml=_service_port(port, "    name: tcp-<name>   # the prefix says the protocol: tcp")),
    )


def termination_drain_duration(seconds: int) -> Fix:
    """ProxyConfig ``terminationDrainDuration`` (default 5 s: istio/istio pkg/config/mesh/mesh.go): how long
    pilot-agent lets Envoy drain after the pod's SIGTERM before it kills it (pkg/envoy/agent.go ``terminate``).
    ``seconds``: at least the app's own grace (what it takes to finish after SIGTERM, and for callers to stop
    calling), and below the pod's terminationGracePeriodSeconds, after which the kubelet kills everything."""
    proxy_config = f"terminationDrainDuration: {seconds}s"
    return Fix(
        "termination-drain", f"let {SIDECAR_CONTAINER} drain for {seconds} s, as long as the app's grace",
        "the whole mesh; callers are told to go (connection: close, GOAWAY) from the first second",
        "the pod takes as long to stop as the drain (keep terminationGracePeriodSeconds above it); the pods are "
        "recreated to apply it (mesh-wide: meshConfig.defaultConfig.terminationDrainDuration)",
        yaml=f"# pod template annotation (the pod's other proxy settings kept):\nmetadata:\n  annotations:\n"
             f"    {PROXY_CONFIG}: |-\n      {proxy_config}",
        annotations=((PROXY_CONFIG, proxy_config),))


def duration_below(seconds: float) -> str:
    """A timeout safely below ``seconds`` as an Istio duration: 80 % of it, to whole seconds from 10 s, to 0.1 s
    from 1 s, to the millisecond below (never 0, which for an idle timeout means none at all)."""
    value = seconds * 0.8
    if value >= 10:
        return f"{math.floor(value)}s"
    if value >= 1:
        return f"{math.floor(value * 10) / 10:g}s"
    return f"{max(1, math.floor(value * 1000))}ms"


def upstream_pod_commands(cluster: IstioCluster | None, upstream_host: str | None) -> tuple[str, str]:
    """How to find the pod a caller's outbound line went to, as kubectl lines: (the command that lists it, ``-n NS ``
    for the cluster's namespace or ""). By %UPSTREAM_HOST%'s IP (``IP:port``, ``[v6]:port``) when the line has one
    (a pod's IP is its status.podIP, a field selector the API server serves for pods), else by the Service's
    EndpointSlices, else a comment naming the cluster's host."""
    ns = cluster.namespace if cluster is not None else None
    flag = f"-n {ns} " if ns else ""
    ip = ip_of(upstream_host)  # an IP, normalised; a host name is no pod's status.podIP
    if ip:
        return f"kubectl get pods -A -o wide --field-selector status.podIP={ip}", flag
    if cluster is not None and cluster.service:
        return f"kubectl get endpointslices {flag}-l kubernetes.io/service-name={cluster.service} -o wide", flag
    return f"# the pods behind {(cluster.host if cluster is not None else '') or 'the cluster'}", flag


# What to capture next for an access-log line no packet explains (core/correlate.py's own finding), by its flag.
_NEXT_CAPTURE = {
    "UC": "capture lo while it happens: a request from 127.0.0.6 on an idle pooled connection answered by the "
          "app's RST (with or without a FIN before it) is stale-keepalive; on eth0, a challenge ACK before it is "
          "tuple-collision",
    "UF": "capture lo: a SYN from 127.0.0.6 answered by RST means nothing listens on the app port; no answer "
          "means drops; on the caller's side, capture eth0 for challenge ACKs (tuple-collision)",
    "URX": "the retries were spent: look for the failure of each attempt (UF, UC) in the same window",
    "UPE": "capture lo: the app's response headers show which framing rule (RFC 9112 section 6) it breaks",
    "UH": "no healthy endpoint: check the cluster's hosts in /clusters (health_flags) and the endpoints",
    "UT": "the route timeout fired: compare the access log's duration with the app's response time on lo",
}


def capture_next(entry: AccessLogEntry) -> str:
    """The remediation of an access-log line no packet explains: what to capture next, by its response flag; for a
    caller's line (an outbound cluster) on the upstream pod, with the commands that find it by %UPSTREAM_HOST%."""
    nxt = next((_NEXT_CAPTURE[s] for s in entry.flags if s in _NEXT_CAPTURE),
               "capture lo and eth0 while it happens (kubectl meshdoctor watch)")
    upstream = ip_of(entry.upstream_host) if caller_side(entry) else None
    if upstream is None:
        return f"# What to capture next: {nxt}."
    # A caller's line: the lo to capture is the upstream pod's, not this one's.
    find, ns = upstream_pod_commands(parse_istio_cluster(entry.upstream_cluster), entry.upstream_host)
    return (f"# What to capture next, on the upstream pod ({upstream}): {nxt}.\n{find}\n"
            f"kubectl meshdoctor watch {ns}pod/<that pod>")
