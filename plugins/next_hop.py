"""``next-hop``: a caller's sidecar relayed a 5xx the next hop answered; the cause lies beyond this pod.

In a mesh the user's 503 is logged by the caller's sidecar (or the gateway), on the outbound cluster of the
service it called (``outbound|PORT|SUBSET|HOST``). When the answer came from upstream, Envoy's
%RESPONSE_CODE_DETAILS% is ``via_upstream`` (Envoy docs, response_code_details.rst: "The response code was set by
the upstream"), whatever it was: the server pod's sidecar failing its own upstream (its ``503 UF`` is relayed as
``503 - via_upstream``, its ``502 UPE`` as ``502 - via_upstream``, its route timeout as ``504 - via_upstream``), or
the app's own 5xx. Istio < 1.24 also retried a 503 by default (``retriable_status_codes: [503]``, 2 retries), so
such a caller logs ``503 URX via_upstream`` once the retries are spent; Istio >= 1.24 leaves 503 out of the
default retry policy (``EXCLUDE_UNSAFE_503_FROM_DEFAULT_RETRY``, istio/istio#50506; the default retries
connect-failure, refused-stream, unavailable and cancelled: pilot/pkg/networking/core/route/retry/retry.go).
Both were measured with real Envoy in the lab (docs/lab-envoy.md). This pod's captures, debug log and counters
then show a healthy hop: the evidence is in the next one.

The finding names the hop (the cluster, the upstream host that answered) and the command to run there. A failure
this sidecar made itself (UF, UC, UO, UH, NR, ... with details other than ``via_upstream``) is other detectors'.

Retries hide the next hop's failures: a request whose first attempt failed and whose retry was answered is a
200 in this sidecar's access log, while the server pod logged the failure. The outbound cluster's
``upstream_rq_retry_success`` (Envoy's cluster_stats.rst: "Total request retry successes") counts them: a warning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import EnvoyCountersEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, NoFlow, Severity
from kubectl_meshdoctor.core.remedies import upstream_pod_commands
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.istio_cluster import IstioCluster, parse_istio_cluster
from kubectl_meshdoctor.envoy.story import StreamStory

VIA_UPSTREAM = "via_upstream"
# The statuses an Envoy hop answers with itself (503 UF/UC/UO/UH/URX, 502 UPE, 504 UT: Envoy's local replies,
# response_code_details.rst); relayed, they say that hop failed. A 500 or 501 relayed is the app's own answer.
HOP_STATUSES = frozenset({502, 503, 504})


def relayed(entry: AccessLogEntry) -> IstioCluster | None:
    """The outbound cluster of a 502, 503 or 504 the next hop answered and this sidecar passed on; None for anything
    else."""
    if entry.details != VIA_UPSTREAM or entry.code not in HOP_STATUSES:
        return None
    cluster = parse_istio_cluster(entry.upstream_cluster)
    return cluster if cluster is not None and cluster.direction == "outbound" else None


def where_to_look(cluster: IstioCluster, upstream_host: str | None) -> str:
    """The commands that find the next hop's pod and read its side (core/remedies.upstream_pod_commands)."""
    find, flag = upstream_pod_commands(cluster, upstream_host)
    return (f"# The answer came from the next hop: read that pod's sidecar.\n{find}\n"
            f"kubectl meshdoctor watch {flag}pod/<that pod> --envoy-debug\n"
            f"# or, offline: kubectl logs {flag}<that pod> -c istio-proxy > server.log; "
            f"kubectl meshdoctor analyze server.log")


RETRIES = (CounterSignal("cluster", "upstream_rq_retry_success",
                         "requests a retry answered after an attempt failed"),)


class NextHop(Detector):
    id = "next-hop"
    envoy_counters = ("upstream_rq_retry", "upstream_rq_retry_success", "upstream_rq_retry_limit_exceeded")

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        found = counter_findings(
            self.id, counters, RETRIES, what="Retries hid failures of the next hop",
            explanation=("This sidecar retried requests whose first attempt failed at the next hop (the server "
                         "pod's sidecar or its app: a 503, a reset, a refused stream), and a retry was answered: "
                         "callers saw success, and the server pod logged the failures. Istio's default policy "
                         "retries connect failures, refused streams and resets twice (and a 503 too before Istio "
                         "1.24, or where a VirtualService's retryOn asks). The failures are real and recur; read "
                         "the server pod's side to see them."),
            remediation=("# The failures are logged in the next hop: read the server pod's sidecar.\n"
                         "kubectl meshdoctor watch -n <namespace> pod/<server pod> --envoy-debug"),
            severity=Severity.WARNING, pod=self.ctx.pod)
        return [f for f in found if isinstance(f.flow, NoFlow) and _outbound(f.flow.server)]

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        cluster = relayed(entry)
        return self._finding(entry, cluster, evidence) if cluster is not None else None

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        cluster = relayed(said)
        return self._finding(said, cluster, evidence) if cluster is not None else None

    def _finding(self, entry: AccessLogEntry, cluster: IstioCluster, evidence: Evidence) -> Finding:
        request = f"{entry.method} {entry.path}" if entry.method else "a request"
        answered = entry.upstream_host or cluster.host or entry.upstream_cluster
        retried = "URX" in entry.flags
        spent = (" after its retries were spent (URX: every attempt got a 5xx; a 503 is retried by default "
                 "before Istio 1.24, or where a VirtualService's retryOn asks)" if retried else "")
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"{entry.code} from the next hop ({answered}): this sidecar passed on {request}'s answer",
            variant=f"{entry.code} via_upstream",
            # the hop it passed the answer on from: this sidecar's upstream connection, the four-tuple the server
            # pod and both eth0 captures see (not its client's, downstream)
            flow=replace(access_log_flow(entry), client=entry.upstream_local) if entry.upstream_local
            else access_log_flow(entry),
            evidence=(evidence,),
            envoy_flags=tuple(entry.flags),
            response_code_details=VIA_UPSTREAM,
            explanation=(
                f"This pod's sidecar sent {request} to {entry.upstream_cluster} and passed on the {entry.code} "
                f"that came back from {answered}{spent}: Envoy's details say via_upstream, so the status was set "
                f"upstream, not by this hop. The cause is in the next hop: the server pod's sidecar (a 503 UF or "
                f"UC, a 502 UPE, a 504 UT of its own, each logged there) or its app. This pod's captures and "
                f"counters show a healthy hop; the server pod's side tells which."),
            remediation=where_to_look(cluster, entry.upstream_host),
            pod=self.ctx.pod,
            ts=entry.ts,
            details={"cluster": entry.upstream_cluster, "upstream_host": entry.upstream_host,
                     "retries_spent": retried},
        )


def _outbound(cluster: str) -> bool:
    parsed = parse_istio_cluster(cluster)
    return parsed is not None and parsed.direction == "outbound"
