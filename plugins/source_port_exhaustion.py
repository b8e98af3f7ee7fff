"""``source-port-exhaustion``: the sidecar cannot open a connection to the app because no local port is left.

Istio >= 1.10 dials the app from 127.0.0.6 (the inbound passthrough source) to the pod IP. Every connection
it closes first waits in TIME_WAIT for 60 s on that four-tuple, so a caller pattern of many short connections
(no keep-alive, ``maxRequestsPerConnection: 1``) uses up ``net.ipv4.ip_local_port_range`` (28,232 ports by
default) towards one app port. connect() then fails at once with EADDRNOTAVAIL: no SYN ever reaches lo, and
Envoy answers 503 with flags UF (URX once retries are spent), details
``upstream_reset_before_response_started{local_connection_failure|immediate_connect_error:_Cannot_assign_requested_address}``
(errno 99; older Envoy prints the number) and counts ``upstream_cx_connect_fail`` (Linux connect(2); RFC 9293
section 3.6.1, TIME-WAIT).
"""

from __future__ import annotations

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.findings import Evidence, Finding, Severity
from kubectl_meshdoctor.core.remedies import destination_rule_pool
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import parse_reset_details, transport_errno

EADDRNOTAVAIL = 99

SYSCTL_FIX = """\
# Or give the pod more source ports and let it reuse TIME_WAIT ones for new outgoing connections
# (namespaced sysctls, allowed by the kubelet's safe list):
spec:
  securityContext:
    sysctls:
    - name: net.ipv4.ip_local_port_range
      value: "1024 65000"
    - name: net.ipv4.tcp_tw_reuse
      value: "1\""""


def _errno(entry: AccessLogEntry) -> int | None:
    reset = parse_reset_details(entry.details)
    return (reset.errno if reset else None) or transport_errno(entry.upstream_failure)


class SourcePortExhaustion(Detector):
    id = "source-port-exhaustion"
    envoy_counters = ("upstream_cx_connect_fail", "upstream_rq_pending_failure_eject")
    kernel_counters = ("TcpAttemptFails",)

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        if "UF" not in entry.flags or _errno(entry) != EADDRNOTAVAIL:
            return None
        flow = access_log_flow(entry)
        source = (entry.upstream_local or "127.0.0.6").rsplit(":", 1)[0]
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"The sidecar ran out of source ports to {flow.server}: connect() failed with EADDRNOTAVAIL "
                  f"({entry.code} {','.join(entry.flags)})",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=tuple(f for f in ("UF", "URX") if f in entry.flags),
            response_code_details=entry.details or "",
            explanation=(
                f"Envoy could not open a connection from {source} to the app at {flow.server}: connect() "
                f"failed at once with EADDRNOTAVAIL (errno 99, 'Cannot assign requested address'), so no SYN "
                f"left the pod. Every local port towards that address is taken, most by connections in TIME_WAIT "
                f"(60 s each after the sidecar closes one): the sidecar opens and closes connections to the app "
                f"faster than the port range allows ({entry.details or entry.upstream_failure})."),
            remediation=(
                "# Reuse connections to the app instead of opening one per request:\n"
                + destination_rule_pool("http", "maxRequestsPerConnection", "0",
                                        comment="0: unlimited requests per pooled connection")
                + "\n" + SYSCTL_FIX),
            pod=self.ctx.pod,
            ts=entry.ts,
        )
