"""``tls-mismatch``: one side of a hop speaks mTLS and the other plaintext.

Two ways, both common while a mesh is being adopted (docs/lab-envoy.md has what real Envoy 1.40 did in each):

- **plaintext to an mTLS-only port**: a PeerAuthentication STRICT (or a namespace's default) leaves the pod's
  15006 with TLS filter chains only (``transport_protocol: tls``, Istio's ALPN). A caller without a sidecar (or
  one that bypasses it) sends plaintext: the TLS inspector reads no ClientHello (``parseClientHello failed:
  ... HTTP_REQUEST``), no filter chain matches, and the listener closes the connection with the request unread,
  so the kernel sends RST. The listener's access log says ``"- - -" 0 NR filter_chain_not_found``; the debug log
  ``closing connection from IP:PORT: no matching filter chain found``; the listener counts
  ``no_filter_chain_match``. The caller sees a reset (its sidecar, if any: 503 UC).
- **TLS where plaintext is expected**: a DestinationRule ``tls.mode: ISTIO_MUTUAL`` (or auto mTLS with stale
  endpoint metadata) towards a workload without a sidecar: the caller's sidecar sends a ClientHello and the app
  answers it in plaintext (``HTTP/1.1 400``) or closes. BoringSSL reads ``WRONG_VERSION_NUMBER``: 503 UF
  ``upstream_reset_before_response_started{remote_connection_failure|TLS_error:|268435703:SSL_routines:
  OPENSSL_internal:WRONG_VERSION_NUMBER:TLS_error_end}``, ``ssl.connection_error`` on the cluster. Other TLS
  errors in the same place (CERTIFICATE_VERIFY_FAILED, an unknown CA) are the same hop's identity mismatch.

On the wire (eth0), the first way shows as a plaintext HTTP request on a new connection answered by the pod's
RST with no response at all; the second as a ClientHello (its SNI names the service and port Istio meant,
core/mtls.py) answered by the start of a plaintext HTTP/1 response on the same connection.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import EnvoyCountersEvent, PacketEvent, endpoint
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.mtls import hello_evidence, hello_of, istio_sni, remember_hello
from kubectl_meshdoctor.core.remedies import destination_rule
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.story import StreamStory

PLAINTEXT, TLS_TO_PLAINTEXT, HANDSHAKE = "plaintext-to-mtls", "tls-to-plaintext", "handshake"
FILTER_CHAIN_NOT_FOUND = "filter_chain_not_found"
_NOTE = "tls-mismatch"
_SYN_NOTE = "tls-mismatch-syn"  # a SYN of the connection not yet answered by a SYN-ACK
# seconds a plaintext finding waits for a refusal of the same port (a listener gone, not a filter chain): after
# real Envoy's exit the callers' next SYN, 0.1 s after it reset its queued connections, was refused
# (tests/data/lab-shutdown-plain); callers retry within seconds, and a finding shown 5 s late costs little
HOLD_S = 5.0
# TLS errors BoringSSL reports when the peer did not speak TLS at all (it answered a ClientHello in plaintext).
_NOT_TLS = ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "packet length too long", "PACKET_LENGTH_TOO_LONG")
_TLS_MARKS = ("TLS_error", "TLS error", "SSL_routines", "SSL routines", "CERTIFICATE_VERIFY_FAILED", "TLSV1_ALERT",
              "SSLV3_ALERT")


def permissive_fix(port: int | None) -> Fix:
    where = f"[{port}]" if port else "[<port>]"
    return Fix(
        "permissive-mtls", f"accept plaintext beside mTLS on port {port or '<port>'} while its callers move into "
                           f"the mesh (PeerAuthentication PERMISSIVE)",
        "mTLS for every caller that has a sidecar; the others are served in plaintext",
        "the port accepts plaintext from anyone who can reach the pod: a step of a migration, not an end (the "
        "lasting fix is a sidecar in each caller, or the callers' traffic through one)",
        yaml=f"""\
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata:
  name: <service>
  namespace: <namespace>
spec:
  selector:
    matchLabels:
      app: <service>
  mtls:
    mode: STRICT
  portLevelMtls:
    {port or '<port>'}:
      mode: PERMISSIVE          # plaintext callers too, on this port only""",
        settings=((f"PeerAuthentication.portLevelMtls{where}.mode", "PERMISSIVE"),))


TLS_DISABLE = Fix(
    "tls-disable", "stop originating mTLS to a workload that has no sidecar to answer it",
    "the callers' sidecars and the rest of the mesh as they are",
    "traffic to that workload is plaintext (no mTLS identity) until it gets a sidecar, which is the lasting fix: "
    "then ISTIO_MUTUAL (or auto mTLS) is right again",
    yaml=destination_rule("    tls:\n      mode: DISABLE          # the workload has no sidecar to terminate mTLS"),
    settings=(("DestinationRule.trafficPolicy.tls.mode", "DISABLE"),))

COUNTERS = (
    CounterSignal("listener", "no_filter_chain_match", "connections that matched no filter chain (plaintext on "
                                                         "an mTLS-only port)"),
    CounterSignal("cluster", "ssl.connection_error", "TLS handshakes to the upstream that failed"),
    CounterSignal("listener", "ssl.connection_error", "TLS handshakes from callers that failed"),
    CounterSignal("listener", "ssl.fail_verify_no_cert", "callers that sent no client certificate"),
)


def kind_of(entry: AccessLogEntry, story: StreamStory | None = None) -> str | None:
    """Which mismatch Envoy's line (or the debug log's story) tells of: PLAINTEXT, TLS_TO_PLAINTEXT, HANDSHAKE (a
    TLS error of another kind), or None."""
    if entry.details == FILTER_CHAIN_NOT_FOUND or (story is not None and story.filter_chain_not_found):
        return PLAINTEXT
    text = " ".join(x for x in (entry.details, entry.upstream_failure, story.tls_error if story else None,
                                story.transport_failure if story else None) if x)
    if not any(mark in text for mark in _TLS_MARKS):
        return None
    if any(mark in text for mark in _NOT_TLS):
        return TLS_TO_PLAINTEXT
    # A handshake that fails is a connect that fails: the pool's failure, 503 UF (...{remote_connection_failure|
    # TLS_error:...}). An RST on a connection whose handshake was done reads as a TLS error too, BoringSSL's
    # "system library ... Connection reset by peer" (real Envoy 1.40 on a conntrack-INVALID reset,
    # tests/data/envoy-1.40-mesh/conntrack-invalid/caller), but Envoy logs that as a termination: 503 UC
    # {connection_termination}. That is no handshake, and not this detector's.
    if ("UC" in entry.flags and "UF" not in entry.flags) or "connection_termination" in (entry.details or ""):
        return None
    return HANDSHAKE


def _port(endpoint: str) -> int | None:
    tail = endpoint.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


class TlsMismatch(Detector):
    id = "tls-mismatch"
    packet_ifaces = frozenset({"eth0"})
    unseen_without = {"eth0": "mTLS on the wire"}
    unseen_rank = 30
    envoy_counters = ("ssl.connection_error", "upstream_cx_connect_fail", "listener.no_filter_chain_match")
    envoy_loggers = ("conn_handler", "connection", "filter", "router", "http")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # plaintext findings held HOLD_S for a refusal of the same port: (its RST's time, the finding)
        self._held: list[tuple[float, Finding]] = []

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        """Plaintext to an mTLS-only port: the first request of a new connection on eth0, answered by the pod's
        RST with no byte of response (the listener closed it unread: no filter chain matched). Held HOLD_S: a
        SYN to the same port refused in that time says the listener itself went away (a sidecar's exit resets
        the connections still in its accept queue the same way), which is no filter chain's doing."""
        if ev.iface != "eth0" or not flow.syn_seen:
            return ()
        remember_hello(ev, flow)
        from_server = (ev.src, ev.sport) == flow.server
        if ev.is_syn and not ev.is_syn_ack:
            flow.notes[_SYN_NOTE] = True
        elif from_server and ev.is_syn_ack:
            flow.notes.pop(_SYN_NOTE, None)
        elif from_server and ev.is_rst and flow.notes.pop(_SYN_NOTE, None):
            server = endpoint(*flow.server)
            self._held = [(t, f) for t, f in self._held if f.flow.server != server]  # the port refuses now
            return ()
        note = flow.notes.get(_NOTE)
        if not from_server:
            if note is None and ev.tls is not None and ev.tls.is_client_hello:
                # the connection speaks TLS: its later bytes are no plaintext (remember_hello keeps the hello)
                flow.notes[_NOTE] = {"hello": True}
            elif note is None and ev.http is not None and ev.http.is_request and not ev.is_rst \
                    and not flow.server_fin:
                flow.notes[_NOTE] = {"request": ev}
            return ()
        if note is None or note.get("done"):
            return ()
        if "hello" in note:
            return self._hello_answered(ev, flow, note)
        if ev.payload_len:
            note["done"] = True  # the server answered: a filter chain took it
            return ()
        if not ev.is_rst:
            return ()
        note["done"] = True
        if not ev.flags._value_ & 0x10:
            # The listener's close with the request unread is an established socket's abort: RST with ACK (real
            # Envoy 1.40, tests/data/envoy-1.40-mesh/mtls-strict). Without ACK no socket of the connection took
            # the segment it answers: conntrack-invalid's, not a filter chain's.
            return ()
        req = note["request"]
        ref = FlowRef.of(flow)
        self._held.append((ev.ts, Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"{ref.client} spoke plaintext HTTP to {ref.server}: the pod reset the connection unread "
                  f"(an mTLS-only port)",
            variant="plaintext to an mTLS-only port",
            flow=ref,
            evidence=(Evidence.of(req, f"plaintext request {req.http.start_line!r} on a new connection"),
                      Evidence.of(ev, f"RST from the pod {1000 * (ev.ts - req.ts):.1f} ms later, no response")),
            envoy_flags=("NR",),
            response_code_details=FILTER_CHAIN_NOT_FOUND,
            explanation=(
                f"The caller {ref.client} sent a plaintext HTTP request to {ref.server} and the pod reset the "
                f"connection without a byte of response. That is the sidecar's inbound listener finding no filter "
                f"chain for a connection that is not TLS: with mTLS STRICT (a PeerAuthentication) the port has TLS "
                f"chains only, the listener closes the connection with the request unread, and the kernel answers "
                f"RST (RFC 9293 section 3.6.1). The sidecar logs it as 0 NR filter_chain_not_found and counts "
                f"no_filter_chain_match; a caller with a sidecar of its own would have spoken mTLS."),
            fixes=(permissive_fix(ref.server and _port(ref.server)),),
            pod=self.ctx.pod,
            ts=ev.ts,
            details={"kind": PLAINTEXT},
        )))
        return ()

    def on_tick(self, now: float) -> Iterable[Finding]:
        due = [f for t, f in self._held if t + HOLD_S <= now]
        self._held = [(t, f) for t, f in self._held if t + HOLD_S > now]
        return due

    def finish(self) -> Iterable[Finding]:
        held, self._held = self._held, []
        return [f for _, f in held]

    def _hello_answered(self, ev: PacketEvent, flow: Flow, note: dict) -> Iterable[Finding]:
        """mTLS to a plaintext port: the server's first answer to the ClientHello is the start of an HTTP/1
        response (a plaintext server reading the hello as a bad request). A ServerHello, an alert, or anything
        else TLS ends the watch: the server speaks TLS."""
        if ev.tls is not None:
            note["done"] = True
            return ()
        if ev.http is None or ev.http.is_request:
            return ()  # a close, or bytes the prefilter did not keep: nothing proven yet
        note["done"] = True
        ref = FlowRef.of(flow)
        hello = hello_of(flow)
        sni = istio_sni(hello.tls.sni) if hello is not None and hello.tls is not None else None
        meant = f" ({sni.host} port {sni.port}, by its SNI)" if sni is not None else ""
        return (Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"{ref.client} spoke mTLS to {ref.server}{meant}, which answered in plaintext: no sidecar there "
                  f"to terminate it (503 UF)",
            variant="mTLS to a plaintext port",
            flow=ref,
            evidence=(*hello_evidence(flow),
                      Evidence.of(ev, f"plaintext response {ev.http.start_line!r} to the ClientHello, "
                                      f"{1000 * (ev.ts - hello.ts):.1f} ms later")),
            envoy_flags=("UF",),
            response_code_details="",
            explanation=(
                f"The caller {ref.client} opened a TLS connection to {ref.server} (a ClientHello{meant}) and the "
                f"server answered with a plaintext HTTP response instead of a ServerHello: nothing there speaks "
                f"TLS. The caller's TLS reads that as WRONG_VERSION_NUMBER (BoringSSL); a caller's sidecar answers "
                f"its client 503 UF (upstream_reset_before_response_started{{remote_connection_failure|TLS_error:"
                f"...WRONG_VERSION_NUMBER...}}) and counts ssl.connection_error on its cluster. A DestinationRule "
                f"tls.mode ISTIO_MUTUAL (or auto mTLS with endpoint metadata that still says tlsMode istio) "
                f"towards a workload without a sidecar does this."),
            fixes=(TLS_DISABLE,),
            pod=self.ctx.pod,
            ts=ev.ts,
            details={"kind": TLS_TO_PLAINTEXT, "from": "packets",
                     **({"sni": hello.tls.sni} if hello is not None and hello.tls and hello.tls.sni else {})},
        ),)

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        kind = kind_of(entry)
        return self._from_logs(kind, entry, None, evidence) if kind else None

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        kind = kind_of(said, story)
        return self._from_logs(kind, said, story, evidence) if kind else None

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        return counter_findings(
            self.id, counters, COUNTERS, what="TLS mismatch: mTLS on one side of a hop, plaintext on the other",
            explanation=("One side of a hop spoke mTLS and the other did not: plaintext callers on a port whose "
                         "PeerAuthentication is STRICT match no filter chain (no_filter_chain_match), and a "
                         "sidecar originating mTLS to a workload without one fails its handshake "
                         "(ssl.connection_error: 503 UF TLS_error)."),
            envoy_flags=("NR", "UF"), fixes=(permissive_fix(None), TLS_DISABLE), pod=self.ctx.pod)

    def _from_logs(self, kind: str, entry: AccessLogEntry, story: StreamStory | None,
                   evidence: Evidence) -> Finding:
        flow = access_log_flow(entry)
        port = _port(flow.server)
        error = (story.tls_error if story else None) or entry.upstream_failure or entry.details or ""
        if kind == PLAINTEXT:
            title = f"A plaintext caller {flow.client} hit an mTLS-only port {flow.server}: no filter chain (0 NR)"
            why = (f"The connection from {flow.client} to {flow.server} matched none of the inbound listener's "
                   f"filter chains: the port takes mTLS only (a PeerAuthentication STRICT) and the caller spoke "
                   f"plaintext"
                   + (" (Envoy's TLS inspector read an HTTP request where a ClientHello belongs)"
                      if "HTTP_REQUEST" in error else "")
                   + ". Envoy closed it unread (the caller saw a reset; through a sidecar of its own, 503 UC) and "
                     "logged 0 NR filter_chain_not_found. The caller has no sidecar, or bypasses it.")
            fixes, flags = (permissive_fix(port),), ("NR",)
        else:
            what = ("answered the sidecar's ClientHello in plaintext (WRONG_VERSION_NUMBER): it has no sidecar to "
                    "terminate mTLS" if kind == TLS_TO_PLAINTEXT else f"failed the TLS handshake ({error})")
            title = (f"The sidecar spoke mTLS to {flow.server}, which {what.split(' (')[0]} (503 UF)"
                     if kind == TLS_TO_PLAINTEXT else f"TLS handshake to {flow.server} failed: {error[:80]} (503 UF)")
            why = (f"The sidecar originated mTLS to {flow.server} for "
                   f"{entry.method + ' ' + entry.path if entry.method else 'a connection'} and the upstream {what}. "
                   f"Envoy answered {entry.code or 503} UF ({entry.details or error}) and counted "
                   f"ssl.connection_error. A DestinationRule tls.mode ISTIO_MUTUAL (or auto mTLS with endpoint "
                   f"metadata that still says tlsMode istio) towards a workload without a sidecar does this.")
            fixes, flags = (TLS_DISABLE,), tuple(f for f in ("UF", "URX") if f in entry.flags) or ("UF",)
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=title,
            variant={PLAINTEXT: "plaintext to an mTLS-only port", TLS_TO_PLAINTEXT: "mTLS to a plaintext port",
                     HANDSHAKE: "TLS handshake failed"}[kind],
            flow=flow,
            evidence=(evidence,),
            envoy_flags=flags,
            response_code_details=entry.details or "",
            explanation=why,
            fixes=fixes,
            pod=self.ctx.pod,
            ts=entry.ts,
            details={"kind": kind, "from": "envoy-log" if story is not None else "access-log",
                     **({"tls_error": error} if kind != PLAINTEXT and error else {})},
        )
