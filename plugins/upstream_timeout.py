"""``upstream-timeout``: the app did not answer within the route's timeout, so Envoy gave up and answered 504.

Envoy's router arms the route timeout (``timeout`` of the route; Istio renders a VirtualService's
``http[].timeout`` there, and has none by default) when the request is sent upstream, and the per-try timeout
(``retries.perTryTimeout``) for each attempt. When it fires before the response headers arrive, Envoy resets the
upstream request, answers the caller 504 with response flag UT and details ``response_timeout`` (per try:
``upstream_per_try_timeout``), and counts ``upstream_rq_timeout`` (``upstream_rq_per_try_timeout``) on the
cluster (Envoy docs: router filter, "x-envoy-upstream-rq-timeout-ms"; response code details). The wire shows
the request on lo and no response before Envoy closes that upstream connection.
"""

from __future__ import annotations

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.findings import Evidence, Finding, Severity
from kubectl_meshdoctor.core.remedies import virtual_service_timeout
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry

TIMEOUT_DETAILS = ("response_timeout", "upstream_per_try_timeout")


def _seconds(ms: int) -> str:
    """Twice the timeout that fired (what Envoy waited, to the nearest whole second; it fires a few ms off)."""
    return f"{2 * max(1, int(ms / 1000 + 0.5))}s"


class UpstreamTimeout(Detector):
    id = "upstream-timeout"
    envoy_counters = ("upstream_rq_timeout", "upstream_rq_per_try_timeout")

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        if "UT" not in entry.flags and entry.details not in TIMEOUT_DETAILS:
            return None
        per_try = entry.details == "upstream_per_try_timeout"
        which = "per-try timeout (retries.perTryTimeout)" if per_try else "route timeout (the VirtualService timeout)"
        request = f"{entry.method} {entry.path}" if entry.method else "the request"
        flow = access_log_flow(entry)
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"{flow.server} did not answer {request} within the {'per-try' if per_try else 'route'} "
                  f"timeout: Envoy gave up after {entry.duration_ms} ms (504 UT)",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=("UT",),
            response_code_details=entry.details or "response_timeout",
            explanation=(
                f"The sidecar sent {request} to the app at {flow.server} and waited {entry.duration_ms} ms for "
                f"its response headers; then its {which} fired. Envoy reset the upstream request, answered the "
                f"caller {entry.code or 504} with response flag UT ({entry.details or 'response_timeout'}) and "
                f"counted upstream_rq_{'per_try_' if per_try else ''}timeout. The app was slower than the route "
                f"allows: either it is overloaded or stuck (check its latency and its own dependencies), or the "
                f"timeout is shorter than the slowest answer it legitimately gives."),
            remediation=(
                "# If the app is right to take this long, give the route more time than its slowest answer\n"
                "# (and keep the caller's own timeout longer still, or the caller gives up first: DC):\n"
                + virtual_service_timeout(_seconds(entry.duration_ms),
                                          _seconds(entry.duration_ms) if per_try else None,
                                          comment=f"Envoy waited {entry.duration_ms} ms")),
            pod=self.ctx.pod,
            ts=entry.ts,
        )
