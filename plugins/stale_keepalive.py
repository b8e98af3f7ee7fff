"""``stale-keepalive``: Envoy reuses a pooled upstream connection just as the app closes it.

Envoy watches its idle pooled connections and drops one as soon as the app's FIN arrives, so it never reuses a
connection whose FIN it has read. It loses the race in two ways, both seen with real Envoy on ``lo`` between
127.0.0.6 and the app port:

- the request crosses the app's FIN on the wire (written well under a millisecond after it, or just before);
  the app's socket is gone, so its kernel answers the data with RST;
- the request reaches the app after its idle timer fired but before its close(): the app never reads it, and
  a close with unread data sends RST instead of FIN (RFC 9293 section 3.6.1), so there is no FIN at all, only
  an idle connection, a request on it and an RST.

Envoy answers the caller 503 with response flag UC and details
``upstream_reset_before_response_started{connection_termination}``; the inbound cluster's
``upstream_cx_destroy_remote_with_active_rq`` moves.

Without a capture, Envoy's logs tell it too. Its debug log says it outright (docs/envoy-component-log.md): the
pool gives the request an idle pooled connection (``using existing [fully connected] connection``), and within
the request that connection goes away (``remote close``, or ``disconnect. resetting 1 pending requests`` when
the app's RST came with no FIN), then ``upstream reset: reset reason: connection termination``. The access log
alone says 503 UC ``{connection_termination}``: the race is then the likely cause, not a proven one (an app
that crashes or closes mid-request logs the same), and the finding says so, and what next: where to look in the
captures of the pod the run holds over the request, and to capture only those it lacks (``next_steps``).

The same race on the downstream hop, on ``eth0``: this pod's sidecar closes an idle downstream connection on its
own idle timeout (the HCM's ``idle_timeout``; a Sidecar's ``inboundConnectionPool``), and the caller (a gateway,
another sidecar) writes its next request on it after the FIN: this pod's kernel answers RST, and the caller's
proxy logs 503 UC. The fix is on the caller's side: its pool's idle timeout below this pod's.

Over mTLS (a caller's sidecar) the caller's request is an encrypted record the capture does not keep; what is kept
tells the same close (docs/lab-envoy.md, the lab's downstream-idle round through a caller sidecar): the
connection's ClientHello (its SNI names the service and port), then, after its last kept packet, this pod's
sidecar ending the TLS session (close_notify, an encrypted 19-byte alert record, RFC 8446 section 6.1) and its
kernel's RST: a close() with the caller's bytes unread, or the caller's bytes after the close, sends RST (RFC 9293
section 3.6.1). Envoy 1.40 there: the HCM's idle timeout, its drain (drain_timeout, 5 s) and delayed close (1 s,
during which it reads nothing), then SSL shutdown and close with the caller's request unread. When the caller's
own close_notify answers the sidecar's before that RST (seen under load), the packets kept are those of a clean
close answered quickly: only the ACK of the unanswered request, which the prefilter drops, told them apart, so the
server's capture alone names nothing and the caller's 503 UC does (tests/data/envoy-1.40-mesh-loaded).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings, flag_signal
from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import CLOSE_NOTIFY, EnvoyCountersEvent, PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix, render
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.mtls import hello_evidence, hello_of, remember_hello
from kubectl_meshdoctor.core.remedies import destination_rule_pool, duration_below
from kubectl_meshdoctor.core.unseen import captured, missing_of, next_look
from kubectl_meshdoctor.core.upstream_pod import LOGGERS as _LOGGERS, unknown_upstream
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import BEFORE_RESPONSE, parse_reset_details
from kubectl_meshdoctor.envoy.stats import scoped
from kubectl_meshdoctor.envoy.story import StreamStory

RACE_WINDOW_S = 0.05  # a request this much before the FIN crossed it on the wire: the same race
# A request this long after the connection's last response found it idle in Envoy's pool: pipelined or
# back-to-back requests (a busy connection) are not a keep-alive reuse.
MIN_IDLE_S = 0.05
# The app's close() follows its idle timer closely (the lab widens the gap to 0.4 s to hit it on purpose); an RST
# that comes later than this after the request is an app that read the request and then aborted, not the race.
MAX_CLOSE_AFTER_REQUEST_S = 0.5
_NOTE = "stale-keepalive"
_DETAILS = "upstream_reset_before_response_started{connection_termination}"
_UPSTREAM_NEXT = ("Capture next: the upstream pod (kubectl meshdoctor watch pod/<pod>) or the sidecar's debug log "
                  "(--envoy-debug).")

# The downstream hop: the caller's pool must let go first. Its side, so no field of this pod is set.
CALLER_FIXES = (Fix(
    "caller-idle-timeout", "let the caller drop idle pooled connections before this pod's sidecar closes them",
    "the whole mesh; this pod's sidecar keeps its idle timeout",
    "a DestinationRule in the caller's namespace (or the caller's own client setting, for a caller outside "
    "the mesh): its connections to this service are reopened after idle spells",
    yaml=destination_rule_pool("http", "idleTimeout", "<below this pod's inbound idle timeout>",
                               "in the caller's namespace; this pod's is its Sidecar's inboundConnectionPool")),)

IDLE_TIMEOUT_FIELD = "DestinationRule.trafficPolicy.connectionPool.http.idleTimeout"
# Retries hide the 503 from the caller but the race still happens (the RST is on the wire): a note, not a fix.
RETRY_NOTE = ("# Retries (a VirtualService with retries.retryOn: reset,connect-failure) hide the 503s that still\n"
              "# happen from the callers; they do not stop the race.")


def next_steps(pod: str, given: tuple[str, ...], leg: str = "", request: str = "the request") -> tuple[str, str]:
    """A 503 UC whose cause the evidence does not show: what to look at in the captures ``given`` of this pod's lo
    and eth0 (core/unseen.py; ``leg``: the line's upstream connection), to capture ``pod``'s others, the debug
    log: the explanation's last sentences and the remediation (no fix: each cause has its own)."""
    look = {"lo": f"on lo, the app's FIN or RST on the sidecar's connection to it{leg} under {request}",
            "eth0": "on eth0, an RST without ACK from the app's port (conntrack-invalid)"}
    capture = (f"{pod}'s {missing_of(given)}" if given else "the upstream pod") if missing_of(given) else ""
    return (next_look(given, look, f"{pod}'s {{}} (kubectl meshdoctor watch pod/<pod>: the FIN or RST under {request}, "
                                   "and from which port)", _LOGGERS),
            "# none yet: the cause is not in this evidence" + (f". Capture {capture} (kubectl meshdoctor watch pod/"
            "<pod>)\n# or" if capture else ", this pod's lo and eth0 captures included.\n# Capture")
            + " this sidecar's debug log (--envoy-debug); the finding they give prints its fix.")


def keepalive_timeout(response: PacketEvent | None) -> float | None:
    """The keep-alive timeout (seconds) the app announced on ``response``, from its ``Keep-Alive: timeout=N``
    header (as Node.js, Apache and others send; draft-thomson-hybi-http-timeout section 2), else None."""
    msg = response.http if response is not None else None
    params = [p.strip().partition("=") for name, value in (msg.headers if msg is not None else ())
              if name.lower() == "keep-alive" for p in value.split(",")]
    for key, _, num in params:
        if key.strip().lower() == "timeout":
            try:
                seconds = float(num.strip())
            except ValueError:
                return None
            return seconds if seconds > 0 else None
    return None


def fixes(keepalive_s: float | None, seen_idle: bool = False, upstream: bool = False) -> tuple[Fix, ...]:
    """The fix of the race with an app whose keep-alive timeout is ``keepalive_s`` s (None: unknown, a placeholder);
    ``seen_idle``: it is how long the connection sat idle before being closed (Envoy's debug log); ``upstream``: a
    caller sidecar's race with the next pod (its sidecar's idle timeout, or an app outside the mesh)."""
    peer, hop = ("the upstream", "an mTLS handshake") if upstream else ("the app", "a handshake on the pod's loopback")
    if keepalive_s is None:
        value, comment, settings = f"<below {peer}'s keep-alive timeout>", "e.g. app 60 s -> 48s", ()
    else:
        value = duration_below(keepalive_s)
        comment = (f"below the {keepalive_s:.3g} s {peer} let it sit idle before closing it" if seen_idle
                   else f"below {peer}'s keep-alive timeout, {keepalive_s:g} s")
        settings = ((IDLE_TIMEOUT_FIELD, value),)
    return (Fix(
        "idle-timeout", f"let Envoy close idle pooled connections to {peer} before {peer} does",
        f"the whole mesh and {peer} as they are; Envoy never reuses a connection {peer} may be closing",
        f"Envoy opens a new connection to {peer} after every idle spell longer than the timeout ({hop})",
        yaml=destination_rule_pool("http", "idleTimeout", value, comment), settings=settings),)


def _relative_to_fin(req: PacketEvent, fin: PacketEvent) -> tuple[float, str]:
    """The request's time after the FIN in milliseconds (negative: before it, the two crossing) and the words
    for it: ``3.2 ms after`` or ``0.4 ms before (crossing)``."""
    gap_ms = (req.ts - fin.ts) * 1000
    return gap_ms, f"{gap_ms:.1f} ms after" if gap_ms >= 0 else f"{-gap_ms:.1f} ms before (crossing)"


COUNTERS = (CounterSignal("cluster", "upstream_cx_destroy_remote_with_active_rq",
                          "connections the upstream closed with a request on them"),
            flag_signal("UC", "requests the upstream's connection closed under: 503 UC"))


# A request the keep-alive race kills fails as soon as it goes out: the app was already closing the connection
# (in the lab, 0.2 s after; a crossing FIN, under a millisecond). One that ran longer was cut by something else:
# a timeout of the app's or of a proxy between (istio/istio#51619: 120 s), not a stale pooled connection.
RACE_WITHIN_MS = 2000


def _connection_termination(entry: AccessLogEntry) -> bool:
    """A 503 UC whose details (when the format has them) say the upstream connection went away under it before
    any response, soon enough after the request to be the race (RACE_WITHIN_MS). Not a close after the response
    began (a websocket's 101, a body cut short: the app had read the request), and not retries spent (URX: every
    attempt's connection closed under it, the last ones opened for it: an app that resets requests)."""
    if "UC" not in entry.flags or "URX" in entry.flags or entry.duration_ms > RACE_WITHIN_MS:
        return False
    if entry.code not in (0, 503):  # 0: a line that names no code (the debug log's own reading)
        return False
    reset = parse_reset_details(entry.details)
    return entry.details is None or (reset is not None and reset.flag == "UC" and reset.phase == BEFORE_RESPONSE)


class _Note:
    """What this detector keeps of one flow, in the flow table's notes (bounded with it): the server's first FIN,
    the first request the server has not answered (the one a reset would race), the server's last data segment
    and the last that carried an HTTP head (its Keep-Alive header), and whether the flow was reported already."""

    __slots__ = ("fin", "last_request", "last_response", "last_head", "reported", "last_ts", "idle_before_fin",
                 "last_kept", "alert", "alert_after", "caller_closing")

    def __init__(self) -> None:
        self.fin: PacketEvent | None = None
        self.last_ts: float | None = None  # the flow's latest packet before the server's FIN
        self.idle_before_fin: float | None = None  # seconds the flow was quiet before that FIN
        self.last_request: PacketEvent | None = None
        self.last_response: PacketEvent | None = None
        self.last_head: PacketEvent | None = None
        self.reported = False
        self.last_kept: PacketEvent | None = None  # the flow's latest packet before the server's TLS alert
        self.alert: PacketEvent | None = None  # the server's first alert (close_notify) on an mTLS connection
        self.alert_after: PacketEvent | None = None  # the packet kept last before that alert
        self.caller_closing = False  # the caller sent its own FIN, RST or alert first: it was closing, not reusing


class StaleKeepalive(Detector):
    id = "stale-keepalive"
    packet_ifaces = frozenset({"lo", "eth0"})
    unseen_without = {"eth0": "callers reusing closed connections", "lo": "the app closing pooled connections"}
    unseen_rank = 60
    # What real Envoy moves for this class (the inbound cluster of the app port).
    envoy_counters = ("upstream_cx_destroy_remote_with_active_rq",)
    envoy_loggers = ("pool", "connection", "client", "router", "http")
    # TcpExtTCPAbortOnClose: a close() with unread data, answered by RST: the app's side of the race.
    kernel_counters = ("TcpEstabResets", "TcpOutRsts", "TcpExtTCPAbortOnClose")

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface not in ("lo", "eth0"):
            return ()
        from_server = (ev.src, ev.sport) == flow.server
        # Per-flow notes live and die with the flow in the bounded flow table.
        note = flow.notes.get(_NOTE)
        if note is None:  # not setdefault: that builds the empty note for every packet
            note = flow.notes[_NOTE] = _Note()
        if note.reported:
            return ()
        if ev.iface == "eth0":
            remember_hello(ev, flow)
            if from_server and note.alert is not None and ev.is_rst:
                return self._mtls_close(ev, flow, note)
            self._watch_tls_close(ev, flow, note, from_server)
        if from_server:
            if ev.is_rst:
                return self._on_reset(ev, flow, note)
            if ev.is_fin and note.fin is None:
                note.fin = ev
                note.idle_before_fin = ev.ts - note.last_ts if note.last_ts is not None else None
            # The plaintext forms read HTTP/1 payloads only: a TLS record (now kept for the mTLS form) is neither
            # a request on a pooled connection nor its answer.
            if ev.payload_len and ev.tls is None:
                note.last_request = None  # answered: an earlier request was not in the race
                note.last_response = ev
                if ev.http is not None:
                    note.last_head = ev  # its headers (a long response's later segments have none)
        elif ev.payload_len and ev.tls is None and not ev.is_rst and note.last_request is None:
            note.last_request = ev  # the first unanswered request is the one written on the stale connection
        if note.fin is None:
            note.last_ts = ev.ts
        return ()

    @staticmethod
    def _watch_tls_close(ev: PacketEvent, flow: Flow, note: _Note, from_server: bool) -> None:
        """On an mTLS connection (its ClientHello seen), the server's first alert: TLS 1.3's encrypted alert
        record, or a plaintext close_notify (TLS 1.2); and whether the caller closed first."""
        tls = ev.tls
        closing = tls is not None and (tls.is_encrypted_alert
                                       or (tls.alert is not None and tls.alert[1] == CLOSE_NOTIFY))
        if not from_server:
            if closing or ev.is_fin or ev.is_rst:
                note.caller_closing = True
        elif closing and note.alert is None and not note.caller_closing and hello_of(flow) is not None:
            note.alert, note.alert_after = ev, note.last_kept
        elif note.alert is not None and ev.payload_len and not closing:
            note.caller_closing = True  # the server sent more after its alert: not the close seen here
        if note.alert is None:
            note.last_kept = ev

    def _mtls_close(self, rst: PacketEvent, flow: Flow, note: _Note) -> Iterable[Finding]:
        """This pod's sidecar ended an mTLS connection (its alert) and its kernel reset it: the caller's bytes
        were unread at the close or came after it. Not when the caller closed first, nor when the connection was
        busy (a kept packet less than MIN_IDLE_S before the alert)."""
        alert, last = note.alert, note.alert_after
        if note.caller_closing or alert is None or last is None:
            return ()
        ref = FlowRef.of(flow)
        quiet_s = alert.ts - last.ts
        if quiet_s < MIN_IDLE_S:
            return ()
        after_ms = (rst.ts - alert.ts) * 1000
        fin = note.fin if note.fin is not None and note.fin.ts >= alert.ts else None
        how = (f"{after_ms:.1f} ms after its FIN: the caller wrote on the connection after the server closed it"
               if fin is not None else
               f"{after_ms:.1f} ms later, with no FIN: the sidecar closed the socket with the caller's bytes unread")
        last_what = (f"the last packet kept before the close (application data is not captured), "
                     f"{quiet_s:.3f} s before it")
        if last.tls is not None:
            last_what = f"{last.tls.short()}: {last_what}"
        evidence = hello_evidence(flow)
        if not any(e.frame == last.frame for e in evidence):
            evidence += (Evidence.of(last, last_what),)
        evidence += (Evidence.of(alert, f"close_notify from the server's sidecar: an encrypted alert record "
                                        f"({alert.tls.length if alert.tls else 0} bytes), TLS shutdown",
                                 record="close_notify"),)
        if fin is not None:
            evidence += (Evidence.of(fin, "FIN from the server's sidecar"),)
        evidence += (Evidence.of(rst, f"RST from the server {how}"),)
        return (self._finding(
            rst, flow, note, evidence=evidence,
            explanation=(
                f"The server pod's sidecar ({ref.server}) ended the mTLS session with its caller ({ref.client}): "
                f"close_notify (TLS 1.3 encrypts alerts; a 19-byte record is one, RFC 8446 sections 5.2 and "
                f"6.1), then its kernel reset the connection {how}. A close with unread data, or data arriving "
                f"after the close, is answered with RST (RFC 9293 section 3.6.1): the caller had written on a "
                f"connection the server's sidecar was closing, {quiet_s:.3f} s after the last packet kept of it. "
                f"Most often that is the sidecar's idle timeout (the HCM's idle_timeout, then its drain and "
                f"delayed close, during which Envoy reads nothing) racing the caller's pool, which still held the connection as "
                f"idle. The caller's sidecar answers its client 503 UC (upstream_reset_before_response_started"
                f"{{connection_termination}} in the caller's access log, on this four-tuple); the server's sidecar "
                f"logs nothing: it read no request. The caller keeps idle connections longer than the server's "
                f"sidecar does."),
            details={"hop": "downstream", "tls": True, "quiet_before_close_s": round(quiet_s, 6),
                     "reset_after_alert_ms": round(after_ms, 3)},
            fixes=CALLER_FIXES,
            title=f"Caller {ref.client} wrote on an mTLS connection the server's sidecar was closing: "
                  f"close_notify, then {ref.server} reset it"),)

    def _on_reset(self, rst: PacketEvent, flow: Flow, note: _Note) -> Iterable[Finding]:
        fin, req, last = note.fin, note.last_request, note.last_response
        if req is None:
            return ()
        if fin is not None and req.ts >= fin.ts - RACE_WINDOW_S:
            if flow.iface == "eth0":
                # An idle close follows a served request and a quiet spell. A sidecar that FINs a connection it
                # has just accepted (its upstream connect failed: 127.0.0.6 port exhaustion, a refused app on a
                # TCP port) closed it for another hop's failure; the caller's bytes meeting the RST are no race.
                if note.last_response is None or (note.idle_before_fin or 0.0) < MIN_IDLE_S:
                    return ()
                return (self._downstream_after_fin(rst, flow, note, fin, req),)
            return (self._crossing_fin(rst, flow, note, fin, req),)
        if flow.iface != "lo":
            return ()  # an unread request at close is the app's race, on lo
        if (fin is None and last is not None and req.ts - last.ts >= MIN_IDLE_S
                and rst.ts - req.ts <= MAX_CLOSE_AFTER_REQUEST_S):
            return (self._unread_on_close(rst, flow, note, last, req),)
        return ()

    def _crossing_fin(self, rst: PacketEvent, flow: Flow, note: _Note, fin: PacketEvent,
                      req: PacketEvent) -> Finding:
        gap_ms, when = _relative_to_fin(req, fin)
        ref = FlowRef.of(flow)
        return self._finding(
            rst, flow, note,
            evidence=(Evidence.of(fin, "FIN from the app (idle keep-alive close)"),
                      Evidence.of(req, f"request from the sidecar, {when} the FIN"),
                      Evidence.of(rst, "RST from the app: the socket is gone")),
            explanation=(
                f"The app at {ref.server} closed this pooled connection (FIN) and the sidecar ({ref.client}) wrote "
                f"the next request on it {when} that FIN, before Envoy had read the FIN and dropped the connection "
                f"from its pool; the app's kernel answered with RST because no socket is left to read it (RFC 9293 "
                f"section 3.6.1)."),
            details={"request_after_fin_ms": round(gap_ms, 3)},
            fixes=fixes(keepalive_timeout(note.last_head) or _idle_until(note.last_response, fin)))

    def _downstream_after_fin(self, rst: PacketEvent, flow: Flow, note: _Note, fin: PacketEvent,
                              req: PacketEvent) -> Finding:
        gap_ms, when = _relative_to_fin(req, fin)
        ref = FlowRef.of(flow)
        return self._finding(
            rst, flow, note,
            evidence=(*hello_evidence(flow), Evidence.of(fin, "FIN from this pod's sidecar (its idle timeout)"),
                      Evidence.of(req, f"request from the caller, {when} the FIN"),
                      Evidence.of(rst, "RST from this pod: the sidecar's socket is gone")),
            explanation=(
                f"This pod's sidecar ({ref.server}) closed an idle downstream connection (FIN) and the caller "
                f"({ref.client}) wrote its next request on it {when} that FIN, still taking it for a pooled "
                f"connection; this pod's kernel answered RST (RFC 9293 section 3.6.1). The caller's proxy answers "
                f"its client 503 with response flag UC (upstream_reset_before_response_started"
                f"{{connection_termination}} in the caller's access log; this pod's sidecar logs nothing: it saw no "
                f"request). The caller keeps idle connections longer than this pod's sidecar does."),
            details={"request_after_fin_ms": round(gap_ms, 3), "hop": "downstream"},
            fixes=CALLER_FIXES,
            title=f"Caller {ref.client} reused a connection this pod's sidecar had closed: {ref.server} reset it")

    def _unread_on_close(self, rst: PacketEvent, flow: Flow, note: _Note, last: PacketEvent,
                         req: PacketEvent) -> Finding:
        idle_s = req.ts - last.ts
        wait_ms = (rst.ts - req.ts) * 1000
        ref = FlowRef.of(flow)
        return self._finding(
            rst, flow, note,
            evidence=(Evidence.of(last, f"last response from the app, then {idle_s:.3f} s idle in the pool"),
                      Evidence.of(req, f"request from the sidecar on the idle connection, {idle_s:.3f} s later"),
                      Evidence.of(rst, f"RST from the app {wait_ms:.1f} ms later, with no FIN: the request was "
                                       f"never read")),
            explanation=(
                f"The sidecar ({ref.client}) reused this pooled connection after {idle_s:.3f} s idle, and the app at "
                f"{ref.server} reset it {wait_ms:.1f} ms later without answering and without a FIN: the request "
                f"arrived after the app's keep-alive idle timer had fired but before its close(), so the app never "
                f"read it, and a close with unread data sends RST instead of FIN (RFC 9293 section 3.6.1); the pod's "
                f"kernel counts such closes as TcpExtTCPAbortOnClose. Envoy had no FIN to tell it the connection "
                f"was closing. (An app that resets connections on purpose, SO_LINGER 0, looks the same on the "
                f"wire.)"),
            details={"idle_before_reuse_s": round(idle_s, 6), "reset_after_request_ms": round(wait_ms, 3)},
            fixes=fixes(keepalive_timeout(note.last_head)))

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        # tcp_proxy clusters count every close of a live TCP connection here (a TCP "request" is the connection
        # itself): only clusters that spoke HTTP to the upstream are the race.
        http = {c for stat in ("upstream_cx_http1_total", "upstream_cx_http2_total", "upstream_cx_http3_total")
                for c in scoped(counters.stats, "cluster", stat)}
        found = [f for f in counter_findings(
            self.id, counters, COUNTERS,
            what="Pooled connections closed under requests (503 UC), cause not in the counters",
            explanation=("The upstream closed pooled connections while a request was on them: Envoy answers each "
                         "503 UC (connection_termination). The counters cannot tell why: an app closing idle "
                         "keep-alive connections as Envoy reuses them (the keep-alive race), an app aborting "
                         "mid-request, or the upstream pod's kernel resetting the connection (a conntrack-INVALID "
                         f"segment that bypassed Istio's REDIRECT: conntrack-invalid). {_UPSTREAM_NEXT}"),
            envoy_flags=("UC",), remediation=next_steps("the upstream pod", ())[1], pod=self.ctx.pod)
            if f.flow.server in http or f.flow.server == "istio_requests_total"]
        # An inbound cluster's upstream is this pod's app: the captures given of it are this run's own.
        given = captured(self.ctx.by_iface)
        tail, remedy = next_steps("this pod", given, request="a request")
        return [replace(f, explanation=f.explanation.replace(_UPSTREAM_NEXT, tail), remediation=remedy)
                if given and f.flow.server.startswith("inbound|") else f for f in found]

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        if not _connection_termination(entry):
            return None
        return self._from_logs(entry, None, evidence)

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        said = entry if entry is not None else story.entry()
        if not _connection_termination(said) or story.upstream_reused is False:
            return None  # a connection opened for this very request and closed under it is no pooled reuse
        if story.upstream_shared:
            return None  # other requests were in flight on it (HTTP/2): a busy connection is no idle one closed
        return self._from_logs(said, story, evidence)

    def _from_logs(self, entry: AccessLogEntry, story: StreamStory | None, evidence: Evidence) -> Finding:
        flow = access_log_flow(entry)
        outbound = (entry.upstream_cluster or "").startswith("outbound|")
        request = f"{entry.method} {entry.path}" if entry.method else "a request"
        proven = story is not None and story.upstream_reused and story.upstream_closed
        idle = story.upstream_idle_s if story is not None else None
        who = "the upstream (another sidecar, or an app outside the mesh)" if outbound else "the app"
        if proven:
            idle_text = f" after {idle:.3f} s idle" if idle is not None else ""
            closed = (f" {1000 * story.upstream_closed_after_s:.1f} ms after the request went out"
                      if story.upstream_closed_after_s is not None else " while the request was on it")
            how = ("a remote close (its FIN)" if story.upstream_remote_close
                   else "a reset with no FIN (the request was never read)")
            why = (f"Envoy's debug log shows the pool giving {request} a pooled connection (C"
                   f"{story.upstream_connection}) it had held{idle_text}, and {who} closing that connection"
                   f"{closed}: {how}. Envoy then reset the request: upstream reset, connection termination. That "
                   f"is the keep-alive race: {who} closes idle connections sooner than Envoy's pool lets go of them.")
        else:
            # Nothing here shows a pooled connection closed by its peer, so no cause is named (issue 33): a
            # conntrack-INVALID segment reset by the upstream pod's kernel logs the same line, and its fix is not
            # the keep-alive race's.
            upstream_pod = "the upstream pod" if outbound else "this pod"
            why = (f"Envoy's access log says the connection to {who} went away while {request} was on it (503 UC, "
                   f"{entry.details or 'connection termination'}). The access log cannot tell why; it is logged "
                   f"alike for a pooled connection {who} closed as the request went out (the keep-alive race), "
                   f"for an app that crashed or aborted mid-request, and for a reset by {upstream_pod}'s kernel "
                   f"when a conntrack-INVALID segment bypassed Istio's REDIRECT (conntrack-invalid: an RST without "
                   f"ACK from the app's port). ")
            # The upstream pod's captures are not this pipeline's: a run that holds it says so (core/upstream_pod.py)
            tail, remedy = unknown_upstream() if outbound else next_steps(upstream_pod, captured(
                self.ctx.by_iface, entry.ts, entry.ts + entry.duration_ms / 1000), f" ({entry.upstream_local} to "
                f"{entry.upstream_host})" if entry.upstream_local and entry.upstream_host else "")
            why += tail
        keepalive = idle if proven and idle is not None and idle > 0 else None
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=(f"Envoy reused an idle pooled connection to {flow.server} that {who.split(' (')[0]} was closing "
                   f"(503 UC)" if proven else
                   f"{flow.server}'s connection closed under {request} (503 UC): cause not in this evidence"),
            variant=("request on a connection the app was closing" if not outbound
                     else "request on a connection the upstream was closing") if proven
            else "connection closed under the request (cause not in this evidence)",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=("UC",),
            response_code_details=entry.details or "",
            explanation=why + (" The caller's sidecar retries such 503s by default (Istio's retry on reset): the "
                               "user sees them when the retries are spent." if outbound else ""),
            fixes=fixes(keepalive, True, outbound) if proven else (),
            remediation=render(fixes(keepalive, True, outbound), RETRY_NOTE) if proven else remedy,
            pod=self.ctx.pod,
            ts=entry.ts,
            details={"from": "envoy-log" if story is not None else "access-log", "proven": bool(proven),
                     **({"idle_before_reuse_s": round(idle, 6)} if idle is not None else {})},
        )

    def _finding(self, rst: PacketEvent, flow: Flow, note: _Note, *, evidence: tuple[Evidence, ...],
                 explanation: str, details: dict, remediation: str = "", title: str | None = None,
                 fixes: tuple[Fix, ...] = ()) -> Finding:
        note.reported = True
        ref = FlowRef.of(flow)
        downstream = flow.iface == "eth0"
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=title or f"Request on a keep-alive connection the app was closing: {ref.server} reset it",
            variant="caller reused a connection the sidecar closed" if downstream
            else "request on a connection the app was closing",
            flow=ref, evidence=evidence, envoy_flags=("UC",),
            explanation=explanation if downstream else (
                f"{explanation} Envoy answers the caller 503 with response flag UC and details {_DETAILS}, and "
                f"counts upstream_cx_destroy_remote_with_active_rq on the inbound cluster. The app's keep-alive "
                f"timeout is shorter than Envoy's idle timeout for this cluster (1 h by default)."),
            remediation=remediation or render(fixes, RETRY_NOTE),
            fixes=fixes,
            pod=self.ctx.pod, ts=rst.ts, response_code_details=_DETAILS,
            details=details,
        )


def _idle_until(last: PacketEvent | None, fin: PacketEvent) -> float | None:
    """How long the connection sat idle before the app's FIN: the app's keep-alive timeout, seen on the wire."""
    return fin.ts - last.ts if last is not None and fin.ts > last.ts else None
