"""The status line under the header: packets per interface (or pods), flows, findings and tcpdump's drops; the
verdict (the failures seen, or none, as the report's first line says it); then what the run is doing (a slow
step with its age) and its latest problem."""

from __future__ import annotations

import textwrap

from kubectl_meshdoctor.core.groups import FindingGroup
from kubectl_meshdoctor.frontends.report import verdict_of
from kubectl_meshdoctor.frontends.shown import one_line

from .session import Session

# Progress messages of start-up steps that wait on something (commands.watch.live, kube.debug): shown with their age.
WAITING_STEPS = ("resolving", "checking", "adding", "reusing", "waiting", "reading", "stopping")


def status_text(session: Session, groups: list[FindingGroup], findings: int, progress: str, waited: float,
                finished: bool, held: int | None, where: str = "", width: int = 0, compact: bool = False) -> str:
    """``findings``: how many the list counts; ``waited``: seconds since ``progress`` came (shown for a
    WAITING_STEPS step from 2 s on, while not ``finished``); ``held``: findings held while paused (None: not
    paused); ``where``: the run's target, when the header is hidden; ``width``: the line's columns (0: as wide as
    the text).

    Wide, one row each: the target (cut to two rows), the counts, the verdict, the step, the latest problem (two
    rows). ``compact`` (80x24, s44: the status took 5 of the 24 rows): two rows, the target then the counts (the
    target cut with "…" at ``width``: the counts, with how many problems, are whole); then one line that the screen
    cuts at its edge: a step being waited on (or any step before there is a verdict), the verdict, any other
    step, the latest problem (the app also shows a new one as a notification). The report has every line
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
    counts = f"{ifaces}  flows: {st.flows_seen}  findings: {findings}  {dropped}".rstrip()
    if compact:  # the problems counted with the counts; a step waited on, the verdict, any other step, the problem
        counts += f"  problems: {len(problems)}" if problems else ""
        step = state + progress
        waiting = not said or state or progress.startswith(WAITING_STEPS)
        second = [step if waiting else "", said or "", "" if waiting else step, latest]
        # one line: the screen cuts it with "…" (the app's CSS: text-overflow), the text stays whole for a search
        return _before(where, counts, width) + "\n" + one_line("  ·  ".join(x for x in second if x))
    if width > 1 and len(where) > 2 * width:
        where = where[:2 * width - 1] + "…"
    trouble = f"\n{_cut(latest, width, rows=2)}" if problems else ""
    return (f"{where + chr(10) if where else ''}{counts}\n"
            f"{said + chr(10) if said else ''}{_cut(state + progress, width)}{trouble}")


def _before(where: str, counts: str, width: int) -> str:
    """``where`` and ``counts`` on one row of ``width`` columns: ``where`` cut with "…" to leave ``counts``
    whole (a pod's name first, its namespace and context cut), the row cut if ``counts`` alone is wider."""
    where = one_line(where)
    if not where:
        return _cut(counts, width)
    room = width - len(counts) - 2
    if width > 1 and len(where) > room:
        where = where[:room - 1] + "…" if room > 8 else ""  # less than a pod's name: the counts alone
    return _cut(f"{where}  {counts}" if where else counts, width)


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
