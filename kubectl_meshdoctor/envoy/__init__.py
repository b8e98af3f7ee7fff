"""Parsers for what an Envoy sidecar tells us: admin `/clusters`, `/stats`, `/logging`, `/server_info`,
Istio access-log lines, and response flags / response code details.

Pure functions over text, frozen dataclasses out; no I/O. Each module names the Envoy / Istio source it
follows; tests/envoy holds reference samples and checks every parser against real Envoy's output.
"""

from .access_log import AccessLogEntry, parse_line, parse_lines
from .clusters import Cluster, FormatError, Host, Outlier, Thresholds, parse_clusters
from .flags import (
    RESET_REASONS,
    RESPONSE_FLAGS,
    ResetDetails,
    ResetReason,
    ResponseFlag,
    decode_flags,
    encode_flags,
    parse_reset_details,
)
from .logging import LEVELS, LevelError, log_level_queries, parse_logging
from .server_info import envoy_version
from .stats import cluster_failures, delta, listener_failures, parse_stats

__all__ = [
    "AccessLogEntry", "Cluster", "FormatError", "Host", "LEVELS", "LevelError", "Outlier", "RESET_REASONS",
    "RESPONSE_FLAGS", "ResetDetails", "ResetReason", "ResponseFlag", "Thresholds", "cluster_failures",
    "decode_flags", "delta", "encode_flags", "envoy_version", "listener_failures", "log_level_queries",
    "parse_clusters", "parse_line", "parse_lines", "parse_logging", "parse_reset_details", "parse_stats",
]
