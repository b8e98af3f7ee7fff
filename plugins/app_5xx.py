"""``app-5xx``: the app answered a 5xx of its own, and the pod's sidecar passed it on; not a failure of the mesh.

A server pod's sidecar logs each request it served on its inbound cluster (``inbound|PORT||``). When the answer
came from the app, %RESPONSE_CODE_DETAILS% is ``via_upstream`` (Envoy docs, response_code_details.rst: "The
response code was set by the upstream") and no response flag is set: the app's ``500``, its ``503``, passed on
as they came. The sidecar's own failures (``503 UF``, ``502 UPE``, ``504 UT``, ...) carry a flag and other
details, and are other detectors'. An app's own 5xx is told, not alarmed on: an info finding, as a caller's
relayed 500 or 501 is no next-hop failure (plugins/next_hop.py) and a line without a failure flag is no
``access-log`` finding (core/correlate.py). When the caller's sidecar's line of the same request was read too,
core/hops.py makes both one finding on the leg ``server sidecar -> app``.
"""

from __future__ import annotations

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.findings import Evidence, Finding, Severity
from kubectl_meshdoctor.core.hops import app_answered
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.story import StreamStory

VIA_UPSTREAM = "via_upstream"


class App5xx(Detector):
    id = "app-5xx"

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        return self._finding(entry, evidence) if app_answered(entry) else None

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        return self._finding(said, evidence) if app_answered(said) else None

    def _finding(self, entry: AccessLogEntry, evidence: Evidence) -> Finding:
        request = f"{entry.method} {entry.path}" if entry.method else "a request"
        app = entry.upstream_host or entry.downstream_local or "the app"
        rid = f" (x-request-id {entry.request_id})" if entry.request_id else ""
        pod = self.ctx.pod or "<this pod>"
        return Finding(
            detector=self.id,
            severity=Severity.INFO,
            title=f"The app ({app}) answered {entry.code} to {request}; the sidecar passed it on: not a mesh failure",
            variant=f"{entry.code} via_upstream",
            flow=access_log_flow(entry),
            evidence=(evidence,),
            envoy_flags=tuple(entry.flags),
            response_code_details=VIA_UPSTREAM,
            explanation=(
                f"This pod's sidecar served {request}{rid} on {entry.upstream_cluster} and passed on the "
                f"{entry.code} its app answered: Envoy's details say via_upstream, with no response flag, so the "
                f"status was set by the app, not by either sidecar. This is not a failure of the mesh (no "
                f"connection, TLS or routing problem); a caller sees this {entry.code} as the next hop's answer. "
                f"The cause is in the app: its own log for the request."),
            remediation=(f"# The app answered {entry.code} itself: read its log for the request{rid}.\n"
                         f"kubectl logs {pod} -c <the app's container> --since=10m"
                         + (f" | grep {entry.request_id}" if entry.request_id else "")),
            pod=self.ctx.pod,
            ts=entry.ts,
            details={"cluster": entry.upstream_cluster, "request_id": entry.request_id},
        )
