"""``syn-timeout``: a SYN retransmitted with no answer at all.

Linux retransmits an unanswered SYN after 1 s, then 3 s, 7 s, ... (``tcp_syn_retries``), or, from Linux 6.7 with
``tcp_syn_linear_timeouts`` (default 4), the first four after 1 s each; each retransmission is a stall the caller
sees. Envoy logs UF once its connect timeout fires, URX when retries run out. SYNs that share
a client port with a redirected connection belong to ``tuple-collision`` and are left to it.

A SYN that got an answer was not dropped, whatever followed: an ACK of an old connection (``tuple-collision``),
an RST (``upstream-refused``) are other detectors' stories. A SYN resent within QUICK_RESEND_S got an answer even
when the capture lacks it: the client's kernel resends at once after an answer it rejected. Those attempts get
an honest "cannot tell" finding that says what to capture, never "dropped".

Without a capture, Envoy's logs name it: a UF whose reset reason is ``connection_timeout`` (Envoy's connect
timeout fired: 10 s in Istio by default) or whose connect errno is ETIMEDOUT (110, ``Connection timed out``) or
EHOSTUNREACH (113, ``No route to host``: an ICMP or a firewall's reject where no SYN-ACK comes), and the debug
log's ``connect timeout`` on the upstream connection. A UF line that names no reason (a TCP proxy's, or Envoy's
before response_code_details) is read by its duration: one connect timeout of Istio's 10 s default, Envoy's 5 s or
Istio's 1 s of before 1.5 (or up to three attempts of one), where a refused connect fails within milliseconds (timed_out_by_duration).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings
from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector, PendingSyns
from kubectl_meshdoctor.core.events import EnvoyCountersEvent, PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.remedies import destination_rule_pool, virtual_service_retries
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import parse_reset_details, transport_errno
from kubectl_meshdoctor.envoy.story import StreamStory

ETIMEDOUT, EHOSTUNREACH = 110, 113
_UNANSWERED = {ETIMEDOUT: "the connect timed out (ETIMEDOUT)", EHOSTUNREACH: "no route to the host (EHOSTUNREACH)"}


# Connect timeouts a UF's duration is read against when its line names no reason (a TCP proxy's line, Envoy before
# response_code_details): Istio's meshConfig.connectTimeout default (10 s, its DestinationRule connectTimeout
# too), Envoy's own cluster connect_timeout default (5 s, config.cluster.v3.Cluster) and Istio's default before
# istio/istio#20920 (1 s: Istio 1.0 - 1.4, istio/istio#11319). Envoy's timer fires a few ms either side of it (9994
# to 10001 ms in the lines of istio/istio#17139 and #56356): TIMER_SLACK of it.
CONNECT_TIMEOUTS_MS = (10_000, 5_000, 1_000)
_DEFAULT_OF = {10_000: "Istio's default connectTimeout", 5_000: "Envoy's default cluster connect_timeout",
               1_000: "Istio's default connectTimeout before 1.5"}
TIMER_SLACK = 0.01
MAX_ATTEMPTS = 3  # Istio's default retry policy: 2 retries after the first attempt
RETRY_BACKOFF_MS = 250  # Envoy's retry back-off ceiling at its 25 ms base (10 times it): the most a retry adds


def timed_out_by_duration(entry: AccessLogEntry) -> str | None:
    """Why a UF line's duration says Envoy's connect timeout fired: it lasted one connect timeout of
    CONNECT_TIMEOUTS_MS (or MAX_ATTEMPTS of them, with back-offs between), where a refused connect fails within
    milliseconds. None when the line gives a reason of its own or lasted anything else."""
    if "UF" not in entry.flags or entry.details or entry.upstream_failure:
        return None
    for timeout in CONNECT_TIMEOUTS_MS:
        for attempts in range(1, MAX_ATTEMPTS + 1):
            low = attempts * timeout * (1 - TIMER_SLACK)
            high = attempts * timeout * (1 + TIMER_SLACK) + (attempts - 1) * RETRY_BACKOFF_MS
            if low <= entry.duration_ms <= high:
                times = f"{attempts} attempts of " if attempts > 1 else ""
                return (f"Envoy's connect timeout fired (the line lasted {entry.duration_ms} ms: {times}"
                        f"{_DEFAULT_OF[timeout]}, {timeout // 1000} s; a refused connect fails within milliseconds)")
    return None


def unanswered(entry: AccessLogEntry, story: StreamStory | None = None) -> str | None:
    """Why Envoy's line (or story) says the upstream connect got no answer, in words; None when it does not."""
    if story is not None and (story.timeout == "connect timeout" or story.reset_reason == "connection timeout"):
        return "Envoy's connect timeout fired"  # its own timer (tcp_proxy's too), not the kernel's ETIMEDOUT
    if "UF" not in entry.flags:
        return None
    reset = parse_reset_details(entry.details)
    if reset is not None and reset.reason.replace(" ", "_") == "connection_timeout":
        return "Envoy's connect timeout fired"
    errno = next((e for e in ((reset.errno if reset else None), transport_errno(entry.upstream_failure),
                              story.errno if story else None) if e is not None), None)
    if errno is not None:
        return _UNANSWERED.get(errno)
    return timed_out_by_duration(entry) if story is None else None

ERROR_AFTER_RETRANSMITS = 3

# No fix: what drops the SYN is not on the wire, so the finding says where to look. What follows bounds the stall
# and is labelled so: it is no fix (the SYNs are still lost), and no lab test could show the failure gone.
_REMEDIATION = (
    "# No fix can be read from the capture: find what eats the SYN: a NetworkPolicy or firewall, a full accept\n"
    "# queue (nstat TcpExtListenDrops), conntrack drops (conntrack -S: insert_failed, drop).\n"
    "# A mitigation, not a fix (the SYNs are still lost): bound the stall and retry on another endpoint:\n"
    + destination_rule_pool("tcp", "connectTimeout", "1s")
    + "\n---\n" + virtual_service_retries(3, "connect-failure,reset", "2s"))


GIVE_UP_AFTER_S = 10.0  # silence after the last retransmission before an unanswered attempt is reported
# Seconds: a SYN resent sooner than this after the one before was answered. An unanswered SYN waits the initial
# RTO, 1 s (RFC 6298 section 2.1), but a SYN-SENT socket that gets an ACK it does not accept answers it with an RST
# (RFC 9293 section 3.10.7.3) and Linux resends its SYN at once (tcp_input.c tcp_rcv_synsent_state_process: the
# retransmit timer set to TCP_TIMEOUT_MIN; 11-15 ms in the lab on 6.18).
QUICK_RESEND_S = 0.2


@dataclass(slots=True)
class _Pending:
    syn: PacketEvent
    retransmits: int = 0
    answered: bool = False  # since the last SYN, by something other than a SYN-ACK (RST, an old connection's ACK)
    answer: PacketEvent | None = None  # the first such answer captured: the attempt is another detector's story
    resent_at_once: PacketEvent | None = None  # a SYN resent within QUICK_RESEND_S: answered, answer not captured
    last: PacketEvent | None = None
    reported: bool = False


class SynTimeout(Detector):
    """One finding per connection attempt, concluded when the SYN is finally answered, when the client falls
    silent for GIVE_UP_AFTER_S, or at the end of the capture: a warning, an error from
    ERROR_AFTER_RETRANSMITS retransmissions on."""

    id = "syn-timeout"
    # A SYN to another host leaves the pod by eth0; one on lo goes to the pod's own sockets (the sidecar, the app).
    unseen_without = {"eth0": "SYN timeouts to other hosts"}
    unseen_rank = 20
    # A SYN the listener dropped (full accept queue) or conntrack refused leaves no answer on the wire.
    kernel_counters = ("TcpExtListenDrops", "TcpExtListenOverflows", "ConntrackInsertFailed", "ConntrackDrop")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pending = PendingSyns(ttl_s=180.0)  # covers the default tcp_syn_retries backoff (~127 s)

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        return counter_findings(
            self.id, counters, (CounterSignal("cluster", "upstream_cx_connect_timeout",
                                              "connects that got no answer within the connect timeout"),),
            what="Upstream connects timed out: SYNs with no answer (503 UF)",
            explanation=("Envoy's connects to the upstream got no SYN-ACK before its connect timeout (10 s in Istio "
                         "by default) fired; the counter cannot tell why: SYNs (or their answers) dropped, a full "
                         "accept queue, or answers the kernel rejected (an ACK of an old connection on the same "
                         "four-tuple). Envoy answers 503 UF (URX when retries are spent). Capture eth0 and lo with "
                         "every packet (watch --full-capture) to see what answers the SYNs."),
            envoy_flags=("UF",), 
            remediation=_REMEDIATION, pod=self.ctx.pod)

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        why = unanswered(entry)
        return self._from_logs(entry, why, evidence, False) if why else None

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        why = unanswered(said, story)
        return self._from_logs(said, why, evidence, True) if why else None

    def _from_logs(self, entry: AccessLogEntry, why: str, evidence: Evidence, debug: bool) -> Finding:
        flow = access_log_flow(entry)
        request = f"{entry.method} {entry.path}" if entry.method else "a connection"
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"The sidecar's connect to {flow.server} got no answer: {why} "
                  f"({' '.join(x for x in (str(entry.code or ''), ','.join(entry.flags) or 'UF') if x)})",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=tuple(f for f in ("UF", "URX") if f in entry.flags) or ("UF",),
            variant="connect got no answer",
            response_code_details=entry.details or "",
            explanation=(
                f"The sidecar tried to connect to {flow.server} for {request} and {why}: no SYN-ACK came back in "
                f"time. The log cannot tell why: the SYNs or their answers were dropped (a NetworkPolicy, a "
                f"firewall, a node's conntrack table), the endpoint is gone from the network (a stale endpoint), "
                f"its accept queue is full, or each SYN was answered by something the kernel rejects (an ACK of an "
                f"old connection on the same four-tuple). Envoy answered UF (URX once retries are spent). Capture "
                f"eth0 and lo with every packet (watch --full-capture) while it happens to see what answers the "
                f"SYNs, if anything."),
            remediation=_REMEDIATION,
            pod=self.ctx.pod,
            ts=entry.ts,
            details={"from": "envoy-log" if debug else "access-log", "why": why},
        )

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.is_syn:
            return self._on_syn(ev)
        pending = self._pending.get(PendingSyns.key_of_answer(ev))
        if pending is None and ev.iface == "lo":
            pending = self._pending.of_client(ev)  # REDIRECTed on the way out, its source restored on the answer
        if pending is None:
            return ()
        if not ev.is_syn_ack:
            pending.answered = True
            pending.answer = pending.answer or ev
            return ()
        self._pending.pop(PendingSyns.key_of_syn(pending.syn))
        if pending.retransmits and not pending.reported and pending.answer is None:
            return (self._finding(pending, answer=ev),)
        return ()

    def on_tick(self, now: float) -> Iterable[Finding]:
        out = [self._conclude(p) for p in self._pending.values()
               if self._due(p) and p.last is not None and now - p.last.ts > GIVE_UP_AFTER_S]
        self._pending.expire(now)
        return out

    def finish(self) -> Iterable[Finding]:
        return [self._conclude(p) for p in self._pending.values() if self._due(p)]

    @staticmethod
    def _due(p: _Pending) -> bool:
        """An attempt this detector reports: resent, never reported, and no answer captured (a captured answer,
        an old connection's ACK or an RST, is tuple-collision's or upstream-refused's story, never a drop)."""
        return bool(p.retransmits or p.resent_at_once) and not p.reported and p.answer is None

    def _conclude(self, p: _Pending) -> Finding:
        return self._unseen_answer(p) if p.resent_at_once is not None else self._finding(p)

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
        if ev.ts - (pending.last or pending.syn).ts < QUICK_RESEND_S:
            pending.resent_at_once = pending.resent_at_once or ev  # answered, though the capture lacks the answer
        else:
            pending.retransmits += 1
        pending.last = ev
        return ()

    def _finding(self, pending: _Pending, answer: PacketEvent | None = None) -> Finding:
        pending.reported = True
        syn, last = pending.syn, pending.last
        assert last is not None
        n = pending.retransmits
        waited = last.ts - syn.ts
        severity = Severity.ERROR if n >= ERROR_AFTER_RETRANSMITS else Severity.WARNING
        evidence = [Evidence.of(syn, "SYN"),
                    Evidence.of(last, f"SYN retransmission {n}, {waited:.3f} s after the first"
                                      + (", no answer" if answer is None else ""))]
        outcome = "no answer in the capture"
        if answer is not None:
            outcome = f"answered by a SYN-ACK only after {answer.ts - syn.ts:.3f} s"
            evidence.append(Evidence.of(answer, f"SYN-ACK after {answer.ts - syn.ts:.3f} s"))
        return Finding(
            detector=self.id,
            severity=severity,
            title=f"SYN to {syn.dst_endpoint} retransmitted without an answer",
            flow=FlowRef(syn.src_endpoint, syn.dst_endpoint, syn.iface),
            evidence=tuple(evidence),
            envoy_flags=("UF", "URX"),
            variant="SYN retransmitted, no answer",
            response_code_details="upstream_reset_before_response_started{connection_timeout}",
            explanation=(
                f"{syn.src_endpoint} sent a SYN to {syn.dst_endpoint} and the capture holds no SYN-ACK, RST or "
                f"other answer to it; the kernel retransmitted it {n} time{'s' if n > 1 else ''} over {waited:.1f} s "
                f"({outcome}; Linux backs off as RFC 6298 section 5 says, after linear first retries from 6.7 on), "
                f"each after a full timeout, as it does when nothing at all came back. Something between this capture "
                f"and the listener drops the SYNs or their answers, or the listener's accept queue is full. Envoy "
                f"logs UF when its connect timeout fires (URX once retries are spent); callers see slow or failed "
                f"requests."),
            remediation=_REMEDIATION,
            pod=self.ctx.pod,
            ts=(answer or last).ts,
            details={"retransmits": n, "waited_s": round(waited, 6), "answered": answer is not None},
        )

    def _unseen_answer(self, pending: _Pending) -> Finding:
        """An attempt resent at once (QUICK_RESEND_S): answered by something this capture does not hold."""
        pending.reported = True
        syn, quick = pending.syn, pending.resent_at_once
        assert quick is not None
        last = pending.last or quick
        gap = quick.ts - syn.ts
        evidence = [Evidence.of(syn, "SYN"),
                    Evidence.of(quick, f"the same SYN resent {gap * 1000:.0f} ms later: an answer came and was "
                                       f"rejected (an unanswered SYN waits 1 s)")]
        if last is not quick:
            evidence.append(Evidence.of(last, f"SYN resent again, {last.ts - syn.ts:.3f} s after the first"))
        return Finding(
            detector=self.id,
            severity=Severity.ERROR if pending.retransmits else Severity.WARNING,
            title=f"SYN to {syn.dst_endpoint} was answered, but not with a SYN-ACK (the answer is not in the capture)",
            flow=FlowRef(syn.src_endpoint, syn.dst_endpoint, syn.iface),
            evidence=tuple(evidence),
            envoy_flags=(),
            variant="SYN answered, answer not captured",
            response_code_details="",
            explanation=(
                f"{syn.src_endpoint}'s kernel resent its SYN to {syn.dst_endpoint} {gap * 1000:.0f} ms after the "
                f"first, where a SYN nobody answers waits 1 s (RFC 6298 section 2.1): it got an answer it rejected "
                f"and reset (RFC 9293 section 3.10.7.3; Linux then resends at once), so the SYN was not dropped. "
                f"The answer is not in this capture, so it cannot tell what sent it: most often a socket still "
                f"holding the same four-tuple (an old connection's ACK: tuple-collision), else an RST or ICMP error. "
                f"{'Later SYNs kept failing: the connect stalls. ' if pending.retransmits else ''}"
                f"Capture lo and eth0 with every packet (watch --full-capture), and read nstat's "
                f"TcpExtTCPChallengeACK and TcpExtTCPACKSkippedFinWait2 and `ss -tan state fin-wait-2` in the "
                f"pod while it happens."),
            remediation="# No fix can be read from the capture: capture the answer first (watch --full-capture).",
            pod=self.ctx.pod,
            ts=last.ts,
            details={"retransmits": pending.retransmits, "resent_after_s": round(gap, 6), "answered": True},
        )
