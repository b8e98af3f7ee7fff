"""``downstream-disconnect``: the caller closed its connection before the sidecar's response was sent.

Envoy logs such a request with response code 0 (nothing was sent), response flag DC and details
``downstream_remote_disconnect``, and resets the upstream request, so the app's work is thrown away (Envoy docs:
response code details; access log %RESPONSE_FLAGS%). The usual cause is a caller timeout shorter than the time
the app takes: the caller gives up first, and, retrying, adds load to an app that is already slow.
"""

from __future__ import annotations

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.findings import Evidence, Finding, Severity
from kubectl_meshdoctor.core.remedies import virtual_service_timeout
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry

DETAILS = "downstream_remote_disconnect"


class DownstreamDisconnect(Detector):
    id = "downstream-disconnect"
    envoy_counters = ("upstream_rq_rx_reset", "upstream_rq_tx_reset")

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        if "DC" not in entry.flags and entry.details != DETAILS:
            return None
        request = f"{entry.method} {entry.path}" if entry.method else "a connection"
        flow = access_log_flow(entry)
        waited = (f"the app had answered after {entry.upstream_service_time} ms but the response was not yet "
                  f"sent" if entry.upstream_service_time is not None else "the app had not answered yet")
        return Finding(
            detector=self.id,
            severity=Severity.WARNING,
            title=f"The caller {flow.client} gave up on {request} after {entry.duration_ms} ms, before "
                  f"{flow.server} answered (0 DC)",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=("DC",),
            response_code_details=entry.details or DETAILS,
            explanation=(
                f"The caller ({flow.client}) closed its connection {entry.duration_ms} ms into {request}; "
                f"{waited}. Envoy logged response code {entry.code} with flag DC ({entry.details or DETAILS}) and "
                f"reset the request to the app. The caller gave up first: its own timeout is shorter than the "
                f"app takes. The caller saw a timeout or a closed connection, not an HTTP status, so nothing in "
                f"the caller's sidecar log explains it but a matching DC or UC there."),
            remediation=(
                "# Make the caller wait longer than the app takes (the caller's client timeout), or let the route\n"
                "# answer first with a clear 504 (UT) by giving it a timeout shorter than the caller's:\n"
                + virtual_service_timeout(f"{max(100, entry.duration_ms * 4 // 5)}ms",
                                          comment=f"below the caller's own timeout ({entry.duration_ms} ms here)")),
            pod=self.ctx.pod,
            ts=entry.ts,
        )
