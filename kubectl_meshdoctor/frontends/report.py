"""Sinks that render a finished run's report (core/report_model.py): ``-o json`` (the stable contract of
docs/DESIGN.md), ``-o text`` and ``-o markdown``. ``-o text`` to a terminal is wrapped to its width
(``rendered_for``); piped, or to a file, it is as ``RENDERERS`` give it."""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
import time
from collections import Counter
from collections.abc import Sequence

from kubectl_meshdoctor import __version__
from kubectl_meshdoctor.core.findings import ENVOY_LOG, SPEC, Finding, NoFlow, Severity
from kubectl_meshdoctor.core.fixes import note_of, render
from kubectl_meshdoctor.core.hop_path import hop_of
from kubectl_meshdoctor.core.groups import FindingGroup
from kubectl_meshdoctor.core.pipeline import PipelineStats
from kubectl_meshdoctor.core.report_model import (
    FilesSide,
    FilesSource,
    LintSource,
    LiveSource,
    LogLinesRead,
    PerPodSide,
    Report,
    group_pods,
)

from .hanging import hang
from .ladder import render_ladder
from .shown import block


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"


def _headline(report: Report) -> str:
    if isinstance(report.source, LintSource):
        n = len(report.source.pods)
        return f"kubectl-meshdoctor {__version__} lint: {n} pod{'' if n == 1 else 's'} checked"
    st = report.stats
    logs = _logs_read(report)
    lines, own = (logs.access_log_lines, logs.component_log_entries) if logs is not None else (0, 0)
    dumps = report.envoy.counters if isinstance(report.envoy, FilesSide) else None
    clusters = report.envoy.clusters if isinstance(report.envoy, FilesSide) else None
    if not st.by_iface and (lines or own or dumps or clusters):  # logs or dumps alone: no packet to analyse
        hosts = sum(c["hosts"] for c in clusters.values()) if clusters else 0
        read = [f"{lines} access-log line{'' if lines == 1 else 's'}" if lines else "",
                f"{own} entr{'y' if own == 1 else 'ies'} of Envoy's own log" if own else "",
                f"/stats counters (since {dumps.since})" if dumps else "",
                f"/clusters ({len(clusters)} cluster(s), {hosts} host(s))" if clusters else ""]
        skipped = logs.other_log_lines if logs is not None else 0
        return (f"kubectl-meshdoctor {__version__}: no capture; {', '.join(x for x in read if x)} read"
                + (f"; {skipped} line(s) of no known kind skipped" if skipped else ""))
    ifaces = ", ".join(_iface_count(report, k) for k in sorted(set(st.by_iface) | set(_read_live(report)))) or "none"
    return (f"kubectl-meshdoctor {__version__}: {st.packets} packets analysed ({ifaces}), {st.flows_seen} flows, "
            f"{st.duration_s:.1f} s")


def verdict(report: Report) -> str | None:
    """The report's first word on the run, one line (verdict_of); None for a lint report, and for a run that read
    nothing."""
    if isinstance(report.source, LintSource):
        return None
    logs = _logs_read(report)
    return verdict_of(report.groups, report.stats, logs.access_log_lines if logs is not None else 0)


def verdict_of(groups: Sequence[FindingGroup], stats: PipelineStats, requests: int) -> str | None:
    """One line on a run: the failures seen (errors and warnings of traffic, by problem: ``groups``), else ``no
    failure seen in N s of traffic (M requests logged, K connections)`` from ``stats`` and the ``requests``
    (access-log lines) read; the pods' spec warnings (lint) counted apart, for they are no failure seen. None
    when nothing was read (no packet, no request). The report and the triage desk's status line say it alike."""
    spec = [g for g in groups if isinstance(g.shown.flow, NoFlow) and g.shown.flow.kind == SPEC]
    failing = [g for g in groups if g not in spec and g.shown.severity in (Severity.ERROR, Severity.WARNING)]
    specs = f"; {len(spec)} spec warning{'' if len(spec) == 1 else 's'} of the pods (lint)" if spec else ""
    if failing:
        errors = sum(g.shown.severity is Severity.ERROR for g in failing)
        named = ", ".join(dict.fromkeys(g.shown.detector for g in failing))
        warnings = len(failing) - errors
        return (f"verdict: {len(failing)} failure problem{'' if len(failing) == 1 else 's'} ({errors} error"
                f"{'' if errors == 1 else 's'}, {warnings} warning{'' if warnings == 1 else 's'}): {named}{specs}")
    if not stats.packets and not requests:
        return None
    seen = [f"{requests} request{'' if requests == 1 else 's'} logged" if requests else "",
            f"{stats.flows_seen} connection{'' if stats.flows_seen == 1 else 's'}" if stats.packets else ""]
    span = f" in {stats.duration_s:.0f} s of traffic" if stats.duration_s >= 1 else ""
    return f"verdict: no failure seen{span} ({', '.join(x for x in seen if x)}){specs}"


def _read_live(report: Report) -> dict[str, int]:
    """A live run's frames read by each of its streams (``eth0``, ``pod/eth0``): offline they are by file."""
    return report.stats.frames_read if isinstance(report.source, LiveSource) else {}


def _iface_count(report: Report, key: str) -> str:
    """``eth0 240``; with the frames read when the detectors were given fewer (the lean capture's prefilter keeps
    the segments a detector acts on: an eth0 of pure ACKs analyses none of its frames)."""
    st = report.stats.by_iface.get(key)
    analysed = st.packets if st is not None else 0
    read = _read_live(report).get(key, 0)
    return f"{key} {analysed}" + (f" (of {read} read)" if read > analysed else "")


def _logs_read(report: Report) -> LogLinesRead | None:
    """The Envoy log lines a run read: one sidecar's, the files', or several pods' summed."""
    if isinstance(report.envoy, PerPodSide):
        sides = [side.logs for side in report.envoy.per_pod.values()]
        return LogLinesRead(*(sum(getattr(x, f) for x in sides) for f in LogLinesRead.__slots__)) if sides else None
    return getattr(report.envoy, "logs", None)


def _pods_read(report: Report) -> list[str]:
    """``pod/NAME: FILE (lo), FILE (envoy-log)`` for each pod of an analyze that names pods: what was read as
    whose."""
    source = report.source
    if not isinstance(source, FilesSource):
        return []
    out = []
    for s in source.per_pod:
        what = {**(s.kinds or {}), **(s.interfaces or {})}
        dirs = {os.path.dirname(f) for f in s.files}
        # a pod directory's half-dozen files: its directory once, so the header stays a line a pod
        shared = next(iter(dirs)) if len(dirs) == 1 and len(s.files) >= FILES_FACTORED else ""
        out.append(f"pod/{s.pod}" + (f" (in {shared}{os.sep})" if shared else "") + ": " + ", ".join(
            f"{os.path.basename(f) if shared else f} ({what.get(f, 'capture')})" for f in s.files))
    return out


FILES_FACTORED = 3  # files of one pod, all in one directory, from which the header names that directory once


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


def _pods_text(g: FindingGroup) -> str:
    """`` pod/NAME`` for one pod, `` N pods (A, B)`` for a group over several: none pinned on its first."""
    pods = group_pods(g)
    if len(pods) > 1:
        return f" {len(pods)} pods ({', '.join(pods)})"
    return f" pod/{pods[0]}" if pods else ""


def _where(f: Finding, several_pods: bool) -> str:
    """An instance among others: its client (and pod, in a group over ``several_pods``), or for a finding of no
    one connection (a spec's, the counters') its pod and where."""
    if not f.flow.of_one_connection:
        return f"pod/{f.pod} {f.flow.server}" if f.pod else f.flow.server
    return f"pod/{f.pod} {f.flow.client}" if f.pod and several_pods else f.flow.client


def _group_head(g: FindingGroup) -> str:
    f = g.newest
    flags = f" [{','.join(f.envoy_flags)}]" if f.envoy_flags else ""
    pod = _pods_text(g)
    return f"{f.severity.value.upper()} {f.detector}{flags}{pod}: {g.label}"


def _sharing(groups) -> Counter:
    """How many problems of a pod name each of its counters, by (pod, counter): an Envoy cluster's counter
    counts every problem on that cluster, not the one it is shown with."""
    return Counter((g.shown.pod, name) for g in groups for name in g.counters)


def _whose(pod: str | None, name: str, sharing: Counter) -> str:
    n = sharing[pod, name]
    return "the run's" if n < 2 else f"the run's, for {'both' if n == 2 else f'all {n}'} problems that name it"


class _Verbatim(str):
    """A line of the text report never wrapped: a fix's YAML (its comments but as comments), a quoted log line
    (copied and searched for as is: a terminal's own soft wrap keeps a long line one line when copied)."""


def render_text(report: Report, width: int | None = None) -> str:
    """A report a person reads in a terminal: one block per problem (group of alike findings), most severe
    first, each a screenful at most: how often and when, the newest instance in full, a few others by flow,
    the run's counters once, the explanation and the fix once. ``width``: a terminal's columns, every line
    wrapped to it with a hanging indent (``frontends.hanging``) but a fix's YAML and the quoted log lines, and
    its control bytes escaped; None (piped, a file): the explanations wrapped to TEXT_WIDTH, the rest as is."""
    prose = min(width, TEXT_WIDTH) if width else TEXT_WIDTH
    lines = [_headline(report), *filter(None, [verdict(report)]), *_pods_read(report)]
    for p in report.problems:
        lines.append(f"problem: {p.line()}")
    lines += [d.line() for d in report.debug_reports()]
    for u in report.unseen():  # wrapped at the prose width: one line of some 200 columns otherwise
        lines += textwrap.wrap(u.line(), prose, subsequent_indent="  ", break_on_hyphens=False)
    if not report.findings:
        lines.append("no findings")
    sharing = _sharing(report.groups)
    for g in report.groups:
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
            lines.append(_envoy_details(f))
        several_pods = len(group_pods(g)) > 1
        if g.count > 1 and len(set(map(len, (i.stands_on for i in g.instances)))) > 1:
            lines.append("  stands on: " + ", ".join(f"{kind} in {n} of {g.count}"
                                                     for kind, n in g.stands_on_counts().items()))
        which = ("newest, " if f is g.newest else "best evidenced, ") if g.count > 1 else ""
        lines.append(f"  {which}{'pod/' + f.pod + ' ' if several_pods else ''}{f.flow.text()}")
        if (hop := hop_of(f)) is not None:
            lines.append(f"  hop: {hop.text()}")
        for e in f.evidence:  # a multi-line value (a YAML annotation) stays under its own line
            lines.append(f"      evidence: {e.cited()}".replace("\n", "\n" + " " * 16))
        for line in f.access_log:
            lines.append(_Verbatim(f"      access log: {line}"))
        quoted = {e.frame for e in f.evidence if e.kind == ENVOY_LOG}
        own = [line for line in f.envoy_log][:ENVOY_LINES_SHOWN] if not quoted else []
        for line in own:  # the lines a packet finding's request left in Envoy's debug log
            lines.append(_Verbatim(f"      envoy log: {line}"))
        if len(f.envoy_log) > len(own) and own:
            lines.append(f"      envoy log: ... {len(f.envoy_log) - len(own)} more line(s) (-o json has them)")
        others = [i for i in g.instances if i is not f][-OTHERS_LISTED:]
        if others:
            listed = ", ".join(_where(o, several_pods) + (f" ({_clock(o.ts)})" if o.ts else "")
                               for o in reversed(others))
            more = g.count - 1 - len(others)
            lines += textwrap.wrap(f"{listed}" + (f" and {more} more (-o json lists every one)" if more else ""),
                                   prose, initial_indent="  also: ", subsequent_indent="        ",
                                   break_on_hyphens=False, break_long_words=False)
        for name, value in sorted(g.counters.items()):
            lines.append(f"  counter ({_whose(f.pod, name, sharing)}): {name} {value:+}")
        if f.explanation:  # wrapped: a screenful per problem in a terminal, not one line 1,000 columns wide
            lines += hang(f"  why: {f.explanation}", prose, indent=7) if width else \
                textwrap.wrap(f.explanation, prose, initial_indent="  why: ", subsequent_indent="       ",
                              break_on_hyphens=False, break_long_words=False)
        lines += _fix_lines(f, prose)
    if width:  # each line's own escapes first: they widen it
        lines = [part for line in lines for one in line.split("\n") for part in _wrapped(line, block(one), width)]
    return "\n".join(lines) + "\n"


def _envoy_details(f: Finding) -> str:
    """The %RESPONSE_CODE_DETAILS% line: what Envoy logged when a log line backs the finding; else what it would
    log (with its response flags), which a packets-only finding infers: Envoy's log was not read."""
    if {"access-log", "envoy-log"} & set(f.stands_on):
        return f"  envoy logged: {f.response_code_details}"
    flags = "/".join(f.envoy_flags)
    return (f"  envoy would log: {f.response_code_details}" + (f" (flag {flags})" if flags else "")
            + ", no log line of it")  # the run may have read a log: none of its lines is this one


def _wrapped(line: str, one: str, width: int) -> list[str]:
    """``one`` (a line of ``line``) wrapped to ``width``: a _Verbatim line kept whole, but for a YAML comment,
    which goes on as a comment (``#   ...``: the fix still parses, a `command` in it stays on one line)."""
    if not isinstance(line, _Verbatim):
        return hang(one, width)
    return hang(one, width, prose=True) if one.lstrip().startswith("#") else [one]


def rendered_for(output: str, report: Report, stream) -> str:
    """``report`` as ``-o output`` for ``stream``: ``-o text`` to a terminal wrapped to its width
    (shutil.get_terminal_size: $COLUMNS, else the terminal's), anything else as ``RENDERERS`` give it, so a
    pipe, a file and the golden reports read as before."""
    if output == "text" and stream.isatty():
        return render_text(report, max(shutil.get_terminal_size().columns, 40))
    return RENDERERS[output](report)


def _fix_lines(f: Finding, width: int = TEXT_WIDTH) -> list[str]:
    """The text report's fix: the first fix in full (it keeps the most), the others by name, so that a problem
    stays a screenful; markdown and JSON give every fix's YAML. Its YAML and notes (commands) are _Verbatim."""
    if not f.fixes or (f.remediation and not f.remediation.startswith(render(f.fixes))):  # the detector's own text
        return ["  fix:", *(_Verbatim("    " + ln) for ln in f.remediation.splitlines())] if f.remediation else []
    first, n = f.fixes[0], len(f.fixes)
    wrap = dict(width=width, subsequent_indent="      ", break_on_hyphens=False, break_long_words=False)
    lines = textwrap.wrap(f"fix: 1 of {n} ({first.name}), {first.title}", initial_indent="  ", **wrap)
    lines += textwrap.wrap(f"keeps: {first.keeps}; costs: {first.costs}", initial_indent="    ", **wrap)
    lines += [_Verbatim("    " + ln) for ln in first.text.splitlines()]
    for i, fix in enumerate(f.fixes[1:], start=2):
        lines += textwrap.wrap(f"or {i} of {n} ({fix.name}), {fix.title}", initial_indent="  ", **wrap)
    if n > 1:
        lines.append("  (-o markdown or -o json: every fix, with what it keeps and costs)")
    lines += [_Verbatim("    " + ln) for ln in note_of(f.remediation, f.fixes).splitlines()]
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
    if (said := verdict(report)) is not None:
        out += [f"**{_md(said)}**", ""]
    pods_read = _pods_read(report)
    out += [f"- {_md(line)}" for line in pods_read] + ([""] if pods_read else [])
    for p in report.problems:
        out.append(f"> **problem** {_md(p.line())}")
    debug = [d.line() for d in report.debug_reports()]
    out += [f"> {line}" for line in debug] + [f"> {_md(u.line())}" for u in report.unseen()]
    debug += [u.line() for u in report.unseen()]
    if report.problems or debug:
        out.append("")
    groups = report.groups
    if not groups:
        out.append("No findings.")
        return "\n".join(out) + "\n"
    sharing = _sharing(groups)
    several_pods = len({f.pod for f in report.findings if f.pod}) > 1
    out += ["| severity | detector | Envoy flags | times | server | finding | first seen (UTC) | last seen (UTC) |",
            "|---|---|---|---|---|---|---|---|"]
    for g in groups:
        f = g.newest
        pods = group_pods(g)
        server = f"{len(pods)} pods" if len(pods) > 1 else \
            f"pod/{pods[0]} {f.flow.server}" if pods and several_pods else f.flow.server
        seen = (f"{_clock(g.first_ts)} | {_clock(g.last_ts)}" if g.first_ts else "- | -")  # a spec has no time
        out.append(f"| {f.severity.value} | `{f.detector}` | {','.join(f.envoy_flags)} | {g.count} | "
                   f"{_cell(server)} | {_cell(g.label)} | {seen} |")
    for n, g in enumerate(groups, 1):
        f = g.shown
        out += ["", f"## {n}. {f.severity.value}: {_md(g.label)}", "", f"{_md(f.title)}, seen {g.span_text()}.", "",
                f"- detector: `{f.detector}`", f"- Envoy response flags: {', '.join(f.envoy_flags) or '-'}"]
        if f.response_code_details:
            out.append(f"- response_code_details: `{f.response_code_details}`")
        pods = group_pods(g)
        if pods:
            out.append(f"- pod{'s' if len(pods) > 1 else ''}: {_md(', '.join(pods))}")
        if (hop := hop_of(f)) is not None:
            out.append(f"- hop: {_md(hop.text())}")
        for name, value in sorted(g.counters.items()):
            out.append(f"- counter ({_whose(f.pod, name, sharing)}): `{name}` {value:+}")
        out += ["", f"Evidence of the {'newest' if f is g.newest else 'best evidenced'} instance:", "",
                "| source | where | what |", "|---|---|---|"]
        out += [f"| {_cell(e.source)} | {_cell(e.locator())} | {_cell(e.what)} |" for e in f.evidence]
        for line in f.access_log:
            out += ["", "Access log:", "", "```text", line, "```"]
        if f.envoy_log:
            out += ["", "Envoy's own log:", "", "```text", *f.envoy_log, "```"]
        if g.count > 1:
            shown = g.instances[-INSTANCES_TABLE:]
            out += ["", f"Instances ({len(shown)} newest of {g.count}; `-o json` lists every one):", "",
                    "| # | time (UTC) | flow | deciding evidence |", "|---|---|---|---|"]
            first = g.count - len(shown) + 1
            for i, occ in enumerate(shown, first):
                framed = [e for e in occ.evidence if e.frame]  # the deciding packet is the latest evidence
                last = max(framed, key=lambda e: e.ts) if framed else None
                deciding = f"{last.source} {last.locator()}" if last is not None else "-"
                out.append(f"| {i} | {_clock(occ.ts)} | {_cell(occ.flow.text(labelled=False))} | {_cell(deciding)} |")
        ladder = render_ladder(f)
        if ladder:
            out += ["", "Packets of the newest instance (time in ms since its first packet):", "", "```text",
                    *ladder, "```"]
        out += ["", _md(f.explanation), "", "Fix:", "", "```yaml", f.remediation, "```"]
    return "\n".join(out) + "\n"


def _shown(render):
    """A renderer for a terminal or a ticket: the traffic's control bytes escaped (frontends/shown.py). JSON
    escapes them itself."""
    def shown(report: Report) -> str:
        return block(render(report))
    shown.__doc__ = render.__doc__
    return shown


RENDERERS = {"json": render_json, "text": _shown(render_text), "markdown": _shown(render_markdown)}
