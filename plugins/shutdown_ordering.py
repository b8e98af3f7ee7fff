"""``shutdown-ordering``: the pod's sidecar exits while its app still runs and callers still call it.

How a classic sidecar stops (istio/istio pkg/envoy/agent.go ``terminate``, pkg/envoy/admin.go ``DrainListeners``,
pkg/envoy/proxy.go ``Run``): on the pod's SIGTERM, which the kubelet sends every container at once, pilot-agent
POSTs ``/drain_listeners?inboundonly&graceful`` to Envoy (started with ``--drain-strategy immediate``: from now on
each HTTP/1 response on an inbound listener carries ``connection: close``, HTTP/2 gets GOAWAY; the listeners
still accept), waits ``terminationDrainDuration`` (ProxyConfig, 5 s by default: pkg/config/mesh/mesh.go), then
kills Envoy (``cmd.Process.Kill()``, SIGKILL). The app meanwhile serves out its own grace period, and callers,
which learn of the endpoint's removal seconds later (EndpointSlice, istiod's push, their EDS), go on calling.

What the real kernel and Envoy 1.40 show (measured in the lab, tests/data/README.md ``lab-shutdown-*``), on the
pod's ``eth0``, which the caller's and the server's captures both hold:

- at the exit, the server end of every connection the sidecar still held sends FIN at once (the kernel closes a
  killed process's sockets), before any response; the caller's next segment (its TLS close_notify) is answered
  by a bare RST. The request in flight there is the caller sidecar's ``503 UC
  upstream_reset_before_response_started{connection_termination}``. A connection cut in its TLS handshake (the
  close acknowledges nothing past the caller's ClientHello) had no request yet: the caller's sidecar met a connect
  failure, retried it into the refusals below, and logged ``503 URX,UF`` (measured: lab-shutdown-handshake-cut);
- after it, each SYN to the pod's port is answered by RST from that port (istio-init's REDIRECT to 15006, where
  nothing listens: RFC 9293 section 3.10.7.1), after the same port accepted connections earlier in the capture;
  the caller's sidecar retries and logs ``503 URX,UF
  upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}``;
- before it, over plaintext, the drain's ``connection: close`` on the sidecar's responses (over mTLS it is
  encrypted, and the capture shows only that connections are closed after each request);
- the caller's outbound cluster counts ``upstream_cx_connect_fail`` (every refused attempt) and
  ``upstream_cx_destroy_remote_with_active_rq`` (the request in flight); the pod's Envoy, killed, has none to read.

A refusal counts only from an endpoint that accepted before in the capture and showed a sidecar's signs: a TLS
ServerHello (Istio's mTLS is terminated by the sidecar), or an HTTP/1 response with Envoy's own fields
(``x-envoy-upstream-service-time``, ``server: istio-envoy``). Envoy's own logs have nothing of the exit (killed).
The app's own outbound connections are cut too (on ``lo``: EOF, then its SYNs REDIRECTed to 127.0.0.1:15001
refused): those packets are ``startup-ordering``'s, variant ``sidecar-stopped``; this detector reads only
``eth0``, so the two never claim the same packets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kubectl_meshdoctor.core.detector import Detector, PendingSyns
from kubectl_meshdoctor.core.events import ContextEvent, PacketEvent, PodEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix, render
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.pod_history import last_exit_words, sidecar_runs_evidence
from kubectl_meshdoctor.core.remedies import SIDECAR_CONTAINER, native_sidecar, termination_drain_duration

MAX_ENDPOINTS = 1000  # the pod's own ports and the peers it calls: bounded all the same
MAX_CLOSES = 2000
CLOSE_KEPT_S = 60.0  # a close older than this (packet time) can no longer be the exit's
DETAILS = {("UF", "URX"): "upstream_reset_before_response_started{remote_connection_failure|"
                          "delayed_connect_error:_Connection_refused}",
           ("UC",): "upstream_reset_before_response_started{connection_termination}"}
ENVOY_FIELDS = ("x-envoy-upstream-service-time", "x-envoy-decorator-operation")


def fixes(app_grace_s: int = 20) -> tuple[Fix, ...]:
    """The fixes in the order that keeps the most, each proven in the lab (tests/lab/test_shutdown_ordering.py):
    the sidecar outlives the app (native sidecar: the kubelet stops the app containers first), or the drain
    outlasts the app's grace (``app_grace_s``, seconds). Not ``EXIT_ON_ZERO_ACTIVE_CONNECTIONS``: pilot-agent then
    exits when Envoy's ``downstream_cx_active`` is 0, which during a drain it is between two requests of callers
    that keep calling (each connection closed after its response); in the lab it exited 2.2 s after its minimum
    drain with the callers still calling, 13 of 94 calls failed (NOTE_EXIT_ON_ZERO)."""
    return (native_sidecar(), termination_drain_duration(app_grace_s))


FIXES: tuple[Fix, ...] = fixes()
NOTE_EXIT_ON_ZERO = (
    " Not a fix here: proxyMetadata EXIT_ON_ZERO_ACTIVE_CONNECTIONS makes pilot-agent exit once Envoy's "
    "downstream_cx_active is 0 after MINIMUM_DRAIN_DURATION, which a drain reaches between two requests while "
    "callers still call (each connection is closed after its response); it helps long-lived connections only.")


@dataclass(frozen=True, slots=True)
class _Attempt:
    syn: PacketEvent  # PendingSyns' values carry their SYN


@dataclass(slots=True)
class _Served:
    """What the capture saw of one endpoint (a pod's port) while it listened."""

    last_accept: PacketEvent
    accepted: int = 0
    sidecar: PacketEvent | None = None  # the first packet that showed a sidecar there (ServerHello, Envoy fields)
    drain: PacketEvent | None = None  # the first HTTP/1 response with connection: close (the drain, in plaintext)
    drains: int = 0
    exited: PacketEvent | None = None  # the first refusal after it accepted: the sidecar had exited
    # the server's own first FINs, newest last, each with the ClientHello it came before the end of (None: the
    # client had sent more than its ClientHello)
    closes: list[tuple[PacketEvent, PacketEvent | None]] = field(default_factory=list)


def _connection_close(ev: PacketEvent) -> bool:
    """Whether ``ev`` is an HTTP/1 message with ``connection: close`` (RFC 9112 section 9.6)."""
    if ev.http is None:
        return False
    # once an HTTP/1 message: a loop that lowers only a name of the right length, not a generator lowering each
    for name, value in ev.http.headers:
        if len(name) == 10 and name.lower() == "connection" and "close" in value.lower():
            return True
    return False


def _in_handshake(flow: Flow, close: PacketEvent) -> PacketEvent | None:
    """The connection's ClientHello when the server's ``close`` acknowledges nothing past it (RFC 9293 section
    3.4: its ACK is the next byte the server expects), so the client had not sent its second flight, and the TLS
    handshake was cut: the caller's sidecar met a connect failure (UF), not a request reset. None otherwise, and
    for a close with no ACK bit (nothing acknowledged to read)."""
    hello = flow.notes.get("client-hello")
    if hello is None or not close.flags._value_ & 0x10:
        return None
    hello_end = (hello.seq + 5 + hello.tls.length) % 2**32  # the record's 5-byte header, then its body
    return hello if (hello_end - close.ack) % 2**32 < 2**31 else None


def _envoy_response(ev: PacketEvent) -> bool:
    if ev.http is None or ev.http.is_request:
        return False
    return any(k.lower() in ENVOY_FIELDS or (k.lower() == "server" and "envoy" in v.lower())
               for k, v in ev.http.headers)


class ShutdownOrdering(Detector):
    id = "shutdown-ordering"
    packet_ifaces = frozenset({"eth0"})
    packet_kinds = frozenset({"syn", "fin", "rst", "http", "tls"})  # not the pure ACKs
    unseen_without = {"eth0": "a stopped sidecar's refusals"}
    unseen_rank = 50
    pod_runs = True
    envoy_counters = ("upstream_cx_connect_fail", "upstream_cx_destroy_remote_with_active_rq")
    kernel_counters = ("TcpOutRsts",)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pending = PendingSyns(ttl_s=30.0)
        self._served: dict[tuple[str, int], _Served] = {}
        self._pod: PodEvent | None = None

    def on_context(self, ev: ContextEvent) -> Iterable[Finding]:
        if isinstance(ev, PodEvent):
            self._pod = ev
        return ()

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface != "eth0":
            return ()  # the callers' connections; lo's refusals at 15001 are startup-ordering's
        if ev.is_syn:
            self._pending.add(PendingSyns.key_of_syn(ev), _Attempt(ev))
            return ()
        src = (ev.src, ev.sport)
        served = self._served.get(src)
        if ev.is_syn_ack:
            self._pending.pop(PendingSyns.key_of_answer(ev))
            if served is None or served.exited is not None:  # a sidecar back after an exit starts anew
                served = self._served[src] = _Served(ev)
                self._bound()
            served.last_accept, served.accepted = ev, served.accepted + 1
            return ()
        if served is None or (src != flow.server):
            if (ev.dst, ev.dport) == flow.server:
                if ev.tls is not None and ev.tls.is_encrypted_alert:
                    flow.notes["client-alert"] = True  # the caller closed first (its close_notify): not the exit's
                elif ev.tls is not None and ev.tls.is_client_hello:
                    # the latest, not core/mtls.remember_hello's first: after a HelloRetryRequest the client sends
                    # a second ClientHello (RFC 8446 section 4.1.4), and the close is held to that one's end
                    flow.notes["client-hello"] = ev
                elif _connection_close(ev):
                    flow.notes["asked-close"] = True  # its answer's connection: close is the caller's, not a drain
            return ()
        if ev.is_rst:
            attempt = self._pending.get(PendingSyns.key_of_answer(ev))
            if attempt is not None and ev.ack == (attempt.syn.seq + 1) % 2**32:
                self._pending.pop(PendingSyns.key_of_answer(ev))
                return self._refused(served, attempt.syn, ev)
        if served.sidecar is None and ((ev.tls is not None and ev.tls.is_server_hello) or _envoy_response(ev)):
            served.sidecar = ev
        if _connection_close(ev) and not ev.http.is_request:
            flow.notes["drain-close"] = True
            if not flow.notes.get("asked-close"):  # Envoy's own: an HTTP/1.1 keep-alive request told to go
                served.drains += 1
                served.drain = served.drain or ev
        if (ev.is_fin or ev.is_rst) and not flow.notes.get("server-closed"):
            flow.notes["server-closed"] = True
            if not flow.client_fin and not flow.notes.get("client-alert") and not flow.notes.get("drain-close"):
                # the server closed (or reset: a connection the kernel held that Envoy never took) first, with no
                # connection: close said before
                served.closes.append((ev, _in_handshake(flow, ev)))
                del served.closes[:-MAX_CLOSES]
        return ()

    def _bound(self) -> None:
        while len(self._served) > MAX_ENDPOINTS:
            del self._served[next(iter(self._served))]

    def _refused(self, served: _Served, syn: PacketEvent, rst: PacketEvent) -> list[Finding]:
        if served.sidecar is None or served.last_accept.ts >= rst.ts:
            return []  # not known to be a sidecar's port, or it accepts still: another detector's story
        findings: list[Finding] = []
        if served.exited is None:
            served.exited = rst
            # the sockets the kill closed: the server's own FINs since its last accepted connection
            cut = [c for c in served.closes if served.last_accept.ts - 0.05 <= c[0].ts <= rst.ts]
            findings.extend(self._cut(served, fin, hello) for fin, hello in cut)
            served.closes.clear()
        findings.append(self._refusal(served, syn, rst))
        return findings

    def _timeline(self, served: _Served) -> tuple[list[Evidence], str, dict]:
        """The words and details of the shutdown's timeline: the sidecar's sign, the drain (when seen), the last
        accepted connection, the first refusal, by frame; the pod's status when it was read (evidence). The
        packets of the timeline are named, not evidence: an access-log line is held to a finding by its evidence's
        times (core/correlate.py explains), and the capture's first ServerHello would stretch that to the start."""
        assert served.exited is not None
        last, exited = served.last_accept, served.exited
        evidence: list[Evidence] = []
        details: dict = {"last_accepted": {"frame": last.frame, "ts": round(last.ts, 6)},
                         "exited_by": {"frame": exited.frame, "ts": round(exited.ts, 6)}, "accepted": served.accepted}
        text = (f"The sidecar accepted its last connection at {last.source} frame {last.frame} (SYN-ACK) and refused "
                f"from frame {exited.frame} on ({exited.ts - last.ts:.3f} s later): it exited in between.")
        if served.sidecar is not None:
            sign = served.sidecar
            details["sidecar_seen"] = {"frame": sign.frame, "ts": round(sign.ts, 6)}
            text += (f" A sidecar answered there at frame {sign.frame} ("
                     f"{'its mTLS ServerHello' if sign.tls is not None else 'Envoy fields in its response'}).")
        if served.drain is not None:
            gap = exited.ts - served.drain.ts
            details["drain"] = {"frame": served.drain.frame, "ts": round(served.drain.ts, 6),
                                "responses": served.drains, "seconds": round(gap, 3)}
            text += (f" It had been draining since frame {served.drain.frame}: {served.drains} response(s) with "
                     f"`connection: close` over {gap:.1f} s before the exit, pilot-agent's terminationDrainDuration "
                     f"(5 s unless set).")
        else:
            text += (" The drain before it (pilot-agent's drain_listeners, `connection: close` on each response for "
                     "terminationDrainDuration, 5 s unless set) is encrypted on an mTLS hop: the capture shows "
                     "only connections closed after their request.")
        pod = self._pod
        if pod is not None and last.src in pod.ips:  # its own sidecar exited, not a peer's it called
            where = f"pod/{pod.name}"
            evidence.append(Evidence.spec_field(where, f"status.containerStatuses[{SIDECAR_CONTAINER}].restartCount",
                                                str(pod.sidecar_restarts)))
            evidence += sidecar_runs_evidence(pod, exited.ts)
            text += (f" When {where}'s status was read (as the watch began), {SIDECAR_CONTAINER} had restarted "
                     f"{pod.sidecar_restarts} time(s)"
                     + (": it has gone down before (kubectl logs -c istio-proxy --previous says why)."
                        if pod.sidecar_restarts else ".") + last_exit_words(pod)
                     + f" Which this exit was: kubectl get pod {pod.name} (RESTARTS: istio-proxy restarted) or "
                       f"kubectl get events --field-selector involvedObject.name={pod.name} (Killing: the pod's "
                       f"termination).")
        return evidence, text, details

    def _finding(self, served: _Served, flow: FlowRef, first: tuple[Evidence, ...], flags: tuple[str, ...],
                 text: str, ts: float, title: str, variant: str) -> Finding:
        """A finding of this shutdown: ``first`` its own packets, then the timeline's words."""
        evidence, timeline, details = self._timeline(served)
        return Finding(
            detector=self.id, severity=Severity.ERROR, title=title, flow=flow, evidence=(*first, *evidence),
            envoy_flags=flags, response_code_details=DETAILS[flags], explanation=text + timeline + NOTE_EXIT_ON_ZERO,
            remediation=render(FIXES), fixes=FIXES, pod=self.ctx.pod, ts=ts,
            details={"cause": "sidecar-exited", **details}, variant=variant)

    def _refusal(self, served: _Served, syn: PacketEvent, rst: PacketEvent) -> Finding:
        port = rst.src_endpoint
        return self._finding(
            served, FlowRef(syn.src_endpoint, port, syn.iface),
            (Evidence.of(syn, f"SYN to {port}"),
             Evidence.of(rst, f"RST from {port}: nothing listens on the sidecar's inbound port any more")),
            ("UF", "URX"),
            f"{port} accepted connections earlier in this capture, through its sidecar, and now answers a SYN with "
            f"RST after {1e6 * (rst.ts - syn.ts):.0f} us: istio-init's REDIRECT still sends it to 15006, where the "
            f"killed Envoy no longer listens (RFC 9293 section 3.10.7.1). A classic sidecar's shutdown does this: "
            f"pilot-agent drains for terminationDrainDuration, then kills Envoy, while the app serves out its grace "
            f"period and callers, which learn of the endpoint's removal later, still call (a crash or OOM kill of "
            f"istio-proxy looks the same, without the drain before it). The caller's sidecar retries and logs 503 "
            f"URX,UF ... Connection_refused. ",
            rst.ts, f"Connection to {port} refused after its sidecar exited: the app's callers were still calling",
            "connection refused after the sidecar exited")

    def _cut(self, served: _Served, fin: PacketEvent, hello: PacketEvent | None) -> Finding:
        port = fin.src_endpoint
        close = "RST" if fin.is_rst else "FIN"
        if hello is not None:
            return self._finding(
                served, FlowRef(fin.dst_endpoint, port, fin.iface),
                (Evidence.of(hello, f"ClientHello to {port}"),
                 Evidence.of(fin, f"{close} from {port} acknowledging nothing past the ClientHello: the killed "
                                  f"sidecar's socket closed in the TLS handshake")), ("UF", "URX"),
                f"The sidecar at {port} closed this connection when it exited, in its TLS handshake: the kernel "
                f"closes a killed process's sockets, and this one had received the caller's ClientHello and nothing "
                f"after it. The caller's sidecar meets a connect failure (UF), retries it (Istio's default retryOn "
                f"has connect-failure), and its retries are refused here: it logs 503 URX,UF. ",
                fin.ts, f"{port}'s sidecar exited in a connection's TLS handshake: the caller's connect failed (503 UF)",
                "TLS handshake cut by the sidecar's exit")
        return self._finding(
            served, FlowRef(fin.dst_endpoint, port, fin.iface),
            (Evidence.of(fin, f"{close} from {port} with no response: the killed sidecar's socket closed"),), ("UC",),
            f"The sidecar at {port} closed this connection when it exited: the kernel closes a killed process's "
            f"sockets, so the connections it still held were ended at once with no answer (during the drain a served "
            f"connection is closed after its response, so one still open carried a request). The caller's sidecar "
            f"logs the request in flight as 503 UC upstream_reset_before_response_started{{connection_termination}}. ",
            fin.ts, f"{port}'s sidecar exited under an open connection: its request in flight is lost (503 UC)",
            "connection closed by the sidecar's exit")

    def on_tick(self, now: float) -> Iterable[Finding]:
        self._pending.expire(now)
        for served in self._served.values():
            if served.closes and served.closes[0][0].ts < now - CLOSE_KEPT_S:
                served.closes[:] = [c for c in served.closes if c[0].ts >= now - CLOSE_KEPT_S]
        return ()

