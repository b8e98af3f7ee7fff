"""``downstream-disconnect``: the caller closed its connection before the sidecar's response was sent.

Envoy logs such a request with response code 0 (nothing was sent), response flag DC and details
``downstream_remote_disconnect``, and resets the upstream request, so the app's work is thrown away (Envoy docs:
response code details; access log %RESPONSE_FLAGS%). The usual cause is a caller timeout shorter than the time
the app takes: the caller gives up first, and, retrying, adds load to an app that is already slow. On eth0 it
is the caller's FIN (or RST) after a request and before any response to it.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.remedies import virtual_service_timeout
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry

DETAILS = "downstream_remote_disconnect"
_NOTE = "downstream-disconnect"
# A FIN this soon after the request is a client that half-closes (shutdown of its write side) once it has sent
# it, not one whose timeout ran out: Envoy's HTTP connection manager takes a downstream half-close as a close.
HALF_CLOSE_MS = 50
# Below this a route timeout "shorter than the caller's" would cut ordinary requests short: no such fix then.
MIN_ROUTE_TIMEOUT_MS = 2000

HALF_CLOSE_FIX = """\
# The caller half-closes its connection (shutdown(SHUT_WR), or an HTTP/1.0-style client that ends its send
# side) as soon as its request is out. Envoy's HTTP connection manager takes that for a disconnect and drops
# the request. Keep the write side open until the response has come (every HTTP/1.1 client does); a raw TCP
# client that must half-close belongs on a TCP port (a Service port named tcp-*, appProtocol: tcp)."""


class DownstreamDisconnect(Detector):
    id = "downstream-disconnect"
    envoy_counters = ("upstream_rq_rx_reset", "upstream_rq_tx_reset")

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface != "eth0":
            return ()
        from_client = (ev.src, ev.sport) == flow.client
        if ev.http is not None:
            if ev.http.is_request and from_client:
                flow.notes[_NOTE] = ev  # waiting for its response
            elif not from_client:
                flow.notes.pop(_NOTE, None)  # answered
            return ()
        request = flow.notes.get(_NOTE)
        if request is None or not from_client or not (ev.is_fin or ev.is_rst):
            return ()
        del flow.notes[_NOTE]
        waited_ms = int(round((ev.ts - request.ts) * 1000))
        what = "FIN" if ev.is_fin else "RST"
        return (self._finding(FlowRef.of(flow), (Evidence.of(request, "request from the caller"),
                                                  Evidence.of(ev, f"{what} from the caller {waited_ms} ms later, "
                                                                  f"no response yet")),
                              request.http.start_line.rsplit(" ", 1)[0], waited_ms, 0, None, ev.ts),)

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        if "DC" not in entry.flags and entry.details != DETAILS:
            return None
        request = f"{entry.method} {entry.path}" if entry.method else "a connection"
        return self._finding(access_log_flow(entry), (evidence,), request, entry.duration_ms, entry.code,
                             entry.upstream_service_time, entry.ts, entry.details or DETAILS)

    def _finding(self, flow: FlowRef, evidence: tuple[Evidence, ...], request: str, waited_ms: int, code: int,
                 service_time: int | None, ts: float, details: str = DETAILS) -> Finding:
        waited = (f"the app had answered after {service_time} ms but the response was not yet sent"
                  if service_time is not None else "the app had not answered yet")
        if waited_ms < HALF_CLOSE_MS:
            why = (f"The caller closed its side {waited_ms} ms after sending: not a timeout but a half-close, which "
                   f"Envoy's HTTP connection manager does not keep open for the response.")
            fix = HALF_CLOSE_FIX
        else:
            why = ("The caller gave up first: its own timeout is shorter than the app takes. The caller saw a "
                   "timeout or a closed connection, not an HTTP status, so nothing in the caller's sidecar log "
                   "explains it but a matching DC or UC there.")
            fix = ("# Make the caller wait longer than the app takes (the caller's client timeout)"
                   + (", or let the route\n# answer first with a clear 504 (UT) by giving it a timeout shorter than "
                      "the caller's:\n" + virtual_service_timeout(f"{waited_ms * 4 // 5}ms", comment=f"below the "
                                                                  f"caller's own timeout ({waited_ms} ms here)")
                      if waited_ms >= MIN_ROUTE_TIMEOUT_MS else "; a route timeout below a caller's that short "
                      "would cut ordinary requests short."))
        return Finding(
            detector=self.id,
            severity=Severity.WARNING,
            title=f"The caller {flow.client} gave up on {request} after {waited_ms} ms, before "
                  f"{flow.server} answered (0 DC)",
            flow=flow,
            evidence=evidence,
            envoy_flags=("DC",),
            variant="caller gave up before the answer",
            response_code_details=details,
            explanation=(
                f"The caller ({flow.client}) closed its connection {waited_ms} ms into {request}; "
                f"{waited}. Envoy logs response code {code} with flag DC ({details}) and "
                f"reset the request to the app. {why}"),
            remediation=fix,
            pod=self.ctx.pod,
            ts=ts,
        )
