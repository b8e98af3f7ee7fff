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

Without a capture, Envoy's logs name it: a 503 UF line whose details or transport failure reason carry the
connect errno ECONNREFUSED (``delayed_connect_error:_Connection_refused``, older ``..._111``), and, in the
debug log, ``connecting to IP:PORT`` then ``delayed connect error: Connection refused`` (older ``delayed
connection error: 111``) on the upstream connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings, flag_signal
from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector, PendingSyns
from kubectl_meshdoctor.core.events import ContextEvent, EnvoyCountersEvent, ListenersEvent, PacketEvent, PodEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix, render
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.remedies import sidecar_ingress
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import parse_reset_details, transport_errno
from kubectl_meshdoctor.envoy.stats import scoped
from kubectl_meshdoctor.envoy.story import StreamStory

ECONNREFUSED = 111


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


# A variant names its cause; "unknown" says what was missing, in the headline itself: the pod's listening sockets
# and restarts, which a live watch reads and a capture alone does not hold.
_LABEL = {"unknown": "cause unknown without the pod's listening sockets and restarts, which watch reads"}
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


def refused_errno(entry: AccessLogEntry, story: StreamStory | None = None) -> bool:
    """Whether Envoy's line (or the debug log's story) says the upstream connect was refused (ECONNREFUSED)."""
    if story is not None and story.errno == ECONNREFUSED:
        return True
    if "UF" not in entry.flags:
        return False
    reset = parse_reset_details(entry.details)
    return ECONNREFUSED in ((reset.errno if reset else None), transport_errno(entry.upstream_failure))


class UpstreamRefused(Detector):
    id = "upstream-refused"
    packet_ifaces = frozenset({"lo"})
    unseen_without = {"lo": "the app refusing the sidecar"}
    unseen_rank = 10
    envoy_counters = ("upstream_cx_connect_fail", "upstream_rq_pending_failure_eject")
    kernel_counters = ("TcpAttemptFails", "TcpOutRsts")
    envoy_loggers = ("connection", "pool", "router")

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        # upstream_cx_connect_fail counts every failed connect: the timeouts (syn-timeout's) and the TLS
        # handshakes (tls-mismatch's) are counted apart too; what is left was refused or unreachable.
        other = [scoped(counters.stats, "cluster", s) for s in ("upstream_cx_connect_timeout", "ssl.connection_error")]
        found = counter_findings(
            self.id, counters, (CounterSignal("cluster", "upstream_cx_connect_fail", "failed connects"),
                                flag_signal("UF", "requests whose upstream connect failed: 503 UF")),
            what="Upstream connects refused or unreachable (503 UF)",
            explanation=("Envoy could not connect to the upstream: refused (nothing listens: the app is down, "
                         "restarting, bound to 127.0.0.1, or listens on another port), unreachable, or with no "
                         "local port left (EADDRNOTAVAIL). Envoy answers 503 UF (URX when retries are spent). The "
                         "access log's details or the connection logger at debug name the errno."),
            envoy_flags=("UF",), pod=self.ctx.pod)
        out = []
        for f in found:
            fails = f.counters.get(f"cluster.{f.flow.server}.upstream_cx_connect_fail")
            if fails is not None and fails <= sum(o.get(f.flow.server, 0) for o in other):
                continue
            port = f.flow.server.split("|")[1] if f.flow.server.count("|") >= 3 else ""
            fx = fixes(int(port), "unknown") if port.isdigit() and f.flow.server.startswith("inbound|") else ()
            out.append(replace(f, fixes=fx, remediation=render(fx)) if fx else f)
        return out

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        return self._from_logs(entry, None, evidence) if refused_errno(entry) else None

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        return self._from_logs(said, story, evidence) if refused_errno(said, story) else None

    def _from_logs(self, entry: AccessLogEntry, story: StreamStory | None, evidence: Evidence) -> Finding:
        flow = access_log_flow(entry)
        outbound = (entry.upstream_cluster or "").startswith("outbound|")
        ip, _, port_text = flow.server.rpartition(":")
        port = int(port_text) if port_text.isdigit() else 0
        cause = _cause(self._listening, ip.strip("[]"), port, self._restarts) if not outbound else "unknown"
        request = f"{entry.method} {entry.path}" if entry.method else "a connection"
        who = ("the endpoint (the upstream pod's sidecar, or its app when it has none)" if outbound
               else "the app")
        said = ("Envoy's debug log shows the connect to it refused (delayed connect error: Connection refused)"
                if story is not None else
                f"Envoy's access log says the connect was refused ({entry.details or entry.upstream_failure})")
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"Nothing listens on {flow.server}: the sidecar's connection to {who.split(' (')[0]} was refused "
                  f"({entry.code} {','.join(entry.flags)})",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=tuple(f for f in ("UF", "URX") if f in entry.flags) or ("UF",),
            explanation=(
                f"The sidecar could not connect to {who} at {flow.server} for {request}: {said}. The kernel there "
                f"answered the SYN with RST (RFC 9293 section 3.10.7.1: no socket listens). Envoy answered "
                f"{entry.code or 503} with response flag UF and counted upstream_cx_connect_fail. "
                + (("From the caller's side this is an endpoint that is gone or not ready: a pod terminating "
                    "(its sidecar drained first), or one whose sidecar is not up yet; the caller's retries "
                    "(URX when spent) hide some of them.") if outbound else
                   _CAUSE_TEXT[cause].format(port=port, restarts=self._restarts))),
            fixes=fixes(port, cause) if not outbound else (),
            remediation="" if not outbound else (
                "# On the upstream pod: keep its sidecar until the app has drained (terminationDrainDuration,\n"
                "# EXIT_ON_ZERO_ACTIVE_CONNECTIONS), and its app ready only once it listens (readinessProbe)."),
            pod=self.ctx.pod,
            ts=entry.ts,
            response_code_details=entry.details or "",
            details={"cause": cause, "restarts": self._restarts,
                     "from": "envoy-log" if story is not None else "access-log"},
            variant=f"connection refused ({_LABEL.get(cause, cause)})",
        )

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
            variant=f"connection refused ({_LABEL.get(cause, cause)})",
        ),)

    def on_tick(self, now: float) -> Iterable[Finding]:
        self._pending.expire(now)
        return ()
