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

import math
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
from kubectl_meshdoctor.envoy.story import StreamStory

TIMEOUT_DETAILS = ("response_timeout", "upstream_per_try_timeout")
DEFAULT_ATTEMPTS = 3  # Istio's default retry policy: two retries (attempts: 2), so three tries in all
TIMEOUT_BODY = len("upstream request timeout")  # Envoy's local reply to a route timeout
_NOTE = "upstream-timeout"



def _seconds(ms: int) -> str:
    """Twice the timeout that fired (what Envoy waited, to the nearest whole second; it fires a few ms off)."""
    return f"{2 * max(1, int(ms / 1000 + 0.5))}s"


ROUTE_TIMEOUT_FIELD = "VirtualService.http.timeout"


def _tenths(ms: float) -> str:
    """``ms`` as a duration Istio reads, rounded up to a tenth of a second ("1.1s")."""
    return f"{max(1, math.ceil(ms / 100)) / 10:g}s"


UNKNOWN_WAIT = "<twice the app's slowest answer>"


def fixes(waited_ms: int | None, per_try: bool) -> tuple[Fix, ...]:
    """The fix of a route timeout that fired after ``waited_ms``: twice that time for the route. For a per-try
    timeout ``waited_ms`` is one try's wait: twice that a try, and the route long enough for every try
    (virtual_service_timeout's two retries: three tries), else the route's timeout cuts the retries off.
    ``waited_ms`` None: the evidence does not say how long Envoy waited; the YAML then names the value to choose."""
    if waited_ms is None:
        longer = each = UNKNOWN_WAIT
        what = "the log does not show how long Envoy waited"
    elif per_try:
        each = _tenths(2 * waited_ms)
        longer, what = _tenths(3 * 2 * waited_ms), "about twice what each try waited, for three tries"
    else:
        longer = each = _seconds(waited_ms)
        what = "about twice what Envoy waited"
    return (Fix(
        "route-timeout", (f"give the route more time than the app's slowest answer ({longer} here: {what}; more "
                          f"if the app needs it)" if waited_ms is not None else
                          f"give the route more time than the app's slowest answer ({what}: choose about twice "
                          f"the app's slowest answer)"),
        "the whole mesh; the app's slow answers are served instead of cut off",
        "callers of a stuck app wait longer for the 504, and the caller's own timeout must be longer still (else "
        "it gives up first: DC); if the app is overloaded or stuck, a longer timeout only hides it",
        yaml=virtual_service_timeout(longer, each if per_try else None, comment=what),
        settings=() if per_try or waited_ms is None else ((ROUTE_TIMEOUT_FIELD, longer),)),)


COUNTERS = (CounterSignal("cluster", "upstream_rq_timeout", "requests the route timeout cut off"),
            CounterSignal("cluster", "upstream_rq_per_try_timeout", "attempts the per-try timeout cut off"),
            flag_signal("UT", "requests Envoy answered 504 UT"))


class UpstreamTimeout(Detector):
    id = "upstream-timeout"
    packet_ifaces = frozenset({"eth0"})
    packet_kinds = frozenset({"http"})
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
        return self._from_logs(entry, evidence, None)

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        # A debug log that starts at the timeout line (a paste, a log raised mid-request) shows no start: a 0 ms
        # wait there is an unknown wait, never a timeout of 0 (Envoy's route timeouts are whole milliseconds).
        unknown = entry is None and said.duration_ms == 0
        return self._from_logs(said, evidence, len(story.retried) + 1, unknown)

    def _from_logs(self, entry: AccessLogEntry, evidence: Evidence, attempts: int | None,
                   unknown_wait: bool = False) -> Finding | None:
        """``attempts``: how many tries the debug log shows (None when only the access log speaks: then URX
        says the retries were spent, and Istio's default is two retries)."""
        if "UT" not in entry.flags and entry.details not in TIMEOUT_DETAILS:
            return None
        request = f"{entry.method} {entry.path}" if entry.method else "the request"
        if attempts is None:
            attempts = DEFAULT_ATTEMPTS if "URX" in entry.flags else 1
        return self._finding(access_log_flow(entry), (evidence,), request,
                             None if unknown_wait else entry.duration_ms, entry.details or "", entry.code or 504,
                             entry.ts, attempts)

    def _finding(self, flow: FlowRef, evidence: tuple[Evidence, ...], request: str, waited_ms: int | None,
                 details: str, code: int, ts: float, attempts: int = 1) -> Finding:
        per_try = details == "upstream_per_try_timeout"
        which = "per-try timeout (retries.perTryTimeout)" if per_try else "route timeout (the VirtualService timeout)"
        # Each try waited its per-try timeout: the fix is sized from one try's wait, not from the whole request's.
        tries = attempts if per_try and attempts > 1 else 1
        each_ms = round(waited_ms / tries) if waited_ms is not None else None
        over = (f" over {tries} attempts (about {each_ms} ms each: the retries were spent)"
                if tries > 1 and each_ms is not None else "")
        gave_up = (f"Envoy gave up after {waited_ms} ms" if waited_ms is not None
                   else "Envoy gave up (the log shows no start, so not how long it waited)")
        waited = f"waited {waited_ms} ms{over}" if waited_ms is not None else "waited"
        known = flow.server not in ("-", "")  # a log that names no upstream address
        server, target = (flow.server, f"the app at {flow.server}") if known else ("the upstream", "the upstream")
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"{server} did not answer {request} within the {'per-try' if per_try else 'route'} "
                  f"timeout: {gave_up} (504 UT)",
            flow=flow,
            evidence=evidence,
            envoy_flags=("UT",),
            variant=f"no answer within the {'per-try' if per_try else 'route'} timeout",
            response_code_details=details,
            explanation=(
                f"The sidecar sent {request} to {target} and {waited} for "
                f"its response headers; then its {which} fired. Envoy reset the upstream request, answered the "
                f"caller {code} with response flag UT{f' ({details})' if details else ''} and "
                f"counted upstream_rq_{'per_try_' if per_try else ''}timeout. The app was slower than the route "
                f"allows: either it is overloaded or stuck (check its latency and its own dependencies), or the "
                f"timeout is shorter than the slowest answer it legitimately gives."),
            fixes=fixes(each_ms, per_try),
            pod=self.ctx.pod,
            ts=ts,
        )
