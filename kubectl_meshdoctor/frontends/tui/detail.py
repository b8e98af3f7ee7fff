"""The detail pane's text for one finding: what, where, the evidence, the packets' ladder, the explanation and
the fix. Plain text (PlainStatic shows it, never as markup: titles carry brackets)."""

from __future__ import annotations

import re

from kubectl_meshdoctor.core.findings import Finding
from kubectl_meshdoctor.core.hop_path import flags_logger, hop_of, quotes_flags
from kubectl_meshdoctor.core.redact import SENSITIVE_HEADERS, SENSITIVE_QUERY_PARAMS
from kubectl_meshdoctor.frontends.ladder import render_ladder


def finding_detail(f: Finding, redact: bool = True) -> str:
    """The detail pane's text for one finding (Rich markup-free on purpose: titles carry brackets): what, where,
    evidence; then the ladder (``render_ladder``), then ``finding_explanation``."""
    lines = [f"{f.severity.value.upper()}  {f.detector}  Envoy flags: {', '.join(f.envoy_flags) or '-'}",
             f.title, "", f.flow.text()]
    if f.response_code_details:
        lines.append(f"envoy details: {f.response_code_details}")
    if f.pod:
        lines.append(f"pod: {f.pod}")
    if (hop := hop_of(f)) is not None:
        lines.append(f"hop: {hop.text()}")
    lines.append("evidence:")
    lines += [f"  {e.cited()}" for e in f.evidence]  # each by its kind: frame, line, counter, spec field
    lines += [f"  access log: {line}" for line in f.access_log]
    if (logger := flags_logger(f)) is not None and logger.caller_ip and not quotes_flags(f):
        lines.append(f"  access log: {logger.text()}")  # the pod's own log has none of them: say whose has
    lines += [f"  counter: {name} {value:+}" for name, value in sorted(f.counters.items())]
    return "\n".join(lines)


# A YAML comment line of one paragraph: its indent and `#`, one space, then its text.
_COMMENT = re.compile(r"^( *#) (\S.*)$")


def comment_paragraphs(text: str) -> str:
    """``text`` (a fix: YAML and its comments) with each comment that its writer broke over several lines made one
    line again, for the detail pane to wrap at its own width (s44: a comment broken at 100 columns and wrapped
    again at 80 read "...so that each / connection gets an ephemeral / port of its own"). A line goes on the
    comment before it when both are ``# text`` at the same indent and it starts in lower case or with "(": a
    sentence going on; a capital starts a sentence of its own, and ``#   keeps:`` (more spaces) an item of its
    own. Still YAML: the pane wraps a comment as a comment."""
    out: list[str] = []
    for line in text.split("\n"):
        this, before = _COMMENT.match(line), _COMMENT.match(out[-1]) if out else None
        if this and before and this.group(1) == before.group(1) and (this.group(2)[0].islower()
                                                                   or this.group(2)[0] == "("):
            out[-1] += " " + this.group(2)
        else:
            out.append(line)
    return "\n".join(out)


def finding_explanation(f: Finding, redact: bool = True) -> str:
    lines = [f.explanation, "", "fix:", comment_paragraphs(f.remediation), ""]
    if redact:
        lines.append(f"privacy: values of {', '.join(sorted(SENSITIVE_HEADERS))}, of header names that are not "
                     f"tokens, and of the query parameters {', '.join(sorted(SENSITIVE_QUERY_PARAMS))} are shown "
                     f"as <redacted> (watch --no-redact shows them)")
    else:
        lines.append("privacy: redaction is off (--no-redact): header values and request targets are shown as "
                     "captured")
    return "\n".join(lines)


def ladder_text(f: Finding, width: int | None = None) -> str:
    """The ladder under its heading, fitted to ``width`` columns (render_ladder) when given."""
    ladder = render_ladder(f, width)
    return "\n".join(["packets, ms since the first:", *ladder]) if ladder else ""
