"""Envoy admin `GET /stats` (text) parsed, cluster and listener names taken apart, and counter deltas.

Sources (the sample and its provenance: tests/envoy/data/stats_sample.txt.SOURCE.md):
- envoyproxy/envoy `docs/root/configuration/upstream/cluster_manager/cluster_stats.rst` (cluster stat names),
  `source/common/http/http1/codec_stats.h` and `http2/codec_stats.h` (codec stat names),
  `source/common/stats/histogram_impl.cc` (histogram rendering), `docs/root/operations/admin.rst` (/stats);
- istio/istio `pilot/pkg/networking/core/cluster_builder.go` (alt_stat_name `<cluster>;`),
  `pkg/config/constants/constants.go` (`StatPrefixDelimiter = ";"`), `pkg/bootstrap/config.go` (the default
  stats inclusion list that hides `cluster.outbound|...` stats unless the pod opts in).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .clusters import FormatError
from .numbers import ascii_int
from .stats_prometheus import looks_like_prometheus, parse_prometheus

StatValue = int | str  # counters and gauges are ints; text readouts and histograms stay text

NO_RECORDED_VALUES = "No recorded values"
_HISTOGRAM = re.compile(r"P\d+(\.\d+)?\(")
# Stat names hold `.`, `|`, `;`, `=`, `:` and `/` (Istio labels), but never spaces, quotes, braces or tags.
_NAME = re.compile(r'[^\s"{}<>\[\]]+')

# Delimiter Istio >= 1.23 puts after a cluster name / HCM stat prefix (`cluster.<name>;.<stat>`).
ISTIO_DELIMITER = ";."


def parse_stats(body: str) -> dict[str, StatValue]:
    """`name: value` lines -> {name: value} in body order.

    Counters and gauges become ints; text readouts (`name: "text"`) become their unquoted text; histograms
    (`P0(nan,2) P25(...) ...` or `No recorded values`) are kept as their raw text. Lines without `: ` are
    skipped; a non-empty body where no line parses raises FormatError. A `/stats/prometheus` body is read too,
    its names given back in this shape (envoy/stats_prometheus.py).
    """
    stats: dict[str, StatValue] = {}
    lines = [line.rstrip("\r") for line in body.splitlines() if line.strip()]
    if looks_like_prometheus(lines):
        return dict(parse_prometheus(body))
    for line in lines:
        # Names contain `:` (spiffe://...) but not `: `; text readouts may contain `: `, so split at the first.
        name, sep, value = line.partition(": ")
        if not sep or not _NAME.fullmatch(name):
            continue
        stats[name] = _value(value)
    if lines and not stats:
        first = lines[0].strip()
        raise FormatError(f"not an Envoy /stats body: first line is {first[:60]!r}")
    return stats


def _value(text: str) -> StatValue:
    number = ascii_int(text)
    if number is not None:
        return number
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    # Histogram quantiles, "No recorded values", something newer, or digits no uint64 holds: keep it raw.
    return text


def histograms(stats: Mapping[str, StatValue]) -> dict[str, str]:
    """The histogram lines among parsed stats (raw quantile text)."""
    return {k: v for k, v in stats.items()
            if isinstance(v, str) and (v == NO_RECORDED_VALUES or _HISTOGRAM.match(v))}


# ---------------------------------------------------------------------------------------------------------
# Cluster and HCM stat names. Cluster names contain dots and `|`, so without Istio's `;.` delimiter the
# cluster name is found by matching the known stat names against the tail instead.

_CLUSTER_STAT = re.compile(
    r"[a-z0-9_]+"  # leaf stats: upstream_cx_total, membership_total, lb_*, update_*, version ...
    r"|circuit_breakers\.(default|high)\.[a-z_]+"
    r"|outlier_detection\.[a-z0-9_]+"
    r"|http[123]\.[a-z0-9_]+"
    r"|(retry|internal|external|canary)\.upstream_rq_[a-z0-9_]+"
    r"|ssl\.(ciphers|curves|sigalgs|versions)\.[A-Za-z0-9_.\-]+|ssl\.[a-z_]+"
    r"|(client_ssl_socket_factory|metadata_exchange|tls_inspector|zone\.[^.]+\.[^.]+)\.[a-z0-9_]+"
    r"|[A-Za-z0-9_\-]+\.total_match_count"  # subset selector stats (default., tlsMode-istio.)
)
_LISTENER_STAT = re.compile(r"[a-z0-9_]+|(http1|http2|http3|codec|rbac)\.[a-z0-9_.]+")


def _split(name: str, prefix: str, known: re.Pattern[str]) -> tuple[str, str] | None:
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix):]
    owner, sep, stat = rest.partition(ISTIO_DELIMITER)
    if sep:
        return owner, stat
    # Leftmost dot whose tail is a whole known stat name: a cluster's own dots never leave a tail that
    # matches (`default.svc.cluster.local.upstream_cx_total` is not a stat name).
    for i, ch in enumerate(rest):
        if ch == "." and i and known.fullmatch(rest[i + 1:]):
            return rest[:i], rest[i + 1:]
    return None


def split_cluster_stat(name: str) -> tuple[str, str] | None:
    """`cluster.outbound|80||h.ns.svc.cluster.local;.upstream_cx_total` (or without `;`) -> (cluster, stat).

    None for stats that are not per-cluster (`cluster_manager.*`, `http.*`, ...).
    """
    return _split(name, "cluster.", _CLUSTER_STAT)


def split_listener_stat(name: str) -> tuple[str, str] | None:
    """`http.inbound_0.0.0.0_5000;.downstream_cx_protocol_error` -> (HCM stat prefix, stat)."""
    return _split(name, "http.", _LISTENER_STAT)


_LISTENER_OWN_STAT = re.compile(r"[a-z0-9_]+|ssl\.[a-z0-9_.]+|(server_ssl_socket_factory|tls_inspector|"
                                r"original_dst|http_inspector)\.[a-z0-9_]+")


def split_listener_address_stat(name: str) -> tuple[str, str] | None:
    """`listener.0.0.0.0_15006.no_filter_chain_match` -> ("0.0.0.0_15006", "no_filter_chain_match"); None for
    stats that are not a listener's own (`listener_manager.*`, `listener.admin.*` are kept as they come)."""
    return _split(name, "listener.", _LISTENER_OWN_STAT)


def scoped(stats: Mapping[str, StatValue], scope: str, stat: str) -> dict[str, int]:
    """Who counted ``stat`` and how much: ``scope`` "cluster" (-> cluster name), "http" (-> the HCM's stat
    prefix, e.g. ``inbound_0.0.0.0_5000``) or "listener" (-> the listener's address, ``0.0.0.0_15006``). Only
    non-zero integer values; raises ValueError for another scope."""
    split = {"cluster": split_cluster_stat, "http": split_listener_stat,
             "listener": split_listener_address_stat}.get(scope)
    if split is None:
        raise ValueError(f"no stat scope {scope!r}: cluster, http or listener")
    out: dict[str, int] = {}
    for name, value in stats.items():
        if isinstance(value, int) and value and name.endswith(stat):
            parts = split(name)
            if parts is not None and parts[1] == stat:
                out[parts[0]] = out.get(parts[0], 0) + value
    return out


def by_cluster(stats: Mapping[str, StatValue]) -> dict[str, dict[str, StatValue]]:
    """Every per-cluster stat grouped as {cluster name: {stat: value}}."""
    grouped: dict[str, dict[str, StatValue]] = {}
    for name, value in stats.items():
        split = split_cluster_stat(name)
        if split:
            grouped.setdefault(split[0], {})[split[1]] = value
    return grouped


# What explains upstream resets, connect failures and 503s (stats_sample.txt.SOURCE.md, "Stats that matter").
CLUSTER_FAILURE_STATS: tuple[str, ...] = (
    "upstream_cx_connect_fail", "upstream_cx_connect_timeout", "upstream_cx_connect_attempts_exceeded",
    "upstream_cx_destroy_remote_with_active_rq", "upstream_cx_destroy_local_with_active_rq",
    "upstream_cx_destroy_with_active_rq", "upstream_cx_close_notify", "upstream_cx_idle_timeout",
    "upstream_cx_max_requests", "upstream_cx_protocol_error", "upstream_cx_none_healthy",
    "upstream_rq_pending_failure_eject", "upstream_rq_pending_overflow", "upstream_cx_overflow",
    "upstream_cx_pool_overflow", "upstream_rq_rx_reset", "upstream_rq_tx_reset", "upstream_rq_timeout",
    "upstream_rq_per_try_timeout", "upstream_rq_per_try_idle_timeout", "upstream_rq_maintenance_mode",
    "upstream_rq_5xx", "membership_healthy", "membership_total",
    "outlier_detection.ejections_active", "outlier_detection.ejections_enforced_total",
    # denominators, so "7 connect failures" can be read against how many connections there were
    "upstream_cx_total", "upstream_rq_total",
)
_CLUSTER_FAILURE_PATTERN = re.compile(
    r"upstream_rq_retry\w*"  # retry, retry_success, retry_limit_exceeded, retry_overflow, retry_backoff_*
    r"|upstream_rq_5\d\d|(internal|external|retry)\.upstream_rq_5(\d\d|xx)"
    r"|http[12]\.\w+"  # upstream codec events
    r"|circuit_breakers\.(default|high)\.\w+_open"
    r"|outlier_detection\.ejections_\w*consecutive_\w+"
)
LISTENER_FAILURE_STATS: tuple[str, ...] = (
    "downstream_cx_protocol_error", "downstream_rq_rx_reset", "downstream_rq_tx_reset",
    "downstream_cx_destroy_remote_active_rq", "downstream_cx_destroy_local_active_rq", "downstream_rq_5xx",
    "downstream_rq_timeout", "downstream_rq_idle_timeout", "downstream_rq_too_large",
    "no_route", "no_cluster", "rq_reset_after_downstream_response_started",
)


def is_cluster_failure_stat(stat: str) -> bool:
    return stat in CLUSTER_FAILURE_STATS or bool(_CLUSTER_FAILURE_PATTERN.fullmatch(stat))


def cluster_failures(stats: Mapping[str, StatValue]) -> dict[str, dict[str, int]]:
    """Per cluster, the counters that explain resets and connect failures: {cluster: {stat: n}}."""
    grouped: dict[str, dict[str, int]] = {}
    for name, value in stats.items():
        split = split_cluster_stat(name)
        if split and isinstance(value, int) and is_cluster_failure_stat(split[1]):
            grouped.setdefault(split[0], {})[split[1]] = value
    return grouped


def listener_failures(stats: Mapping[str, StatValue]) -> dict[str, dict[str, int]]:
    """Per HCM stat prefix (`inbound_0.0.0.0_5000`), the downstream-side failure counters."""
    grouped: dict[str, dict[str, int]] = {}
    for name, value in stats.items():
        split = split_listener_stat(name)
        if split and isinstance(value, int) and (split[1] in LISTENER_FAILURE_STATS
                                                 or split[1].startswith(("http1.", "http2."))):
            grouped.setdefault(split[0], {})[split[1]] = value
    return grouped


# The clusters whose stats Istio keeps whatever the pod's proxyStatsMatcher says (istio/istio
# pkg/bootstrap/config.go, configureStatsMatcher: "cluster.xds-grpc" among the retained prefixes).
ALWAYS_KEPT_CLUSTERS = frozenset({"xds-grpc"})


def cluster_stats_visible(stats: Mapping[str, StatValue]) -> bool:
    """False when the default Istio stats inclusion list hides the per-cluster stats: no cluster but the ones
    Istio always keeps has one. Any other cluster counts, whatever its name: `outbound|...` and `inbound|...`,
    an older Istio's `in.8080` and `out.<host>|<port>`, another control plane's (App Mesh's `cds_ingress_...`).

    Zeros would then be a lie: the caller should say the pod needs `proxyStatsMatcher` (and a restart).
    """
    return any(split[0] not in ALWAYS_KEPT_CLUSTERS
               for split in map(split_cluster_stat, stats) if split is not None)


def delta(before: Mapping[str, StatValue], after: Mapping[str, StatValue]) -> dict[str, int]:
    """{name: after - before} for the numeric stats that moved.

    A stat absent from `before` counts from 0 (Envoy creates `upstream_rq_503` and the like lazily). A
    negative delta is kept: it is a gauge going down, or counters reset by an Envoy restart.
    """
    moved: dict[str, int] = {}
    for name, value in after.items():
        if not isinstance(value, int):
            continue
        old = before.get(name, 0)
        change = value - (old if isinstance(old, int) else 0)
        if change:
            moved[name] = change
    return moved


# ---------------------------------------------------------------------------------------------------------
# Istio standard metrics: the response_flags label of istio_requests_total.

_ISTIOCUSTOM = re.compile(
    r"istiocustom\.istio_requests_total\.reporter\.(?P<reporter>\w+)\..*"
    r"\.response_code\.(?P<code>[0-9]{1,3})\..*\.response_flags\.(?P<flags>[^.]+)\.")
_REPORTER_EQ = re.compile(r"(?:^|;\.;)(?:wasmcustom\.)?(?P<key>[a-z_]+)=\.=(?P<value>[^;]*)")


def istio_requests(stats: Mapping[str, StatValue]) -> dict[tuple[str, int, str], int]:
    """`istio_requests_total` summed by (reporter, response code, response flags), both Istio namings.

    Current proxies: `istiocustom.istio_requests_total.reporter.source....response_flags.UC....: N`;
    older: `reporter=.=destination;.;...;.;response_flags=.=UC;.;..._istio_requests_total: N`.
    """
    totals: dict[tuple[str, int, str], int] = {}
    for name, value in stats.items():
        if not isinstance(value, int):
            continue
        key = _istio_request_key(name)
        if key:
            totals[key] = totals.get(key, 0) + value
    return totals


def _istio_request_key(name: str) -> tuple[str, int, str] | None:
    match = _ISTIOCUSTOM.match(name)
    if match:
        return match["reporter"], int(match["code"]), match["flags"]
    if name.endswith("istio_requests_total") and "reporter=.=" in name:
        labels = {m["key"]: m["value"] for m in _REPORTER_EQ.finditer(name)}
        code = ascii_int(labels.get("response_code", ""), max_digits=3)  # an HTTP status, or 0
        if code is not None:
            return labels.get("reporter", ""), code, labels.get("response_flags", "-")
    return None
