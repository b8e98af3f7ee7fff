"""``tuple-collision``: two connections that Istio's REDIRECT folds onto one four-tuple.

Istio's nat rules REDIRECT every captured inbound port to the listener on 15006, so a client ip:port connected to
pod port P and now sending a SYN to pod port Q reaches the kernel as a second connection on the same
(pod ip, 15006, client ip, client port) four-tuple. The established socket answers the SYN with a challenge ACK
(RFC 5961 section 4; RFC 9293 section 3.10.7.4). The client's kernel answers it with an RST that is in window
for the live connection, so the pod resets that connection, and retransmits its SYN within milliseconds, which
then succeeds: the live connection is the casualty (its next request meets an RST: UC in a calling sidecar).
Or the SYN is silently dropped (a conntrack clash) and retransmitted after a second or more (UF, URX once
retries run out). Seen on the pod's ``eth0``, before the nat rules rewrite the port.

The outbound variant (OUTBOUND_VARIANT), on ``lo``: ISTIO_REDIRECT sends every outbound connection of the app to
127.0.0.1:15001, so the four-tuple inside the pod is (app ip:port, 127.0.0.1:15001) whatever the destination.
When the sidecar closed such a connection first, its orphaned socket waits in FIN-WAIT-2 (``tcp_fin_timeout``,
60 s by default); if conntrack forgot the connection meanwhile, the app's own FIN leaves un-NATed and never
reaches it. A new connect from the same app port then meets that socket: it answers the SYN with an ACK carrying
the old connection's numbers (tcp_minisocks.c tcp_timewait_state_process, a SYN out of window in FIN-WAIT-2).
The app's kernel answers with an RST whose sequence number is that ACK's ack; where it gets through the stale
socket dies and the SYN, resent at once, succeeds (seen in the lab on 6.18: ~15 ms lost); where the RST is
dropped (a conntrack INVALID drop), every resent SYN meets the same ACK until connect() times out. The SYN never
reaches Envoy: no sidecar logs anything. A TIME-WAIT socket of a sidecar that is down answers the same way (tcp_v4_rcv:
a SYN that TCP_TW_SYN would hand to a listener, with none, gets the ACK); the app's RST frees it and the resent SYN
is refused. That is no collision: the refusal is the failure, named by the refusal's detectors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kubectl_meshdoctor.core.detector import Detector, PendingSyns
from kubectl_meshdoctor.core.events import PacketEvent, TcpFlags, endpoint
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


OUTBOUND_VARIANT = "outbound SYN met the caller sidecar's half-closed :15001 socket"
# Seconds: a SYN resent later than this after the first met the stale socket after the client's RST: the
# RST did not free the four-tuple (dropped on its way), and the connect stalls until it times out.
STALLED_AFTER_S = 0.5


def outbound_fixes() -> tuple[Fix, ...]:
    """The fixes of the outbound collision: the app stops reusing its source port."""
    return (
        Fix("client-port", "let the app's kernel choose each connection's source port",
            "the whole mesh; only the app changes",
            "a change in the app (it binds a fixed source port, or an SO_REUSEADDR port pool, for its connects)",
            yaml="# in the app: connect() without bind(), so that the kernel picks each connection's ephemeral "
                 "port\n# (net.ipv4.ip_local_port_range). Linux moves on by a few even ports per connect to the "
                 "same\n# destination (RFC 6056 section 3.3.4, __inet_hash_connect), so a port comes back to it "
                 "only\n# after the range has turned, thousands of connects later: past the 60 s "
                 "(net.ipv4.tcp_fin_timeout)\n# the sidecar's half-closed socket on 127.0.0.1:15001 lives, "
                 "unless the app opens more than\n# about 50 connections a second to that destination"),
    )


@dataclass(slots=True)
class _Outbound:
    """An app's SYN to the outbound listener on lo, and what answered it."""

    syn: PacketEvent
    stale_ack: PacketEvent | None = None  # the first ACK of an old connection answering it
    acks: int = 0
    rst: PacketEvent | None = None  # the app's RST carrying the stale ACK's ack
    resent: list[PacketEvent] = field(default_factory=list)
    reported: bool = False


class TupleCollision(Detector):
    id = "tuple-collision"
    # On lo it reads only the app's REDIRECTed SYNs; the inbound collision's challenge ACK crosses eth0.
    unseen_without = {"eth0": "the collision's challenge ACK"}
    unseen_rank = 10  # first: the class a run of lo alone most often lacks eth0 for
    # The kernel counts the challenge ACK it sends (RFC 5961 section 4) and conntrack the insert it refuses; a
    # FIN-WAIT-2 socket's ACKs it rate-limits (the outbound variant).
    kernel_counters = ("TcpExtTCPChallengeACK", "ConntrackInsertFailed", "ConntrackDrop",
                       "TcpExtTCPACKSkippedFinWait2")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pending = PendingSyns(ttl_s=60.0)
        self._outbound = PendingSyns(ttl_s=180.0)

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface == "lo":
            # Inbound REDIRECT happens in PREROUTING, for packets that arrive from outside; on lo the sidecar's
            # upstream connections (from 127.0.0.6) are RETURNed, so one source port to two app ports is normal.
            # What lo shows is the outbound side: the app's SYNs REDIRECTed to 15001.
            return self._on_loopback(ev)
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
        self._outbound.expire(now)
        return found

    def finish(self) -> Iterable[Finding]:
        found = [self._challenge_ack(p, p.challenge) for p in self._pending.values() if p.challenge is not None]
        return found + [self._stale_socket(o, None) for o in self._outbound.values()
                        if o.stale_ack is not None and not o.reported]

    def _on_loopback(self, ev: PacketEvent) -> Iterable[Finding]:
        """The outbound variant (module docstring): a SYN to the outbound listener, the old connection's ACK
        answering it (its source restored by conntrack: of_client), the app's RST, the resent SYN."""
        if ev.is_syn:
            if ev.dport != self.ctx.redirect_map.outbound_port or not ev.dst.startswith("127."):
                return ()
            key = PendingSyns.key_of_syn(ev)
            attempt = self._outbound.get(key)
            if attempt is None or attempt.syn.seq != ev.seq:
                self._outbound.add(key, _Outbound(ev))
                return ()
            attempt.resent.append(ev)
            if attempt.stale_ack is not None and not attempt.reported and ev.ts - attempt.syn.ts > STALLED_AFTER_S:
                return (self._stale_socket(attempt, None),)  # the RST freed nothing: the connect stalls
            return ()
        if ev.is_rst:
            attempt = self._outbound.get(PendingSyns.key_of_syn(ev))
            if attempt is not None and attempt.stale_ack is not None and ev.seq == attempt.stale_ack.ack:
                attempt.rst = attempt.rst or ev
                return ()
        attempt = self._outbound.of_client(ev)
        if attempt is None:
            return ()
        if ev.is_rst and ev.ack == (attempt.syn.seq + 1) % 2**32:
            # The SYN refused: the app's RST freed the four-tuple and nothing listens on 15001 (the sidecar is
            # down). The stale socket cost nothing here; the refusal is the failure, and the refusal's detectors
            # (startup-ordering, upstream-refused) name it. Seen in the lab when a sidecar is killed and the app
            # binds a port again whose earlier connection the dead sidecar's TIME-WAIT socket still holds.
            self._outbound.pop(PendingSyns.key_of_syn(attempt.syn))
            return ()
        if ev.is_syn_ack:
            self._outbound.pop(PendingSyns.key_of_syn(attempt.syn))
            if attempt.stale_ack is not None and not attempt.reported:
                return (self._stale_socket(attempt, ev),)
            return ()
        if ev.flags == TcpFlags.ACK and ev.ack != (attempt.syn.seq + 1) % 2**32:
            # An ACK without SYN answering a SYN: a socket that owns the four-tuple, not the listener.
            attempt.acks += 1
            attempt.stale_ack = attempt.stale_ack or ev
        return ()

    def _stale_socket(self, attempt: _Outbound, synack: PacketEvent | None) -> Finding:
        """The outbound variant's finding: a warning when the resent SYN got its SYN-ACK (``synack``), an error
        when the connect stalled (SYNs resent after STALLED_AFTER_S, or none answered in the capture)."""
        attempt.reported = True
        syn, ack = attempt.syn, attempt.stale_ack
        assert ack is not None
        evidence = [Evidence.of(syn, f"the app's SYN to {syn.dst_endpoint} (REDIRECTed to the outbound listener)"),
                    Evidence.of(ack, f"ACK from {ack.src_endpoint} with the old connection's numbers (ack {ack.ack}, "
                                     f"not SYN seq+1 {(syn.seq + 1) % 2**32}): a socket still holds the four-tuple")]
        if attempt.rst is not None:
            evidence.append(Evidence.of(attempt.rst, f"the app's RST, seq {attempt.rst.seq} (the ACK's ack)"))
        if synack is not None:
            lost = synack.ts - syn.ts
            evidence.append(Evidence.of(synack, f"SYN-ACK {lost * 1000:.0f} ms after the first SYN: the stale "
                                                f"socket is gone"))
            outcome = (f"Here the app's RST got through: the stale socket died and the SYN, resent at once, was "
                       f"answered {lost * 1000:.0f} ms after the first. That delay is the cost this time; where the "
                       f"RST is dropped (conntrack INVALID), the connect stalls until it times out.")
            severity, ts = Severity.WARNING, synack.ts
        else:
            last = attempt.resent[-1] if attempt.resent else ack
            if attempt.resent:
                evidence.append(Evidence.of(last, f"SYN resent {last.ts - syn.ts:.3f} s after the first, "
                                                  f"{attempt.acks} stale ACK(s) so far, no SYN-ACK"))
            why = ("not in the capture: dropped before lo, as a conntrack INVALID drop does" if attempt.rst is None
                   else "it did not kill the socket")
            outcome = (f"The app's RST did not free the four-tuple ({why}): "
                       f"every resent SYN meets the stale socket, no SYN-ACK comes, and the app's connect() times "
                       f"out.")
            severity, ts = Severity.ERROR, last.ts
        return Finding(
            detector=self.id,
            severity=severity,
            title=f"The app's SYN from {syn.src_endpoint} met the caller sidecar's half-closed socket on "
                  f"{syn.dst_endpoint}",
            flow=FlowRef(syn.src_endpoint, syn.dst_endpoint, syn.iface),
            evidence=tuple(evidence),
            envoy_flags=(),
            explanation=(
                f"Istio REDIRECTs the app's outbound connections to {syn.dst_endpoint}, so every connection from "
                f"{syn.src_endpoint} is the same four-tuple inside the pod, whatever its destination. The sidecar "
                f"closed an earlier connection from this port first; its socket still waits in FIN-WAIT-2 "
                f"(net.ipv4.tcp_fin_timeout, 60 s by default) after conntrack forgot the connection, so the app's "
                f"FIN never reached it. The new SYN was answered not by a SYN-ACK but by that socket's ACK with the "
                f"old connection's numbers; the SYN was not dropped. {outcome} The SYN never reaches Envoy, so no "
                f"sidecar logs anything: the app sees a slow or failed connect. Check: `ss -tan state fin-wait-2` "
                f"in the pod shows 127.0.0.1:{syn.dport} to {syn.src_endpoint}; nstat TcpExtTCPACKSkippedFinWait2."),
            fixes=outbound_fixes(),
            pod=self.ctx.pod,
            ts=ts,
            details={"stale_acks": attempt.acks, "stalled": synack is None,
                     "lost_s": round(synack.ts - syn.ts, 6) if synack is not None else None},
            variant=OUTBOUND_VARIANT,
        )

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
