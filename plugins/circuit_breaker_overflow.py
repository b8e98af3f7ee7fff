"""``circuit-breaker-overflow``: a connection-pool limit (Envoy's circuit breakers) refused a request.

Istio renders a DestinationRule's ``connectionPool`` as the cluster's ``circuit_breakers`` thresholds
(``tcp.maxConnections`` -> max_connections, ``http.http1MaxPendingRequests`` -> max_pending_requests,
``http.http2MaxRequests`` -> max_requests; istio/istio pilot/pkg/networking/core/cluster_traffic_policy.go); its
defaults are 2^32-1, so an overflow means someone set a limit the traffic outgrew. A request that finds every
allowed connection busy waits in the pending queue; one that finds the queue full is refused at once, without a
connection or a SYN to the upstream: Envoy answers 503 UO ``upstream_reset_before_response_started{overflow}``
and counts ``upstream_rq_pending_overflow`` (Envoy's cluster_stats.rst). The pool logs ``max pending streams
overflow`` (``max pending requests overflow`` before Envoy 1.16), the router ``upstream reset: reset reason:
overflow``. Istio does not retry it (no ``retry_on`` covers a local overflow).
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings, flag_signal
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import EnvoyCountersEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.remedies import destination_rule
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import parse_reset_details
from kubectl_meshdoctor.envoy.story import StreamStory

DETAILS = "upstream_reset_before_response_started{overflow}"
MAX_CONNECTIONS_FIELD = "DestinationRule.trafficPolicy.connectionPool.tcp.maxConnections"
MAX_PENDING_FIELD = "DestinationRule.trafficPolicy.connectionPool.http.http1MaxPendingRequests"
LIMIT = "100"  # what the printed fix sets; the user sizes it to the traffic (Istio's default is 2^32-1)

FIXES = (Fix(
    "pool-limits", "raise the connection-pool limits the DestinationRule sets to what the traffic needs",
    "the whole mesh; requests wait for a connection instead of being refused",
    "more connections to the upstream at once (and more queued requests): an upstream that cannot take them "
    "slows down instead; size the limits from its capacity, or drop them (Istio's default is unlimited)",
    yaml=destination_rule(f"""\
    connectionPool:
      tcp:
        maxConnections: {LIMIT}          # from the upstream's capacity; unset: unlimited
      http:
        http1MaxPendingRequests: {LIMIT}  # requests that may wait for a connection"""),
    settings=((MAX_CONNECTIONS_FIELD, LIMIT), (MAX_PENDING_FIELD, LIMIT))),)

COUNTERS = (
    CounterSignal("cluster", "upstream_rq_pending_overflow", "requests refused by the pending-request limit"),
    CounterSignal("cluster", "upstream_rq_retry_overflow", "retries refused by the retry limit"),
    flag_signal("UO", "requests Envoy answered 503 UO"),
)


def overflowed(entry: AccessLogEntry) -> bool:
    """A line Envoy wrote for a request a circuit breaker refused: UO with the overflow reset (or no details)."""
    reset = parse_reset_details(entry.details)
    return "UO" in entry.flags and (entry.details is None or (reset is not None and reset.flag == "UO"))


class CircuitBreakerOverflow(Detector):
    id = "circuit-breaker-overflow"
    envoy_counters = ("upstream_rq_pending_overflow", "upstream_cx_overflow")
    envoy_loggers = ("pool", "router", "http")

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        return self._finding(entry, None, evidence) if overflowed(entry) else None

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        return self._finding(said, story, evidence) if overflowed(said) else None

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        return counter_findings(
            self.id, counters, COUNTERS, what="Circuit breaker overflow: requests refused by a pool limit (503 UO)",
            explanation=("A connection-pool limit of the cluster (a DestinationRule's connectionPool) refused "
                         "requests: every allowed connection was busy and the pending queue full, so Envoy "
                         "answered 503 UO without dialling the upstream (upstream_cx_overflow counts the "
                         "connections the limit held back)."),
            envoy_flags=("UO",), fixes=FIXES, pod=self.ctx.pod)

    def _finding(self, entry: AccessLogEntry, story: StreamStory | None, evidence: Evidence) -> Finding:
        flow = access_log_flow(entry)
        request = f"{entry.method} {entry.path}" if entry.method else "a request"
        cluster = entry.upstream_cluster or (story.cluster if story else None) or "the cluster"
        logged = story is not None and story.overflow
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"A circuit breaker of {cluster} refused {request}: the pool's limits were reached (503 UO)",
            variant="pending-request limit reached",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=("UO",),
            response_code_details=entry.details or "",
            explanation=(
                f"Envoy refused {request} itself: every connection {cluster}'s connection pool allows was busy "
                f"and its queue of pending requests was full, so the request got no connection and no SYN left "
                f"for the upstream at {flow.server}. Envoy answered {entry.code or 503} with response flag UO "
                f"({entry.details or DETAILS}) and counted upstream_rq_pending_overflow"
                + (" (its pool logged 'max pending streams overflow')" if logged else "")
                + ". The limits are a DestinationRule's connectionPool (maxConnections, http1MaxPendingRequests, "
                  "http2MaxRequests), rendered as the cluster's circuit breakers; Istio's defaults are unlimited, "
                  "so someone set them, and the traffic outgrew them (or the upstream slowed down and held its "
                  "connections longer)."),
            fixes=FIXES,
            pod=self.ctx.pod,
            ts=entry.ts,
            details={"from": "envoy-log" if story is not None else "access-log", "cluster": cluster},
        )
