"""Envoy response flags and the upstream-reset form of `%RESPONSE_CODE_DETAILS%`.

Sources (collected in tests/envoy/data/response_flags.md):
- envoyproxy/envoy `source/common/stream_info/utility.h` (`ResponseFlagUtils`, short and long names) and
  `envoy/stream_info/stream_info.h` (`CoreResponseFlag` enum order);
- `source/common/stream_info/utility.cc` (`toString`: flags joined with `,`, `-` when none);
- `source/common/router/router.cc` (`streamResetReasonToResponseFlag`) and `source/common/http/utility.cc`
  (`resetReasonToString`) for the reset reason -> details token -> flag table;
- `docs/root/configuration/http/http_conn_man/response_code_details.rst`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .numbers import ascii_int

HTTP = "HTTP"
TCP = "TCP"


@dataclass(frozen=True)
class ResponseFlag:
    """One response flag as `%RESPONSE_FLAGS%` (short) and `%RESPONSE_FLAGS_LONG%` (long) print it."""

    short: str  # e.g. "UF"
    long: str  # e.g. "UpstreamConnectionFailure"; "" for a flag this table does not know
    meaning: str
    protocols: tuple[str, ...]  # ("HTTP",) or ("HTTP", "TCP"); () when unknown
    typical_status: str  # downstream status usually seen with it, e.g. "503", "0 or any"
    index: int = 0  # CoreResponseFlag enum position (1-based); 0 for an unknown (custom/newer) flag

    @property
    def known(self) -> bool:
        return self.index > 0


def _f(index: int, short: str, long: str, protocols: str, status: str, meaning: str) -> ResponseFlag:
    return ResponseFlag(short, long, meaning, tuple(protocols.split("+")), status, index)


# In CoreResponseFlag enum order: Envoy before the custom-flag rework (~1.29) printed flags in this order.
RESPONSE_FLAGS: tuple[ResponseFlag, ...] = (
    _f(1, "LH", "FailedLocalHealthCheck", "HTTP", "503",
       "this Envoy's local service is failing health checks, so Envoy answered instead of proxying"),
    _f(2, "UH", "NoHealthyUpstream", "HTTP+TCP", "503",
       "the upstream cluster had no healthy endpoint"),
    _f(3, "UT", "UpstreamRequestTimeout", "HTTP", "504",
       "the route or request timeout fired before the upstream finished responding"),
    _f(4, "LR", "LocalReset", "HTTP", "503",
       "Envoy itself reset the stream or connection"),
    _f(5, "UR", "UpstreamRemoteReset", "HTTP", "503",
       "the upstream peer reset the stream (HTTP/2 RST_STREAM, refused stream, CONNECT error)"),
    _f(6, "UF", "UpstreamConnectionFailure", "HTTP+TCP", "503",
       "Envoy could not establish the upstream connection (refused, timeout, TLS handshake failure)"),
    _f(7, "UC", "UpstreamConnectionTermination", "HTTP", "503",
       "an established upstream connection closed while the request was in flight (keep-alive race)"),
    _f(8, "UO", "UpstreamOverflow", "HTTP+TCP", "503",
       "a circuit breaker (connections, pending requests, requests, retries) rejected the request"),
    _f(9, "NR", "NoRouteFound", "HTTP+TCP", "404",
       "no route matched (HTTP) or no filter chain matched the connection (TCP)"),
    _f(10, "DI", "DelayInjected", "HTTP", "any",
       "the fault filter added an artificial delay"),
    _f(11, "FI", "FaultInjected", "HTTP", "configured",
       "the fault filter aborted the request with a configured status"),
    _f(12, "RL", "RateLimited", "HTTP", "429",
       "a local or global rate limit rejected the request"),
    _f(13, "UAEX", "UnauthorizedExternalService", "HTTP", "403 (configurable)",
       "the external authorization service denied the request"),
    _f(14, "RLSE", "RateLimitServiceError", "HTTP", "500 (configurable)",
       "calling the rate limit service failed"),
    _f(15, "DC", "DownstreamConnectionTermination", "HTTP", "0 or any",
       "the downstream connection went away before the response completed"),
    _f(16, "URX", "UpstreamRetryLimitExceeded", "HTTP+TCP", "5xx",
       "retries or TCP connect attempts were used up; the last attempt's failure is reported too"),
    _f(17, "SI", "StreamIdleTimeout", "HTTP", "408 / 504",
       "the stream idle timeout fired"),
    _f(18, "IH", "InvalidEnvoyRequestHeaders", "HTTP", "400",
       "a strictly checked x-envoy-* request header had an invalid value"),
    _f(19, "DPE", "DownstreamProtocolError", "HTTP", "400/431/... or 0",
       "the downstream sent something the HTTP codec rejected"),
    _f(20, "UMSDR", "UpstreamMaxStreamDurationReached", "HTTP", "408/504",
       "the upstream stream reached its max stream duration"),
    _f(21, "RFCF", "ResponseFromCacheFilter", "HTTP", "any",
       "the response was served from the cache filter"),
    _f(22, "NFCF", "NoFilterConfigFound", "HTTP", "500",
       "a dynamically configured (ECDS) filter had no config by the warming deadline"),
    _f(23, "DT", "DurationTimeout", "HTTP+TCP", "408/504/0",
       "the max (downstream) connection duration was exceeded"),
    _f(24, "UPE", "UpstreamProtocolError", "HTTP", "502",
       "the upstream response could not be parsed by the HTTP codec"),
    _f(25, "NC", "NoClusterFound", "HTTP+TCP", "503",
       "the route pointed at a cluster that does not exist"),
    _f(26, "OM", "OverloadManagerTerminated", "HTTP", "503",
       "the overload manager shed the request"),
    _f(27, "DF", "DnsResolutionFailed", "HTTP", "503",
       "DNS resolution (dynamic forward proxy) failed"),
    _f(28, "DO", "DropOverload", "HTTP", "503",
       "the EDS drop_overloads policy dropped the request"),
    _f(29, "DR", "DownstreamRemoteReset", "HTTP", "0",
       "the downstream reset the stream"),
    _f(30, "UDO", "UnconditionalDropOverload", "HTTP", "503",
       "drop_overloads set to 100% dropped the request"),
)

FLAGS_BY_SHORT: dict[str, ResponseFlag] = {f.short: f for f in RESPONSE_FLAGS}
FLAGS_BY_LONG: dict[str, ResponseFlag] = {f.long: f for f in RESPONSE_FLAGS}

NO_FLAGS = "-"


def flag(name: str) -> ResponseFlag:
    """The flag for a short (`UF`) or long (`UpstreamConnectionFailure`) name; an unknown entry if neither.

    Unknown names are kept because extensions register custom flags (response_flags.md section 1).
    """
    known = FLAGS_BY_SHORT.get(name) or FLAGS_BY_LONG.get(name)
    if known is not None:
        return known
    return ResponseFlag(name, "", "response flag unknown to meshdoctor (custom extension or newer Envoy)", (), "")


def decode_flags(text: str | None) -> tuple[ResponseFlag, ...]:
    """`"URX,UF"` -> (URX, UF) in the printed order; `-`, empty or None -> ().

    The printed order changed across Envoy versions (`UF,URX` before the custom-flag rework, `URX,UF` after),
    so callers should compare sets; we keep the order only so a line can be rendered back as it was.
    """
    if text is None:
        return ()
    text = text.strip()
    if text in ("", NO_FLAGS):
        return ()
    return tuple(flag(token.strip()) for token in text.split(",") if token.strip())


def encode_flags(flags: tuple[ResponseFlag, ...] | tuple[str, ...] | list[str]) -> str:
    """The `%RESPONSE_FLAGS%` rendering: short names joined with `,`, or `-` for none."""
    names = [f.short if isinstance(f, ResponseFlag) else f for f in flags]
    return ",".join(names) if names else NO_FLAGS


# ---------------------------------------------------------------------------------------------------------
# Upstream reset reasons (response_flags.md section 2).


@dataclass(frozen=True)
class ResetReason:
    """One `Http::StreamResetReason` as the router reports it."""

    text: str  # Http::Utility::resetReasonToString, e.g. "connection termination"
    token: str  # the same with spaces as `_`, as it appears inside the details braces
    flag: str  # response flag the router sets, e.g. "UC"
    status: int  # downstream status of the local reply when nothing was sent yet


RESET_REASONS: tuple[ResetReason, ...] = (
    ResetReason("local connection failure", "local_connection_failure", "UF", 503),
    ResetReason("remote connection failure", "remote_connection_failure", "UF", 503),
    ResetReason("connection timeout", "connection_timeout", "UF", 503),
    ResetReason("connection termination", "connection_termination", "UC", 503),
    ResetReason("local reset", "local_reset", "LR", 503),
    ResetReason("local refused stream reset", "local_refused_stream_reset", "LR", 503),
    ResetReason("overflow", "overflow", "UO", 503),
    ResetReason("remote reset", "remote_reset", "UR", 503),
    ResetReason("remote refused stream reset", "remote_refused_stream_reset", "UR", 503),
    ResetReason("remote error with CONNECT request", "remote_error_with_CONNECT_request", "UR", 503),
    ResetReason("protocol error", "protocol_error", "UPE", 502),
    ResetReason("overload manager reset", "overload_manager_reset", "OM", 503),
    # Envoy before the local/remote split (2022 - early 2023 logs) printed the generic token.
    ResetReason("connection failure", "connection_failure", "UF", 503),
)

RESET_BY_TOKEN: dict[str, ResetReason] = {r.token: r for r in RESET_REASONS}

BEFORE_RESPONSE = "before_response_started"
AFTER_RESPONSE = "after_response_started"

_RESET_DETAILS = re.compile(r"upstream_reset_(before_response_started|after_response_started)\{(.*)\}")

# strerror texts Envoy >= 1.33 prints where older builds printed the errno (Linux numbers).
_ERRNO_BY_TEXT = {
    "Connection refused": 111,
    "Connection timed out": 110,
    "Connection reset by peer": 104,
    "No route to host": 113,
    "Network is unreachable": 101,
    "Host is down": 112,
    "Cannot assign requested address": 99,
    "Broken pipe": 32,
}


@dataclass(frozen=True)
class ResetDetails:
    """`upstream_reset_{before,after}_response_started{<reason>[<,||><transport failure>]}` taken apart."""

    phase: str  # BEFORE_RESPONSE or AFTER_RESPONSE
    reason: str  # token as printed, e.g. "remote_connection_failure" or the old "connection_failure"
    transport: str  # transport failure token as printed, e.g. "delayed_connect_error:_111"; "" if none
    raw: str

    @property
    def reset(self) -> ResetReason | None:
        # Envoy of early 2021 wrote the reason with its spaces (`{connection termination}`).
        return RESET_BY_TOKEN.get(self.reason.strip().replace(" ", "_"))

    @property
    def flag(self) -> str | None:
        """The response flag this reset maps to (UF, UC, UPE, ...), None for a reason we do not know."""
        reset = self.reset
        return reset.flag if reset else None

    @property
    def reason_text(self) -> str:
        reset = self.reset
        return reset.text if reset else self.reason.replace("_", " ")

    @property
    def transport_text(self) -> str:
        """Best-effort readable transport text: Envoy replaced spaces with `_`, which is not reversible."""
        return self.transport.replace("_", " ")

    @property
    def is_connect_failure(self) -> bool:
        return self.flag == "UF"

    @property
    def errno(self) -> int | None:
        """The connect errno, from `delayed connect error: 111` (older) or `...: Connection refused` (newer)."""
        return transport_errno(self.transport)


def transport_errno(transport: str | None) -> int | None:
    """Errno from an `%UPSTREAM_TRANSPORT_FAILURE_REASON%` / details token, in either spelling."""
    if not transport:
        return None
    # Envoy >= 1.40 appends `|remote_address:IP:PORT` to the connect error: the errno ends at the `|`.
    text = transport.split("|", 1)[0].replace("_", " ")
    match = re.search(r"connect error:\s*(.+)$", text)
    if not match:
        return None
    value = match.group(1).strip()
    number = ascii_int(value, max_digits=4)  # Linux errnos are < 4096
    return number if number is not None else _ERRNO_BY_TEXT.get(value)


def parse_reset_details(details: str | None) -> ResetDetails | None:
    """Take apart an upstream-reset `%RESPONSE_CODE_DETAILS%`; None for any other details (`via_upstream`...).

    Accepts every spelling seen in real logs (response_flags.md, "Rendering differences"):
    `,` or `|` between the reason and the transport text, errno numbers or strerror text, and the old
    generic `connection_failure` token.
    """
    if not details:
        return None
    match = _RESET_DETAILS.fullmatch(details.strip())
    if not match:
        return None
    phase, inner = match.groups()
    # Reason tokens never contain `,` or `|`, but transport texts can (TLS errors use `|`), so split once at
    # whichever separator comes first.
    cut = min((i for i in (inner.find(","), inner.find("|")) if i >= 0), default=-1)
    reason, transport = (inner, "") if cut < 0 else (inner[:cut], inner[cut + 1:])
    return ResetDetails(phase, reason, transport, details)


# The name the brief and callers know it by.
parse_response_code_details = parse_reset_details


# `%RESPONSE_CODE_DETAILS%` values of Envoy's own replies -> the flag its access log sets with them
# (response_flags.md section 3; docs/root/configuration/http/http_conn_man/response_code_details.rst). Envoy's
# debug log names the details of a local reply ("Sending local reply with details X") but not the flags.
_DETAILS_FLAGS: dict[str, str] = {
    "response_timeout": "UT", "upstream_response_timeout": "UT", "upstream_per_try_timeout": "UT",
    "upstream_per_try_idle_timeout": "UT", "no_healthy_upstream": "UH", "cluster_not_found": "NC",
    "route_not_found": "NR", "filter_chain_not_found": "NR", "downstream_remote_disconnect": "DC",
    "stream_idle_timeout": "SI", "duration_timeout": "DT", "overload": "OM", "maintenance_mode": "UO",
    "request_headers_failed_strict_check": "IH", "upstream_max_stream_duration_reached": "UMSDR",
    "low_version": "DPE", "ext_authz_denied": "UAEX", "ext_authz_error": "UAEX", "fault_filter_abort": "FI",
    "fault_filter_delay": "DI", "http2.remote_reset": "DR", "http2.remote_refuse": "DR",
}


def flags_of_details(details: str | None) -> tuple[str, ...]:
    """The response flags Envoy's access log sets with ``details`` (short names; () when it sets none or the
    details are not Envoy's own): an upstream reset by its reason (UF, UC, UPE, UO, ...), a codec error of the
    downstream request (``http1.*``, most ``http2.*``) DPE, the others by the table above."""
    if not details:
        return ()
    reset = parse_reset_details(details)
    if reset is not None:
        return (reset.flag,) if reset.flag else ()
    head = details.split("{", 1)[0].split("(", 1)[0].strip()
    if head in _DETAILS_FLAGS:
        return (_DETAILS_FLAGS[head],)
    if head.startswith(("http1.", "http2.")) and head not in ("http2.remote_reset", "http2.remote_refuse"):
        return ("DPE",)
    if head.startswith("downstream_local_disconnect"):
        return ("DC",)
    return ()


_DETAILS_STATUS: dict[str, int] = {
    "response_timeout": 504, "upstream_response_timeout": 504, "upstream_per_try_timeout": 504,
    "upstream_per_try_idle_timeout": 504, "no_healthy_upstream": 503, "cluster_not_found": 503,
    "maintenance_mode": 503, "overload": 503, "route_not_found": 404, "filter_chain_not_found": 0,
    "downstream_remote_disconnect": 0, "low_version": 426, "upgrade_failed": 403, "stream_idle_timeout": 504,
    "request_overall_timeout": 408,
}


def status_of_details(details: str | None) -> int | None:
    """The status Envoy's own reply with ``details`` carries (response_flags.md sections 2 and 3), None when the
    details do not say (``via_upstream``: the upstream's own status)."""
    if not details:
        return None
    reset = parse_reset_details(details)
    if reset is not None:
        return reset.reset.status if reset.reset and reset.phase == BEFORE_RESPONSE else None
    head = details.split("{", 1)[0].split("(", 1)[0].strip()
    if head in _DETAILS_STATUS:
        return _DETAILS_STATUS[head]
    return 400 if head.startswith("http1.") else None
