"""``upstream-refused``: the sidecar's connection to the app is refused.

Envoy's inbound listener connects to the app from 127.0.0.6 over ``lo``. When nothing listens on the app port
(the app restarts, listens on another port, or binds 127.0.0.1 only while Envoy dials the pod IP), the kernel
answers the SYN with RST (RFC 9293 section 3.10.7.1: no socket, send a reset). Envoy answers the caller 503 with
response flag UF and details
``upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}``
(Envoy 1.40; older builds: ``{connection_failure,delayed_connect_error:_111}``); the inbound cluster's
``upstream_cx_connect_fail`` and ``upstream_rq_pending_failure_eject`` move.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kubectl_meshdoctor.core.detector import Detector, PendingSyns
from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.flows import Flow


def _remediation(port: int) -> str:
    return f"""\
# Make the app listen on port {port} on all addresses (0.0.0.0 / ::, not 127.0.0.1: Istio's sidecar
# connects to the pod IP), and let the pod report ready only when it does:
spec:
  containers:
  - name: <app>
    ports:
    - containerPort: {port}
    readinessProbe:
      tcpSocket:
        port: {port}
      periodSeconds: 5
# If the app restarts (kubectl get pod: RESTARTS), fix the crash or the liveness probe first; if the
# Service targetPort points elsewhere, correct it."""


@dataclass(slots=True)
class _Attempt:
    syn: PacketEvent


DETAILS = "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}"


class UpstreamRefused(Detector):
    id = "upstream-refused"
    envoy_counters = ("upstream_cx_connect_fail", "upstream_rq_pending_failure_eject")
    kernel_counters = ("TcpAttemptFails", "TcpOutRsts")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pending = PendingSyns(ttl_s=30.0)

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface != "lo":
            return ()  # the sidecar -> app leg only exists on the pod's loopback
        if ev.is_syn:
            self._pending.add(PendingSyns.key_of_syn(ev), _Attempt(ev))
            return ()
        key = PendingSyns.key_of_answer(ev)
        attempt = self._pending.get(key)
        if attempt is None:
            return ()
        self._pending.pop(key)
        if not ev.is_rst:
            return ()
        syn = attempt.syn
        return (Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"Nothing listens on {syn.dst_endpoint}: the sidecar's connection to the app was refused",
            flow=FlowRef(syn.src_endpoint, syn.dst_endpoint, syn.iface),
            evidence=(Evidence.of(syn, "SYN from the sidecar"), Evidence.of(ev, "RST: connection refused")),
            envoy_flags=("UF",),
            explanation=(
                f"The sidecar ({syn.src_endpoint}) opened a connection to the app at {syn.dst_endpoint} and the "
                f"pod's kernel answered the SYN with RST after {1000 * (ev.ts - syn.ts):.1f} ms: no socket "
                f"listens there (RFC 9293 section 3.10.7.1). Envoy answers the caller 503 with response flag UF "
                f"and details {DETAILS}, and counts upstream_cx_connect_fail on the inbound cluster. Typical "
                f"causes: the app is restarting, listens on another port, or binds 127.0.0.1 only while the "
                f"sidecar dials the pod IP (Istio >= 1.10; older meshes dialled 127.0.0.1)."),
            remediation=_remediation(syn.dport),
            pod=self.ctx.pod,
            ts=ev.ts,
            response_code_details=DETAILS,
        ),)

    def on_tick(self, now: float) -> Iterable[Finding]:
        self._pending.expire(now)
        return ()
