"""``source-port-exhaustion``: the sidecar cannot open a connection to the app because no local port is left.

Istio >= 1.10 dials the app from 127.0.0.6 (the inbound passthrough source) to the pod IP. Every connection
it closes first waits in TIME_WAIT for 60 s on that four-tuple, so a caller pattern of many short connections
(no keep-alive, ``maxRequestsPerConnection: 1``) uses up ``net.ipv4.ip_local_port_range`` (28,232 ports by
default) towards one app port. connect() then fails at once with EADDRNOTAVAIL: no SYN ever reaches lo, and
Envoy answers 503 with flag UF (URX once retries are spent) and details (Envoy 1.40, measured in the lab)
``upstream_reset_before_response_started{remote_connection_failure|immediate_connect_error:
_Cannot_assign_requested_address|remote_address:POD_IP:PORT}`` (errno 99; older Envoy prints the number) and
counts ``upstream_cx_connect_fail`` (Linux connect(2); RFC 9293 section 3.6.1, TIME-WAIT). On lo the sidecar's
own FINs before it show who closed those connections first, and so holds their TIME_WAIT.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.remedies import destination_rule_pool
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import parse_reset_details, transport_errno

EADDRNOTAVAIL = 99
PASSTHROUGH_SOURCE = "127.0.0.6"  # where Istio >= 1.10's sidecar dials the app from
TIME_WAIT_S = 60.0  # Linux's TCP_TIMEWAIT_LEN: how long a closed connection holds its four-tuple
MAX_CLOSES = 100_000  # the sidecar's first FINs remembered: a window, not the capture's history
SHOWN_CLOSES = 3  # of them, how many the finding names as evidence
# Envoy's default START_TIME and DURATION are whole milliseconds, cut down, not rounded (Envoy's
# access_log_formatter: %E3S; DURATION in ms): a FIN 0.4 ms after the printed start can still come before the
# failed connect(). The window ends where the request does, widened by those two cuts.
LOG_CLOCK_S = 0.002

MAX_REQUESTS_FIELD = "DestinationRule.trafficPolicy.connectionPool.http.maxRequestsPerConnection"
PORT_RANGE_FIELD = "Pod.spec.securityContext.sysctls[net.ipv4.ip_local_port_range]"
WIDE_PORT_RANGE = "1024 65000"

FIXES = (
    Fix("reuse-connections", "let the sidecar reuse its connections to the app instead of one per request",
        "the whole mesh; far fewer connections to the app, so no TIME_WAIT pile-up",
        "long-lived connections to the app: a restarted app instance gets new requests only as the pool "
        "reconnects, and an app that must close connections has to say so (Connection: close)",
        yaml=destination_rule_pool("http", "maxRequestsPerConnection", "0",
                                   comment="0: unlimited requests per pooled connection"),
        settings=((MAX_REQUESTS_FIELD, "0"),)),
    Fix("port-range", "give the pod more source ports (a namespaced sysctl on the kubelet's safe list)",
        "the mesh and the traffic pattern as they are",
        "it only moves the limit (one connection a request still exhausts the wider range, at a higher rate), "
        "and an app port inside the range can be taken by an outgoing connection before the app binds it",
        yaml=f"""\
spec:
  securityContext:
    sysctls:
    - name: net.ipv4.ip_local_port_range
      value: "{WIDE_PORT_RANGE}\"""",
        settings=((PORT_RANGE_FIELD, WIDE_PORT_RANGE),)),
)


def _errno(entry: AccessLogEntry) -> int | None:
    reset = parse_reset_details(entry.details)
    return (reset.errno if reset else None) or transport_errno(entry.upstream_failure)


class SourcePortExhaustion(Detector):
    id = "source-port-exhaustion"
    packet_ifaces = frozenset({"lo"})
    packet_kinds = frozenset({"fin"})
    envoy_counters = ("upstream_cx_connect_fail", "upstream_rq_pending_failure_eject")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._closes: deque[PacketEvent] = deque(maxlen=MAX_CLOSES)  # sidecar-first FINs on lo, in time order

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        # The side that sends the first FIN ends in TIME_WAIT: only the sidecar's first FINs hold its ports.
        if ev.iface == "lo" and ev.is_fin and ev.src == PASSTHROUGH_SOURCE and not flow.server_fin:
            self._closes.append(ev)
        return ()

    def _closes_before(self, server: str, entry: AccessLogEntry) -> list[PacketEvent]:
        # connect() failed somewhere between the request's start and its end: the closes up to its end count.
        end = entry.ts + entry.duration_ms / 1000.0 + LOG_CLOCK_S
        return [ev for ev in self._closes if ev.dst_endpoint == server and end - TIME_WAIT_S <= ev.ts <= end]

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        if "UF" not in entry.flags or _errno(entry) != EADDRNOTAVAIL:
            return None
        flow = access_log_flow(entry)
        source = (entry.upstream_local or PASSTHROUGH_SOURCE).rsplit(":", 1)[0]
        closes = self._closes_before(flow.server, entry)
        seen = (f" The capture shows the sidecar closing {len(closes)} connection{'s' if len(closes) != 1 else ''} "
                f"to it first in the {TIME_WAIT_S:.0f} s before: each holds its source port in TIME_WAIT."
                if closes else "")
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"The sidecar ran out of source ports to {flow.server}: connect() failed with EADDRNOTAVAIL "
                  f"({entry.code} {','.join(entry.flags)})",
            flow=flow,
            evidence=(evidence, *(Evidence.of(ev, "the sidecar closes first (TIME_WAIT)")
                                  for ev in closes[-SHOWN_CLOSES:])),
            envoy_flags=tuple(f for f in ("UF", "URX") if f in entry.flags),
            variant="no source port left (EADDRNOTAVAIL)",
            response_code_details=entry.details or "",
            explanation=(
                f"Envoy could not open a connection from {source} to the app at {flow.server}: connect() "
                f"failed at once with EADDRNOTAVAIL (errno 99, 'Cannot assign requested address'), so no SYN "
                f"left the pod. Every local port towards that address is taken, most by connections in TIME_WAIT "
                f"(60 s each after the sidecar closes one): the sidecar opens and closes connections to the app "
                f"faster than the port range allows ({entry.details or entry.upstream_failure}).{seen}"),
            fixes=FIXES,
            pod=self.ctx.pod,
            ts=entry.ts,
            details={"sidecar_closes_before": len(closes)},
        )
