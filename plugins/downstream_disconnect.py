"""``downstream-disconnect``: the caller closed its connection before the sidecar's response was sent.

Envoy logs such a request with response code 0 (nothing was sent), response flag DC and details
``downstream_remote_disconnect``, and resets the upstream request, so the app's work is thrown away (Envoy docs:
response code details; access log %RESPONSE_FLAGS%). The usual cause is a caller timeout shorter than the time
the app takes: the caller gives up first, and, retrying, adds load to an app that is already slow. On eth0 it
is the caller's FIN (or RST) after a request and before any response to it. A caller that half-closes its
connection once its request is out (shutdown(SHUT_WR)) is dropped the same way, at once: Envoy's HTTP
connection manager takes the FIN for a close (seen with Envoy 1.40 in the lab).
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings, flag_signal
from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import EnvoyCountersEvent, PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix, render
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.remedies import virtual_service_timeout
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry

DETAILS = "downstream_remote_disconnect"
_NOTE = "downstream-disconnect"
# A FIN this soon after the request is a client that half-closes (shutdown of its write side) once it has sent
# it, not one whose timeout ran out: Envoy's HTTP connection manager takes a downstream half-close as a close.
HALF_CLOSE_MS = 50
# Below this a route timeout "shorter than the caller's" would cut ordinary requests short: no such fix then.
MIN_ROUTE_TIMEOUT_MS = 2000
# How the caller left: a FIN within HALF_CLOSE_MS of its request (a half-close); later, or an RST (it gave up:
# its timeout, or an abort); a FIN after a body whose segments are not read (an upload: either); an access-log
# line with no method or path (a request never whole).
KINDS = ("half-close", "gave-up", "upload", "incomplete")

# The caller's side, so no field of this pod is set: the lab applies them as the change their names stand for.
HALF_CLOSE_FIX = Fix(
    "caller-no-half-close", "let the caller keep its write side open until the response has come",
    "the whole mesh; the request reaches the app and its answer the caller",
    "a change in the caller: no shutdown(SHUT_WR) after the request (every HTTP/1.1 client keeps it open); a raw "
    "TCP client that must half-close belongs on a TCP port (a Service port named tcp-*, appProtocol: tcp), "
    "where Envoy proxies the half-close instead of parsing HTTP",
    yaml="# In the caller: send the request and read the response before closing its side of the connection;\n"
         "# Envoy's HTTP connection manager takes a downstream half-close (FIN) for a disconnect and drops the "
         "request.")


def fixes(waited_ms: int, kind: str = "") -> tuple[Fix, ...]:
    """The fixes of a caller that closed ``waited_ms`` after its request began. ``kind`` (see KINDS; by default
    from the time alone, as for an access-log line): a half-close gets the half-close fix, a caller that gave
    up the timeout fix, an upload closed at an unknown point both; a request never whole, none."""
    kind = kind or ("half-close" if waited_ms < HALF_CLOSE_MS else "gave-up")
    timeout = Fix(
        "caller-timeout", f"let the caller wait longer than the app takes (it gave up after {waited_ms} ms here)",
        "the whole mesh; the app's answer reaches the caller instead of being thrown away",
        "the caller waits longer for a slow app; how long the app takes for this request is not on the wire "
        "(Envoy reset it when the caller left): take its slowest answer, and keep the caller's timeout above the "
        "route's so that the mesh answers first, with a 504 UT, when the app is stuck",
        yaml="# In the caller: its HTTP client's request timeout (its code or its configuration), above the app's "
             "slowest\n# answer.")
    return {"half-close": (HALF_CLOSE_FIX,), "gave-up": (timeout,), "upload": (timeout, HALF_CLOSE_FIX),
            "incomplete": ()}[kind]


def note(waited_ms: int, kind: str = "") -> str:
    """What the finding says after its fixes. A route timeout below a long caller timeout makes the mesh answer
    first (a 504 UT instead of a silent DC): the failure stays, so it is a note, not a fix."""
    kind = kind or ("half-close" if waited_ms < HALF_CLOSE_MS else "gave-up")
    if kind == "half-close":
        return ""
    if kind == "incomplete":
        return ("# No fix to print: the caller closed before its request was whole (the line has no method or "
                "path): a TCP\n# health check, a port scan, or a client that gave up while sending. If it "
                "recurs, capture eth0 to see which.")
    mesh = ("# A caller in the mesh whose own sidecar gave up has the route's timeout there (a VirtualService "
            "http.timeout\n# in the caller's namespace): raise that one above the app's slowest answer.")
    if waited_ms < MIN_ROUTE_TIMEOUT_MS:
        return mesh + "\n# A route timeout below a caller's timeout that short would cut ordinary requests short."
    return (mesh + "\n# Or let the route answer first with a clear 504 (UT) instead of a silent DC, by giving it a "
            "timeout shorter\n# than the caller's (the request still fails, but the caller and the app's sidecar "
            "both log why):\n" + virtual_service_timeout(f"{waited_ms * 4 // 5}ms", comment=f"below the caller's "
                                                                                        f"own timeout ({waited_ms} "
                                                                                        f"ms here)"))


class DownstreamDisconnect(Detector):
    id = "downstream-disconnect"
    packet_ifaces = frozenset({"eth0"})
    packet_kinds = frozenset({"http", "fin", "rst"})
    envoy_counters = ("upstream_rq_rx_reset", "upstream_rq_tx_reset")

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface != "eth0":
            return ()
        from_client = (ev.src, ev.sport) == flow.client
        if ev.http is not None:
            if ev.http.is_request and from_client:
                flow.notes[_NOTE] = ev  # waiting for its response
            elif not from_client and not (ev.http.status is not None and 100 <= ev.http.status < 200):
                flow.notes.pop(_NOTE, None)  # answered (a 100 Continue or 103 is not the answer)
            if not (from_client and ev.http.is_request and (ev.is_fin or ev.is_rst)):
                return ()
            # else the request and the caller's FIN in one segment (a corked or coalesced send): a half-close
        request = flow.notes.get(_NOTE)
        if request is None or not from_client or not (ev.is_fin or ev.is_rst):
            return ()
        del flow.notes[_NOTE]
        if flow.server_fin and ev is not request:
            # the pod closed first, its response never written (a sidecar's exit, an idle close racing the
            # request): the caller's FIN answers that close, it did not give up (real Envoy 1.40's exit,
            # tests/data/lab-shutdown-plain frames 581 and 583)
            return ()
        waited_ms = int(round((ev.ts - request.ts) * 1000))
        what = "FIN" if ev.is_fin else "RST"
        # Bytes the caller sent after the request's first segment (a body): their segments are not read here,
        # so when the FIN came after the last of them is not known.
        sent_after = (ev.seq - request.seq - request.payload_len) % 2**32 if ev is not request else 0
        if ev.is_rst:
            kind = "gave-up"  # an abort (its timeout, SO_LINGER 0, a killed process), never a half-close
        elif waited_ms < HALF_CLOSE_MS or ev.payload_len:  # a FIN on the request's last bytes: sent with them
            kind = "half-close"
        else:
            kind = "upload" if 0 < sent_after < 2**31 else "gave-up"
        evidence = ((Evidence.of(ev, f"request from the caller with its {what} in the same segment"),)
                    if ev is request else
                    (Evidence.of(request, "request from the caller"),
                     Evidence.of(ev, f"{what} from the caller {waited_ms} ms later, no response yet")))
        return (self._finding(FlowRef.of(flow), evidence, request.http.start_line.rsplit(" ", 1)[0], waited_ms, 0,
                              None, ev.ts, kind=kind, sent_after=sent_after),)

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        return counter_findings(
            self.id, counters, (CounterSignal("http", "downstream_cx_destroy_remote_active_rq",
                                              "caller connections closed with a request in flight"),
                                flag_signal("DC", "requests whose caller went away: 0 DC")),
            what="Callers gave up before the response (0 DC)",
            explanation=("Callers closed their connection while their request was in flight: their own timeout "
                         "is shorter than the app takes, or they half-close after sending. Envoy logs 0 DC "
                         "(downstream_remote_disconnect); the access log's durations tell which."),
            envoy_flags=("DC",), severity=Severity.WARNING, pod=self.ctx.pod)

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        if "DC" not in entry.flags and entry.details != DETAILS:
            return None
        request = f"{entry.method} {entry.path}" if entry.method else "a request not yet whole"
        kind = "" if entry.method else "incomplete"
        return self._finding(access_log_flow(entry), (evidence,), request, entry.duration_ms, entry.code,
                             entry.upstream_service_time, entry.ts, entry.details or DETAILS, kind=kind)

    def _finding(self, flow: FlowRef, evidence: tuple[Evidence, ...], request: str, waited_ms: int, code: int,
                 service_time: int | None, ts: float, details: str = DETAILS, kind: str = "",
                 sent_after: int = 0) -> Finding:
        kind = kind or ("half-close" if waited_ms < HALF_CLOSE_MS else "gave-up")
        waited = (f"the app had answered after {service_time} ms but the response was not yet sent"
                  if service_time is not None else "the app had not answered yet")
        why = {
            "half-close": f"The caller closed its side as soon as its request was out (its FIN within "
                          f"{HALF_CLOSE_MS} ms of it, or on its last segment): not a timeout but a half-close, "
                          f"which Envoy's HTTP connection manager does not keep open for the response.",
            "gave-up": "The caller gave up first: its own timeout is shorter than the app takes. The caller saw a "
                       "timeout or a closed connection, not an HTTP status, so nothing in the caller's sidecar log "
                       "explains it but a matching DC or UC there.",
            "upload": f"The caller sent {sent_after} bytes more after the request's first segment (a body); the "
                      f"time counts from that segment, and when the FIN came after the body's end is not known "
                      f"here: a caller that gave up, or one that half-closed once its upload was out.",
            "incomplete": "Envoy had no whole request yet (no method or path in its line).",
        }[kind]
        title, variant = {
            "half-close": (f"The caller {flow.client} half-closed its connection with {request}, before "
                           f"{flow.server} answered (0 DC)", "caller half-closed after its request"),
            "incomplete": (f"The caller {flow.client} closed its connection to {flow.server} before its request "
                           f"was whole (0 DC)", "caller closed before its request was whole"),
            "upload": (f"The caller {flow.client} closed its connection {waited_ms} ms into {request}, after "
                       f"{sent_after} bytes more of it, before {flow.server} answered (0 DC)",
                       "caller closed after its upload, before the answer"),
        }.get(kind, (f"The caller {flow.client} gave up on {request} after {waited_ms} ms, before {flow.server} "
                     f"answered (0 DC)", "caller gave up before the answer"))
        chosen = fixes(waited_ms, kind)
        return Finding(
            detector=self.id,
            severity=Severity.WARNING,
            title=title,
            flow=flow,
            evidence=evidence,
            envoy_flags=("DC",),
            variant=variant,
            response_code_details=details,
            explanation=(
                f"The caller ({flow.client}) closed its connection {waited_ms} ms into {request}; "
                f"{waited}. Envoy logs response code {code} with flag DC ({details}) and "
                f"reset the request to the app. {why}"),
            remediation=render(chosen, note(waited_ms, kind)),
            fixes=chosen,
            pod=self.ctx.pod,
            ts=ts,
        )
