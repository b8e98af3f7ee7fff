"""The Envoy version from the admin `GET /server_info` JSON.

Source: envoyproxy/envoy `api/envoy/admin/v3/server_info.proto` (`ServerInfo.version`) and
`source/common/version/version.cc` (`VersionInfo::version`:
`<sha>/<x.y.z[-label]>/<Clean|Modified>/<RELEASE|DEBUG>/<ssl>`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .clusters import FormatError

_VERSION = re.compile(r"^([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})")  # ASCII: `\d` also takes `²`


def envoy_version(server_info: str | dict[str, Any]) -> str:
    """`{"version": "<sha>/1.33.2/Clean/RELEASE/BoringSSL", ...}` -> "1.33.2" (a `-dev` label is dropped)."""
    try:
        doc = json.loads(server_info) if isinstance(server_info, str) else server_info
    except json.JSONDecodeError as e:
        raise FormatError(f"not an Envoy /server_info body: {e.msg} at line {e.lineno}") from None
    except (ValueError, RecursionError) as e:  # a number of > 4300 digits; nesting deeper than Python recurses
        raise FormatError(f"not an Envoy /server_info body: {type(e).__name__}") from None
    version = doc.get("version") if isinstance(doc, dict) else None
    if not isinstance(version, str):
        raise FormatError("not an Envoy /server_info body: no version field")
    # The number is the second '/' part; search every part in case a build puts something else first.
    for part in version.split("/")[1:] + version.split("/")[:1]:
        match = _VERSION.match(part)
        if match:
            return ".".join(match.groups())
    raise FormatError(f"no x.y.z version in /server_info version {version[:80]!r}")


_DURATION = re.compile(r"^([0-9]{1,9})(?:\.([0-9]{1,9}))?s$")  # protobuf Duration's JSON form: "1s", "0.100s"


def file_flush_interval_s(server_info: str | dict[str, Any]) -> float | None:
    """How often Envoy writes its buffered access-log lines out, seconds: ``command_line_options.
    file_flush_interval`` of `/server_info` (api/envoy/admin/v3/server_info.proto, CommandLineOptions; JSON
    "1s" for --file-flush-interval-msec 1000, real Envoy 1.40), None when the body has none or it does not
    parse. Never raises."""
    try:
        doc = json.loads(server_info) if isinstance(server_info, str) else server_info
    except (ValueError, RecursionError):
        return None
    options = doc.get("command_line_options") if isinstance(doc, dict) else None
    value = options.get("file_flush_interval") if isinstance(options, dict) else None
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        return None
    return int(match.group(1)) + (int(match.group(2)) / 10 ** len(match.group(2)) if match.group(2) else 0.0)


def version_tuple(version: str) -> tuple[int, int, int]:
    """"1.33.2" -> (1, 33, 2), for comparisons like `>= (1, 33, 0)`."""
    match = _VERSION.match(version)
    if not match:
        raise ValueError(f"not an x.y.z version: {version!r}")
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch
