"""``no-route``: the request matched no route, and Envoy answered 404 itself.

A VirtualService whose http routes all carry ``match`` conditions (a prefix, a header) and no route without one
leaves the requests outside them with nothing to match; so does a Gateway host the VirtualService does not list.
Envoy's router answers 404 with response flag NR and details ``route_not_found`` and logs ``no route match for
URL '<path>'`` (``no cluster match for URL`` before Envoy 1.24); the HCM counts ``no_route`` under its stat
prefix (Envoy's http_conn_man/stats.rst, router ``no_route``). The app never sees the request.

A connection that matches no listener filter chain is NR too, with details ``filter_chain_not_found``: that is
not a route but a listener refusing the connection (plaintext on an mTLS-only port), tls-mismatch's.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings, flag_signal
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import EnvoyCountersEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.story import StreamStory

DETAILS = "route_not_found"

FIXES = (Fix(
    "default-route", "give the VirtualService a last http route without match, for every request the others "
                     "do not take",
    "the whole mesh and the routes as they are; the requests that matched none reach the service",
    "every path of the host is served by the service's default subset (a route with a direct response, or a "
    "404 of the app's own, keeps unknown paths out on purpose)",
    yaml="""\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: <service>
spec:
  hosts:
  - <service>.<namespace>.svc.cluster.local
  http:
  # ... the routes with match conditions, as they are ...
  - route:                        # last, with no match: whatever the routes above do not take
    - destination:
        host: <service>.<namespace>.svc.cluster.local"""),)


def no_route(entry: AccessLogEntry) -> bool:
    """A request Envoy answered itself because no route matched (NR with route_not_found, or NR on an HTTP line
    of a format without details)."""
    if "NR" not in entry.flags:
        return False
    return entry.details == DETAILS or (entry.details is None and not entry.is_tcp)


class NoRoute(Detector):
    id = "no-route"
    envoy_counters = ("http.no_route",)
    envoy_loggers = ("router", "http")

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        return self._finding(entry, None, evidence) if no_route(entry) else None

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        return self._finding(said, story, evidence) if no_route(said) or story.no_route else None

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        return counter_findings(
            self.id, counters, (CounterSignal("http", "no_route", "requests no route matched"),
                                flag_signal("NR", "requests Envoy answered 404 NR")),
            what="Requests that matched no route (404 NR)",
            explanation=("Requests reached the sidecar's HTTP connection manager and matched none of its routes: "
                         "Envoy answered 404 NR (route_not_found) itself. A VirtualService whose routes all carry "
                         "match conditions leaves the other requests nothing to match."),
            envoy_flags=("NR",), fixes=FIXES, severity=Severity.WARNING, pod=self.ctx.pod)

    def _finding(self, entry: AccessLogEntry, story: StreamStory | None, evidence: Evidence) -> Finding:
        flow = access_log_flow(entry)
        authority = entry.authority or (story.authority if story else None)
        request = f"{entry.method} {entry.path}" if entry.method else "a request"
        host = f" for host {authority}" if authority else ""
        return Finding(
            detector=self.id,
            severity=Severity.WARNING,
            title=f"No route matched {request}{host}: the sidecar answered 404 NR itself",
            variant="no route matched",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=("NR",),
            response_code_details=entry.details or "",
            explanation=(
                f"{request}{host} matched none of the sidecar's routes, so Envoy answered 404 with response flag "
                f"NR (route_not_found) and the request never reached the app. The routes come from the "
                f"VirtualService of the host (or, at a gateway, the Gateway's hosts): when every http route has a "
                f"match condition (a URI prefix, a header), a request outside them all has nothing to match. A "
                f"request for a host no VirtualService or Service names ends here too."),
            fixes=FIXES,
            pod=self.ctx.pod,
            ts=entry.ts,
            details={"from": "envoy-log" if story is not None else "access-log",
                     **({"authority": authority} if authority else {})},
        )
