"""Every default access-log format Istio has shipped, and Envoy's own, as data: format strings the compiler in
log_format.py turns into readers. docs/access-log-formats.md lists them with the same names, versions and
sources; tests/envoy/test_formats_real_envoy.py has real Envoy write each one.

How they were found: ``git show TAG:PATH`` on istio/istio for every release tag 1.0.0 - 1.30.x, at
``pilot/pkg/networking/core/v1alpha3/listener.go`` (1.1 - 1.7), ``.../v1alpha3/accesslog.go`` (1.8 - 1.14) and
``pilot/pkg/model/telemetry_logging.go`` (1.15 on); Envoy's default from envoyproxy/envoy
``source/common/formatter/substitution_formatter.cc`` (DEFAULT_FORMAT; ``access_log_formatter.cc`` before) and
``docs/root/configuration/observability/access_log/usage.rst`` ("Default Format String"), unchanged since 2018.
Istio picked a format by the proxy's version in 1.3 - 1.5 (< 1.3: ``ISTIO_1_2``) and 1.9 - 1.10 (< 1.9:
``ISTIO_1_8``), so a mesh mid-upgrade writes two.
"""

from __future__ import annotations

from dataclasses import dataclass

_REQUEST = ('[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
            '%RESPONSE_FLAGS% ')
_MIXER = '"%DYNAMIC_METADATA(istio.mixer:status)%" '
_DETAILS = "%RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% "
_FAILURE = '"%UPSTREAM_TRANSPORT_FAILURE_REASON%" '
_MIDDLE = ('%BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" '
           '"%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" ')
_ADDRESSES = "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME%"


@dataclass(frozen=True, slots=True)
class KnownFormat:
    """One default format: ``name`` (stable, the reader reports it), the format string or JSON object text,
    ``istio`` (the releases that wrote it by default), ``source`` (repo:path@tag where it is defined)."""

    name: str
    format: str
    istio: str
    source: str
    encoding: str = "TEXT"


ENVOY_DEFAULT = KnownFormat(
    "envoy-default",
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS% '
    '%BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" '
    '"%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"\n',
    "1.0.x (Istio set no format); any Envoy access log configured without one",
    "envoyproxy/envoy:source/common/formatter/substitution_formatter.cc (DEFAULT_FORMAT); "
    "istio/istio:pilot/pkg/networking/core/v1alpha3/listener.go@1.0.0 (FileAccessLog without a format)")

# Newest first: the reader tries them in this order (their shapes exclude one another; ISTIO_1_23 and ISTIO_1_9
# differ only in the cluster operator, so a line of either is read by the first).
TEXT_FORMATS: tuple[KnownFormat, ...] = (
    KnownFormat("istio-1.23", _REQUEST + _DETAILS + _FAILURE + _MIDDLE + "%UPSTREAM_CLUSTER_RAW% " + _ADDRESSES
                + " %ROUTE_NAME%\n", "1.23.0 and later",
                "istio/istio:pilot/pkg/model/telemetry_logging.go@1.23.0 (EnvoyTextLogFormat)"),
    KnownFormat("istio-1.9", _REQUEST + _DETAILS + _FAILURE + _MIDDLE + "%UPSTREAM_CLUSTER% " + _ADDRESSES
                + " %ROUTE_NAME%\n", "1.11.0 - 1.22.x; 1.9.0 - 1.10.x for proxies >= 1.9",
                "istio/istio:pilot/pkg/networking/core/v1alpha3/accesslog.go@1.9.0 (EnvoyTextLogFormatIstio19), "
                "accesslog.go@1.11.0 and pilot/pkg/model/telemetry_logging.go@1.15.0 (EnvoyTextLogFormat)"),
    KnownFormat("istio-1.8", _REQUEST + _FAILURE + _MIDDLE + "%UPSTREAM_CLUSTER% " + _ADDRESSES + " %ROUTE_NAME%\n",
                "1.8.x; 1.9.0 - 1.10.x for proxies < 1.9",
                "istio/istio:pilot/pkg/networking/core/v1alpha3/accesslog.go@1.8.0 (EnvoyTextLogFormat)"),
    KnownFormat("istio-1.3", _REQUEST + _MIXER + _FAILURE + _MIDDLE + "%UPSTREAM_CLUSTER% " + _ADDRESSES
                + " %ROUTE_NAME%\n", "1.6.0 - 1.7.x; 1.3.0 - 1.5.x for proxies >= 1.3",
                "istio/istio:pilot/pkg/networking/core/v1alpha3/listener.go@1.3.0 (EnvoyTextLogFormat13), "
                "listener.go@1.6.0 (EnvoyTextLogFormat)"),
    KnownFormat("istio-1.2", _REQUEST + _MIXER + _FAILURE + _MIDDLE + "%UPSTREAM_CLUSTER% " + _ADDRESSES + "\n",
                "1.2.x; 1.3.0 - 1.5.x for proxies < 1.3",
                "istio/istio:pilot/pkg/networking/core/v1alpha3/listener.go@1.2.0 (EnvoyTextLogFormat), "
                "listener.go@1.3.0 (EnvoyTextLogFormat12)"),
    KnownFormat("istio-1.1", _REQUEST + _MIXER + _MIDDLE + "%UPSTREAM_CLUSTER% " + _ADDRESSES + "\n", "1.1.x",
                "istio/istio:pilot/pkg/networking/core/v1alpha3/listener.go@1.1.0 (EnvoyTextLogFormat)"),
    ENVOY_DEFAULT,
)

_JSON_KEYS = (
    ("start_time", "%START_TIME%"), ("route_name", "%ROUTE_NAME%"), ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"), ("protocol", "%PROTOCOL%"), ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"), ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    ("connection_termination_details", "%CONNECTION_TERMINATION_DETAILS%"), ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"), ("duration", "%DURATION%"),
    ("upstream_service_time", "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%"), ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"), ("request_id", "%REQ(X-REQUEST-ID)%"), ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"), ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"), ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"), ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    ("upstream_transport_failure_reason", "%UPSTREAM_TRANSPORT_FAILURE_REASON%"),
)


def _json(keys: tuple[tuple[str, str], ...]) -> str:
    return "{" + ", ".join(f'"{k}": "{v}"' for k, v in keys) + "}"


def _without(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple(kv for kv in _JSON_KEYS if kv[0] not in names)


# One JSON reader covers every release: the keys never changed meaning, only which were there (a missing key is
# a missing value), and %UPSTREAM_CLUSTER% or %UPSTREAM_CLUSTER_RAW% fill the same upstream_cluster key.
JSON_FORMATS: tuple[KnownFormat, ...] = (
    KnownFormat("istio-json", _json(_JSON_KEYS), "1.9.0 and later (EnvoyJSONLogFormatIstio19 / ...Istio); "
                "upstream_cluster is %UPSTREAM_CLUSTER_RAW% from 1.23.4 and 1.24.2, %UPSTREAM_CLUSTER% before",
                "istio/istio:pilot/pkg/model/telemetry_logging.go@1.24.2 (EnvoyJSONLogFormatIstio)", "JSON"),
    KnownFormat("istio-json-1.1", _json(_without("response_code_details", "connection_termination_details")
                                        + (("istio_policy_status", "%DYNAMIC_METADATA(istio.mixer:status)%"),)),
                "1.1.0 - 1.8.x (1.1 and 1.2 without route_name, 1.1 without upstream_transport_failure_reason, "
                "1.8 without istio_policy_status; 1.1.0 - 1.1.2 wrote %START_TIME% under \"method\")",
                "istio/istio:pilot/pkg/networking/core/v1alpha3/listener.go@1.1.0 (EnvoyJSONLogFormat), "
                "@1.3.0 (EnvoyJSONLogFormat12/13), accesslog.go@1.8.0", "JSON"),
)
