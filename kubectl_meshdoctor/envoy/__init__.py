"""Parsers for what an Envoy sidecar tells us: admin `/clusters`, `/stats`, `/logging`, `/server_info`,
access-log lines of any format Istio or Envoy shipped or the mesh's own (and the wrappers tools put around
them), and response flags / response code details.

Pure functions over text, frozen dataclasses out; no I/O. Each module names the Envoy / Istio source it
follows; tests/envoy holds reference samples and checks every parser against real Envoy's output.
"""

from .access_log import AccessLogEntry, parse_line, parse_lines
from .log_format import LogFormat, LogFormatError, compile_format
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
from .wrappers import Unwrapped, unwrap

__all__ = [
    "AccessLogEntry", "Cluster", "FormatError", "Host", "LEVELS", "LevelError", "LogFormat", "LogFormatError",
    "Outlier", "RESET_REASONS", "RESPONSE_FLAGS", "ResetDetails", "ResetReason", "ResponseFlag", "Thresholds",
    "Unwrapped", "cluster_failures", "compile_format", "decode_flags", "delta", "encode_flags", "envoy_version",
    "listener_failures", "log_level_queries", "parse_clusters", "parse_line", "parse_lines", "parse_logging",
    "parse_reset_details", "parse_stats", "unwrap",
]
