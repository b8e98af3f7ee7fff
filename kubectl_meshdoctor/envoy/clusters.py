"""Envoy admin `GET /clusters` (text) and `GET /clusters?format=json` parsed into one shape.

Sources (the samples and their provenance: tests/envoy/data/clusters.txt.SOURCE.md, clusters.json.SOURCE.md):
- envoyproxy/envoy `source/server/admin/clusters_handler.cc` (`writeClustersAsText`, `addOutlierInfo`,
  `addCircuitBreakerSettingsAsText`, `writeClustersAsJson`, `setHealthFlag`), `clusters_renderer.cc`;
- `envoy/upstream/host_description.h` (`ALL_HOST_STATS`), `source/common/upstream/host_utility.cc`
  (`healthFlagsToString`);
- `api/envoy/admin/v3/clusters.proto` and `metrics.proto` (JSON field names, proto3 JSON rules).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .numbers import ascii_int


class FormatError(ValueError):
    """The body is not the Envoy admin format the parser was asked for (message: one line)."""


# healthFlagsToString order; JSON booleans map onto the same names so both formats agree.
HEALTH_FLAGS: tuple[str, ...] = (
    "failed_active_hc", "failed_outlier_check", "failed_eds_health", "degraded_active_hc",
    "degraded_eds_health", "pending_dynamic_removal", "pending_active_hc", "excluded_via_immediate_hc_fail",
    "active_hc_timeout", "eds_status_draining",
)
_JSON_HEALTH_BOOLS = {
    "failed_active_health_check": "failed_active_hc",
    "failed_outlier_check": "failed_outlier_check",
    "failed_active_degraded_check": "degraded_active_hc",
    "pending_dynamic_removal": "pending_dynamic_removal",
    "pending_active_hc": "pending_active_hc",
    "excluded_via_immediate_hc_fail": "excluded_via_immediate_hc_fail",
    "active_hc_timeout": "active_hc_timeout",
}
_JSON_EDS_STATUS = {
    "UNHEALTHY": "failed_eds_health",
    "DEGRADED": "degraded_eds_health",
    "DRAINING": "eds_status_draining",
    "TIMEOUT": "failed_eds_health",
}

HOST_COUNTERS = ("cx_active", "cx_connect_fail", "cx_total", "rq_active", "rq_error", "rq_success",
                 "rq_timeout", "rq_total")
THRESHOLD_KEYS = ("max_connections", "max_pending_requests", "max_requests", "max_retries")
OUTLIER_KEYS = ("success_rate_average", "success_rate_ejection_threshold",
                "local_origin_success_rate_average", "local_origin_success_rate_ejection_threshold")
_CLUSTER_KEYS = ("observability_name", "outlier", "default_priority", "high_priority", "added_via_api",
                 "eds_service_name")
_HOST_KEYS = frozenset(HOST_COUNTERS) | {"hostname", "health_flags", "weight", "region", "zone", "sub_zone",
                                         "canary", "priority", "success_rate", "local_origin_success_rate"}


@dataclass(frozen=True)
class Thresholds:
    """Circuit-breaker limits of one routing priority (Istio's defaults are 4294967295 = unlimited)."""

    priority: str  # "default" or "high"
    max_connections: int | None = None
    max_pending_requests: int | None = None
    max_requests: int | None = None
    max_retries: int | None = None


@dataclass(frozen=True)
class Outlier:
    """Outlier-detector values; None where Envoy printed -1 ("not enough data") or omitted the key."""

    success_rate_average: float | None = None
    success_rate_ejection_threshold: float | None = None
    local_origin_success_rate_average: float | None = None
    local_origin_success_rate_ejection_threshold: float | None = None


@dataclass(frozen=True)
class Host:
    """One upstream host of a cluster with its per-host counters (ints)."""

    address: str  # IP without brackets, or a unix socket path (pipe)
    port: int | None  # None for a pipe
    cx_active: int = 0
    cx_connect_fail: int = 0
    cx_total: int = 0
    rq_active: int = 0
    rq_error: int = 0
    rq_success: int = 0
    rq_timeout: int = 0
    rq_total: int = 0
    health_flags: tuple[str, ...] = ()  # () is healthy; else e.g. ("failed_outlier_check",)
    hostname: str = ""
    weight: int = 1
    region: str = ""
    zone: str = ""
    sub_zone: str = ""
    canary: bool = False
    priority: int = 0
    success_rate: float | None = None  # None when Envoy has no value (-1 / key absent)
    local_origin_success_rate: float | None = None

    @property
    def healthy(self) -> bool:
        return not self.health_flags

    @property
    def endpoint(self) -> str:
        """The address as the text format and `%UPSTREAM_HOST%` print it: `ip:port`, `[v6]:port` or a path."""
        if self.port is None:
            return self.address
        if ":" in self.address:
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


@dataclass(frozen=True)
class Cluster:
    """One upstream cluster (Istio: `outbound|<port>|<subset>|<host>`, `inbound|<port>||`, static ones)."""

    name: str
    observability_name: str = ""  # as printed: Istio >= 1.23 appends ";" (alt_stat_name delimiter)
    added_via_api: bool = False
    eds_service_name: str | None = None
    default_priority: Thresholds | None = None
    high_priority: Thresholds | None = None
    outlier: Outlier | None = None
    hosts: tuple[Host, ...] = ()

    @property
    def stat_name(self) -> str:
        """The name in `/stats` (`cluster.<stat_name>;.<stat>` or `cluster.<stat_name>.<stat>`)."""
        return (self.observability_name or self.name).removesuffix(";")

    def host(self, endpoint: str) -> Host | None:
        """The host whose `ip:port` / `[v6]:port` / path is `endpoint` (as in `%UPSTREAM_HOST%`)."""
        return next((h for h in self.hosts if h.endpoint == endpoint), None)


def parse_clusters(body: str) -> dict[str, Cluster]:
    """Either format of `/clusters`, by its first character; clusters keyed by name in body order."""
    return parse_clusters_json(body) if body.lstrip().startswith("{") else parse_clusters_text(body)


# ---------------------------------------------------------------------------------------------------------
# Text format


@dataclass
class _ClusterBuilder:
    name: str
    values: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, dict[str, int]] = field(default_factory=dict)
    outlier: dict[str, float | None] = field(default_factory=dict)
    hosts: dict[tuple[str, int | None], dict[str, Any]] = field(default_factory=dict)


def _rate(value: str) -> float | None:
    """A success-rate value: -1 (`-1` or older `-1.0`) means "not enough data"."""
    number = float(value)
    return None if number < 0 else number


def _split_address(rest: str) -> tuple[str, int | None, str] | None:
    """`10.0.0.1:80::key::v` / `[fd00::1]:80::key::v` / `./path::key::v` -> (address, port, "key::v").

    IPv6 addresses contain `::`, so a bracketed address is cut at its `]:port` first.
    """
    if rest.startswith("["):
        match = re.match(r"\[([0-9A-Fa-f:.%\w]*)\]:([0-9]{1,5})::", rest)
        if not match:
            return None
        return match.group(1), int(match.group(2)), rest[match.end():]
    address, sep, tail = rest.partition("::")
    if not sep:
        return None
    ip, colon, port = address.rpartition(":")
    number = ascii_int(port, max_digits=5) if colon else None
    if number is not None and ip and not ip.startswith("."):
        return ip, number, tail
    return address, None, tail  # a pipe path, e.g. ./etc/istio/proxy/XDS


def _cluster_line(builder: _ClusterBuilder, key: str, tail: str) -> bool:
    """Apply one cluster-level line; False when it is not one we know."""
    if key in ("observability_name", "eds_service_name"):
        builder.values[key] = tail
        return True
    if key == "added_via_api":
        builder.values[key] = tail == "true"
        return True
    name, sep, value = tail.partition("::")
    if not sep:
        return False
    if key in ("default_priority", "high_priority") and name in THRESHOLD_KEYS:
        builder.thresholds.setdefault(key, {})[name] = int(value)
        return True
    if key == "outlier" and name in OUTLIER_KEYS:
        builder.outlier[name] = _rate(value)
        return True
    return False


def _host_line(host: dict[str, Any], key: str, value: str) -> bool:
    if key not in _HOST_KEYS:
        return False
    if key in HOST_COUNTERS or key in ("weight", "priority"):
        host[key] = int(value)
    elif key in ("success_rate", "local_origin_success_rate"):
        host[key] = _rate(value)
    elif key == "canary":
        host[key] = value == "true"
    elif key == "health_flags":
        host[key] = tuple(f for f in value.split("/") if f and f != "healthy")
    else:
        host[key] = value
    return True


def _apply_line(clusters: dict[str, _ClusterBuilder], line: str) -> bool:
    name, sep, rest = line.partition("::")
    if not sep or not name:
        return False
    builder = clusters.get(name) or _ClusterBuilder(name)
    key, _, tail = rest.partition("::")
    try:
        if key in _CLUSTER_KEYS:
            known = _cluster_line(builder, key, tail)
        else:
            split = _split_address(rest)
            if split is None:
                return False
            address, port, host_tail = split
            host_key, sep, value = host_tail.partition("::")
            host = builder.hosts.get((address, port), {"address": address, "port": port})
            known = bool(sep) and _host_line(host, host_key, value)
            if known:
                builder.hosts[(address, port)] = host
    except ValueError:  # a value of the wrong type: not a line we understand
        return False
    if known:
        clusters[name] = builder
    return known


def _freeze(builder: _ClusterBuilder) -> Cluster:
    thresholds = {p: Thresholds(p.removesuffix("_priority"), **v) for p, v in builder.thresholds.items()}
    return Cluster(
        name=builder.name,
        observability_name=builder.values.get("observability_name", ""),
        added_via_api=builder.values.get("added_via_api", False),
        eds_service_name=builder.values.get("eds_service_name"),
        default_priority=thresholds.get("default_priority"),
        high_priority=thresholds.get("high_priority"),
        outlier=Outlier(**builder.outlier) if builder.outlier else None,
        hosts=tuple(Host(**h) for h in builder.hosts.values()),
    )


def _not_the_format(what: str, body: str) -> FormatError:
    first = next((line.strip() for line in body.splitlines() if line.strip()), "")
    return FormatError(f"not an Envoy {what} body: first line is {first[:60]!r}")


def parse_clusters_text(body: str) -> dict[str, Cluster]:
    """`GET /clusters`: `<cluster>::<key>::<value>` and `<cluster>::<host>::<stat>::<value>` lines.

    Lines we do not understand are skipped (newer Envoy adds keys); a non-empty body with no line we
    understand raises FormatError.
    """
    clusters: dict[str, _ClusterBuilder] = {}
    lines = [line.rstrip("\r") for line in body.splitlines() if line.strip()]
    known = sum(_apply_line(clusters, line) for line in lines)
    if lines and not known:
        raise _not_the_format("/clusters", body)
    return {name: _freeze(b) for name, b in clusters.items()}


# ---------------------------------------------------------------------------------------------------------
# JSON format (proto3 JSON: snake_case, defaults omitted, uint64 as strings; istioctl re-marshals camelCase)


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def _snake_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {_snake(k): _snake_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake_keys(v) for v in value]
    return value


def _json_rate(value: Any) -> float | None:
    if not isinstance(value, dict) or "value" not in value:
        return None
    return _rate(str(value["value"]))


def _json_host(status: dict[str, Any]) -> Host:
    address = status.get("address") or {}
    if "socket_address" in address:
        sock = address["socket_address"]
        ip, port = str(sock.get("address", "")), int(sock.get("port_value", 0))
    elif "pipe" in address:
        ip, port = str(address["pipe"].get("path", "")), None
    else:
        ip, port = "", None
    counters = {}
    for stat in status.get("stats") or ():
        if stat.get("name") in HOST_COUNTERS:
            counters[stat["name"]] = int(stat.get("value", 0))  # uint64 arrives as a string; 0 is omitted
    health = status.get("health_status") or {}
    flags = {name for key, name in _JSON_HEALTH_BOOLS.items() if health.get(key)}
    if health.get("eds_health_status") in _JSON_EDS_STATUS:
        flags.add(_JSON_EDS_STATUS[health["eds_health_status"]])
    locality = status.get("locality") or {}
    return Host(
        address=ip, port=port, **counters,
        health_flags=tuple(f for f in HEALTH_FLAGS if f in flags),
        hostname=str(status.get("hostname", "")),
        weight=int(status.get("weight", 1)),  # never 0 in practice; match the text default
        region=str(locality.get("region", "")), zone=str(locality.get("zone", "")),
        sub_zone=str(locality.get("sub_zone", "")),
        priority=int(status.get("priority", 0)),
        success_rate=_json_rate(status.get("success_rate")),
        local_origin_success_rate=_json_rate(status.get("local_origin_success_rate")),
    )


def _json_cluster(status: dict[str, Any]) -> Cluster:
    thresholds: dict[str, Thresholds] = {}
    for t in (status.get("circuit_breakers") or {}).get("thresholds") or ():
        priority = "high" if t.get("priority") == "HIGH" else "default"  # DEFAULT is the omitted zero enum
        thresholds[priority] = Thresholds(priority, **{k: int(t[k]) for k in THRESHOLD_KEYS if k in t})
    sr = _json_rate(status.get("success_rate_ejection_threshold"))
    lo = _json_rate(status.get("local_origin_success_rate_ejection_threshold"))
    return Cluster(
        name=str(status["name"]),
        observability_name=str(status.get("observability_name", "")),
        added_via_api=bool(status.get("added_via_api", False)),
        eds_service_name=status.get("eds_service_name"),
        default_priority=thresholds.get("default"),
        high_priority=thresholds.get("high"),
        outlier=Outlier(success_rate_ejection_threshold=sr, local_origin_success_rate_ejection_threshold=lo)
        if sr is not None or lo is not None else None,
        hosts=tuple(_json_host(h) for h in status.get("host_statuses") or ()),
    )


def parse_clusters_json(body: str) -> dict[str, Cluster]:
    """`GET /clusters?format=json` (`envoy.admin.v3.Clusters`), snake_case or istioctl's camelCase."""
    try:
        doc = _snake_keys(json.loads(body))
    except json.JSONDecodeError as e:
        raise FormatError(f"not an Envoy /clusters JSON body: {e.msg} at line {e.lineno}") from None
    except (ValueError, RecursionError) as e:  # a number of > 4300 digits; nesting deeper than Python recurses
        raise FormatError(f"not an Envoy /clusters JSON body: {type(e).__name__}") from None
    if not isinstance(doc, dict) or (doc and "cluster_statuses" not in doc):
        raise FormatError("not an Envoy /clusters JSON body: no cluster_statuses")
    statuses = doc.get("cluster_statuses") or []  # Envoy with no clusters prints {}
    if not isinstance(statuses, list):
        raise FormatError("not an Envoy /clusters JSON body: cluster_statuses is not a list")
    try:
        clusters = [_json_cluster(s) for s in statuses if isinstance(s, dict) and "name" in s]
    # Fields of the wrong JSON type or size (a list for an address, `"weight": 1e999`): no Envoy wrote this.
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError, RecursionError) as e:
        raise FormatError(f"not an Envoy /clusters JSON body: {str(e)[:100]}") from None
    return {c.name: c for c in clusters}
