"""``http-framing``: an HTTP/1 response from the app whose message framing Envoy rejects.

RFC 9112 section 6: a message body's length comes from Transfer-Encoding or Content-Length, never both, and
``chunked`` must be the final transfer coding of a request (6.1); conflicting Content-Length values are an
unrecoverable error (6.3). Envoy's HTTP/1 codec rejects these (and header names with invalid bytes, RFC 9110
section 5.1), closes the upstream connection (a FIN from 127.0.0.6: Envoy has read the response, so it does
not reset) and answers the caller 502 with response flag UPE and details
``upstream_reset_before_response_started{protocol_error}``; the inbound cluster's ``upstream_cx_protocol_error``
moves. The downstream connection stays open. Header names compare case-insensitively, so
``Transfer-Encoding: chunked`` plus ``transfer-encoding: Chunked`` is two fields.

Without a capture, Envoy's logs name it: 502 UPE ``{protocol_error}`` in the access log, and, in the debug log,
the codec client's ``Error dispatching received data: http/1.1 protocol error: X`` on the upstream connection,
whose X names the rule (CODEC_RULES: Envoy's own checks, the http-parser HPE_* names and Balsa's, as
docs/envoy-component-log.md lists them with their sources).
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings, flag_signal
from kubectl_meshdoctor.core.correlate import access_log_flow
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import EnvoyCountersEvent, HttpStart, PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix, render
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.redact import header_line, raw_line
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import AFTER_RESPONSE, parse_reset_details
from kubectl_meshdoctor.envoy.story import StreamStory

# What Envoy's HTTP/1 codec says (after `http/1.1 protocol error: `) -> the framing rule it names. Balsa (Envoy's
# parser from 1.30 on) and http-parser (before) word the same rule differently; both are here.
CODEC_RULES: tuple[tuple[str, str], ...] = (
    ("both 'content-length' and 'transfer-encoding' are set", "Transfer-Encoding together with Content-Length"),
    ("unsupported transfer encoding", "a Transfer-Encoding Envoy does not accept (more than one, or chunked "
                                      "not the final coding)"),
    ("hpe_invalid_transfer_encoding", "a Transfer-Encoding Envoy does not accept"),
    ("hpe_unexpected_content_length", "conflicting Content-Length values (or Content-Length with "
                                      "Transfer-Encoding)"),
    ("invalid_header_name_character", "invalid header name bytes"),
    ("hpe_invalid_header_token", "invalid header name bytes"),
    ("header value contains invalid chars", "invalid header value bytes"),
    ("hpe_invalid_chunk_size", "an invalid chunk size"),
    ("headers size exceeds limit", "response headers over Envoy's size limit"),
    ("count exceeds limit", "more headers than Envoy's limit"),
    ("hpe_invalid_version", "an invalid HTTP version"),
    ("hpe_invalid_status", "an invalid status line"),
)


def codec_rule(error: str | None) -> str | None:
    """The framing rule an Envoy codec error names, or None when the text is none it knows."""
    text = (error or "").lower()
    return next((rule for needle, rule in CODEC_RULES if needle in text), None)

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


# Why each kind of violation breaks framing, by the prefix framing_violations gives it.
WHY_NAME = ("a field name is a token (RFC 9110 section 5.1) with no whitespace before its colon (RFC 9112 "
            "section 5.1: such whitespace once let two parsers read different headers, so a proxy must remove it "
            "from a response or reject the message)")
WHY_FOLD = ("a header line starting with whitespace continues the line above (obs-fold), which RFC 9112 section "
            "5.2 made obsolete: a proxy must answer 502 for such a response or replace the fold with spaces")
WHY_LENGTH = ("its body length is ambiguous, which RFC 9112 section 6 forbids (6.1 Transfer-Encoding, 6.3 message "
              "body length) because two parsers can disagree on where the message ends (request smuggling)")


WHY_RULE = (  # a CODEC_RULES rule (by a word of it) -> the rule it breaks
    ("header name", WHY_NAME),
    ("header value", "a field value holds no CR, LF or NUL (RFC 9110 section 5.5)"),
    ("chunk size", "a chunk starts with its size in hex digits (RFC 9112 section 7.1)"),
    ("limit", "Envoy's own limits on a header block (the HCM's max_request_headers_kb and the cluster's "
              "max_headers_count: what the response exceeded)"),
    ("version", "a status line is HTTP-version SP status-code SP reason (RFC 9112 section 4)"),
    ("status", "a status line is HTTP-version SP status-code SP reason (RFC 9112 section 4)"),
)


def why_rule(rule: str | None) -> str:
    """The rule a CODEC_RULES rule breaks, as a clause; the body-length rule for those of Transfer-Encoding and
    Content-Length; "" when ``rule`` is None (the codec's words were none known)."""
    if rule is None:
        return ""
    return next((said for word, said in WHY_RULE if word in rule), WHY_LENGTH)


def why(problems: list[str]) -> str:
    """The rules ``problems`` (framing_violations' sentences) break, each said once, in their order."""
    reasons = [WHY_NAME if p.startswith("invalid header name") else WHY_FOLD if p.startswith("obsolete line")
               else WHY_LENGTH for p in problems]
    return "; and ".join(dict.fromkeys(reasons))


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
    packet_ifaces = frozenset({"lo"})
    packet_kinds = frozenset({"http"})
    unseen_without = {"lo": "malformed HTTP/1 responses"}
    unseen_rank = 30
    envoy_counters = ("upstream_cx_protocol_error",)
    envoy_loggers = ("client", "router", "http")

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        return counter_findings(
            self.id, counters, (CounterSignal("cluster", "upstream_cx_protocol_error",
                                              "upstream connections Envoy's codec closed on a protocol error"),
                                flag_signal("UPE", "requests Envoy answered 502 UPE")),
            what="HTTP framing errors: responses Envoy's codec rejects (502 UPE)",
            explanation=("The upstream's responses broke HTTP/1 framing rules Envoy enforces (RFC 9112 section 6: "
                         "Transfer-Encoding with Content-Length, chunked not last, conflicting lengths, invalid "
                         "header bytes): Envoy closed each connection and answered 502 UPE. Which rule: the "
                         "sidecar's client logger at debug names it, and lo shows the response."),
            envoy_flags=("UPE",), 
            fixes=FIXES, remediation=render(FIXES, NOTE), pod=self.ctx.pod)

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        return self._from_logs(entry, None, evidence)

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        return self._from_logs(entry if entry is not None else story.entry(), story, evidence)

    def _from_logs(self, entry: AccessLogEntry, story: StreamStory | None, evidence: Evidence) -> Finding | None:
        reset = parse_reset_details(entry.details)
        if "UPE" not in entry.flags and not (reset is not None and reset.flag == "UPE"):
            return None
        error = story.codec_error if story is not None else None
        rule = codec_rule(error)
        flow = access_log_flow(entry)
        request = f"{entry.method} {entry.path}" if entry.method else "a request"
        said = (f"Envoy's HTTP/1 codec rejected the response of {flow.server} to {request}: {error!r}, that is "
                f"{rule}." if rule else
                f"Envoy's HTTP/1 codec rejected the response of {flow.server} to {request}"
                + (f": {error!r}." if error else "."))
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"{flow.server} answered with framing Envoy rejects: {rule or 'a protocol error'} "
                  f"({entry.code or 502} UPE)",
            variant=rule or "a response Envoy's codec rejects",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=("UPE",),
            explanation=(
                f"{said} "
                + (f"The response had started ({entry.code} went out to the caller), so Envoy reset the stream in "
                   f"the middle of the body (upstream_reset_after_response_started{{protocol_error}}): the caller "
                   f"saw a response cut short. " if reset is not None and reset.phase == AFTER_RESPONSE else
                   f"Envoy closed the upstream connection and answered the caller {entry.code or 502} with "
                   f"response flag UPE ({entry.details or 'protocol_error'}). ")
                + "It counts upstream_cx_protocol_error."
                + (f" The rule broken: {why_rule(rule)}." if rule else "")
                + ("" if rule else " Which header breaks the rule: raise the sidecar's client logger to debug "
                   "(kubectl meshdoctor watch --envoy-debug) or capture lo, where the response shows it.")),
            remediation=render(FIXES, NOTE),
            fixes=FIXES,
            pod=self.ctx.pod,
            ts=entry.ts,
            response_code_details=entry.details or "",
            details={"from": "envoy-log" if story is not None else "access-log",
                     **({"codec_error": error} if error else {})},
        )

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
                f"The app at {ev.src_endpoint} sent a response Envoy cannot pass on: {'; '.join(problems)}. "
                f"The rule broken: {why(problems)}. Envoy's HTTP/1 codec rejects it, closes the upstream "
                f"connection (FIN) and answers the caller 502 with response flag UPE and details upstream_reset_before_response_started{{protocol_error}}, "
                f"counting upstream_cx_protocol_error on the inbound cluster."),
            remediation=render(FIXES, NOTE),
            fixes=FIXES,
            pod=self.ctx.pod,
            ts=ev.ts,
            response_code_details="upstream_reset_before_response_started{protocol_error}",
            details={"violations": problems},
        ),)

