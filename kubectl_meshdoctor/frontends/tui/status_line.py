"""The status line under the header: packets per interface (or pods), flows, findings and tcpdump's drops; the
verdict (the failures seen, or none, as the report's first line says it); then what the run is doing (a slow
step with its age) and its latest problem."""

from __future__ import annotations

import re
import textwrap

from kubectl_meshdoctor.core.groups import FindingGroup
from kubectl_meshdoctor.frontends.report import verdict_of
from kubectl_meshdoctor.frontends.shown import one_line

from .session import Session

SEP = "  ·  "  # between the parts of the compact layout's second row
# the report's verdict (frontends/report.py verdict_of): its prefix, its total of failure problems, their severities
_VERDICT_TOTAL = re.compile(r"^(verdict(?: so far)?: )\d+ failure problems? \(([^()]*)\)")
# its parts: the errors and warnings (or "no failure seen"), what follows (the detectors' names, or the traffic
# seen), and the pods' spec warnings (lint) it counts apart
_VERDICT_PARTS = re.compile(r"^(verdict(?: so far)?: )(?:\d+ failure problems? \(([^()]*)\): |(no failure seen))(.*?)"
                            r"(?:; (\d+ spec warnings?) of the pods \(lint\))?$")
# Progress messages of start-up steps that wait on something (commands.watch.live, kube.debug): shown with their age.
WAITING_STEPS = ("resolving", "checking", "adding", "reusing", "waiting", "reading", "stopping")


def status_text(session: Session, groups: list[FindingGroup], findings: int, progress: str, waited: float,
                finished: bool, held: int | None, where: str = "", width: int = 0, compact: bool = False) -> str:
    """``findings``: how many the list counts; ``waited``: seconds since ``progress`` came (shown for a
    WAITING_STEPS step from 2 s on, while not ``finished``); ``held``: findings held while paused (None: not
    paused); ``where``: the run's target, when the header is hidden; ``width``: the line's columns (0: as wide as
    the text).

    Wide, one row each: the target (cut to two rows), the counts, the verdict, the step, the latest problem (two
    rows). ``compact`` (80x24, s44: the status took 5 of the 24 rows): two rows, the target then the traffic's
    counts (the target cut with "…" at ``width``: the counts are whole); then a step being waited on (or any step
    before there is a verdict), the verdict, how many problems and drops, any other step, the latest problem (the
    app also shows a new one as a notification), fitted by priority (``_second_row``). The report has every line
    whole."""
    st = session.stats()
    pods = {k.rpartition("/")[0] for k in st.by_iface}
    if len(pods) > 1:
        ifaces = f"{len(pods)} pods: {st.packets} pkts"
    else:
        ifaces = "  ".join(f"{k}: {v.packets} pkts" for k, v in sorted(st.by_iface.items())) or ("no packets yet" if session.live else "no packets")
    said = verdict_of(groups, st, session.access_log_count())
    if said is not None and session.live and not finished:  # the capture goes on: what it has seen until now
        said = said.replace("verdict:", "verdict so far:", 1)
    drops = session.drops()
    if drops:
        known = [v for v in drops.values() if v is not None]
        dropped = f"drops: {sum(known)}" if len(known) == len(drops) else "drops: at the end"
    else:
        dropped = ""
    if not finished and progress.startswith(WAITING_STEPS) and waited >= 2:
        progress += f" ({waited:.0f} s)"  # a slow step shows that it is still being waited on
    state = f"PAUSED (p resumes; {held} new findings held)  " if held is not None else ""
    problems = session.problems()
    latest = f"problems ({len(problems)}): {problems[-1]}" if problems else ""
    if compact:  # the traffic's counts; then a step waited on, the verdict, the trouble's counts, the rest
        step = state + progress
        waiting = not said or state or progress.startswith(WAITING_STEPS)
        trouble = "  ".join(x for x in (f"problems: {len(problems)}" if problems else "", dropped) if x)
        second = _second_row([step if waiting else "", said or ""], trouble,
                             [x for x in ("" if waiting else step, latest) if x], width)
        counts = f"{ifaces}  flows: {st.flows_seen}  findings: {findings}"
        short = f"{st.packets} pkts  flows: {st.flows_seen}  findings: {findings}"  # s46: before the namespace
        return _before(where, [counts, short], width) + "\n" + second
    counts = f"{ifaces}  flows: {st.flows_seen}  findings: {findings}  {dropped}".rstrip()
    if width > 1 and len(where) > 2 * width:
        where = where[:2 * width - 1] + "…"
    trouble = f"\n{_cut(latest, width, rows=2)}" if problems else ""
    return (f"{where + chr(10) if where else ''}{counts}\n"
            f"{said + chr(10) if said else ''}{_cut(state + progress, width)}{trouble}")


def _second_row(first: list[str], trouble: str, rest: list[str], width: int) -> str:
    """The compact layout's second row, parts apart by SEP, in priority order: ``first`` (a step waited on, the
    verdict), then ``trouble`` (how many problems, drops: short, always whole), then ``rest`` (any other step, the
    latest problem), which the screen cuts at ``width`` with "…" (the app's CSS: text-overflow): their text stays
    whole for a search. Where ``first`` and ``trouble`` do not fit, lower priorities give way first: ``rest``,
    then the verdict's total (``_short_verdict``: its errors and warnings say it), then its detectors' names,
    which go after the trouble (``_verdict_counts``: s46, the counts whole before any name), then the end of
    ``first``, cut with "…". s45: the verdict's 66-74 columns had left no room for anything after it at 80
    columns."""
    first = [one_line(x) for x in first if x]
    rest = [one_line(x) for x in rest]
    forms = [(first, rest), ([_short_verdict(x) for x in first], rest)]
    for tight in (False, True):
        counted = [_verdict_counts(x, tight) for x in first]
        forms.append(([x for x, _ in counted], [x for _, x in counted if x] + rest))
    for lead, after in forms:
        head = SEP.join([*lead, trouble] if trouble else lead)
        room = width - 1 if after else width  # a column for the screen's "…" after the row's head
        if width <= 1 or len(head) <= room:
            break
    else:  # the end of the step and verdict cut, the trouble's counts kept whole after them
        if not trouble:  # nothing to keep after them: the screen cuts the row
            return SEP.join(x for x in (head, *after) if x)
        text = SEP.join(lead)
        keep = room - len(trouble) - len(SEP) - 1
        head = (text[:keep] + "…" + SEP + trouble) if keep > 0 else _cut(trouble, room)
    return SEP.join(x for x in (head, *after) if x)


def _verdict_counts(line: str, tight: bool = False) -> tuple[str, str]:
    """A verdict line as its counts and the rest: ``verdict: 1 error, 0 warnings + 2 spec (lint)`` and its
    detectors' names ``a, b`` (``verdict: no failure seen + 1 spec (lint)`` and ``in 12 s of traffic (…)``);
    ``tight``, the counts in fewer words (``so far: 1 error, 0 warnings + 2 spec``); any other line as it is, and ""."""
    m = _VERDICT_PARTS.match(line)
    if m is None:
        return line, ""
    lead, severities, none, after, spec = m.groups()
    if tight:
        lead = lead.removeprefix("verdict").removeprefix(":").lstrip()
    counts = lead + (severities or none) + (f" + {spec.split()[0]} spec" if spec else "")
    counts += " (lint)" if spec and not tight else ""
    return counts, after.strip()


def _short_verdict(line: str) -> str:
    """``verdict: 2 failure problems (1 error, 1 warning): a, b`` as ``verdict: 1 error, 1 warning: a, b``: the
    total is the sum of the errors and warnings. Any other line as it is."""
    return _VERDICT_TOTAL.sub(r"\1\2", line, count=1)


def _before(where: str, counts: list[str], width: int) -> str:
    """``where`` and the traffic's counts on one row of ``width`` columns: the first of ``counts`` (their longest
    form first) with which ``where`` is whole (s46: at 80 columns the per-interface packet counts give way to a
    watch's namespace and context); else the first, whole, and ``where`` cut with "…" (a pod's name first, its
    namespace and context cut; a list of files); the row cut if the counts alone are wider."""
    where = one_line(where)
    text = next((c for c in counts if width <= 1 or len(where) + 2 + len(c) <= width), counts[0])
    if not where:
        return _cut(counts[0], width)
    room = width - len(text) - 2
    if width > 1 and len(where) > room:
        where = where[:room - 1] + "…" if room > 8 else ""  # less than a pod's name: the counts alone
    return _cut(f"{where}  {text}" if where else text, width)


def _cut(line: str, width: int, rows: int = 1) -> str:
    """``line`` in ``rows`` rows of ``width`` columns (0: as it is): what the run is doing is one row, its latest
    problem two, so that on 80x24 the findings keep the screen (the report has them whole)."""
    line = one_line(line)  # its control bytes as the screen shows them: escaped, so as wide as their escapes
    if width <= 1 or len(line) <= width:
        return line
    # wrapped here as the screen wraps (at spaces), so that the rows kept are the rows shown
    wrapped = textwrap.wrap(line, width, break_long_words=True, break_on_hyphens=False)
    if len(wrapped) > rows:
        wrapped = wrapped[:rows]
        wrapped[-1] = wrapped[-1][:width - 1] + "…"
    return "\n".join(wrapped)
