"""``downstream-protocol-error``: the caller spoke something the sidecar's HTTP codec refuses.

Envoy's HTTP/1 connection manager answers without asking the app (Envoy docs: response code details):
- HTTP/1.0 (or 0.9) unless ``accept_http_10`` is on: ``426 Upgrade Required``, details ``low_version``. Istio
  turns it on with the proxy metadata ``ISTIO_META_HTTP10=1``.
- an ``Upgrade`` the route is not configured for (``h2c``; ``websocket`` where upgrades are off):
  ``403``, details ``upgrade_failed``.
- a request its parser rejects (bad header bytes, a bad request line, conflicting framing): ``400`` with flag
  DPE and details ``http1.codec_error`` or a more precise ``http1.*``; headers too large: ``431``.

On eth0 it is the caller's request followed by Envoy's answer on the same connection: 426 to an HTTP/1.0
request line, 403 to a request with an ``Upgrade`` header, 400 to a request with a header line that is not
``name: value``.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings, flag_signal
from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import EnvoyCountersEvent, PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.local_reply import is_local_reply

HTTP10_FIELD = "ProxyConfig.proxyMetadata.ISTIO_META_HTTP10"
_CALLER = "the whole mesh and this pod's sidecar as they are"

FIXES = {
    "http10": (
        Fix("caller-http11", "make the caller speak HTTP/1.1", _CALLER,
            "a change in the caller (an old client library, a health checker, a load balancer's probe)",
            yaml="# in the caller: send HTTP/1.1 requests (with a Host header)"),
        Fix("accept-http10", "let this pod's sidecar accept HTTP/1.0 (Istio's ISTIO_META_HTTP10)",
            "the caller as it is, and the mesh on this port",
            "every HTTP/1.0 request is served: no keep-alive unless the caller asks, no chunked responses to it; "
            "the pod must be restarted to take the annotation",
            yaml="""\
# pod template annotation:
metadata:
  annotations:
    proxy.istio.io/config: |
      proxyMetadata:
        ISTIO_META_HTTP10: "1\"""",
            settings=((HTTP10_FIELD, "1"),)),
    ),
    "upgrade": (
        Fix("caller-no-upgrade", "make the caller ask for no protocol switch the route does not allow", _CALLER,
            "a change in the caller: for h2c, HTTP/2 with prior knowledge or plain HTTP/1.1 (a Service port "
            "named http2- or grpc-, appProtocol: http2, makes Istio speak HTTP/2 itself); WebSocket upgrades are "
            "on by default in Istio, so check no EnvoyFilter turns upgrade_configs off",
            yaml="# in the caller: no Upgrade header (or only one the route allows: websocket)"),
    ),
    "codec": (
        Fix("caller-valid-request", "make the caller send requests that follow HTTP/1.1 syntax (RFC 9112)",
            _CALLER,
            "a change in the caller; Envoy's counters name the rule (kubectl meshdoctor analyze on a /stats dump: "
            "http.*.downstream_cx_protocol_error), and headers over 60 KiB need the client to send less",
            yaml="# in the caller: header names are tokens (no spaces), one request line, no bare CR or LF"),
    ),
}


def _kind(entry: AccessLogEntry) -> str | None:
    details = entry.details or ""
    if details == "via_upstream":
        return None  # the app's own answer, whatever its code (a WebSocket server's 426, an app's 431)
    if details == "low_version":
        return "http10"
    if details == "upgrade_failed":
        return "upgrade"
    # http2.remote_reset / http2.remote_refuse are the caller resetting its own stream (DR): no codec error.
    if "DPE" in entry.flags or (details.startswith(("http1.", "http2."))
                                and details not in ("http2.remote_reset", "http2.remote_refuse")):
        return "codec"
    return None


_NOTE = "downstream-protocol-error"
# What Envoy's details say for each kind, as the lab's Envoy 1.40 wrote them.
_DETAILS = {"http10": "low_version", "upgrade": "upgrade_failed", "codec": ""}


# Envoy's local replies (body lengths as the lab's Envoy 1.40 sent them): "Upgrade Required", none for a
# refused upgrade (an AuthorizationPolicy's 403 says "RBAC: access denied"), "Bad Request".
LOCAL_REPLY_LENGTHS = {426: len("Upgrade Required"), 403: 0, 400: len("Bad Request")}


def _wire_kind(request: PacketEvent, response: PacketEvent, status: int) -> str | None:
    http = request.http
    if status not in LOCAL_REPLY_LENGTHS or not is_local_reply(response.http.headers, LOCAL_REPLY_LENGTHS[status]):
        return None
    if status == 426 and http.start_line.endswith(("HTTP/1.0", "HTTP/0.9")):
        return "http10"
    if status == 403 and any(name.lower() == "upgrade" for name, _ in http.headers):
        return "upgrade"
    if status == 400 and http.raw_header_lines:
        return "codec"
    return None


class DownstreamProtocolError(Detector):
    id = "downstream-protocol-error"
    packet_ifaces = frozenset({"eth0"})
    packet_kinds = frozenset({"http"})

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface != "eth0" or ev.http is None:
            return ()
        if ev.http.is_request and (ev.src, ev.sport) == flow.client:
            flow.notes[_NOTE] = ev
            return ()
        request = flow.notes.pop(_NOTE, None)
        status = ev.http.status
        if request is None or status is None:
            return ()
        kind = _wire_kind(request, ev, status)
        if kind is None:
            return ()
        return (self._finding(kind, FlowRef.of(flow),
                              (Evidence.of(request, f"request from the caller: {request.http.start_line!r}"),
                               Evidence.of(ev, f"the sidecar's own answer: {ev.http.start_line!r}")),
                              request.http.start_line, status, _DETAILS[kind],
                              ("DPE",) if kind != "upgrade" else (), ev.ts),)

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        return counter_findings(
            self.id, counters, (CounterSignal("http", "downstream_cx_protocol_error",
                                              "caller connections the sidecar's codec refused"),
                                flag_signal("DPE", "requests the sidecar's codec refused: DPE")),
            what="Callers' requests refused by the sidecar's codec (DPE)",
            explanation=("Callers sent requests the sidecar's HTTP codec refuses: HTTP/1.0 without "
                         "ISTIO_META_HTTP10 (426), malformed requests or headers (400), refused upgrades (403). "
                         "Envoy answers them itself with DPE; the access log's details say which."),
            envoy_flags=("DPE",), fixes=FIXES["http10"] + FIXES["codec"], pod=self.ctx.pod)

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        kind = _kind(entry)
        if kind is None:
            return None
        request = f"{entry.method} {entry.path} {entry.protocol or ''}".strip() if entry.method else "a request"
        flags = ("DPE",) if "DPE" in entry.flags or kind == "codec" else tuple(entry.flags)
        return self._finding(kind, access_log_flow(entry), (evidence,), request, entry.code, entry.details or "",
                             flags, entry.ts)

    def _finding(self, kind: str, flow: FlowRef, evidence: tuple[Evidence, ...], request: str, code: int,
                 details: str, flags: tuple[str, ...], ts: float) -> Finding:
        what, why, fix = {
            "http10": ("spoke HTTP/1.0", f"the caller sent {request}: HTTP/1.0, which the sidecar's codec refuses "
                       f"unless accept_http_10 is on (Istio: ISTIO_META_HTTP10); Envoy answered 426 Upgrade "
                       f"Required itself", FIXES["http10"]),
            "upgrade": ("asked for an Upgrade the route refuses", f"the caller sent {request} with an Upgrade "
                        f"header the route has no upgrade for; Envoy answered 403 (upgrade_failed) itself",
                        FIXES["upgrade"]),
            "codec": ("sent a request the sidecar cannot parse", f"the sidecar's HTTP/1 parser rejected the "
                      f"caller's request ({details or 'a codec error'}); Envoy answered {code} itself "
                      f"and closed the connection", FIXES["codec"]),
        }[kind]
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"The caller {flow.client} {what}: the sidecar answered {code} {details}".rstrip(),
            variant=f"caller {what}: {code}",
            flow=flow,
            evidence=evidence,
            envoy_flags=flags,
            response_code_details=details,
            explanation=(f"The app never saw this request: {why}. Every request like it fails the same way; it "
                         f"is the caller, not the app or the network, that must change (or the sidecar's "
                         f"settings, where the fix says so)."),
            fixes=fix,
            pod=self.ctx.pod,
            ts=ts,
            details={"kind": kind},
        )
