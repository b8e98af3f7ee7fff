"""``tuple-collision``: two connections that Istio's REDIRECT folds onto one four-tuple.

Istio's nat rules REDIRECT every captured inbound port to the listener on 15006, so a client ip:port connected to
pod port P and now sending a SYN to pod port Q reaches the kernel as a second connection on the same
(pod ip, 15006, client ip, client port) four-tuple. The established socket answers the SYN with a challenge ACK
(RFC 5961 section 4; RFC 9293 section 3.10.7.4). The client's kernel answers it with an RST that is in window
for the live connection, so the pod resets that connection, and retransmits its SYN within milliseconds, which
then succeeds: the live connection is the casualty (its next request meets an RST: UC in a calling sidecar).
Or the SYN is silently dropped (a conntrack clash) and retransmitted after a second or more (UF, URX once
retries run out). Seen on the pod's ``eth0``, before the nat rules rewrite the port.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kubectl_meshdoctor.core.detector import Detector, PendingSyns
from kubectl_meshdoctor.core.events import PacketEvent, endpoint
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.remedies import exclude_inbound_ports, tproxy_interception


@dataclass(slots=True)
class _PendingSyn:
    syn: PacketEvent
    peers: list[tuple[str, int, str, float, str]]  # (peer server endpoint, first frame, source, first ts, state)
    reported: bool = False
    retransmits: list[PacketEvent] = field(default_factory=list)
    challenge: PacketEvent | None = None  # the challenge ACK, its finding waiting for the client's RST


# How long after a challenge ACK the client's RST is waited for (packet time): the client's kernel answers at
# once (microseconds in the lab); a capture that lost it, or started after it, must not hold the finding longer.
RST_WAIT_S = 1.0


def fixes(port: int) -> tuple[Fix, ...]:
    """The fixes of a collision on pod port ``port``, the mesh kept first: TPROXY, the port out of capture,
    the client's own change."""
    return (
        tproxy_interception(),
        exclude_inbound_ports(str(port), str(port)),
        Fix("client-port", "let the client's kernel choose its source port",
            "the whole mesh; only the client changes",
            "a change in the client (it reuses one source port for two destinations: a fixed bind() or an "
            "SO_REUSEADDR port pool)",
            yaml="# in the client: connect() without bind(), or bind to port 0, so that each connection gets an "
                 "ephemeral\n# port of its own (net.ipv4.ip_local_port_range)"),
    )


class TupleCollision(Detector):
    id = "tuple-collision"
    # The kernel counts the challenge ACK it sends (RFC 5961 section 4) and conntrack the insert it refuses.
    kernel_counters = ("TcpExtTCPChallengeACK", "ConntrackInsertFailed", "ConntrackDrop")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pending = PendingSyns(ttl_s=60.0)

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface == "lo":
            # Inbound REDIRECT happens in PREROUTING, for packets that arrive from outside; on lo the sidecar's
            # upstream connections (from 127.0.0.6) are RETURNed, so one source port to two app ports is normal.
            return ()
        if ev.is_syn:
            return self._on_syn(ev, flow)
        if ev.is_rst:
            mine = self._pending.get(PendingSyns.key_of_syn(ev))
            if mine is not None and mine.challenge is not None and ev.seq == mine.challenge.ack:
                # The client's RST carrying the sequence number the challenge ACK handed it (RFC 5961 section 4):
                # in window for the live connection, which the pod resets.
                found, mine.challenge = self._challenge_ack(mine, mine.challenge, ev), None
                return (found,)  # the attempt stays, reported: its retransmitted SYN is no new collision
        key = PendingSyns.key_of_answer(ev)
        pending = self._pending.get(key)
        if pending is None:
            return ()
        if ev.is_rst or ev.is_syn_ack:
            self._pending.pop(key)
            if pending.challenge is not None:  # the attempt ended before the client's RST was seen
                return (self._challenge_ack(pending, pending.challenge),)
            if ev.is_syn_ack and pending.peers and not pending.reported:
                return (self._exposure(pending, ev),)
            return ()
        if pending.reported or ev.flags == 0:
            return ()
        # An ACK without SYN answering a SYN: an established socket owns the four-tuple (challenge ACK).
        if ev.ack == (pending.syn.seq + 1) % 2**32:
            return ()
        if not pending.peers and (flow.reused_closed or self.ctx.redirect_map.listener_for(ev.sport) is None):
            # TIME_WAIT reuse or an uncaptured port: not Istio's REDIRECT folding two connections together.
            return ()
        pending.reported = True
        pending.challenge = ev
        return ()

    def on_tick(self, now: float) -> Iterable[Finding]:
        found = []
        for p in self._pending.values():
            if p.challenge is not None and now - p.challenge.ts > RST_WAIT_S:
                found.append(self._challenge_ack(p, p.challenge))
                p.challenge = None
        self._pending.expire(now)
        return found

    def finish(self) -> Iterable[Finding]:
        return [self._challenge_ack(p, p.challenge) for p in self._pending.values() if p.challenge is not None]

    def backed_by_counters(self, f: Finding) -> bool:
        return bool(f.envoy_flags)  # the exposure (the SYN succeeded) carries no flag: no failure to back

    def _on_syn(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        key = PendingSyns.key_of_syn(ev)
        pending = self._pending.get(key)
        if pending is not None and pending.syn.seq == ev.seq:
            pending.retransmits.append(ev)
            if pending.peers and not pending.reported:
                pending.reported = True
                return (self._dropped(pending, ev),)
            return ()
        peers = [
            (endpoint(*f.server), f.first_frame, f.source, f.first_ts, f.state.value)
            for f in self.ctx.flows.redirect_peers(ev, self.ctx.redirect_map)
        ]
        self._pending.add(key, _PendingSyn(ev, peers))
        return ()

    def _evidence(self, pending: _PendingSyn, answer: PacketEvent, what: str) -> list[Evidence]:
        """The SYN, the packet that decided (``what`` it was), and the first frame of each colliding connection."""
        syn = pending.syn
        out = [Evidence.of(syn, "SYN"), Evidence.of(answer, what)]
        for server, frame, source, first_ts, state in pending.peers:
            if frame:
                out.append(Evidence(source or syn.source, syn.iface, frame, first_ts,
                                    f"first packet of the live connection {syn.src_endpoint} -> {server} ({state})"))
        return out

    def _finding(self, pending: _PendingSyn, severity: Severity, title: str, evidence: list[Evidence],
                 flags: tuple[str, ...], explanation: str, ts: float,
                 details: str = "upstream_reset_before_response_started{remote_connection_failure}",
                 variant: str = "") -> Finding:
        syn = pending.syn
        return Finding(
            detector=self.id,
            severity=severity,
            title=title,
            flow=FlowRef(syn.src_endpoint, syn.dst_endpoint, syn.iface),
            evidence=tuple(evidence),
            envoy_flags=flags,
            response_code_details=details,
            explanation=explanation,
            fixes=fixes(syn.dport),
            pod=self.ctx.pod,
            ts=ts,
            details={"peers": [p[0] for p in pending.peers]},
            variant=variant,
        )

    def _peer_text(self, pending: _PendingSyn) -> str:
        if not pending.peers:
            return "a connection from the same client port that started before the capture"
        return "its live connection to " + ", ".join(p[0] for p in pending.peers)

    def _challenge_ack(self, pending: _PendingSyn, ack: PacketEvent, rst: PacketEvent | None = None) -> Finding:
        syn = pending.syn
        listener = self.ctx.redirect_map.listener_for(syn.dport)
        evidence = self._evidence(pending, ack, f"challenge ACK (ack {ack.ack}, not SYN seq+1 "
                                                f"{(syn.seq + 1) % 2**32})")
        if rst is not None:  # shown after the challenge ACK it answers, before the live connection's first frame
            evidence.insert(2, Evidence.of(rst, f"client's RST, seq {rst.seq} (the challenge ACK's ack): in window "
                                                f"for the live connection, which the pod resets"))
        return self._finding(
            pending, Severity.ERROR,
            f"SYN to {syn.dst_endpoint} collided with a live connection from the same client port",
            evidence, ("UC", "UF", "URX"),
            f"Istio REDIRECTs inbound ports to {listener}, so {syn.src_endpoint}'s SYN to {syn.dst_endpoint} and "
            f"{self._peer_text(pending)} are the same four-tuple ({syn.dst}:{listener}, {syn.src_endpoint}) inside "
            f"the pod. The pod's kernel found the established socket and answered the SYN with a challenge ACK "
            f"(RFC 5961 section 4) instead of a SYN-ACK. The client's kernel answers that ACK with an RST whose "
            f"sequence number the challenge ACK handed it, which is in window for the live connection, so the pod "
            f"resets the live connection; the client then retransmits its SYN within milliseconds and the new "
            f"connection succeeds. The live connection is what breaks: the client's next request on it is answered "
            f"with RST, which a calling sidecar logs as 503 UC (its pooled connection reset). When the SYN keeps "
            f"meeting a live socket, or is dropped, the caller's connect fails: UF, URX once retries run out.",
            ack.ts, "upstream_reset_before_response_started{connection_termination}",
            f"challenge ACK to a SYN for {syn.dst_endpoint}",
        )

    def _dropped(self, pending: _PendingSyn, retrans: PacketEvent) -> Finding:
        syn = pending.syn
        evidence = self._evidence(pending, retrans, f"SYN retransmitted after {retrans.ts - syn.ts:.3f} s, "
                                                    f"no answer")
        return self._finding(
            pending, Severity.ERROR,
            f"SYN to {syn.dst_endpoint} dropped while the same client port holds a redirected connection",
            evidence, ("UF", "URX"),
            f"{syn.src_endpoint} holds {self._peer_text(pending)}; Istio REDIRECTs both ports to the same listener, "
            f"so the new SYN maps onto an existing four-tuple (conntrack clash) and is dropped; the client "
            f"retransmits. Envoy on the calling side logs UF/URX; callers see connect stalls of 1 s and more.",
            retrans.ts, "upstream_reset_before_response_started{connection_timeout}",
            f"SYN for {syn.dst_endpoint} dropped",
        )

    def _exposure(self, pending: _PendingSyn, synack: PacketEvent) -> Finding:
        syn = pending.syn
        evidence = self._evidence(pending, synack, "SYN-ACK")
        return self._finding(
            pending, Severity.WARNING,
            f"Client port {syn.src_endpoint} reused for two redirected ports of {syn.dst} at once",
            evidence, (),
            f"{syn.src_endpoint} connected to {syn.dst_endpoint} while holding {self._peer_text(pending)}. Both "
            f"REDIRECT to the same listener, so they share one four-tuple inside the pod. This time the kernel's "
            f"NAT remapped the port and the SYN succeeded; when conntrack loses the first entry the next one gets a "
            f"challenge ACK (RFC 5961 section 4), the client's RST kills the live connection, and a calling sidecar "
            f"logs UC for its next request on it (UF/URX when the connect itself fails).",
            synack.ts, details="", variant=f"client port shared by two ports of {syn.dst} (no failure yet)",
        )
