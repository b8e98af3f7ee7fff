"""``syn-timeout``: a SYN retransmitted with no answer at all.

Linux retransmits an unanswered SYN after 1 s, then 3 s, 7 s, ... (``tcp_syn_retries``); each retransmission is
a stall the caller sees. Envoy logs UF once its connect timeout fires, URX when retries run out. SYNs that share
a client port with a redirected connection belong to ``tuple-collision`` and are left to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..detectors import Detector, PendingSyns
from ..events import PacketEvent
from ..findings import Evidence, Finding, FlowRef, Severity
from ..flows import Flow

ERROR_AFTER_RETRANSMITS = 3

_REMEDIATION = """\
# Find what eats the SYN: a NetworkPolicy or firewall, a full accept queue (TcpExtListenDrops), conntrack
# drops (conntrack -S: insert_failed, drop). Meanwhile bound the stall and retry on another endpoint:
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: <service>
spec:
  host: <service>.<namespace>.svc.cluster.local
  trafficPolicy:
    connectionPool:
      tcp:
        connectTimeout: 1s
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: <service>
spec:
  hosts: [<service>]
  http:
  - route:
    - destination:
        host: <service>
    retries:
      attempts: 3
      retryOn: connect-failure,reset
      perTryTimeout: 2s"""


@dataclass(slots=True)
class _Pending:
    syn: PacketEvent
    retransmits: int = 0
    answered: bool = False
    last: PacketEvent | None = None


class SynTimeout(Detector):
    id = "syn-timeout"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pending = PendingSyns(ttl_s=180.0)  # covers the default tcp_syn_retries backoff (~127 s)

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.is_syn:
            return self._on_syn(ev)
        key = PendingSyns.key_of_answer(ev)
        pending = self._pending.get(key)
        if pending is not None:
            if ev.is_syn_ack:
                self._pending.pop(key)
            else:
                pending.answered = True  # a RST or a challenge ACK: another detector's story
        return ()

    def on_tick(self, now: float) -> Iterable[Finding]:
        self._pending.expire(now)
        return ()

    def _on_syn(self, ev: PacketEvent) -> Iterable[Finding]:
        key = PendingSyns.key_of_syn(ev)
        pending = self._pending.get(key)
        if pending is None or pending.syn.seq != ev.seq:
            if self.ctx.flows.redirect_peers(ev, self.ctx.redirect_map):
                self._pending.pop(key)
                return ()
            self._pending.add(key, _Pending(ev))
            return ()
        if pending.answered:
            pending.answered = False  # the client retries after an answer it rejected; not a silent drop
            return ()
        pending.retransmits += 1
        pending.last = ev
        if pending.retransmits == 1:
            return (self._finding(pending, Severity.WARNING),)
        if pending.retransmits == ERROR_AFTER_RETRANSMITS:
            return (self._finding(pending, Severity.ERROR),)
        return ()

    def _finding(self, pending: _Pending, severity: Severity) -> Finding:
        syn, last = pending.syn, pending.last
        assert last is not None
        n = pending.retransmits
        waited = last.ts - syn.ts
        return Finding(
            detector=self.id,
            severity=severity,
            title=f"SYN to {syn.dst_endpoint} unanswered, retransmitted {n} time{'s' if n > 1 else ''} "
                  f"({waited:.1f} s)",
            flow=FlowRef(syn.src_endpoint, syn.dst_endpoint, syn.iface),
            evidence=(Evidence.of(syn, "SYN"),
                      Evidence.of(last, f"SYN retransmission {n}, {waited:.3f} s after the first, no answer")),
            envoy_flags=("UF", "URX"),
            response_code_details="upstream_reset_before_response_started{connection_timeout}",
            explanation=(
                f"{syn.src_endpoint} sent a SYN to {syn.dst_endpoint} and got no SYN-ACK, RST or ICMP; the kernel "
                f"retransmitted it {n} time{'s' if n > 1 else ''} over {waited:.1f} s (RFC 6298 section 5 backoff). "
                f"Something between drops it, or the listener's accept queue is full. Envoy logs UF when its "
                f"connect timeout fires (URX once retries are spent); callers see slow or failed requests."),
            remediation=_REMEDIATION,
            pod=self.ctx.pod,
            ts=last.ts,
            details={"retransmits": n, "waited_s": round(waited, 6)},
        )
