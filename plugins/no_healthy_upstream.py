"""``no-healthy-upstream``: the cluster had no endpoint Envoy would route to, and Envoy answered 503 UH itself.

Outlier detection (a DestinationRule's ``outlierDetection``) ejects an endpoint after ``consecutive5xxErrors``
(or gateway errors) for ``baseEjectionTime``, longer each time; with ``maxEjectionPercent: 100`` it may eject
every endpoint. Istio renders no ``minHealthPercent`` as ``healthy_panic_threshold: 0``, which switches Envoy's
panic routing off (istio/istio pilot/pkg/networking/core/cluster_traffic_policy.go): with every endpoint ejected
(or none known, or all failing active health checks), the router answers 503 with response flag UH and details
``no_healthy_upstream`` and counts ``upstream_cx_none_healthy``. The cluster manager logs ``host X in cluster C
was ejected by the outlier detector`` and ``no healthy host``; `/clusters` shows the endpoint's
``health_flags::/failed_outlier_check`` (Envoy's admin docs, clusters; cluster_stats.rst, outlier detection).
One app that answers a burst of 500s can so turn every later request into a 503 until the ejection ends.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

from kubectl_meshdoctor.core.correlate import access_log_flow, log_line_summary
from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings, flag_signal
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import AccessLogEvent, ClustersEvent, ContextEvent, EnvoyCountersEvent
from kubectl_meshdoctor.core.findings import COUNTER, Evidence, Finding, NoFlow, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.remedies import destination_rule
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.story import StreamStory

DETAILS = "no_healthy_upstream"
MIN_HEALTH_FIELD = "DestinationRule.trafficPolicy.outlierDetection.minHealthPercent"
MAX_EJECTION_FIELD = "DestinationRule.trafficPolicy.outlierDetection.maxEjectionPercent"
# Outlier detection ejects a host after consecutive 5xx (consecutive5xxErrors, Istio's default 5; Envoy's
# outlier_detection.consecutive_5xx): the run of them kept per cluster, bounded, to quote what made it eject.
MAX_RUN = 64
MAX_CLUSTERS = 256


def _outlier_rule(field: str, value: str, comment: str) -> str:
    return destination_rule(f"    outlierDetection:\n      {field}: {value}          # {comment}")


FIXES = (
    Fix("min-health-percent", "route to every endpoint again when too few are healthy (Envoy's panic routing)",
        "outlier detection as it is: a failing endpoint is still ejected while enough others are healthy",
        "below that share of healthy endpoints the ejected ones get traffic too: some requests meet the failing "
        "endpoint, instead of every request meeting a 503 UH",
        yaml=_outlier_rule("minHealthPercent", "50", "below 50 % healthy: route to all of them"),
        settings=((MIN_HEALTH_FIELD, "50"),)),
    Fix("max-ejection-percent", "never let outlier detection eject every endpoint",
        "outlier detection as it is for the others: at most half the endpoints ejected at once",
        "with one endpoint, none is ever ejected (Envoy ejects none while that would exceed the share), so its "
        "errors reach the callers as the app's own 5xx",
        yaml=_outlier_rule("maxEjectionPercent", "50", "at most half the endpoints at once"),
        settings=((MAX_EJECTION_FIELD, "50"),)),
)

COUNTERS = (
    CounterSignal("cluster", "upstream_cx_none_healthy", "requests that found no healthy endpoint"),
    CounterSignal("cluster", "outlier_detection.ejections_enforced_total", "endpoints ejected by outlier "
                                                                           "detection"),
    flag_signal("UH", "requests Envoy answered 503 UH"),
)


class NoHealthyUpstream(Detector):
    id = "no-healthy-upstream"
    envoy_counters = ("upstream_cx_none_healthy", "outlier_detection.ejections_enforced_total")
    envoy_loggers = ("upstream", "router", "http")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._clusters: ClustersEvent | None = None
        # cluster -> the 5xx answers of its hosts since the last answer that was not one, as (line, evidence)
        self._runs: OrderedDict[str, deque[tuple[AccessLogEntry, Evidence]]] = OrderedDict()

    def on_context(self, ev: ContextEvent) -> Iterable[Finding]:
        if isinstance(ev, ClustersEvent):
            self._clusters = ev
        elif isinstance(ev, AccessLogEvent):
            self._answered(ev)
        return ()

    def _answered(self, ev: AccessLogEvent) -> None:
        """Keep a cluster's run of 5xx answers from its hosts (an answer that came back from an upstream host:
        %UPSTREAM_HOST% set); any other answer from one ends the run, as it resets Envoy's consecutive-5xx count."""
        entry = ev.entry
        if not entry.upstream_cluster or not entry.upstream_host or self._uh(entry):
            return
        run = self._runs.get(entry.upstream_cluster)
        if entry.code < 500:
            if run:
                run.clear()
            return
        if run is None:
            run = self._runs[entry.upstream_cluster] = deque(maxlen=MAX_RUN)
            if len(self._runs) > MAX_CLUSTERS:
                self._runs.popitem(last=False)
        run.append((entry, Evidence.log_line(ev.source or "istio-proxy log", ev.line, entry.ts,
                                             log_line_summary(entry))))

    def _burst(self, cluster: str | None, before: float) -> list[tuple[AccessLogEntry, Evidence]]:
        """The 5xx answers of ``cluster`` that came before ``before`` and no finding quoted yet: what outlier
        detection counted when it ejected. Taken: a later 503 UH of the same ejection quotes only itself."""
        run = self._runs.get(cluster or "")
        if not run:
            return []
        taken = [x for x in run if x[0].ts <= before]
        for x in taken:
            run.remove(x)
        return taken

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        return self._finding(entry, None, evidence) if self._uh(entry) else None

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        return self._finding(said, story, evidence) if self._uh(said) else None

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        # An ejection alone is outlier detection working; requests that found no endpoint are the failure.
        found = [f for f in counter_findings(
            self.id, counters, COUNTERS, what="No healthy upstream: requests found every endpoint ejected (503 UH)",
            explanation=("Requests found no endpoint Envoy would route to: outlier detection had ejected them "
                         "(or none were known), and with panic routing off (Istio's default: no "
                         "minHealthPercent) Envoy answered 503 UH itself."),
            envoy_flags=("UH",), fixes=FIXES, pod=self.ctx.pod)
            if any(k.endswith(".upstream_cx_none_healthy") or "response_flags=UH" in k for k in f.counters)]
        return found or self._all_out_of_rotation()

    def _all_out_of_rotation(self) -> list[Finding]:
        """A `/clusters` dump alone: a cluster with every endpoint out of rotation fails every request."""
        if self._clusters is None:
            return []
        out = []
        for cluster, hosts in self._clusters.hosts.items():
            down = self._clusters.unhealthy.get(cluster, {})
            if not hosts or len(down) < hosts:
                continue
            flags = sorted({f for fl in down.values() for f in fl})
            out.append(Finding(
                detector=self.id, severity=Severity.ERROR,
                title=f"Every endpoint of {cluster} is out of rotation ({', '.join(flags)}): requests get 503 UH",
                variant="every endpoint out of rotation", flow=NoFlow(COUNTER, cluster),
                evidence=tuple(Evidence.counter(self._clusters.source, self._clusters.ts, "/clusters",
                                                f"{cluster}::{h}::health_flags::/{'/'.join(fl)}")
                               for h, fl in down.items()),
                envoy_flags=("UH",), response_code_details=DETAILS,
                explanation=(f"/clusters shows all {hosts} endpoint(s) of {cluster} kept out of rotation "
                             f"({', '.join(flags)}: failed_outlier_check is an outlier ejection, failed_active_hc "
                             f"a failed health check). With panic routing off (Istio's default) Envoy answers "
                             f"every request for the cluster 503 UH until one returns."),
                fixes=FIXES, pod=self.ctx.pod, ts=self._clusters.ts,
                details={"cluster": cluster, "ejected": {h: list(fl) for h, fl in down.items()}}))
        return out

    @staticmethod
    def _uh(entry: AccessLogEntry) -> bool:
        return "UH" in entry.flags or entry.details == DETAILS

    def _ejected(self, cluster: str | None) -> dict[str, tuple[str, ...]]:
        """The endpoints `/clusters` showed out of rotation in ``cluster``, with their health flags."""
        if self._clusters is None or not cluster:
            return {}
        return dict(self._clusters.unhealthy.get(cluster, {}))

    def _finding(self, entry: AccessLogEntry, story: StreamStory | None, evidence: Evidence) -> Finding:
        cluster = entry.upstream_cluster or (story.cluster if story else None)
        flow = access_log_flow(entry)
        request = f"{entry.method} {entry.path}" if entry.method else "a request"
        ejected = self._ejected(cluster)
        hosts = self._clusters.hosts.get(cluster or "", 0) if self._clusters else 0
        seen = [r.text for r in (story.refs if story else ()) if r.kind == "outlier-ejected"]
        burst = self._burst(cluster, entry.ts)
        codes = ", ".join(dict.fromkeys(str(e.code) for e, _ in burst))
        before = (f" Before it, {len(burst)} answer(s) {codes} came back from the cluster's endpoints in a row"
                  f" (quoted): what outlier detection counts towards consecutive5xxErrors." if burst else "")
        shown = (f" /clusters shows {len(ejected)} of {hosts} endpoint(s) out of rotation: "
                 + ", ".join(f"{h} ({'/'.join(flags)})" for h, flags in ejected.items()) + "." if ejected else "")
        more = tuple(Evidence.counter(self._clusters.source, self._clusters.ts, "/clusters",
                                      f"{cluster}::{h}::health_flags::/{'/'.join(flags)}")
                     for h, flags in ejected.items()) if ejected and self._clusters else ()
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"No healthy endpoint in {cluster or 'the cluster'} for {request}: Envoy answered 503 UH itself",
            variant="every endpoint out of rotation",
            flow=flow,
            evidence=(evidence, *(ev for _, ev in burst), *more),
            envoy_flags=("UH",),
            response_code_details=entry.details or "",
            explanation=(
                f"Envoy found no endpoint of {cluster or 'the cluster'} it would route {request} to and answered "
                f"{entry.code or 503} with response flag UH ({DETAILS}) without dialling anything."
                + (f" Its debug log shows why: {'; '.join(seen)}." if seen else "") + before + shown
                + " Outlier detection (a DestinationRule's outlierDetection) ejects an endpoint after consecutive "
                  "5xx; with maxEjectionPercent 100 it may eject every one, and with panic routing off (no "
                  "minHealthPercent, Istio's default) every request then meets this 503 until the ejection ends, "
                  "even when the endpoint has recovered. Find what made it fail (the 5xx before the first UH), "
                  "and keep the ejection from taking the last endpoints."),
            fixes=FIXES,
            pod=self.ctx.pod,
            ts=entry.ts,
            # The burst before the line itself, when there was one; else the correlator quotes the line alone.
            access_log=(tuple(e.quoted(self.ctx.redact) for e, _ in burst) + ((entry.quoted(self.ctx.redact),)
                                                                               if entry.raw else ())
                        if burst else ()),
            entries=tuple(e for e, _ in burst) + ((entry,) if entry.raw else ()) if burst else (),
            details={"from": "envoy-log" if story is not None else "access-log",
                     **({"cluster": cluster} if cluster else {}),
                     **({"ejected": {h: list(f) for h, f in ejected.items()}} if ejected else {})},
        )
