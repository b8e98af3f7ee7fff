"""``upstream-goaway``: an HTTP/2 (or gRPC) app refused the sidecar's streams.

An HTTP/2 server that shuts down or hits its stream limit sends GOAWAY with the last stream id it will process,
or resets a stream with REFUSED_STREAM (RFC 9113 sections 6.8 and 8.7): such a request was never processed and
is safe to retry. Envoy counts ``upstream_cx_close_notify`` for the GOAWAY, retries refused streams when the
route's retry policy has ``refused-stream`` (Istio's default retry policy does, twice), and once retries are
spent answers 503 with flag UR (with URX) and details
``upstream_reset_before_response_started{remote_refused_stream_reset}``.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings, flag_signal
from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import EnvoyCountersEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.remedies import virtual_service_retries
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import parse_reset_details
from kubectl_meshdoctor.envoy.stats import scoped

REFUSED = "remote_refused_stream_reset"


# Istio's default retry conditions (networking/core/route/retry: connect-failure, refused-stream, unavailable,
# cancelled, retriable-status-codes with 503), kept: only the attempts go up. `reset` would also retry requests
# the app may have processed.
RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
FIXES = (Fix(
    "retry-refused-stream", "retry refused streams more than Istio's default of 2: they were never processed",
    "the whole mesh and the app as they are; a refused request is safe to send again (RFC 9113 section 8.7)",
    "a request can wait for up to three attempts; the retries are the callers' (a VirtualService configures "
    "their sidecars' routes); also let the app drain on shutdown (stop accepting "
    "before closing: terminationGracePeriodSeconds, a preStop sleep) and keep its max concurrent streams above "
    "the sidecar's pool use, so fewer streams are refused",
    yaml=virtual_service_retries(3, RETRY_ON),
    settings=(("VirtualService.http.retries.attempts", "3"), ("VirtualService.http.retries.retryOn", RETRY_ON))),)


class UpstreamGoaway(Detector):
    id = "upstream-goaway"
    envoy_counters = ("upstream_cx_close_notify", "upstream_rq_retry", "upstream_rq_retry_limit_exceeded")

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        # A reset stream a retry rescued failed nobody: only resets beyond the retries that succeeded on the
        # cluster are failures the callers met (with retry-refused-stream applied, the lab's resets all are).
        rescued = scoped(counters.stats, "cluster", "upstream_rq_retry_success")
        found = counter_findings(
            self.id, counters, (CounterSignal("cluster", "http2.rx_reset",
                                              "streams the HTTP/2 upstream reset or refused (RST_STREAM)"),
                                flag_signal("UR", "requests whose upstream stream was reset: 503 UR")),
            what="HTTP/2 upstream resetting or refusing streams (503 UR)",
            explanation=("The HTTP/2 upstream reset streams Envoy opened (RST_STREAM: REFUSED_STREAM at its "
                         "concurrent stream limit, or streams cut by its GOAWAY when it shuts down or rotates "
                         "connections). A refused stream was never processed and is safe to retry; Envoy's inbound "
                         "route does not retry it, so the caller gets 503 UR."),
            envoy_flags=("UR",), fixes=FIXES, pod=self.ctx.pod)
        return [f for f in found if f.counters.get(f"cluster.{f.flow.server}.http2.rx_reset", 1)
                > rescued.get(f.flow.server, 0)]

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        reset = parse_reset_details(entry.details)
        if reset is None or reset.reason != REFUSED:
            return None
        flow = access_log_flow(entry)
        request = f"{entry.method} {entry.path}" if entry.method else "a request"
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"The HTTP/2 app at {flow.server} refused the sidecar's stream for {request} "
                  f"({entry.code} {','.join(entry.flags)})",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=tuple(f for f in ("UR", "URX") if f in entry.flags) or ("UR",),
            variant="stream refused (GOAWAY)",
            response_code_details=entry.details or "",
            explanation=(
                f"The app at {flow.server} refused the stream Envoy opened for {request}: it sent GOAWAY (it is "
                f"shutting down, or closing an old connection) or RST_STREAM REFUSED_STREAM (its concurrent "
                f"stream limit), RFC 9113 sections 6.8 and 8.7. The request was never processed, so it is safe to "
                f"retry; Envoy's retries were spent or not configured, and the caller got {entry.code}."),
            fixes=FIXES,
            pod=self.ctx.pod,
            ts=entry.ts,
        )
