"""The sidecar stand-in's admin API: Envoy's admin endpoints on 127.0.0.1:15000, in Envoy's own formats.

Served from the sidecar's process and event loop (sidecar.serve), so every number is a live counter of what the
stand-in did (SidecarStats) and /logging changes the levels its EnvoyLog filters on. Loopback only, like Envoy:
reachable from inside the pod network namespace (an ephemeral container, `kubectl port-forward pod 15000`), not
from the pod IP.

Endpoints (shapes: ../shared/reference/envoy/*.txt and their .SOURCE.md notes):
- GET /clusters                 text, `<cluster>::<key>::<value>` / `<cluster>::<host>::<stat>::<value>` lines
- GET /clusters?format=json     proto3 JSON (snake_case, defaults omitted, uint64 as strings), 1-space indent
- GET /stats                    `name: value` (text readouts, then counters and gauges, then histograms, each
                                sorted); ?filter=RE2 (partial match), ?usedonly, ?type=Counters|Gauges|
                                Histograms|TextReadouts|All, ?format=json
- POST /logging                 `active loggers:` list; ?level=L (all), ?<logger>=L (one), ?paths=a:L,b:L (many);
                                400 with Envoy's error + usage body on a bad level/logger/parameter count
- POST /reset_counters          zero every counter (gauges kept), "OK\n"
- GET /server_info              JSON: version `<sha>/1.33.2/Clean/RELEASE/BoringSSL`, state LIVE, uptimes,
                                command_line_options (Istio's envoy flags), node
- GET /ready                    `LIVE\n`
- GET /help, GET /              the command list / a small home page
Anything else: 404 `invalid path. admin commands are:...`. A mutating endpoint (/logging, /reset_counters) asked
with another method than POST: 405 `Method GET not allowed, POST required.` (Envoy's admin.cc). Other endpoints
accept GET and POST, as Envoy's do.

STAND-IN notes: the static clusters (prometheus_stats, agent, sds-grpc, xds-grpc, BlackHoleCluster,
PassthroughCluster, InboundPassthroughCluster) carry fixed, plausible numbers; the /stats set is what a pod that
opted in to `cluster.inbound`/`http.inbound` stats (proxyStatsMatcher) shows; histogram quantiles are computed by
linear interpolation over the recorded values (Envoy's circllhist buckets differ slightly); the help texts are
close to Envoy's, not byte-exact.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Iterable

from aiohttp import web

from kubectl_meshdoctor.lab.sidecar import (
    GAUGES,
    LOG_LEVELS,
    LOGGERS,
    ClusterStats,
    EnvoyLog,
    HostStats,
    SidecarStats,
)

ADMIN_HOST = "127.0.0.1"
ADMIN_PORT = 15000
MAX_U32 = 4294967295
MAX_U64 = 18446744073709551615


# ---------------------------------------------------------------------------------------------------------
# Which Envoy / Istio generation the stand-in imitates (sidecar --envoy-style).


@dataclass(frozen=True)
class EnvoyBuild:
    envoy: tuple[int, int, int]
    istio: str
    sha: str
    delimited: bool  # Istio >= 1.23: alt_stat_name / stat prefixes end in ";" (`cluster.inbound|5000||;.x`)
    unknown_rate: str  # how /clusters prints an unknown success rate (fmtlib changed -1.0 -> -1)

    @property
    def version(self) -> str:
        return f"{self.sha}/{'.'.join(map(str, self.envoy))}/Clean/RELEASE/BoringSSL"

    @property
    def delimiter(self) -> str:
        return ";" if self.delimited else ""


BUILDS = {
    "2025": EnvoyBuild((1, 33, 2), "1.25.2", "8a3b1c57e1e5ab4c37b1c3a0e4e5b4ad53f21a2d", True, "-1"),
    "2024": EnvoyBuild((1, 31, 2), "1.23.2", "3c2b4a6c54e6a4b5e3f1b2d90e0f7a1c6b5d4e3f", True, "-1"),
    "2022": EnvoyBuild((1, 24, 1), "1.16.1", "b5aa4e8a52d2f9b1d3b43c6f0c71d3f7ab8d2e61", False, "-1.0"),
}


@dataclass(frozen=True)
class PodInfo:
    """The pod the sidecar belongs to (for /clusters endpoints and /server_info's node)."""

    name: str
    namespace: str
    ip: str
    app_ports: tuple[int, ...]
    http_ports: tuple[int, ...]


# ---------------------------------------------------------------------------------------------------------
# Clusters as /clusters renders them.

INBOUND_THRESHOLDS = ((MAX_U32, MAX_U32, MAX_U32, MAX_U32), (1024, 1024, 1024, 3))  # Istio's defaults
ENVOY_THRESHOLDS = ((1024, 1024, 1024, 3), (1024, 1024, 1024, 3))  # Envoy's defaults (no circuit_breakers)
XDS_THRESHOLDS = ((100000, 100000, 100000, 3), (100000, 100000, 100000, 3))  # Istio bootstrap, xds-grpc
THRESHOLD_NAMES = ("max_connections", "max_pending_requests", "max_requests", "max_retries")
HOST_COUNTERS = ("cx_connect_fail", "cx_total", "rq_error", "rq_success", "rq_timeout", "rq_total")
HOST_GAUGES = ("cx_active", "rq_active")


@dataclass(frozen=True)
class HostView:
    address: str  # "ip:port" or a pipe path
    pipe: bool
    stats: HostStats


@dataclass(frozen=True)
class ClusterView:
    name: str
    added_via_api: bool
    thresholds: tuple[tuple[int, ...], tuple[int, ...]]
    hosts: tuple[HostView, ...]
    live: ClusterStats | None = None  # the stand-in's counters (inbound clusters)


def _static(name: str, api: bool, thresholds: tuple[tuple[int, ...], tuple[int, ...]],
            hosts: tuple[HostView, ...] = ()) -> ClusterView:
    return ClusterView(name, api, thresholds, hosts)


def _grpc_host(path: str) -> HostView:
    # One long-lived gRPC stream (ADS / SDS) on one connection to pilot-agent's unix socket.
    return HostView(path, True, HostStats(cx_active=1, cx_total=1, rq_active=1, rq_total=1))


def cluster_views(stats: SidecarStats) -> list[ClusterView]:
    """Every cluster in the order /clusters prints them (Envoy's is a hash order; this one is fixed)."""
    inbound = [
        ClusterView(name, True, INBOUND_THRESHOLDS,
                    tuple(HostView(addr, False, host) for addr, host in c.hosts.items()), c)
        for name, c in stats.clusters.items()
    ]
    return [
        _static("prometheus_stats", False, ENVOY_THRESHOLDS,
                (HostView("127.0.0.1:15000", False, HostStats()),)),
        _static("agent", False, ENVOY_THRESHOLDS, (HostView("127.0.0.1:15020", False, HostStats()),)),
        *inbound,
        _static("BlackHoleCluster", True, ENVOY_THRESHOLDS),
        _static("sds-grpc", False, ENVOY_THRESHOLDS, (_grpc_host("./var/run/secrets/workload-spiffe-uds/socket"),)),
        _static("InboundPassthroughCluster", True, INBOUND_THRESHOLDS),
        _static("xds-grpc", False, XDS_THRESHOLDS, (_grpc_host("./etc/istio/proxy/XDS"),)),
        _static("PassthroughCluster", True, INBOUND_THRESHOLDS),
    ]


def clusters_text(views: Iterable[ClusterView], build: EnvoyBuild) -> str:
    """GET /clusters (clusters_handler.cc writeClustersAsText)."""
    out: list[str] = []
    for c in views:
        n = c.name
        out.append(f"{n}::observability_name::{n}{build.delimiter}")
        for prio, values in zip(("default_priority", "high_priority"), c.thresholds):
            out += [f"{n}::{prio}::{key}::{v}" for key, v in zip(THRESHOLD_NAMES, values)]
        out.append(f"{n}::added_via_api::{str(c.added_via_api).lower()}")
        for h in c.hosts:
            prefix = f"{n}::{h.address}"
            out += [f"{prefix}::{key}::{getattr(h.stats, key)}" for key in sorted(HOST_COUNTERS + HOST_GAUGES)]
            out += [f"{prefix}::hostname::", f"{prefix}::health_flags::healthy", f"{prefix}::weight::1",
                    f"{prefix}::region::", f"{prefix}::zone::", f"{prefix}::sub_zone::", f"{prefix}::canary::false",
                    f"{prefix}::priority::0", f"{prefix}::success_rate::{build.unknown_rate}",
                    f"{prefix}::local_origin_success_rate::{build.unknown_rate}"]
    return "".join(line + "\n" for line in out)


def _metric(name: str, value: int, gauge: bool) -> dict[str, str]:
    # proto3 JSON: the COUNTER type (enum 0) and a zero value are defaults and left out; uint64 is a string.
    metric: dict[str, str] = {"type": "GAUGE"} if gauge else {}
    if value:
        metric["value"] = str(value)
    metric["name"] = name
    return metric


def clusters_json(views: Iterable[ClusterView], build: EnvoyBuild) -> str:
    """GET /clusters?format=json (admin.v3.Clusters)."""
    statuses = []
    for c in views:
        status: dict[str, Any] = {"name": c.name}
        if c.added_via_api:
            status["added_via_api"] = True
        if c.hosts:
            status["host_statuses"] = [{
                "address": {"pipe": {"path": h.address}} if h.pipe else {"socket_address": {
                    "address": h.address.rsplit(":", 1)[0], "port_value": int(h.address.rsplit(":", 1)[1])}},
                "stats": [_metric(k, getattr(h.stats, k), False) for k in HOST_COUNTERS]
                + [_metric(k, getattr(h.stats, k), True) for k in HOST_GAUGES],
                "health_status": {"eds_health_status": "HEALTHY"},
                "weight": 1,
                "locality": {},
            } for h in c.hosts]
        thresholds = []
        for prio, values in zip((None, "HIGH"), c.thresholds):
            t: dict[str, Any] = {"priority": prio} if prio else {}
            t.update(zip(THRESHOLD_NAMES, values))
            thresholds.append(t)
        status["circuit_breakers"] = {"thresholds": thresholds}
        status["observability_name"] = c.name + build.delimiter
        statuses.append(status)
    return json.dumps({"cluster_statuses": statuses}, indent=1)


# ---------------------------------------------------------------------------------------------------------
# /stats

# Stats every cluster has beyond what the stand-in counts (cluster_stats.rst; a real sidecar's dump). 0 unless
# cluster_extras() says otherwise.
CLUSTER_STAT_NAMES = (
    "assignment_stale", "assignment_timeout_received", "bind_errors",
    "circuit_breakers.default.cx_open", "circuit_breakers.default.cx_pool_open",
    "circuit_breakers.default.remaining_cx", "circuit_breakers.default.remaining_cx_pools",
    "circuit_breakers.default.remaining_pending", "circuit_breakers.default.remaining_retries",
    "circuit_breakers.default.remaining_rq", "circuit_breakers.default.rq_open",
    "circuit_breakers.default.rq_pending_open", "circuit_breakers.default.rq_retry_open",
    "circuit_breakers.high.cx_open", "circuit_breakers.high.cx_pool_open", "circuit_breakers.high.rq_open",
    "circuit_breakers.high.rq_pending_open", "circuit_breakers.high.rq_retry_open", "default.total_match_count",
    "http1.dropped_headers_with_underscores", "http1.metadata_not_supported_error",
    "http1.requests_rejected_with_underscores_in_headers", "http1.response_flood", "init_fetch_timeout",
    "lb_healthy_panic", "lb_local_cluster_not_ok", "lb_recalculate_zone_structures", "lb_subsets_active",
    "lb_subsets_created", "lb_subsets_fallback", "lb_subsets_fallback_panic", "lb_subsets_removed",
    "lb_subsets_selected", "lb_zone_cluster_too_small", "lb_zone_no_capacity_left", "lb_zone_number_differs",
    "lb_zone_routing_all_directly", "lb_zone_routing_cross_zone", "lb_zone_routing_sampled", "max_host_weight",
    "membership_change", "membership_degraded", "membership_excluded", "membership_healthy", "membership_total",
    "original_dst_host_invalid", "retry_or_shadow_abandoned", "update_attempt", "update_empty", "update_failure",
    "update_no_rebuild", "update_rejected", "update_success", "upstream_cx_active", "upstream_cx_close_notify",
    "upstream_cx_connect_attempts_exceeded", "upstream_cx_connect_fail", "upstream_cx_connect_timeout",
    "upstream_cx_connect_with_0_rtt", "upstream_cx_destroy", "upstream_cx_destroy_local",
    "upstream_cx_destroy_local_with_active_rq", "upstream_cx_destroy_remote",
    "upstream_cx_destroy_remote_with_active_rq", "upstream_cx_destroy_with_active_rq", "upstream_cx_http1_total",
    "upstream_cx_http2_total", "upstream_cx_http3_total", "upstream_cx_idle_timeout",
    "upstream_cx_max_duration_reached", "upstream_cx_max_requests", "upstream_cx_none_healthy",
    "upstream_cx_overflow", "upstream_cx_pool_overflow", "upstream_cx_protocol_error",
    "upstream_cx_rx_bytes_buffered", "upstream_cx_rx_bytes_total", "upstream_cx_total",
    "upstream_cx_tx_bytes_buffered", "upstream_cx_tx_bytes_total", "upstream_flow_control_backed_up_total",
    "upstream_flow_control_drained_total", "upstream_flow_control_paused_reading_total",
    "upstream_flow_control_resumed_reading_total", "upstream_http3_broken",
    "upstream_internal_redirect_failed_total", "upstream_internal_redirect_succeeded_total", "upstream_rq_0rtt",
    "upstream_rq_active", "upstream_rq_cancelled", "upstream_rq_completed", "upstream_rq_maintenance_mode",
    "upstream_rq_max_duration_reached", "upstream_rq_pending_active", "upstream_rq_pending_failure_eject",
    "upstream_rq_pending_overflow", "upstream_rq_pending_total", "upstream_rq_per_try_idle_timeout",
    "upstream_rq_per_try_timeout", "upstream_rq_retry", "upstream_rq_retry_backoff_exponential",
    "upstream_rq_retry_backoff_ratelimited", "upstream_rq_retry_limit_exceeded", "upstream_rq_retry_overflow",
    "upstream_rq_retry_success", "upstream_rq_rx_reset", "upstream_rq_timeout", "upstream_rq_total",
    "upstream_rq_tx_reset", "version",
)
CLUSTER_HISTOGRAMS = ("upstream_cx_connect_ms", "upstream_cx_length_ms", "upstream_rq_time")
HCM_STAT_NAMES = (
    "downstream_cx_active", "downstream_cx_destroy", "downstream_cx_destroy_active_rq",
    "downstream_cx_destroy_local", "downstream_cx_destroy_local_active_rq", "downstream_cx_destroy_remote",
    "downstream_cx_destroy_remote_active_rq", "downstream_cx_http1_active", "downstream_cx_http1_total",
    "downstream_cx_idle_timeout", "downstream_cx_protocol_error", "downstream_cx_total", "downstream_rq_1xx",
    "downstream_rq_2xx", "downstream_rq_3xx", "downstream_rq_4xx", "downstream_rq_5xx", "downstream_rq_active",
    "downstream_rq_completed", "downstream_rq_http1_total", "downstream_rq_idle_timeout",
    "downstream_rq_max_duration_reached", "downstream_rq_overload_close",
    "downstream_rq_response_before_rq_complete", "downstream_rq_rx_reset", "downstream_rq_timeout",
    "downstream_rq_too_large", "downstream_rq_total", "downstream_rq_tx_reset", "no_cluster", "no_route",
    "rq_direct_response", "rq_redirect", "rq_reset_after_downstream_response_started", "rq_total",
)
HCM_HISTOGRAMS = ("downstream_cx_length_ms", "downstream_rq_time")
QUANTILES = (0, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 100)
STAT_TYPES = ("All", "Counters", "Gauges", "Histograms", "TextReadouts")
_GAUGE_SUFFIXES = tuple(GAUGES) + ("_open", "max_host_weight", "version")
_GAUGE_PARTS = (".remaining_", ".membership_", "server.", "_buffered", "total_listeners_", "active_clusters",
                "warming_clusters")
_SERVER_COUNTERS = ("server.debug_assertion_failures", "server.envoy_bug_failures", "server.dynamic_unknown_fields",
                    "server.static_unknown_fields", "server.main_thread.watchdog_miss",
                    "server.main_thread.watchdog_mega_miss")


def is_gauge(name: str) -> bool:
    if name in _SERVER_COUNTERS:
        return False
    leaf = name.rsplit(".", 1)[-1]
    return leaf in GAUGES or name.endswith(_GAUGE_SUFFIXES) or any(p in name for p in _GAUGE_PARTS)


@dataclass
class StatsSnapshot:
    text_readouts: dict[str, str]
    values: dict[str, int]  # counters and gauges
    histograms: dict[str, list[float]]


def _cluster_values(view: ClusterView) -> dict[str, int]:
    values = dict.fromkeys(CLUSTER_STAT_NAMES, 0)
    live = view.live
    if live is not None:
        for f in fields(live):
            value = getattr(live, f.name)
            if isinstance(value, int):
                values[f.name] = value
        for code, n in live.upstream_rq_code.items():
            values[f"upstream_rq_{code}"] = n
        for klass in {code // 100 for code in live.upstream_rq_code}:
            values[f"upstream_rq_{klass}xx"] = sum(n for c, n in live.upstream_rq_code.items() if c // 100 == klass)
    else:  # a static cluster: its numbers follow from its hosts
        values["upstream_cx_total"] = sum(h.stats.cx_total for h in view.hosts)
        values["upstream_cx_active"] = sum(h.stats.cx_active for h in view.hosts)
        values["upstream_rq_total"] = sum(h.stats.rq_total for h in view.hosts)
        values["upstream_rq_active"] = sum(h.stats.rq_active for h in view.hosts)
    default = view.thresholds[0]
    values["circuit_breakers.default.remaining_cx"] = default[0] - values["upstream_cx_active"]
    values["circuit_breakers.default.remaining_pending"] = default[1] - values["upstream_rq_pending_active"]
    values["circuit_breakers.default.remaining_rq"] = default[2] - values["upstream_rq_active"]
    values["circuit_breakers.default.remaining_retries"] = default[3]
    values["circuit_breakers.default.remaining_cx_pools"] = MAX_U64 - (1 if view.hosts else 0)
    values["membership_total"] = values["membership_healthy"] = len(view.hosts)
    values["membership_change"] = 1 if view.hosts else 0
    values["max_host_weight"] = 1 if view.hosts else 0
    values["update_success"] = 0 if view.added_via_api else (1 if view.hosts else 0)
    return values


def snapshot(stats: SidecarStats, build: EnvoyBuild, pod: PodInfo) -> StatsSnapshot:
    """Every stat /stats prints, with live values."""
    d = build.delimiter
    views = cluster_views(stats)
    version = f"{datetime.fromtimestamp(stats.started, tz=timezone.utc):%Y-%m-%dT%H:%M:%SZ}/1"
    text: dict[str, str] = {"cluster_manager.cds.version_text": version,
                            "listener_manager.lds.version_text": version}
    values: dict[str, int] = {}
    histograms: dict[str, list[float]] = {}
    for view in views:
        prefix = f"cluster.{view.name}{d}"
        if view.added_via_api:
            text[f"{prefix}.version_text"] = version
        values.update((f"{prefix}.{k}", v) for k, v in _cluster_values(view).items())
        live = view.live
        for name in CLUSTER_HISTOGRAMS:
            histograms[f"{prefix}.{name}"] = list(live.histograms.get(name, ())) if live is not None else []
    for port in sorted(stats.http):
        prefix = f"http.inbound_0.0.0.0_{port}{d}"
        values.update((f"{prefix}.{k}", 0) for k in HCM_STAT_NAMES)
        hcm = stats.http[port]
        for name in HCM_HISTOGRAMS:
            histograms[f"{prefix}.{name}"] = list(hcm.histograms.get(name, ()))
    for name, value in stats.flat(d):
        if name.startswith(("http.", "tcp.", "listener.")):
            values[name] = value
    uptime = int(time.time() - stats.started)
    memory = _rss()
    values.update({
        "cluster_manager.active_clusters": len(views), "cluster_manager.cds.update_attempt": 1,
        "cluster_manager.cds.update_success": 1, "cluster_manager.cluster_added": len(views),
        "cluster_manager.cluster_modified": 0, "cluster_manager.cluster_removed": 0,
        "cluster_manager.warming_clusters": 0,
        "listener_manager.lds.update_attempt": 1, "listener_manager.lds.update_success": 1,
        "listener_manager.listener_added": 4, "listener_manager.listener_create_success": 8,
        "listener_manager.total_listeners_active": 4, "listener_manager.total_listeners_draining": 0,
        "listener_manager.total_listeners_warming": 0,
        "server.concurrency": 2, "server.debug_assertion_failures": 0, "server.dynamic_unknown_fields": 0,
        "server.envoy_bug_failures": 0, "server.hot_restart_epoch": 0, "server.hot_restart_generation": 1,
        "server.live": 1, "server.main_thread.watchdog_mega_miss": 0, "server.main_thread.watchdog_miss": 0,
        "server.memory_allocated": memory, "server.memory_heap_size": memory, "server.memory_physical_size": memory,
        "server.parent_connections": 0, "server.state": 0, "server.static_unknown_fields": 0,
        "server.stats_recent_lookups": 0, "server.total_connections": stats.downstream_cx_active,
        "server.uptime": uptime, "server.version": int(build.sha[:6], 16),
    })
    return StatsSnapshot(text, values, histograms)


def _rss() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - a stat, never a failure of the admin API
        return 0


def _number(value: float) -> str:
    """A double as Envoy's fmt prints it: shortest form, no trailing `.0`."""
    if math.isnan(value):
        return "nan"
    return f"{value:.6g}"


def quantiles(values: list[float]) -> list[float]:
    """QUANTILES of `values` (linear interpolation between order statistics)."""
    ordered = sorted(values)
    out = []
    for q in QUANTILES:
        pos = (len(ordered) - 1) * q / 100
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
    return out


def histogram_text(values: list[float]) -> str:
    if not values:
        return "No recorded values"
    # (interval, cumulative): the interval is the last stats flush's share, which the stand-in does not keep.
    return " ".join(f"P{_number(q)}(nan,{_number(v)})" for q, v in zip(QUANTILES, quantiles(values)))


class StatsQueryError(ValueError):
    pass


def select_stats(snap: StatsSnapshot, *, filter_re: str | None, used_only: bool, stat_type: str) -> StatsSnapshot:
    """Apply /stats' filter (RE2 partial match), usedonly and type parameters. Raises StatsQueryError."""
    try:
        pattern = re.compile(filter_re) if filter_re else None
    except re.error:
        raise StatsQueryError("Invalid re2 regex") from None
    if stat_type not in STAT_TYPES:
        raise StatsQueryError(f"invalid type: {stat_type}")

    def keep(name: str, kind: str, used: bool) -> bool:
        if pattern is not None and not pattern.search(name):
            return False
        if used_only and not used:
            return False
        return stat_type == "All" or stat_type == kind

    return StatsSnapshot(
        {k: v for k, v in snap.text_readouts.items() if keep(k, "TextReadouts", bool(v))},
        {k: v for k, v in snap.values.items() if keep(k, "Gauges" if is_gauge(k) else "Counters", v != 0)},
        {k: v for k, v in snap.histograms.items() if keep(k, "Histograms", bool(v))},
    )


def stats_text(snap: StatsSnapshot) -> str:
    lines = [f'{k}: "{v}"' for k, v in sorted(snap.text_readouts.items())]
    lines += [f"{k}: {v}" for k, v in sorted(snap.values.items())]
    lines += [f"{k}: {histogram_text(v)}" for k, v in sorted(snap.histograms.items())]
    return "".join(line + "\n" for line in lines)


def stats_json(snap: StatsSnapshot) -> str:
    items: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(snap.text_readouts.items())]
    items += [{"name": k, "value": v} for k, v in sorted(snap.values.items())]
    if snap.histograms:
        computed = []
        for name, values in sorted(snap.histograms.items()):
            qs = quantiles(values) if values else [None] * len(QUANTILES)
            computed.append({"name": name, "values": [{"interval": None, "cumulative": q} for q in qs]})
        items.append({"histograms": {"supported_quantiles": list(QUANTILES), "computed_quantiles": computed}})
    return json.dumps({"stats": items}, indent=1)


# ---------------------------------------------------------------------------------------------------------
# /logging (logs_handler.cc)

LOGGING_USAGE = (
    "usage: /logging?<name>=<level> (change single level)\n"
    "usage: /logging?paths=name1:level1,name2:level2,... (change multiple levels)\n"
    "usage: /logging?level=<level> (change all levels)\n"
    "levels: " + "".join(f"{level} " for level in LOG_LEVELS) + "\n"
)


class LoggingError(ValueError):
    pass


def change_log_levels(levels: dict[str, str], params: list[tuple[str, str]]) -> None:
    """Envoy's LogsHandler::changeLogLevel on the (key, value) query parameters, in order. Changes `levels`
    in place, all or nothing; raises LoggingError with Envoy's message."""
    data: dict[str, list[str]] = {}
    for key, value in params:
        data.setdefault(key, []).append(value)
    # The HTML admin page always sends level= and paths=, possibly empty: empty ones are dropped.
    for key in ("level", "paths"):
        if key in data and data[key][0] == "":
            del data[key]
    if not data:
        return
    if len(data) != 1:
        raise LoggingError("invalid number of parameters")
    if "level" in data:
        level = _parse_level(data["level"][0])
        for name in levels:
            levels[name] = level
        return
    changes: dict[str, str] = {}
    if "paths" in data:
        for pair in (p for p in data["paths"][0].split(",") if p.strip()):
            name, _, level = pair.partition(":")
            if not name.strip() or not level.strip():
                raise LoggingError("empty logger name or empty logger level")
            changes[name.strip()] = _parse_level(level.strip())
    else:
        ((name, values),) = data.items()
        changes[name] = _parse_level(values[0])
    if any(name not in levels for name in changes):
        raise LoggingError("unknown logger name")
    levels.update(changes)


def _parse_level(text: str) -> str:
    if text not in LOG_LEVELS:
        raise LoggingError("unknown logger level")
    return text


def active_loggers(levels: dict[str, str]) -> str:
    return "active loggers:\n" + "".join(f"  {name}: {levels[name]}\n" for name in LOGGERS if name in levels) + "\n"


def logging_response(levels: dict[str, str], params: list[tuple[str, str]]) -> tuple[int, str]:
    """(status, body) of POST /logging?<params>."""
    try:
        change_log_levels(levels, params)
    except LoggingError as exc:
        return 400, f"error: {exc}\n\n" + LOGGING_USAGE + active_loggers(levels)
    return 200, active_loggers(levels)


# ---------------------------------------------------------------------------------------------------------
# The server


@dataclass(frozen=True)
class Endpoint:
    handler: Callable[[web.Request], Awaitable[web.Response]]
    help: str
    mutates: bool = False
    params: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (name, help, enum values)


TEXT = "text/plain; charset=UTF-8"
JSON = "application/json"


class AdminServer:
    """Envoy's admin listener for one sidecar stand-in: `await start()`, `await stop()`."""

    def __init__(self, stats: SidecarStats, log: EnvoyLog, pod: PodInfo, *, host: str = ADMIN_HOST,
                 port: int = ADMIN_PORT, style: str = "2025") -> None:
        self.stats = stats
        self.log = log
        self.pod = pod
        self.host = host
        self.port = port
        self.build = BUILDS[style]
        self._runner: web.AppRunner | None = None
        self.endpoints: dict[str, Endpoint] = {
            "/": Endpoint(self._home, "Admin home page"),
            "/clusters": Endpoint(self._clusters, "upstream cluster status",
                                  params=(("format", "File format to use", ("text", "json")),)),
            "/help": Endpoint(self._help, "print out list of admin commands"),
            "/logging": Endpoint(self._logging, "query/change logging levels", mutates=True, params=(
                ("paths", "Change multiple logging levels by setting to <logger_name1>:<desired_level1>,"
                          "<logger_name2>:<desired_level2>. If fine grain logging is enabled, use __FILE__ or a "
                          "glob experision as the logger name. For example, source/common*:warning", ()),
                ("level", "desired logging level, this will change all loggers's level", ("", *LOG_LEVELS)))),
            "/ready": Endpoint(self._ready, "print server state, return 200 if LIVE, otherwise return 503"),
            "/reset_counters": Endpoint(self._reset_counters, "reset all counters to zero", mutates=True),
            "/server_info": Endpoint(self._server_info, "print server version/status information"),
            "/stats": Endpoint(self._stats, "print server stats", params=(
                ("usedonly", "Only include stats that have been written by system since restart", ()),
                ("filter", "Regular expression (Google re2) for filtering stats", ()),
                ("format", "Format to use", ("text", "json")),
                ("type", "Stat types to include.", STAT_TYPES))),
        }

    async def start(self) -> None:
        """Bind host:port and serve; raises OSError when the port is taken."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the bound port when asked for port 0

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- plumbing ---

    @staticmethod
    def _reply(body: str, status: int = 200, content_type: str = TEXT) -> web.Response:
        # Envoy's admin response headers (admin_filter / admin.cc): no-cache, nosniff, server envoy.
        return web.Response(status=status, body=body.encode(), headers={
            "Content-Type": content_type, "Cache-Control": "no-cache, max-age=0",
            "X-Content-Type-Options": "nosniff", "Server": "envoy",
        })

    def help_text(self) -> str:
        out = ["admin commands are:\n"]
        for path in sorted(self.endpoints):
            ep = self.endpoints[path]
            out.append(f"  {path}{' (POST)' if ep.mutates else ''}: {ep.help}\n")
            for name, text, values in ep.params:
                out.append(f"      {name}: {text}\n")
                if values:
                    out.append(f"          Values: {', '.join(values)}\n")
        return "".join(out)

    async def _dispatch(self, request: web.Request) -> web.Response:
        ep = self.endpoints.get(request.path)
        if ep is None:
            return self._reply("invalid path. " + self.help_text(), 404)
        if ep.mutates and request.method != "POST":
            return self._reply(f"Method {request.method} not allowed, POST required.", 405)
        return await ep.handler(request)

    # --- endpoints ---

    async def _home(self, request: web.Request) -> web.Response:
        rows = "".join(f"<tr><td><a href='{p[1:] or '.'}'>{p}</a></td><td>{e.help}</td></tr>"
                       for p, e in sorted(self.endpoints.items()) if p != "/")
        return self._reply(f"<html><head><title>Envoy Admin</title></head><body><table>{rows}</table></body></html>",
                           content_type="text/html; charset=UTF-8")

    async def _help(self, request: web.Request) -> web.Response:
        return self._reply(self.help_text())

    async def _clusters(self, request: web.Request) -> web.Response:
        views = cluster_views(self.stats)
        if request.query.get("format") == "json":
            return self._reply(clusters_json(views, self.build), content_type=JSON)
        return self._reply(clusters_text(views, self.build))

    async def _stats(self, request: web.Request) -> web.Response:
        query = request.query
        fmt = query.get("format", "text")
        if fmt not in ("text", "json"):
            return self._reply("usage: /stats?format=(text|json)\n\n", 400)
        try:
            snap = select_stats(snapshot(self.stats, self.build, self.pod), filter_re=query.get("filter"),
                                used_only="usedonly" in query, stat_type=query.get("type", "All"))
        except StatsQueryError as exc:
            return self._reply(str(exc), 400)
        if fmt == "json":
            return self._reply(stats_json(snap), content_type=JSON)
        return self._reply(stats_text(snap))

    async def _logging(self, request: web.Request) -> web.Response:
        status, body = logging_response(self.log.levels, list(request.query.items()))
        return self._reply(body, status)

    async def _reset_counters(self, request: web.Request) -> web.Response:
        self.stats.reset_counters()
        return self._reply("OK\n")

    async def _ready(self, request: web.Request) -> web.Response:
        return self._reply("LIVE\n")

    async def _server_info(self, request: web.Request) -> web.Response:
        return self._reply(json.dumps(self.server_info(), indent=1), content_type=JSON)

    def server_info(self) -> dict[str, Any]:
        """admin.v3.ServerInfo as Envoy prints it (every primitive field, defaults included)."""
        uptime = f"{int(time.time() - self.stats.started)}s"
        major, minor, patch = self.build.envoy
        pod = self.pod
        return {
            "version": self.build.version,
            "state": "LIVE",
            "uptime_current_epoch": uptime,
            "uptime_all_epochs": uptime,
            "hot_restart_version": "disabled",
            "command_line_options": {
                "base_id": "0", "use_dynamic_base_id": False, "skip_hot_restart_on_no_parent": False,
                "skip_hot_restart_parent_stats": False, "base_id_path": "", "concurrency": 2,
                "config_path": "etc/istio/proxy/envoy-rev.json", "config_yaml": "",
                "allow_unknown_static_fields": True, "reject_unknown_dynamic_fields": False,
                "ignore_unknown_dynamic_fields": False, "admin_address_path": "",
                "local_address_ip_version": "v4", "log_level": "warning", "component_log_level": "misc:error",
                "log_format": self.log.format_string, "log_format_escaped": False, "log_path": "",
                "service_cluster": "", "service_node": "", "service_zone": "", "drain_strategy": "Immediate",
                "mode": "Serve", "disable_hot_restart": True, "enable_mutex_tracing": False, "restart_epoch": 0,
                "cpuset_threads": False, "disabled_extensions": [], "enable_fine_grain_logging": False,
                "socket_path": "@envoy_domain_socket", "socket_mode": 0, "enable_core_dump": False,
                "stats_tag": [], "file_flush_interval": "1s", "drain_time": "45s", "parent_shutdown_time": "60s",
            },
            "node": {
                "id": f"sidecar~{pod.ip}~{pod.name}.{pod.namespace}~{pod.namespace}.svc.cluster.local",
                "cluster": f"{pod.name}.{pod.namespace}",
                "metadata": {
                    "CLUSTER_ID": "Kubernetes", "INSTANCE_IPS": pod.ip, "ISTIO_VERSION": self.build.istio,
                    "NAME": pod.name, "NAMESPACE": pod.namespace, "WORKLOAD_NAME": pod.name,
                    "INTERCEPTION_MODE": "REDIRECT", "ENVOY_STATS_MATCHER": {
                        "inclusionPrefixes": "cluster.inbound,http.inbound"},
                    "APP_CONTAINERS": "app",
                },
                "locality": {},
                "user_agent_name": "envoy",
                "user_agent_build_version": {
                    "version": {"major_number": major, "minor_number": minor, "patch": patch},
                    "metadata": {"build.type": "RELEASE", "revision.sha": self.build.sha,
                                 "revision.status": "Clean", "ssl.version": "BoringSSL"},
                },
            },
        }

