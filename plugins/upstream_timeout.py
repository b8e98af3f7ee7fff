"""``upstream-timeout``: the app did not answer within the route's timeout, so Envoy gave up and answered 504.

Envoy's router arms the route timeout (``timeout`` of the route; Istio renders a VirtualService's
``http[].timeout`` there, and has none by default) when the request is sent upstream, and the per-try timeout
(``retries.perTryTimeout``) for each attempt. When it fires before the response headers arrive, Envoy resets the
upstream request, answers the caller 504 with response flag UT and details ``response_timeout`` (per try:
``upstream_per_try_timeout``), and counts ``upstream_rq_timeout`` (``upstream_rq_per_try_timeout``) on the
cluster (Envoy docs: router filter, "x-envoy-upstream-rq-timeout-ms"; response code details). The wire shows
the request on lo and no response before Envoy closes that upstream connection; on eth0, Envoy's own 504: a
local reply (envoy/local_reply.py: no ``x-envoy-upstream-service-time``, Envoy as server, its 24-byte body),
so an app's own 504, or another server's, is not taken for it.
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
from kubectl_meshdoctor.core.remedies import virtual_service_timeout
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.local_reply import SERVICE_TIME, is_local_reply

TIMEOUT_DETAILS = ("response_timeout", "upstream_per_try_timeout")
TIMEOUT_BODY = len("upstream request timeout")  # Envoy's local reply to a route timeout
_NOTE = "upstream-timeout"



def _seconds(ms: int) -> str:
    """Twice the timeout that fired (what Envoy waited, to the nearest whole second; it fires a few ms off)."""
    return f"{2 * max(1, int(ms / 1000 + 0.5))}s"


ROUTE_TIMEOUT_FIELD = "VirtualService.http.timeout"


def fixes(waited_ms: int, per_try: bool) -> tuple[Fix, ...]:
    """The fix of a route (or per-try) timeout that fired after ``waited_ms``: twice that time for the route."""
    longer = _seconds(waited_ms)
    return (Fix(
        "route-timeout", f"give the route more time than the app's slowest answer ({longer} here: about twice "
                         f"what Envoy waited; more if the app needs it)",
        "the whole mesh; the app's slow answers are served instead of cut off",
        "callers of a stuck app wait longer for the 504, and the caller's own timeout must be longer still (else "
        "it gives up first: DC); if the app is overloaded or stuck, a longer timeout only hides it",
        yaml=virtual_service_timeout(longer, longer if per_try else None, comment="about twice what Envoy waited"),
        settings=() if per_try else ((ROUTE_TIMEOUT_FIELD, longer),)),)


COUNTERS = (CounterSignal("cluster", "upstream_rq_timeout", "requests the route timeout cut off"),
            CounterSignal("cluster", "upstream_rq_per_try_timeout", "attempts the per-try timeout cut off"),
            flag_signal("UT", "requests Envoy answered 504 UT"))


class UpstreamTimeout(Detector):
    id = "upstream-timeout"
    envoy_counters = ("upstream_rq_timeout", "upstream_rq_per_try_timeout")

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface != "eth0" or ev.http is None:
            return ()
        if ev.http.is_request and (ev.src, ev.sport) == flow.client:
            flow.notes[_NOTE] = ev  # the request this connection's next response answers
            return ()
        request = flow.notes.pop(_NOTE, None)
        if request is None or ev.http.status != 504 or not is_local_reply(ev.http.headers, TIMEOUT_BODY):
            return ()
        waited_ms = int(round((ev.ts - request.ts) * 1000))
        return (self._finding(FlowRef.of(flow), (Evidence.of(request, "request from the caller"),
                                                  Evidence.of(ev, f"504 from the sidecar itself, {waited_ms} ms "
                                                                  f"later (no {SERVICE_TIME})")),
                              request.http.start_line.rsplit(" ", 1)[0], waited_ms, "response_timeout", 504,
                              ev.ts),)

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        return counter_findings(
            self.id, counters, COUNTERS, what="Upstream timeouts: no response within the route's timeout (504 UT)",
            explanation=("The upstream did not send its response headers before the route's (or per-try) timeout: "
                         "Envoy reset the request and answered 504 UT. How long the app took is in the access "
                         "log's duration, or on lo; the fix gives the route more time than the app's slowest "
                         "legitimate answer."),
            envoy_flags=("UT",), 
            remediation="# Raise the VirtualService's timeout above the app's slowest legitimate answer:\n"
                        + virtual_service_timeout("<twice the slowest answer>", None,
                                                  comment="read the app's latency first"),
            pod=self.ctx.pod)

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        if "UT" not in entry.flags and entry.details not in TIMEOUT_DETAILS:
            return None
        request = f"{entry.method} {entry.path}" if entry.method else "the request"
        return self._finding(access_log_flow(entry), (evidence,), request, entry.duration_ms,
                             entry.details or "", entry.code or 504, entry.ts)

    def _finding(self, flow: FlowRef, evidence: tuple[Evidence, ...], request: str, waited_ms: int, details: str,
                 code: int, ts: float) -> Finding:
        per_try = details == "upstream_per_try_timeout"
        which = "per-try timeout (retries.perTryTimeout)" if per_try else "route timeout (the VirtualService timeout)"
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"{flow.server} did not answer {request} within the {'per-try' if per_try else 'route'} "
                  f"timeout: Envoy gave up after {waited_ms} ms (504 UT)",
            flow=flow,
            evidence=evidence,
            envoy_flags=("UT",),
            variant=f"no answer within the {'per-try' if per_try else 'route'} timeout",
            response_code_details=details,
            explanation=(
                f"The sidecar sent {request} to the app at {flow.server} and waited {waited_ms} ms for "
                f"its response headers; then its {which} fired. Envoy reset the upstream request, answered the "
                f"caller {code} with response flag UT{f' ({details})' if details else ''} and "
                f"counted upstream_rq_{'per_try_' if per_try else ''}timeout. The app was slower than the route "
                f"allows: either it is overloaded or stuck (check its latency and its own dependencies), or the "
                f"timeout is shorter than the slowest answer it legitimately gives."),
            fixes=fixes(waited_ms, per_try),
            pod=self.ctx.pod,
            ts=ts,
        )
