"""``upstream-refused``: the sidecar's connection to the app is refused.

Envoy's inbound listener connects to the app from 127.0.0.6 over ``lo``. When nothing listens on the app port
(the app restarts, listens on another port, or binds 127.0.0.1 only while Envoy dials the pod IP), the kernel
answers the SYN with RST (RFC 9293 section 3.10.7.1: no socket, send a reset). Envoy answers the caller 503 with
response flag UF and details
``upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}``
(Envoy 1.40; older builds: ``{connection_failure,delayed_connect_error:_111}``); the inbound cluster's
``upstream_cx_connect_fail`` and ``upstream_rq_pending_failure_eject`` move.

When the pod's listening sockets are known (``watch`` reads /proc/net/tcp when it starts: a ListenersEvent),
the finding says which cause fits: a socket on 127.0.0.1 only (or ::1) but none on every address or the pod
IP is an app bound to localhost; no socket on the port at all is an app not listening: restarting when the
pod's status counts restarts of its app containers (a PodEvent), else down or listening on another port.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kubectl_meshdoctor.core.detector import Detector, PendingSyns
from kubectl_meshdoctor.core.events import ContextEvent, ListenersEvent, PacketEvent, PodEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.remedies import sidecar_ingress


def _listen_fix(port: int) -> Fix:
    return Fix(
        "app-listens", f"make the app listen on port {port} on every address, and report ready only when it does",
        "the whole mesh; the app is fixed where it fails",
        "a change to the app or its Deployment; if it restarts (kubectl get pod: RESTARTS), the crash or the "
        "liveness probe comes first, and a Service targetPort that points elsewhere must be corrected",
        yaml=f"""\
spec:
  containers:
  - name: <app>
    ports:
    - containerPort: {port}
    readinessProbe:
      tcpSocket:
        port: {port}
      periodSeconds: 5""")


def _bind_all_fix(port: int) -> Fix:
    return Fix(
        "bind-all", f"make the app listen on every address (0.0.0.0 / ::), not 127.0.0.1 only, on {port}",
        "the whole mesh, unchanged: Istio >= 1.10's sidecar connects to the pod IP, as for every other app",
        "a change to the app's listen address (e.g. --bind 0.0.0.0, server.address=0.0.0.0); the port then also "
        "answers on the pod IP, which inbound capture already sends through the sidecar",
        yaml=f"# in the app's configuration: listen on 0.0.0.0:{port} (or [::]:{port}), not 127.0.0.1:{port}")


def _sidecar_localhost_fix(port: int) -> Fix:
    return Fix(
        "sidecar-localhost", f"let this workload's sidecar dial the app on 127.0.0.1:{port} (Istio < 1.10's way)",
        "the app unchanged, and the mesh on the port: the sidecar still terminates it",
        "a Sidecar per workload, which replaces the inbound listeners Istio derives from its Services (list every "
        "port it serves); an app on 127.0.0.1 is still unreachable to anything that bypasses the sidecar",
        yaml="# list every port the workload serves, each with its own defaultEndpoint 127.0.0.1:PORT\n"
             + sidecar_ingress(port, "HTTP", f"127.0.0.1:{port}"))


def fixes(port: int, cause: str) -> tuple[Fix, ...]:
    """The fixes of a refusal on app port ``port`` for ``cause`` (see _cause): an app bound to localhost gets
    the bind fixes, one not listening the listen fix, an unknown cause (a capture alone) all of them."""
    if cause == "bound-to-localhost":
        return _bind_all_fix(port), _sidecar_localhost_fix(port)
    if cause == "unknown":
        return _listen_fix(port), _bind_all_fix(port), _sidecar_localhost_fix(port)
    return (_listen_fix(port),)


@dataclass(slots=True)
class _Attempt:
    syn: PacketEvent


LOOPBACK = ("127.0.0.1", "::1")
EVERY_ADDRESS = ("0.0.0.0", "::")

def _cause(listening: frozenset[tuple[str, int]] | None, ip: str, port: int, restarts: int) -> str:
    """Which cause of a refusal the pod's listening sockets and restarts point at: "unknown" without them."""
    if listening is None:
        return "restarting" if restarts else "unknown"
    on_port = {addr for addr, p in listening if p == port}
    if on_port & {ip, *EVERY_ADDRESS}:
        return "restarting" if restarts else "listening-now"  # it listens now: it was down at that moment
    if on_port & set(LOOPBACK):
        return "bound-to-localhost"
    return "restarting" if restarts else "not-listening"


_CAUSE_TEXT = {
    "bound-to-localhost": "The pod's kernel shows the app listening on {port} on 127.0.0.1 only: it refuses "
                          "connections to the pod IP, which is where Istio >= 1.10's sidecar connects.",
    "not-listening": "The pod's kernel shows no socket listening on port {port} at all: the app is down or "
                     "restarting (kubectl get pod: RESTARTS; lint's restart-loop), or listens on another port "
                     "than the Service's targetPort.",
    "restarting": "The pod's app containers have restarted {restarts} time(s) (kubectl get pod: RESTARTS): while "
                  "the app is down, nothing listens and every connection is refused. Find why it restarts "
                  "(kubectl logs --previous; lint's restart-loop names a failing probe).",
    "listening-now": "A socket listens on port {port} now, so the app was not listening at that moment: it "
                     "restarts, or came up after the sidecar started sending it traffic (lint's "
                     "hold-application).",
    "unknown": "Typical causes: the app is restarting, listens on another port, or binds 127.0.0.1 only while "
               "the sidecar dials the pod IP (Istio >= 1.10; older meshes dialled 127.0.0.1).",
}


DETAILS = "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}"


class UpstreamRefused(Detector):
    id = "upstream-refused"
    envoy_counters = ("upstream_cx_connect_fail", "upstream_rq_pending_failure_eject")
    kernel_counters = ("TcpAttemptFails", "TcpOutRsts")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pending = PendingSyns(ttl_s=30.0)
        self._listening: frozenset[tuple[str, int]] | None = None
        self._restarts = 0

    def on_context(self, ev: ContextEvent) -> Iterable[Finding]:
        if isinstance(ev, ListenersEvent):
            self._listening = ev.listening
        elif isinstance(ev, PodEvent):
            self._restarts = ev.restarts
        return ()

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
        cause = _cause(self._listening, syn.dst, syn.dport, self._restarts)
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
                f"and details {DETAILS}, and counts upstream_cx_connect_fail on the inbound cluster. "
                + _CAUSE_TEXT[cause].format(port=syn.dport, restarts=self._restarts)),
            fixes=fixes(syn.dport, cause),
            pod=self.ctx.pod,
            ts=ev.ts,
            response_code_details=DETAILS,
            details={"cause": cause, "restarts": self._restarts},
            variant=f"connection refused ({cause})",
        ),)

    def on_tick(self, now: float) -> Iterable[Finding]:
        self._pending.expire(now)
        return ()
