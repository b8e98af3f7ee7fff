"""Parsers for what an Envoy sidecar tells us: admin `/clusters`, `/stats`, `/logging`, `/server_info`,
access-log lines of any format Istio or Envoy shipped or the mesh's own (and the wrappers tools put around
them), and response flags / response code details.

Pure functions over text, frozen dataclasses out; no I/O. Each module names the Envoy / Istio source it
follows; tests/envoy holds reference samples and checks every parser against real Envoy's output.

The names below are imported from their module on first use (PEP 562): what needs one parser (the capture
reader process needs the access log's entry type and the names of credential headers) does not load them all.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module of this package that defines it
_HOME = {
    "AccessLogEntry": "access_log", "parse_line": "access_log", "parse_lines": "access_log",
    "LogFormat": "log_format", "LogFormatError": "log_format", "compile_format": "log_format",
    "Cluster": "clusters", "FormatError": "clusters", "Host": "clusters", "Outlier": "clusters",
    "Thresholds": "clusters", "parse_clusters": "clusters",
    "RESET_REASONS": "flags", "RESPONSE_FLAGS": "flags", "ResetDetails": "flags", "ResetReason": "flags",
    "ResponseFlag": "flags", "decode_flags": "flags", "encode_flags": "flags", "parse_reset_details": "flags",
    "LEVELS": "logging", "LevelError": "logging", "log_level_queries": "logging", "parse_logging": "logging",
    "envoy_version": "server_info",
    "cluster_failures": "stats", "delta": "stats", "listener_failures": "stats", "parse_stats": "stats",
    "Unwrapped": "wrappers", "unwrap": "wrappers",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # once: later uses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
