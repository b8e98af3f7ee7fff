"""Sinks that render a finished run: ``-o json`` (the stable contract of docs/DESIGN.md), ``-o text`` and
``-o markdown``; and a run's exit code."""

from __future__ import annotations

import json
import re
import textwrap
import time
from dataclasses import dataclass, field

from kubectl_meshdoctor import __version__
from kubectl_meshdoctor.core.findings import ENVOY_LOG, Finding, Problem, Severity
from kubectl_meshdoctor.core.fixes import note_of, render
from kubectl_meshdoctor.core.groups import FindingGroup, group_findings
from kubectl_meshdoctor.core.pipeline import PipelineStats

from .envoy_debug import debug_reports, jsonable
from .ladder import render_ladder
from .shown import block

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
    # the sidecar's side: version, counters that moved, log lines read, and under "debug" what --envoy-debug did to
    # its log levels (sinks/envoy_debug.py EnvoyDebugReport; per pod under "per_pod" when several)
    envoy: dict | None = None
    kernel: dict | None = None  # kernel counters of the pod's namespace that moved (nstat names -> delta)
    # No interface's capture ever ran (no such device, no tcpdump, every exec refused): no packet finding means
    # nothing here, so without an error finding (lint, access log) the run exits 2, its problems saying why.
    captured_nothing: bool = False

    def __post_init__(self) -> None:
        # Findings past the pipeline's MAX_FINDINGS are counted, not kept: a report must say that it is cut.
        dropped = self.stats.findings_dropped
        if dropped and not any(p.where == "findings" for p in self.problems):
            what = (f"{dropped} more findings than the {len(self.findings)} kept were concluded and are not listed "
                    f"(the groups' counts stop there too)")
            self.problems = [*self.problems, Problem("findings", what)]

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
            **({"envoy": jsonable(self.envoy)} if self.envoy is not None else {}),
            **({"kernel": self.kernel} if self.kernel is not None else {}),
            "findings": [f.to_dict() for f in self.findings],
            "groups": groups_to_dicts(self.findings),
        }


def groups_to_dicts(findings: list[Finding]) -> list[dict]:
    """The report's ``groups``: one problem each (core/groups.py), its instances as indexes into ``findings``."""
    index = {id(f): i for i, f in enumerate(findings)}
    out = []
    for g in group_findings(findings):
        f = g.newest
        pods = _pods(g)
        # A spec finding's group spans pods (lint -A): no one pod or server is its own.
        where = {"pods": pods} if len(pods) > 1 else {"pod": pods[0], "server": f.flow.server} if pods else \
            {"server": f.flow.server}
        out.append({"detector": f.detector, "severity": f.severity.value, **where,
                    "envoy_flags": list(f.envoy_flags), "variant": f.variant,
                    "label": g.label, "count": g.count, "first_ts": g.first_ts, "last_ts": g.last_ts,
                    "rate_per_min": g.rate_per_min, "instances": [index[id(i)] for i in g.instances],
                    **({"counters": g.counters} if g.counters else {})})
    return out


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"


def _headline(report: Report) -> str:
    if report.source.get("kind") == "lint":
        n = len(report.source.get("pods", []))
        return f"kubectl-meshdoctor {__version__} lint: {n} pod{'' if n == 1 else 's'} checked"
    st = report.stats
    envoy = report.envoy or {}
    lines, own = envoy.get("access_log_lines"), envoy.get("component_log_entries")
    dumps = "counters_since" in envoy
    if not st.by_iface and (lines or own or dumps):  # logs or dumps alone: no packet was there to analyse
        read = [f"{lines} access-log lines" if lines else "", f"{own} entries of Envoy's own log" if own else "",
                f"/stats counters (since {envoy['counters_since']})" if dumps else ""]
        skipped = envoy.get("other_log_lines") or 0
        return (f"kubectl-meshdoctor {__version__}: no capture; {', '.join(x for x in read if x)} read"
                + (f"; {skipped} line(s) of no known kind skipped" if skipped else ""))
    ifaces = ", ".join(f"{k} {v.packets}" for k, v in sorted(st.by_iface.items())) or "none"
    return (f"kubectl-meshdoctor {__version__}: {st.packets} packets analysed ({ifaces}), {st.flows_seen} flows, "
            f"{st.duration_s:.1f} s")


def _flow_text(f: Finding) -> str:
    """``flow: client -> server on iface``, or ``where: pod:port`` for spec findings (lint) without a flow."""
    if f.flow.of_spec:
        return f"where: {f.flow.server}"
    if not f.flow.iface:  # from an access-log line: Envoy's addresses, no interface seen
        return f"flow: {f.flow.client} -> {f.flow.server} (from Envoy's logs)"
    return f"flow: {f.flow.client} -> {f.flow.server} on {f.flow.iface}"


def _evidence_text(e) -> str:
    """``source frame N: what`` for packets, ``source line N: what`` for log lines (no interface), ``source:
    what`` for spec fields (frame 0)."""
    if not e.frame:
        return f"{e.source}: {e.what}"
    return f"{e.source} {'frame' if e.iface else 'line'} {e.frame}: {e.what}"


TEXT_WIDTH = 118  # columns the text report wraps its explanations to
ENVOY_LINES_SHOWN = 8  # lines of Envoy's debug log the text report quotes for a finding; -o json has all
OTHERS_LISTED = 5  # instances of a group the text report lists besides the newest; -o json has every one
INSTANCES_TABLE = 10  # rows of a group's instances table in markdown


def _clock(ts: float) -> str:
    """``HH:MM:SS.mmm`` UTC; a time no clock can show (a capture's timestamps in the wrong unit) as seconds."""
    try:
        # Rounded to the millisecond as Envoy prints it (its %START_TIME% is whole milliseconds): a float's
        # .768 must not read .767, or the printed time is not found in the log it came from.
        ms = round(ts * 1000)
        return time.strftime("%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}"
    except (OverflowError, OSError, ValueError):
        return f"{ts:.3f} s"


def _pods(g: FindingGroup) -> list[str]:
    """The pods a group's findings are about, in order, each once (a lint rule fires on many pods)."""
    return list(dict.fromkeys(f.pod for f in g.instances if f.pod))


def _pods_text(g: FindingGroup) -> str:
    """`` pod/NAME`` for one pod, `` N pods (A, B)`` for a group over several: none pinned on its first."""
    pods = _pods(g)
    if len(pods) > 1:
        return f" {len(pods)} pods ({', '.join(pods)})"
    return f" pod/{pods[0]}" if pods else ""


def _where(f: Finding, several_pods: bool) -> str:
    """An instance among others: its client (and pod, in a group over ``several_pods``), or for a spec finding
    (lint) its pod and port."""
    if f.flow.of_spec:
        return f"pod/{f.pod} {f.flow.server}" if f.pod else f.flow.server
    return f"pod/{f.pod} {f.flow.client}" if f.pod and several_pods else f.flow.client


def _group_head(g: FindingGroup) -> str:
    f = g.newest
    flags = f" [{','.join(f.envoy_flags)}]" if f.envoy_flags else ""
    pod = _pods_text(g)
    return f"{f.severity.value.upper()} {f.detector}{flags}{pod}: {g.label}"


def render_text(report: Report) -> str:
    """A report a person reads in a terminal: one block per problem (group of alike findings), most severe
    first, each a screenful at most: how often and when, the newest instance in full, a few others by flow,
    the run's counters once, the explanation and the fix once."""
    lines = [_headline(report)]
    for p in report.problems:
        lines.append(f"problem: {p.line()}")
    lines += [d.line() for d in debug_reports(report.envoy)]
    if not report.findings:
        lines.append("no findings")
    for g in group_findings(report.findings):
        f = g.shown
        lines.append("")
        lines.append(_group_head(g))
        if g.first_ts:  # a spec finding (lint) has no time
            when = f"at {_clock(g.first_ts)} UTC" if g.count == 1 else \
                f"first {_clock(g.first_ts)}, last {_clock(g.last_ts)} UTC"
            lines.append(f"  seen {g.span_text()}, {when}")
        elif g.count > 1:
            lines.append(f"  {g.count} times")
        if f.title != g.label:
            lines.append(f"  {f.title}")
        if f.response_code_details:
            lines.append(f"  envoy: {f.response_code_details}")
        several_pods = len(_pods(g)) > 1
        if g.count > 1 and len(set(map(len, (i.stands_on for i in g.instances)))) > 1:
            lines.append("  stands on: " + ", ".join(f"{kind} in {n} of {g.count}"
                                                     for kind, n in g.stands_on_counts().items()))
        which = ("newest, " if f is g.newest else "best evidenced, ") if g.count > 1 else ""
        lines.append(f"  {which}{'pod/' + f.pod + ' ' if several_pods else ''}{_flow_text(f)}")
        for e in f.evidence:  # a multi-line value (a YAML annotation) stays under its own line
            lines.append(f"      evidence: {_evidence_text(e)}".replace("\n", "\n" + " " * 16))
        for line in f.access_log:
            lines.append(f"      access log: {line}")
        quoted = {e.frame for e in f.evidence if e.kind == ENVOY_LOG}
        own = [line for line in f.envoy_log][:ENVOY_LINES_SHOWN] if not quoted else []
        for line in own:  # the lines a packet finding's request left in Envoy's debug log
            lines.append(f"      envoy log: {line}")
        if len(f.envoy_log) > len(own) and own:
            lines.append(f"      envoy log: ... {len(f.envoy_log) - len(own)} more line(s) (-o json has them)")
        others = [i for i in g.instances if i is not f][-OTHERS_LISTED:]
        if others:
            listed = ", ".join(_where(o, several_pods) + (f" ({_clock(o.ts)})" if o.ts else "")
                               for o in reversed(others))
            more = g.count - 1 - len(others)
            lines += textwrap.wrap(f"{listed}" + (f" and {more} more (-o json lists every one)" if more else ""),
                                   TEXT_WIDTH, initial_indent="  also: ", subsequent_indent="        ",
                                   break_on_hyphens=False, break_long_words=False)
        for name, value in sorted(g.counters.items()):
            lines.append(f"  counter (the run's): {name} {value:+}")
        if f.explanation:  # wrapped: a screenful per problem in a terminal, not one line 1,000 columns wide
            lines += textwrap.wrap(f.explanation, TEXT_WIDTH, initial_indent="  why: ", subsequent_indent="       ",
                                   break_on_hyphens=False, break_long_words=False)
        lines += _fix_lines(f)
    return "\n".join(lines) + "\n"


def _fix_lines(f: Finding) -> list[str]:
    """The text report's fix: the first fix in full (it keeps the most), the others by name, so that a problem
    stays a screenful; markdown and JSON give every fix's YAML."""
    if not f.fixes or (f.remediation and not f.remediation.startswith(render(f.fixes))):  # the detector's own text
        return ["  fix:", *("    " + ln for ln in f.remediation.splitlines())] if f.remediation else []
    first, n = f.fixes[0], len(f.fixes)
    wrap = dict(width=TEXT_WIDTH, subsequent_indent="      ", break_on_hyphens=False, break_long_words=False)
    lines = textwrap.wrap(f"fix: 1 of {n} ({first.name}), {first.title}", initial_indent="  ", **wrap)
    lines += textwrap.wrap(f"keeps: {first.keeps}; costs: {first.costs}", initial_indent="    ", **wrap)
    lines += ["    " + ln for ln in first.text.splitlines()]
    for i, fix in enumerate(f.fixes[1:], start=2):
        lines += textwrap.wrap(f"or {i} of {n} ({fix.name}), {fix.title}", initial_indent="  ", **wrap)
    if n > 1:
        lines.append("  (-o markdown or -o json: every fix, with what it keeps and costs)")
    lines += ["    " + ln for ln in note_of(f.remediation, f.fixes).splitlines()]
    return lines


def _cell(text: str) -> str:
    """``text`` as one table cell: prose escaped (``_md``), a pipe escaped, line breaks as <br> (a YAML annotation
    quoted as evidence)."""
    return _md(text).replace("|", "\\|").replace("\n", "<br>")


_CODE_SPAN = re.compile(r"(`[^`\n]*`)")
_MD_ACTIVE = re.compile(r"([\\`*_\[\]<>&])")


def _md(text: str) -> str:
    """``text`` as Markdown prose that shows as written: outside its code spans (ours: `kubectl ...`), every
    character Markdown or HTML would act on is escaped. A request target is the traffic's, and a ticket renders
    what is pasted: `[login](https://...)` must not become a link, nor `<img onerror=...>` an element."""
    parts = _CODE_SPAN.split(text)
    return "".join(part if i % 2 else _MD_ACTIVE.sub(r"\\\1", part) for i, part in enumerate(parts))


def render_markdown(report: Report) -> str:
    """A report to paste into an incident ticket: a summary table of the problems, then one section each with
    its newest instance, a table of instances, the run's counters, the explanation and the fix."""
    out = ["# kubectl-meshdoctor report", "", _headline(report).split(": ", 1)[1] + ".", ""]
    for p in report.problems:
        out.append(f"> **problem** {_md(p.line())}")
    debug = [d.line() for d in debug_reports(report.envoy)]
    out += [f"> {line}" for line in debug]
    if report.problems or debug:
        out.append("")
    groups = group_findings(report.findings)
    if not groups:
        out.append("No findings.")
        return "\n".join(out) + "\n"
    out += ["| severity | detector | Envoy flags | times | server | finding | first seen (UTC) | last seen (UTC) |",
            "|---|---|---|---|---|---|---|---|"]
    for g in groups:
        f = g.newest
        pods = _pods(g)
        server = f"{len(pods)} pods" if len(pods) > 1 else f.flow.server
        seen = (f"{_clock(g.first_ts)} | {_clock(g.last_ts)}" if g.first_ts else "- | -")  # a spec has no time
        out.append(f"| {f.severity.value} | `{f.detector}` | {','.join(f.envoy_flags)} | {g.count} | "
                   f"{_cell(server)} | {_cell(g.label)} | {seen} |")
    for n, g in enumerate(groups, 1):
        f = g.shown
        out += ["", f"## {n}. {f.severity.value}: {_md(g.label)}", "", f"{_md(f.title)}, seen {g.span_text()}.", "",
                f"- detector: `{f.detector}`", f"- Envoy response flags: {', '.join(f.envoy_flags) or '-'}"]
        if f.response_code_details:
            out.append(f"- response_code_details: `{f.response_code_details}`")
        pods = _pods(g)
        if pods:
            out.append(f"- pod{'s' if len(pods) > 1 else ''}: {_md(', '.join(pods))}")
        for name, value in sorted(g.counters.items()):
            out.append(f"- counter (the run's): `{name}` {value:+}")
        out += ["", f"Evidence of the {'newest' if f is g.newest else 'best evidenced'} instance:", "",
                "| source | frame | what |", "|---|---|---|"]
        out += [f"| {_cell(e.source)} | {e.frame} | {_cell(e.what)} |" for e in f.evidence]
        for line in f.access_log:
            out += ["", "Access log:", "", "```text", line, "```"]
        if f.envoy_log:
            out += ["", "Envoy's own log:", "", "```text", *f.envoy_log, "```"]
        if g.count > 1:
            shown = g.instances[-INSTANCES_TABLE:]
            out += ["", f"Instances ({len(shown)} newest of {g.count}; `-o json` lists every one):", "",
                    "| # | time (UTC) | flow | deciding frame |", "|---|---|---|---|"]
            first = g.count - len(shown) + 1
            for i, occ in enumerate(shown, first):
                framed = [e for e in occ.evidence if e.frame]  # the deciding packet is the latest evidence
                frame = f"{max(framed, key=lambda e: e.ts).source} {max(framed, key=lambda e: e.ts).frame}" \
                    if framed else "-"
                out.append(f"| {i} | {_clock(occ.ts)} | {occ.flow.client} -> {occ.flow.server} ({occ.flow.iface}) "
                           f"| {frame} |")
        ladder = render_ladder(f)
        if ladder:
            out += ["", "Packets of the newest instance (time in ms since its first packet):", "", "```text",
                    *ladder, "```"]
        out += ["", _md(f.explanation), "", "Fix:", "", "```yaml", f.remediation, "```"]
    return "\n".join(out) + "\n"


def _shown(render):
    """A renderer for a terminal or a ticket: the traffic's control bytes escaped (sinks/shown.py). JSON
    escapes them itself."""
    def shown(report: Report) -> str:
        return block(render(report))
    shown.__doc__ = render.__doc__
    return shown


RENDERERS = {"json": render_json, "text": _shown(render_text), "markdown": _shown(render_markdown)}
