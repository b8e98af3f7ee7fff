"""``downstream-protocol-error``: the caller spoke something the sidecar's HTTP codec refuses.

Envoy's HTTP/1 connection manager answers without asking the app (Envoy docs: response code details):
- HTTP/1.0 (or 0.9) unless ``accept_http_10`` is on: ``426 Upgrade Required``, details ``low_version``. Istio
  turns it on with the proxy metadata ``ISTIO_META_HTTP10=1``.
- an ``Upgrade`` the route is not configured for (``h2c``; ``websocket`` where upgrades are off):
  ``403``, details ``upgrade_failed``.
- a request its parser rejects (bad header bytes, a bad request line, conflicting framing): ``400`` with flag
  DPE and details ``http1.codec_error`` or a more precise ``http1.*``; headers too large: ``431``.
"""

from __future__ import annotations

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.findings import Evidence, Finding, Severity
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry

HTTP10_FIX = """\
# The caller speaks HTTP/1.0. Best: make it speak HTTP/1.1. Else let this pod's sidecar accept HTTP/1.0
# (pod template annotation; the pod must be restarted to take it):
metadata:
  annotations:
    proxy.istio.io/config: |
      proxyMetadata:
        ISTIO_META_HTTP10: "1\""""

UPGRADE_FIX = """\
# The caller asked to switch protocols (Upgrade: ...) and the route does not allow it. For h2c, let the
# client speak HTTP/2 with prior knowledge, or plain HTTP/1.1; a Service port named http2- or grpc-
# (appProtocol: http2) makes Istio speak HTTP/2 itself. WebSocket upgrades are on by default in Istio: check
# no EnvoyFilter turns upgrade_configs off."""

CODEC_FIX = """\
# The caller's request breaks HTTP/1.1 syntax (RFC 9112): fix the client. Envoy's own counters say which
# rule (kubectl meshdoctor analyze on a /stats dump: http.*.downstream_cx_protocol_error); headers over
# 60 KiB need the client to send less, not Envoy to take more."""


def _kind(entry: AccessLogEntry) -> str | None:
    details = entry.details or ""
    if entry.code == 426 or details == "low_version":
        return "http10"
    if details == "upgrade_failed":
        return "upgrade"
    if "DPE" in entry.flags or details.startswith(("http1.", "http2.")) or entry.code == 431:
        return "codec"
    return None


class DownstreamProtocolError(Detector):
    id = "downstream-protocol-error"

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        kind = _kind(entry)
        if kind is None:
            return None
        flow = access_log_flow(entry)
        request = f"{entry.method} {entry.path} {entry.protocol or ''}".strip() if entry.method else "a request"
        what, why, fix = {
            "http10": ("spoke HTTP/1.0", f"the caller sent {request}: HTTP/1.0, which the sidecar's codec refuses "
                       f"unless accept_http_10 is on (Istio: ISTIO_META_HTTP10); Envoy answered 426 Upgrade "
                       f"Required itself", HTTP10_FIX),
            "upgrade": ("asked for an Upgrade the route refuses", f"the caller sent {request} with an Upgrade "
                        f"header the route has no upgrade for; Envoy answered 403 (upgrade_failed) itself",
                        UPGRADE_FIX),
            "codec": ("sent a request the sidecar cannot parse", f"the sidecar's HTTP/1 parser rejected the "
                      f"caller's request ({entry.details or 'codec error'}); Envoy answered {entry.code} itself "
                      f"and closed the connection", CODEC_FIX),
        }[kind]
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"The caller {flow.client} {what}: the sidecar answered {entry.code} "
                  f"{entry.details or ''}".rstrip(),
            flow=flow,
            evidence=(evidence,),
            envoy_flags=("DPE",) if "DPE" in entry.flags or kind == "codec" else tuple(entry.flags),
            response_code_details=entry.details or "",
            explanation=(f"The app never saw this request: {why}. Every request like it fails the same way; it "
                         f"is the caller, not the app or the network, that must change (or the sidecar's "
                         f"settings, where the fix says so)."),
            remediation=fix,
            pod=self.ctx.pod,
            ts=entry.ts,
            details={"kind": kind},
        )
