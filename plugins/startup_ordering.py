"""``startup-ordering``: the app calls out before its own sidecar listens.

istio-init's nat rules (ISTIO_OUTPUT -> ISTIO_REDIRECT, ``REDIRECT --to-ports 15001``; istio/istio
tools/istio-iptables) send every outbound TCP connection of the app to the sidecar's ``virtualOutbound`` listener
on 15001 from the moment the pod's network exists. Until Envoy listens there, the kernel answers each SYN with
RST (RFC 9293 section 3.10.7.1: no socket) and the app's connect() fails with ECONNREFUSED. Envoy, not running
or not yet listening, logs nothing and counts nothing: the only witnesses are the pod's loopback and its kernel.

What the real kernel shows (measured in the lab's pod namespace with istio-init's rules and nothing on 15001;
tests/data/README.md, ``lab-startup-*``):

- on ``lo``, the SYN as nat OUTPUT rewrote it: ``POD_IP:PORT > 127.0.0.1:15001`` (tcpdump's capture point on lo
  is after nat OUTPUT), then within microseconds ``R.`` (seq 0, ack = the SYN's seq + 1) from the connection's
  *original* destination to the app: ``DEST:DPORT > POD_IP:PORT``. The kernel's reset travels the reply direction
  of the REDIRECTed connection, so conntrack's reverse NAT (nat POSTROUTING, the reply of a DNAT) rewrites its
  source back: the SYN and its answer carry different address pairs, and the answer names what the app dialled.
- on ``eth0``, nothing: the connection never left the pod.
- the pod namespace's ``TcpAttemptFails`` and ``TcpOutRsts`` each count one per refused connect.

A SYN a sidecar answers on 127.0.0.1:15001 is not this class, nor an RST from 127.0.0.1:15001 itself (no
REDIRECT: something dialled 15001 directly). ``upstream-refused`` (the sidecar's connect to the app refused)
waits for an answer from the SYN's own destination, so the two never claim the same packets.

The fixes order the pod's start: holdApplicationUntilProxyStarts (the injector's postStart ``pilot-agent wait``
blocks the kubelet from starting the app containers until Envoy is ready) or a native sidecar (an init container
with restartPolicy Always, started and probed before the app; KEP-753). The same packets come from an app that
outlives a sidecar restart: the capture tells it when the sidecar accepted the app's connections earlier in the
run, and the pod's status (PodEvent: istio-proxy's restarts, the spec's hold) when it was read; neither gets the
start-order fixes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kubectl_meshdoctor.core.detector import Detector, PendingSyns
from kubectl_meshdoctor.core.events import ContextEvent, PacketEvent, PodEvent, endpoint
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix, render
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.hop_path import OUTBOUND_CAPTURE_PORT
from kubectl_meshdoctor.core.pod_history import iso, last_exit_words, sidecar_runs_evidence
from kubectl_meshdoctor.core.remedies import SIDECAR_CONTAINER, hold_application, native_sidecar

# REDIRECT of a locally generated packet rewrites its destination to the loopback address (netfilter's
# nf_nat_redirect: 127.0.0.1, ::1 for ip6tables)
REDIRECT_TARGETS = ("127.0.0.1", "::1")
FIXES: tuple[Fix, ...] = (hold_application(), native_sidecar())


@dataclass(slots=True)
class _Call:
    syn: PacketEvent


def _cause(pod: PodEvent | None, ts: float, served_at: float | None) -> str:
    """Which start the refusal belongs to: "sidecar-stopped" (the sidecar accepted the app's connections earlier
    in the capture, at ``served_at``), "sidecar-restarted" (istio-proxy restarted and its current run began
    after ``ts``, or at all when it is not known when), "not-held" (the spec lets the app start first), "held"
    (the spec holds the app: the sidecar was down later in the pod's life), "unknown" (no pod status)."""
    if served_at is not None and served_at < ts:
        return "sidecar-stopped"
    if pod is None or pod.hold is None:
        return "sidecar-restarted" if pod is not None and pod.sidecar_restarts else "unknown"
    if pod.sidecar_restarts and (pod.sidecar_started is None or pod.sidecar_started >= ts - 1.0):
        return "sidecar-restarted"
    return "held" if pod.hold else "not-held"


_CAUSE_TEXT = {
    "not-held": "The pod's spec lets the app start before its sidecar is ready (lint's hold-application: "
                "istio-proxy is not first with a postStart `pilot-agent wait`, nor a native sidecar), so the "
                "kubelet starts the containers without waiting and the app's first calls race Envoy's start.",
    "held": "The pod's spec holds the app until the proxy is ready ({hold}), so this was not the pod's start: "
            "the sidecar stopped listening while the app ran (restarted, or killed).",
    "sidecar-restarted": "The istio-proxy container has restarted {restarts} time(s): while it was down the "
                         "app's calls were refused. Read why (kubectl logs -c istio-proxy --previous).",
    "sidecar-stopped": "Earlier in this capture the sidecar accepted the app's connections on 15001 (the last "
                       "{served} s before this one): it stopped listening since, so this is not the pod's start but "
                       "istio-proxy going down while the app ran (a crash, an OOM kill, a restart: kubectl get pod "
                       "counts its RESTARTS; kubectl logs -c istio-proxy --previous says why). "
                       "holdApplicationUntilProxyStarts and a native sidecar order only the start.",
    "unknown": "Typical cause: the app starts (or runs) before its sidecar listens: a classic sidecar without "
               "holdApplicationUntilProxyStarts, or a sidecar restart.",
}


class StartupOrdering(Detector):
    id = "startup-ordering"
    packet_ifaces = frozenset({"lo"})
    packet_kinds = frozenset({"syn", "rst"})  # a SYN-ACK or RST answers a REDIRECTed SYN
    unseen_without = {"lo": "the app starting before its sidecar"}
    unseen_rank = 20
    pod_runs = True
    kernel_counters = ("TcpAttemptFails", "TcpOutRsts")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pending = PendingSyns(ttl_s=30.0)
        self._pod: PodEvent | None = None
        self._served_at: float | None = None  # the last REDIRECTed SYN the sidecar answered: it listened then

    def on_context(self, ev: ContextEvent) -> Iterable[Finding]:
        if isinstance(ev, PodEvent):
            self._pod = ev
        return ()

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface != "lo":
            return ()  # a REDIRECTed connection to 15001 never leaves the pod's loopback
        if ev.is_syn:
            if ev.dport == OUTBOUND_CAPTURE_PORT and ev.dst in REDIRECT_TARGETS:
                self._pending.add(self._key(ev.iface, ev.src, ev.sport), _Call(ev))
            return ()
        key = self._key(ev.iface, ev.dst, ev.dport)
        call = self._pending.get(key)
        if call is None:
            return ()
        syn = call.syn
        if ev.is_syn_ack:
            self._served_at = ev.ts
            self._pending.pop(key)  # the sidecar listens (its answer too shows the original destination)
            return ()
        if not ev.is_rst or ev.ack != (syn.seq + 1) % 2**32:
            return ()
        self._pending.pop(key)
        if (ev.src, ev.sport) == (syn.dst, syn.dport):
            return ()  # 127.0.0.1:15001 dialled directly, not REDIRECTed: no original destination to tell
        return (self._finding(syn, ev),)

    @staticmethod
    def _key(iface: str, ip: str, port: int) -> tuple:
        # The answer does not come from the SYN's destination (conntrack's reverse NAT): key by the app's end only.
        return (iface, ip, port)

    def _finding(self, syn: PacketEvent, rst: PacketEvent) -> Finding:
        dest = endpoint(rst.src, rst.sport)
        cause = _cause(self._pod, syn.ts, self._served_at)
        pod = self._pod
        evidence = [Evidence.of(syn, f"SYN from the app to {dest}, REDIRECTed to {syn.dst_endpoint}"),
                    Evidence.of(rst, f"RST from {dest} (conntrack's reverse NAT): nothing listens on "
                                     f"{syn.dst_endpoint}")]
        started = ""
        where = f"pod/{pod.name}" if pod is not None else "pod"
        if pod is not None and pod.hold is not None:
            evidence.append(Evidence.spec_field(
                where, "app held until istio-proxy is ready (lint's hold-application)",
                pod.hold or "no: a classic sidecar without postStart pilot-agent wait"))
        if pod is not None and pod.sidecar_started is not None:
            evidence.append(Evidence.spec_field(
                where, f"status.{'initContainerStatuses' if pod.hold == 'native sidecar' else 'containerStatuses'}"
                       f"[{SIDECAR_CONTAINER}].state.running.startedAt",
                iso(pod.sidecar_started)))
            gap = syn.ts - pod.sidecar_started
            started = (f" When the pod was read, istio-proxy's current run had started {abs(gap):.0f} s "
                       f"{'before' if gap >= 0 else 'after'} this SYN (status startedAt, to the second)")
            if pod.app_started is not None:
                lag = pod.sidecar_started - pod.app_started
                started += f", {abs(lag):.0f} s {'after' if lag >= 0 else 'before'} the app's first container"
            started += "."
        evidence += sidecar_runs_evidence(pod, syn.ts)
        if cause != "not-held":
            started += last_exit_words(pod)
        at_start = cause in ("not-held", "unknown")
        fixes = FIXES if at_start else ()
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"The app's connection to {dest} was refused in its own pod: the sidecar was not listening on "
                  f"{OUTBOUND_CAPTURE_PORT} {'yet' if at_start else 'any more'}",
            flow=FlowRef(syn.src_endpoint, dest, syn.iface),
            evidence=tuple(evidence),
            explanation=(
                f"The app ({syn.src_endpoint}) dialled {dest}; istio-init's nat rules REDIRECTed the SYN to its "
                f"sidecar at {syn.dst_endpoint}, where nothing listened, so the pod's kernel answered RST after "
                f"{1e6 * (rst.ts - syn.ts):.0f} us (RFC 9293 section 3.10.7.1) and the app's connect failed "
                f"with ECONNREFUSED. The RST carries {dest}, the original destination, because conntrack "
                f"reverses the REDIRECT on the reply. Nothing left the pod and Envoy, not listening, logged and "
                f"counted nothing; the pod's TcpAttemptFails and TcpOutRsts count it. "
                + _CAUSE_TEXT[cause].format(hold=pod.hold if pod else "", restarts=pod.sidecar_restarts if pod else 0,
                                            served=f"{syn.ts - (self._served_at or syn.ts):.1f}")
                + started),
            remediation=render(fixes) if fixes else (
                ("# The spec already starts the app after the sidecar; " if cause == "held" else "# ")
                + f"find why {SIDECAR_CONTAINER} stopped listening while the app ran:\n"
                f"kubectl logs {pod.name if pod else '<pod>'} -c {SIDECAR_CONTAINER} --previous"),
            fixes=fixes,
            pod=self.ctx.pod,
            ts=rst.ts,
            details={"cause": cause, "original_destination": dest, "redirected_to": syn.dst_endpoint},
            variant=(f"refused while the sidecar was down ({cause})" if cause in ("sidecar-stopped", "held",
                                                                                "sidecar-restarted")
                     else f"refused before the sidecar listened ({cause})"),
        )

    def on_tick(self, now: float) -> Iterable[Finding]:
        self._pending.expire(now)
        return ()
