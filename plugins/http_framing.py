"""``http-framing``: an HTTP/1 response from the app whose message framing Envoy rejects.

RFC 9112 section 6: a message body's length comes from Transfer-Encoding or Content-Length, never both, and
``chunked`` must be the final transfer coding of a request (6.1); conflicting Content-Length values are an
unrecoverable error (6.3). Envoy's HTTP/1 codec rejects these (and header names with invalid bytes, RFC 9110
section 5.1), closes the upstream connection (a FIN from 127.0.0.6: Envoy has read the response, so it does
not reset) and answers the caller 502 with response flag UPE and details
``upstream_reset_before_response_started{protocol_error}``; the inbound cluster's ``upstream_cx_protocol_error``
moves. The downstream connection stays open. Header names compare case-insensitively, so
``Transfer-Encoding: chunked`` plus ``transfer-encoding: Chunked`` is two fields.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import HttpStart, PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix, render
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.redact import header_line, raw_line


def framing_violations(msg: HttpStart, redact: bool = True) -> list[str]:
    """What in ``msg``'s header block breaks RFC 9112 framing, one sentence each (empty when it is fine)."""
    out: list[str] = []
    te = [(n, v) for n, v in msg.headers if n.lower() == "transfer-encoding"]
    cl = [(n, v) for n, v in msg.headers if n.lower() == "content-length"]
    if len(te) > 1:
        out.append("more than one Transfer-Encoding field: " + "; ".join(header_line(n, v, redact) for n, v in te))
    if te:
        codings = [c.strip().lower() for _, v in te for c in v.split(",") if c.strip()]
        if codings and codings[-1] != "chunked":
            out.append(f"chunked is not the final transfer coding ({', '.join(codings)})")
        if cl:
            out.append("Transfer-Encoding together with Content-Length: "
                       + "; ".join(header_line(n, v, redact) for n, v in te + cl))
    values = {v.strip() for _, v in cl for v in v.split(",")}
    if len(values) > 1:
        out.append("conflicting Content-Length values: " + ", ".join(sorted(values)))
    owners = msg.raw_owners or ("",) * len(msg.raw_header_lines)
    for line, owner in zip(msg.raw_header_lines, owners):
        if line[:1] in (" ", "\t"):
            out.append(f"obsolete line folding: {raw_line(line, redact, owner)!r}")
        else:
            out.append(f"invalid header name bytes: {raw_line(line, redact)!r}")
    return out


FIXES = (Fix(
    "app-framing", "make the app (or the library or proxy in front of it) frame every response one way",
    "the whole mesh; Envoy goes on enforcing RFC 9112, which is what keeps request smuggling out",
    "a change to the app: Envoy resets every such response, so nothing in the mesh can make it pass",
    yaml="""\
# every response carries exactly one framing header:
#   Transfer-Encoding: chunked        (once, chunked last, no Content-Length), or
#   Content-Length: <n>               (once, or repeated with the same value)
# and header names are tokens (no space before the colon, no folded lines)."""),)
# Retries do not remove the failure (the app frames every such response the same way): a note, not a fix.
NOTE = ("# Until the app is fixed, retries (a VirtualService with retries.retryOn: reset) hide a 502 from a\n"
        "# caller only when a retry reaches an endpoint that frames its response well.")


class HttpFraming(Detector):
    id = "http-framing"
    envoy_counters = ("upstream_cx_protocol_error",)

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        msg = ev.http
        if msg is None or ev.iface != "lo" or msg.is_request:
            return ()
        problems = framing_violations(msg, self.ctx.redact)
        if not problems:
            return ()
        return (Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"{ev.src_endpoint} answered with framing Envoy rejects: {problems[0].split(':')[0]}",
            variant=problems[0].split(':')[0],
            flow=FlowRef.of(flow),
            evidence=(Evidence.of(ev, f"{msg.start_line!r} with " + "; ".join(problems)),),
            envoy_flags=("UPE",),
            explanation=(
                f"The app at {ev.src_endpoint} sent a response whose body length is ambiguous: "
                f"{'; '.join(problems)}. RFC 9112 section 6 forbids this (6.1 Transfer-Encoding, 6.3 message "
                f"body length) because two parsers can disagree on where the message ends (request smuggling). "
                f"Envoy's HTTP/1 codec rejects it, closes the upstream connection (FIN) and answers the caller 502 "
                f"with response flag UPE and details upstream_reset_before_response_started{{protocol_error}}, "
                f"counting upstream_cx_protocol_error on the inbound cluster."),
            remediation=render(FIXES, NOTE),
            fixes=FIXES,
            pod=self.ctx.pod,
            ts=ev.ts,
            response_code_details="upstream_reset_before_response_started{protocol_error}",
            details={"violations": problems},
        ),)

