"""Envoy admin `GET /stats/prometheus` (what a Prometheus scrape of the sidecar's :15090 holds) turned back into
the names `GET /stats` uses, so a dump of either shape is read the same way (envoy/stats.py).

Envoy's Prometheus exposition (envoyproxy/envoy source/server/admin/prometheus_stats.cc) prefixes every name with
``envoy_``, turns ``.`` into ``_``, and moves the dynamic part its tag extractors found into labels
(source/common/config/well_known_names.cc: ``envoy_cluster_name``, ``envoy_http_conn_manager_prefix``,
``envoy_listener_address``); ``envoy_cluster_upstream_cx_connect_fail{envoy_cluster_name="inbound|5000||;"} 3``
is ``cluster.inbound|5000||;.upstream_cx_connect_fail: 3``. Istio's standard metrics keep their own names with
labels (``istio_requests_total{reporter="destination",response_code="503",response_flags="UC",...} 5``).
Only the stats meshdoctor reads need their dots back; the rest keep Prometheus' names.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?|NaN|[-+]Inf)"
                   r"(?:[ \t]+-?\d+)?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# metric prefix -> (the label holding the owner's name, the /stats scope)
_SCOPES = (("envoy_cluster_", "envoy_cluster_name", "cluster"),
           ("envoy_http_", "envoy_http_conn_manager_prefix", "http"),
           ("envoy_listener_", "envoy_listener_address", "listener"))
# Where a stat name of /stats holds a dot the exposition made an underscore (cluster_stats.rst, listeners' ssl).
_DOTTED = (("outlier_detection_", "outlier_detection."), ("circuit_breakers_default_", "circuit_breakers.default."),
           ("circuit_breakers_high_", "circuit_breakers.high."), ("ssl_", "ssl."), ("http1_", "http1."),
           ("http2_", "http2."), ("http3_", "http3."))
_ISTIO_REQUESTS = "istio_requests_total"


def looks_like_prometheus(lines: list[str]) -> bool:
    """Whether a body's first lines are Prometheus' text exposition of Envoy's or Istio's stats."""
    return any(line.startswith(("# TYPE envoy_", "# TYPE istio_")) or
               (line.startswith(("envoy_", "istio_")) and _LINE.fullmatch(line.strip())) for line in lines[:50])


def parse_prometheus(body: str) -> dict[str, int]:
    """The integer samples of a `/stats/prometheus` body by their `/stats` names (see the module docstring);
    samples of no known shape keep their Prometheus names. Never raises."""
    out: dict[str, int] = {}
    for line in body.splitlines():
        m = _LINE.fullmatch(line.strip())
        if m is None:
            continue
        name, labels_text, value = m.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        if number != number or number in (float("inf"), float("-inf")) or number != int(number):
            continue
        labels = dict(_LABEL.findall(labels_text or ""))
        key = _stats_name(name, labels)
        out[key] = out.get(key, 0) + int(number)
    return out


def _stats_name(name: str, labels: dict[str, str]) -> str:
    if name == "envoy_server_uptime":
        return "server.uptime"
    for prefix, label, scope in _SCOPES:
        if name.startswith(prefix) and label in labels:
            stat = name[len(prefix):]
            for flat, dotted in _DOTTED:
                if stat.startswith(flat):
                    stat = dotted + stat[len(flat):]
                    break
            return f"{scope}.{labels[label]}.{stat}"
    if name == _ISTIO_REQUESTS:
        # The older /stats naming istio_requests() reads: `key=.=value;.;...;.;_istio_requests_total`.
        return ";.;".join(f"{k}=.={v}" for k, v in labels.items()) + ";.;_" + _ISTIO_REQUESTS
    return name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}" if labels else "")
