"""Sinks that render a finished run: ``-o json`` (the stable contract of docs/DESIGN.md), ``-o text`` and
``-o markdown``; and a run's exit code."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from kubectl_meshdoctor import __version__
from kubectl_meshdoctor.core.findings import Finding, Problem, Severity
from kubectl_meshdoctor.core.pipeline import PipelineStats

from .ladder import render_ladder

EXIT_OK = 0
EXIT_FINDINGS = 1  # at least one finding of severity error
EXIT_USAGE = 2  # usage or input error, or a watch that captured nothing on any interface

@dataclass(slots=True)
class Report:
    """Everything a run concluded. ``source`` says what was read (``{"kind": "pcap", "files": [...]}`` or
    ``{"kind": "live", "pods": [...]}``); ``problems`` are input troubles that did not stop the run (a capture cut
    short, a lost stream)."""

    source: dict
    stats: PipelineStats
    findings: list[Finding]
    problems: list[Problem] = field(default_factory=list)
    envoy: dict | None = None  # the sidecar's side: version, counters that moved, access-log lines read
    kernel: dict | None = None  # kernel counters of the pod's namespace that moved (nstat names -> delta)
    # No interface's capture ever ran (no such device, no tcpdump, every exec refused): no packet finding means
    # nothing here, so without an error finding (lint, access log) the run exits 2, its problems saying why.
    captured_nothing: bool = False

    def exit_code(self) -> int:
        if any(f.severity is Severity.ERROR for f in self.findings):
            return EXIT_FINDINGS
        return EXIT_USAGE if self.captured_nothing else EXIT_OK

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
                # Every frame tshark read per stream; "packets" are those a detector could act on.
                "frames_read": dict(sorted(st.frames_read.items())),
            },
            "problems": [p.to_dict() for p in self.problems],
            **({"envoy": self.envoy} if self.envoy is not None else {}),
            **({"kernel": self.kernel} if self.kernel is not None else {}),
            "findings": [f.to_dict() for f in self.findings],
        }


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"


def group_findings(findings: list[Finding]) -> list[list[Finding]]:
    """Findings grouped by (severity, detector, title), most severe group first, each group in time order:
    a capture with the same failure a hundred times reads as one problem seen a hundred times."""
    groups: dict[tuple, list[Finding]] = {}
    for f in sorted(findings, key=lambda f: f.ts):
        groups.setdefault((f.severity.rank, f.detector, f.title), []).append(f)
    return [groups[k] for k in sorted(groups, key=lambda k: (-k[0], groups[k][0].ts))]


def _pods(group: list[Finding]) -> list[str]:
    """The pods a group's findings are about, in order, each once (a lint rule fires on many pods)."""
    return list(dict.fromkeys(f.pod for f in group if f.pod))


def _pods_text(group: list[Finding]) -> str:
    """`` pod/NAME`` for one pod, `` N pods (A, B)`` for a group over several: none pinned on its first."""
    pods = _pods(group)
    if len(pods) > 1:
        return f" {len(pods)} pods ({', '.join(pods)})"
    return f" pod/{pods[0]}" if pods else ""


def _headline(report: Report) -> str:
    if report.source.get("kind") == "lint":
        return f"kubectl-meshdoctor {__version__} lint: {len(report.source.get('pods', []))} pods checked"
    st = report.stats
    ifaces = ", ".join(f"{k} {v.packets}" for k, v in sorted(st.by_iface.items())) or "none"
    return (f"kubectl-meshdoctor {__version__}: {st.packets} packets analysed ({ifaces}), {st.flows_seen} flows, "
            f"{st.duration_s:.1f} s")


def _flow_text(f: Finding) -> str:
    """``flow: client -> server on iface``, or ``where: pod:port`` for spec findings (lint) without a flow."""
    if f.flow.client == "-" and not f.flow.iface:
        return f"where: {f.flow.server}"
    return f"flow: {f.flow.client} -> {f.flow.server} on {f.flow.iface}"


def _evidence_text(e) -> str:
    """``source frame N: what`` for packets, ``source line N: what`` for log lines (no interface), ``source:
    what`` for spec fields (frame 0)."""
    if not e.frame:
        return f"{e.source}: {e.what}"
    return f"{e.source} {'frame' if e.iface else 'line'} {e.frame}: {e.what}"


def render_text(report: Report) -> str:
    """A report a person reads in a terminal: one block per kind of finding, most severe first; the
    explanation and fix once, then every occurrence with its flow and frames."""
    lines = [_headline(report)]
    for p in report.problems:
        lines.append(f"problem: {p.line()}")
    if not report.findings:
        lines.append("no findings")
    for group in group_findings(report.findings):
        f = group[0]
        lines.append("")
        flags = f" [{','.join(f.envoy_flags)}]" if f.envoy_flags else ""
        pod = _pods_text(group)
        times = f" ({len(group)} times)" if len(group) > 1 else ""
        lines.append(f"{f.severity.value.upper()} {f.detector}{flags}{pod}: {f.title}{times}")
        if f.response_code_details:
            lines.append(f"  envoy: {f.response_code_details}")
        for n, occ in enumerate(group, 1):
            label = f"  #{n} " if len(group) > 1 else "  "
            label += f"pod/{occ.pod} " if occ.pod and len(_pods(group)) > 1 else ""
            lines.append(f"{label}{_flow_text(occ)}")
            for e in occ.evidence:
                lines.append(f"      evidence: {_evidence_text(e)}")
            for line in occ.access_log:
                lines.append(f"      access log: {line}")
            for name, value in sorted(occ.counters.items()):
                lines.append(f"      counter: {name} {value:+}")
        if f.explanation:
            lines.append(f"  why: {f.explanation}" + (" (shown for #1)" if len(group) > 1 else ""))
        if f.remediation:
            lines.append("  fix:")
            lines.extend("    " + ln for ln in f.remediation.splitlines())
    return "\n".join(lines) + "\n"


def render_markdown(report: Report) -> str:
    """A report to paste into an incident ticket: a summary table, then one section per finding."""
    out = ["# kubectl-meshdoctor report", "", _headline(report).split(": ", 1)[1] + ".", ""]
    for p in report.problems:
        out.append(f"> **problem** {p.line()}")
    if report.problems:
        out.append("")
    groups = group_findings(report.findings)
    if not groups:
        out.append("No findings.")
        return "\n".join(out) + "\n"
    out += ["| severity | detector | Envoy flags | times | first flow | finding |", "|---|---|---|---|---|---|"]
    for g in groups:
        f = g[0]
        title = f.title.replace("|", "\\|")
        out.append(f"| {f.severity.value} | `{f.detector}` | {','.join(f.envoy_flags)} | {len(g)} | "
                   f"{f.flow.client} -> {f.flow.server} ({f.flow.iface}) | {title} |")
    for n, g in enumerate(groups, 1):
        f = g[0]
        out += ["", f"## {n}. {f.severity.value}: {f.title}", "",
                f"- detector: `{f.detector}`", f"- Envoy response flags: {', '.join(f.envoy_flags) or '-'}"]
        if f.response_code_details:
            out.append(f"- response_code_details: `{f.response_code_details}`")
        if _pods(g):
            out.append(f"- pod{'s' if len(_pods(g)) > 1 else ''}: {', '.join(_pods(g))}")
        out += ["", "| # | flow | source | frame | what |", "|---|---|---|---|---|"]
        for i, occ in enumerate(g, 1):
            flow = f"{occ.flow.client} -> {occ.flow.server} ({occ.flow.iface})"
            out += [f"| {i} | {flow} | {e.source} | {e.frame} | {e.what} |" for e in occ.evidence]
        ladder = render_ladder(f)
        if ladder:
            out += ["", "Packets of #1 (time in ms since its first packet):", "", "```text", *ladder, "```"]
        out += ["", f.explanation, "", "Fix:", "", "```yaml", f.remediation, "```"]
    return "\n".join(out) + "\n"


RENDERERS = {"json": render_json, "text": render_text, "markdown": render_markdown}
