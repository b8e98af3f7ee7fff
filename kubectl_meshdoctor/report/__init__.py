"""Sinks that render a finished run: ``-o json`` (the stable contract of DESIGN.md) and ``-o text``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .. import __version__
from ..findings import Finding, Severity
from ..pipeline import PipelineStats

EXIT_OK = 0
EXIT_FINDINGS = 1  # at least one finding of severity error
EXIT_USAGE = 2  # usage or input error

REDACTED_HEADERS = ("authorization", "cookie", "set-cookie", "proxy-authorization", "x-api-key")


@dataclass(slots=True)
class Report:
    """Everything a run concluded. ``source`` says what was read (``{"kind": "pcap", "files": [...]}`` or
    ``{"kind": "live", "pods": [...]}``); ``problems`` are input troubles that did not stop the run (a capture cut
    short, a lost stream), each a dict with ``what`` and ``where``."""

    source: dict
    stats: PipelineStats
    findings: list[Finding]
    problems: list[dict] = field(default_factory=list)

    def exit_code(self) -> int:
        return EXIT_FINDINGS if any(f.severity is Severity.ERROR for f in self.findings) else EXIT_OK

    def to_dict(self) -> dict:
        st = self.stats
        return {
            "tool": "kubectl-meshdoctor",
            "version": __version__,
            "source": self.source,
            "stats": {
                "packets": st.packets,
                "flows": st.flows_seen,
                "duration_s": st.duration_s,
                "interfaces": {k: {"packets": v.packets} for k, v in sorted(st.by_iface.items())},
            },
            "problems": self.problems,
            "findings": [f.to_dict() for f in self.findings],
        }


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"


def render_text(report: Report) -> str:
    """A report a person reads in a terminal: one block per finding, most severe first."""
    st = report.stats
    ifaces = ", ".join(f"{k} {v.packets}" for k, v in sorted(st.by_iface.items())) or "none"
    lines = [f"kubectl-meshdoctor {__version__}: {st.packets} packets ({ifaces}), {st.flows_seen} flows, "
             f"{st.duration_s:.1f} s"]
    for p in report.problems:
        lines.append(f"problem: {p['where']}: {p['what']}")
    if not report.findings:
        lines.append("no findings")
    for f in sorted(report.findings, key=lambda f: (-f.severity.rank, f.ts)):
        lines.append("")
        flags = f" [{','.join(f.envoy_flags)}]" if f.envoy_flags else ""
        pod = f" pod/{f.pod}" if f.pod else ""
        lines.append(f"{f.severity.value.upper()} {f.detector}{flags}{pod}: {f.title}")
        lines.append(f"  flow: {f.flow.client} -> {f.flow.server} on {f.flow.iface}")
        if f.response_code_details:
            lines.append(f"  envoy: {f.response_code_details}")
        for e in f.evidence:
            lines.append(f"  evidence: {e.source} frame {e.frame}: {e.what}")
        if f.explanation:
            lines.append(f"  why: {f.explanation}")
        if f.remediation:
            lines.append("  fix:")
            lines.extend("    " + ln for ln in f.remediation.splitlines())
    return "\n".join(lines) + "\n"


def render_markdown(report: Report) -> str:
    """A report to paste into an incident ticket: a summary table, then one section per finding."""
    st = report.stats
    ifaces = ", ".join(f"{k} {v.packets}" for k, v in sorted(st.by_iface.items())) or "none"
    out = [f"# kubectl-meshdoctor report", "",
           f"{st.packets} packets ({ifaces}), {st.flows_seen} flows, {st.duration_s:.1f} s.", ""]
    for p in report.problems:
        out.append(f"> **problem** {p['where']}: {p['what']}")
    if report.problems:
        out.append("")
    findings = sorted(report.findings, key=lambda f: (-f.severity.rank, f.ts))
    if not findings:
        out.append("No findings.")
        return "\n".join(out) + "\n"
    out += ["| severity | detector | Envoy flags | flow | finding |", "|---|---|---|---|---|"]
    for f in findings:
        title = f.title.replace("|", "\\|")
        out.append(f"| {f.severity.value} | `{f.detector}` | {','.join(f.envoy_flags)} | "
                   f"{f.flow.client} -> {f.flow.server} ({f.flow.iface}) | {title} |")
    for n, f in enumerate(findings, 1):
        out += ["", f"## {n}. {f.severity.value}: {f.title}", "",
                f"- detector: `{f.detector}`", f"- Envoy response flags: {', '.join(f.envoy_flags) or '-'}"]
        if f.response_code_details:
            out.append(f"- response_code_details: `{f.response_code_details}`")
        if f.pod:
            out.append(f"- pod: {f.pod}")
        out += ["", "| source | frame | what |", "|---|---|---|"]
        out += [f"| {e.source} | {e.frame} | {e.what} |" for e in f.evidence]
        out += ["", f.explanation, "", "Fix:", "", "```yaml", f.remediation, "```"]
    return "\n".join(out) + "\n"


RENDERERS = {"json": render_json, "text": render_text, "markdown": render_markdown}
