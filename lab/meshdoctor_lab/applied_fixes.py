"""A printed fix, applied to a lab pod as Istio would render it (``lab up --pods collision --fix tproxy``).

The lab is given the fix as data (its name, the pod annotations and labels and the Istio fields it sets: a
finding's ``fixes[]``), never the detector, so the annotations and values a lab test applies are the ones a user
pastes. The annotations go on the lab's Pod object and from there where Istio's injector takes them:
``sidecar.istio.io/interceptionMode`` into istio-init's ``-m`` (the TPROXY rules, policy routing, a transparent
Envoy listener, istio-proxy run as root), ``traffic.sidecar.istio.io/excludeInboundPorts`` into its ``-d`` list
(a RETURN rule), ``proxy.istio.io/config``'s proxyMetadata INVALID_DROP into istio-init's environment (its mangle
rule dropping conntrack-INVALID packets), its holdApplicationUntilProxyStarts and
``sidecar.istio.io/rewriteAppHTTPProbers`` into the containers (apiserver/injection.py); the label
``sidecar.istio.io/inject`` decides whether the pod is injected at all (``injected``). A fix in the app, in
Envoy's configuration or in the client is applied by its name (SETUP_CHANGES, CLIENT_FIXES).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import yaml

from meshdoctor_lab.scenarios.table import (
    APP_PROTOCOL_TCP_FIX,
    CALLER_HTTP11_FIX,
    CALLER_IDLE_FIX,
    CALLER_NO_HALF_CLOSE_FIX,
    CALLER_NO_UPGRADE_FIX,
    CALLER_TIMEOUT_FIX,
    CALLER_VALID_REQUEST_FIX,
    CLIENT_PORT_FIX,
    DEFAULT_ROUTE_FIX,
    MAX_EJECTION_FIX,
    MAX_EJECTION_SETTINGS,
    MIN_HEALTH_FIX,
    MIN_HEALTH_SETTINGS,
    PERMISSIVE_MTLS_FIX,
    PERMISSIVE_MTLS_SETTINGS,
    POOL_LIMITS_FIX,
    POOL_LIMITS_SETTINGS,
    TCP_PORT_NAME_FIX,
    TLS_DISABLE_FIX,
    TLS_DISABLE_SETTINGS,
    PodSetup,
)
from meshdoctor_lab.state import LabError

INTERCEPTION_MODE = "sidecar.istio.io/interceptionMode"  # Istio's annotations, as the injector reads them
EXCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/excludeInboundPorts"
PROXY_CONFIG = "proxy.istio.io/config"  # its holdApplicationUntilProxyStarts: apiserver/injection.py, lab.py
REWRITE_PROBES = "sidecar.istio.io/rewriteAppHTTPProbers"  # apiserver/injection.py
ANNOTATIONS_APPLIED = (INTERCEPTION_MODE, EXCLUDE_INBOUND_PORTS, PROXY_CONFIG, REWRITE_PROBES)
INJECT = "sidecar.istio.io/inject"  # the pod label the injector reads first (pkg/kube/inject webhook.go)
LABELS_APPLIED = (INJECT,)


def injected(labels: tuple[tuple[str, str], ...]) -> bool:
    """Whether Istio's injector adds the sidecar to a pod with these template labels, in the lab's namespace
    (labelled istio-injection=enabled): unless the pod opts out with ``sidecar.istio.io/inject: "false"``."""
    return dict(labels).get(INJECT, "") != "false"  # injectRequired takes only "true" and "false", as written


def holds_application(proxy_config: str) -> bool:
    """Whether a ``proxy.istio.io/config`` value (ProxyConfig YAML) asks to hold the app until the proxy is
    ready (``holdApplicationUntilProxyStarts: true``)."""
    try:
        cfg = yaml.safe_load(proxy_config) if proxy_config else None
    except yaml.YAMLError:
        return False
    return isinstance(cfg, dict) and cfg.get("holdApplicationUntilProxyStarts") is True


def drops_invalid(proxy_config: str) -> bool:
    """Whether a ``proxy.istio.io/config`` value sets ``proxyMetadata.INVALID_DROP`` true: the injection template
    passes proxyMetadata to istio-init's environment, where istio-iptables reads INVALID_DROP (istio/istio
    tools/istio-iptables/pkg/cmd/root.go; strconv.ParseBool's true values)."""
    try:
        cfg = yaml.safe_load(proxy_config) if proxy_config else None
    except yaml.YAMLError:
        return False
    meta = cfg.get("proxyMetadata") if isinstance(cfg, dict) else None
    value = meta.get("INVALID_DROP") if isinstance(meta, dict) else None
    return str(value) in ("1", "t", "T", "TRUE", "true", "True")

# Fixes the scenario's client applies itself (its round changes); the mesh is left as it is.
CLIENT_FIXES = frozenset({CLIENT_PORT_FIX, CALLER_IDLE_FIX, CALLER_HTTP11_FIX, CALLER_NO_UPGRADE_FIX,
                          CALLER_VALID_REQUEST_FIX, CALLER_TIMEOUT_FIX, CALLER_NO_HALF_CLOSE_FIX})


def _without_bind(args: tuple[str, ...]) -> tuple[str, ...]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--bind":
            skip = True
        else:
            out.append(a)
    return tuple(out)


# Fixes in the app or in Envoy's configuration, by name: how each changes the scenario's pod. istiod renders a
# Sidecar ingress with defaultEndpoint 127.0.0.1:PORT as an inbound cluster to 127.0.0.1, the lab's
# legacy_inbound.
SETUP_CHANGES: dict[str, Callable[[PodSetup], PodSetup]] = {
    "app-listens": lambda setup: replace(setup, app_http=()),
    "app-framing": lambda setup: replace(setup, app_http=tuple(a for a in setup.app_http or ()
                                                                 if a != "--broken-framing")),
    "bind-all": lambda setup: replace(setup, app_http=_without_bind(setup.app_http or ())),
    "sidecar-localhost": lambda setup: replace(setup, sidecar=replace(setup.sidecar, legacy_inbound=True)),
    # the VirtualService's last http route without match: istiod renders it as a route on prefix /
    DEFAULT_ROUTE_FIX: lambda setup: replace(setup, sidecar=replace(setup.sidecar, vs_catch_all=True)),
    # a node sysctl in the cluster; the pod namespace's own in the lab (the kernel keeps it per namespace)
    "conntrack-be-liberal": lambda setup: replace(setup, conntrack_be_liberal=True),
    # the Service port's protocol declared TCP (its name's `tcp-` prefix, or appProtocol: tcp, which istiod reads
    # first): the lab reads a port's protocol from its name, so both are that name
    TCP_PORT_NAME_FIX: lambda setup: replace(setup, tcp_port_name="tcp-greeting"),
    APP_PROTOCOL_TCP_FIX: lambda setup: replace(setup, tcp_port_name="tcp-greeting"),
}


def _seconds(duration: str) -> float:
    """An Istio duration ("0.8s", "48s", "1m") in seconds. Raises LabError."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            try:
                return float(duration[:-len(unit)]) * units[unit]
            except ValueError:
                break
    raise LabError(f"{duration!r} is not a duration the lab reads (e.g. 0.8s)")


def _sidecar(**changes) -> Callable[[PodSetup], PodSetup]:
    return lambda setup: replace(setup, sidecar=replace(setup.sidecar, **changes))


def _port_range(value: str) -> tuple[int, int]:
    try:
        low, high = (int(p) for p in value.split())
    except ValueError:
        raise LabError(f"{value!r} is not a port range (e.g. \"1024 65000\")") from None
    return low, high


# The fields a fix sets (Kind.path) -> what they become in the lab pod: the Envoy setting istiod renders them
# into (bootstrap.SidecarSettings), or the pod's namespaced sysctl.
SETTINGS_APPLIED: dict[str, Callable[[PodSetup, str], PodSetup]] = {
    "DestinationRule.trafficPolicy.connectionPool.http.idleTimeout":
        lambda setup, v: _sidecar(upstream_idle_timeout_s=_seconds(v))(setup),
    # Istio's 0 means unlimited: Envoy is given no max_requests_per_connection at all
    "DestinationRule.trafficPolicy.connectionPool.http.maxRequestsPerConnection":
        lambda setup, v: _sidecar(upstream_max_requests_per_connection=int(v) or None)(setup),
    # istiod renders a VirtualService timeout as the route's timeout and max_grpc_timeout (bootstrap.py)
    "VirtualService.http.timeout": lambda setup, v: _sidecar(route_timeout_s=_seconds(v))(setup),
    "VirtualService.http.retries.attempts": lambda setup, v: _sidecar(route_retries=int(v))(setup),
    "VirtualService.http.retries.retryOn": lambda setup, v: _sidecar(route_retry_on=v)(setup),
    # pilot-agent passes ISTIO_META_HTTP10=1 on, and istiod renders accept_http_10 on the inbound HCM
    "ProxyConfig.proxyMetadata.ISTIO_META_HTTP10":
        lambda setup, v: _sidecar(accept_http_10=v == "1")(setup),
    "Pod.spec.securityContext.sysctls[net.ipv4.ip_local_port_range]":
        lambda setup, v: replace(setup, local_ports=_port_range(v)),
    # connectionPool: the circuit_breakers thresholds (Istio's 0 means unset: 2^32-1)
    "DestinationRule.trafficPolicy.connectionPool.tcp.maxConnections":
        lambda setup, v: _sidecar(pool_max_connections=_count(v))(setup),
    "DestinationRule.trafficPolicy.connectionPool.http.http1MaxPendingRequests":
        lambda setup, v: _sidecar(pool_max_pending_requests=_count(v))(setup),
    "DestinationRule.trafficPolicy.connectionPool.http.http2MaxRequests":
        lambda setup, v: _sidecar(pool_max_requests=_count(v))(setup),
    # outlierDetection: the outbound cluster's outlier_detection and healthy_panic_threshold
    "DestinationRule.trafficPolicy.outlierDetection.consecutive5xxErrors":
        lambda setup, v: _sidecar(outlier_consecutive_5xx=_count(v))(setup),
    "DestinationRule.trafficPolicy.outlierDetection.interval":
        lambda setup, v: _sidecar(outlier_interval_s=_seconds(v))(setup),
    "DestinationRule.trafficPolicy.outlierDetection.baseEjectionTime":
        lambda setup, v: _sidecar(outlier_base_ejection_s=_seconds(v))(setup),
    "DestinationRule.trafficPolicy.outlierDetection.maxEjectionPercent":
        lambda setup, v: _sidecar(outlier_max_ejection_percent=_whole(v))(setup),
    "DestinationRule.trafficPolicy.outlierDetection.minHealthPercent":
        lambda setup, v: _sidecar(outlier_min_health_percent=_whole(v))(setup),
    "DestinationRule.trafficPolicy.tls.mode": lambda setup, v: _sidecar(upstream_tls_mode=v)(setup),
    "PeerAuthentication.mtls.mode": lambda setup, v: _sidecar(mtls_mode=v)(setup),
}
# PeerAuthentication.portLevelMtls[PORT].mode: one port's mode over the workload's (STRICT unless set)
_PORT_MTLS = re.compile(r"PeerAuthentication\.portLevelMtls\[(\d+)\]\.mode")


def _port_mtls(setup: PodSetup, port: int, mode: str) -> PodSetup:
    sidecar = setup.sidecar
    ports = tuple((p, m) for p, m in sidecar.port_mtls if p != port) + ((port, mode),)
    return replace(setup, sidecar=replace(sidecar, mtls_mode=sidecar.mtls_mode or "PERMISSIVE", port_mtls=ports))


def _setting(path: str) -> Callable[[PodSetup, str], PodSetup] | None:
    """How the field ``path`` (``Kind.path``) changes a lab pod, None when the lab does not render it."""
    port = _PORT_MTLS.fullmatch(path)
    if port:
        return lambda setup, v: _port_mtls(setup, int(port.group(1)), v)
    return SETTINGS_APPLIED.get(path)


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise LabError(f"{value!r} is not a whole number") from None


def _count(value: str) -> int | None:
    """An Istio count where 0 means unset."""
    return _whole(value) or None


@dataclass(frozen=True)
class LabFix:
    """A fix as the lab is given it: its ``name``, the pod template ``annotations`` it sets (name, value), and the
    Istio fields it sets (``settings``: ``Kind.path``, value)."""

    name: str
    annotations: tuple[tuple[str, str], ...] = ()
    settings: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PodFix:
    """What a fix changes in a lab pod: the Pod's annotations, istio-init's mode and its -d additions, the
    app's or Envoy's settings (by name) or the client's round."""

    name: str
    annotations: tuple[tuple[str, str], ...] = ()
    interception: str = "REDIRECT"
    excluded_ports: tuple[int, ...] = ()
    settings: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def holds_application(self) -> bool:
        """The app starts only once the sidecar is ready (the lab starts Envoy first and waits for it)."""
        return holds_application(dict(self.annotations).get(PROXY_CONFIG, ""))

    @property
    def drops_invalid(self) -> bool:
        """istio-init adds its mangle rule dropping conntrack-INVALID packets (netns.ISTIO_DROP_INVALID_RULES)."""
        return drops_invalid(dict(self.annotations).get(PROXY_CONFIG, ""))

    def setup(self, setup: PodSetup) -> PodSetup:
        """``setup`` with this fix's change to the app or Envoy (unchanged for a fix of rules or client)."""
        change = SETUP_CHANGES.get(self.name)
        setup = change(setup) if change else setup
        for path, value in self.settings:
            setup = _setting(path)(setup, value)
        if self.labels:  # the fix's labels over the scenario's own
            setup = replace(setup, labels=tuple({**dict(setup.labels), **dict(self.labels)}.items()))
        return setup


NO_FIX = PodFix("")


def pod_fix(name: str, annotations: tuple[tuple[str, str], ...] = (),
            settings: tuple[tuple[str, str], ...] = (), labels: tuple[tuple[str, str], ...] = ()) -> PodFix:
    """How the fix ``name`` with ``annotations`` and ``settings`` changes a lab pod (NO_FIX for ""). Raises
    LabError for a fix the lab has no way to apply (an annotation or a field it does not render, or nothing to
    apply and no change of that name)."""
    if not name:
        return NO_FIX
    ann = dict(annotations)
    unknown = sorted(set(ann) - set(ANNOTATIONS_APPLIED))
    if unknown:
        raise LabError(f"fix {name}: the lab does not render the annotation {unknown[0]}")
    unknown = sorted(set(dict(labels)) - set(LABELS_APPLIED))
    if unknown:
        raise LabError(f"fix {name}: the lab does not render the label {unknown[0]}")
    fields = sorted(path for path, _ in settings if _setting(path) is None)
    if fields:
        raise LabError(f"fix {name}: the lab does not render {fields[0]}")
    for path, value in settings:
        try:
            _setting(path)(PodSetup(), value)  # a value the lab cannot read is refused now
        except ValueError as e:
            raise LabError(f"fix {name}: {path} = {value!r}: {e}") from None
    if not ann and not settings and not labels and name not in SETUP_CHANGES and name not in CLIENT_FIXES:
        raise LabError(f"fix {name}: the lab has no way to apply it")
    mode = ann.get(INTERCEPTION_MODE, "REDIRECT").upper()
    if mode not in ("REDIRECT", "TPROXY"):
        raise LabError(f"fix {name}: interception mode {mode} is not one the lab runs")
    excluded = tuple(int(p) for p in ann.get(EXCLUDE_INBOUND_PORTS, "").split(",") if p.strip().isdigit())
    return PodFix(name, tuple(annotations), mode, excluded, tuple(settings), tuple(labels))


# The fixes of the classes no detector prints yet, as the lab is given them (meshdoctor_lab/scenario_fixes.py lab_fix
# falls back on them): scenario -> its fixes, the one keeping the most of the mesh first.
LAB_FIXES: dict[str, tuple[LabFix, ...]] = {
    "overflow": (LabFix(POOL_LIMITS_FIX, settings=POOL_LIMITS_SETTINGS),),
    "outlier": (LabFix(MIN_HEALTH_FIX, settings=MIN_HEALTH_SETTINGS),
                LabFix(MAX_EJECTION_FIX, settings=MAX_EJECTION_SETTINGS)),
    "no-route": (LabFix(DEFAULT_ROUTE_FIX),),
    "mtls-strict": (LabFix(PERMISSIVE_MTLS_FIX, settings=PERMISSIVE_MTLS_SETTINGS),),
    "tls-to-plaintext": (LabFix(TLS_DISABLE_FIX, settings=TLS_DISABLE_SETTINGS),),
}
