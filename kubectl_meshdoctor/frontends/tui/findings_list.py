"""The triage desk's findings list: one row per problem (core/groups.py), not per finding. A collision seen 88
times is one row that counts to 88; five framing violations of one app are five rows that say which is which.

The list keeps its selection by group, not by row index: while findings arrive the highlighted row, the detail,
the packets pane and `s` go on referring to the same problem, and to the instance the user stepped to. During a
run the findings are filed again in their joined form (core/live_join.py: a finding with the lines it explains, the
two hops of one request one finding): a row whose finding was folded into another's goes, and the selection with
it moves to the row that took it in. With several pods each row names its pod (pod_names.py).
"""

from __future__ import annotations

import textwrap

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from kubectl_meshdoctor.core.findings import Finding, Severity
from kubectl_meshdoctor.core.groups import FindingGroup, Grouper, GroupKey, group_key

from ..shown import one_line
from .plain import PlainTable
from .pod_names import other_pods, short_names

SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_SHORT = {Severity.ERROR: "ERR", Severity.WARNING: "WARN", Severity.INFO: "INFO"}
_SEV_WIDTH = 6  # the first column: the selected row's mark, ERR / WARN / INFO over the count (×88)
_MARK = "▶"  # before the selected row's severity
_PADDING = 2  # DataTable's cell padding, one column on each side
MAX_LABEL_LINES = 3


def label_lines(g: FindingGroup, width: int, pods: dict[str, str] | None = None) -> list[str]:
    """The finding cell: the pod (``pods``: pod -> its short name, given when the run has several; a joined
    finding's as ``caller+server``), the detector, its response flags and the server, then the group's label
    wrapped to ``width`` columns (at most MAX_LABEL_LINES lines; a label's start tells rows apart, so a cut falls
    at its end)."""
    f = g.newest
    head = f"{f.detector}  {','.join(f.envoy_flags) or '-'}  {f.flow.server}"
    if pods and f.pod is not None:
        head = "+".join(pods.get(p) or one_line(p) for p in (f.pod, *other_pods(f))) + "  " + head
    wrapped = textwrap.wrap(g.label, max(width, 10), break_on_hyphens=False) or [""]  # Content-Length whole
    if len(wrapped) > MAX_LABEL_LINES:
        wrapped = wrapped[:MAX_LABEL_LINES]
        wrapped[-1] = wrapped[-1][:max(width - 1, 1)] + "…"
    return [head[:width], *wrapped]


class FindingsTable(PlainTable):
    """The findings' table: Enter opens the selected problem's detail, and the footer says so first (and Tab,
    to the detail and packets panes, where they are beside it)."""

    BINDINGS = [Binding("enter", "select_cursor", "Detail", key_display="Enter"),
                Binding("tab", "app.focus_next", "Pane", key_display="Tab")]


class FindingsList:
    """The groups of the findings shown so far, drawn into ``table`` (a DataTable with cursor_type="row")."""

    def __init__(self, table: DataTable) -> None:
        self.table = table
        self.grouper = Grouper()
        self.order: list[FindingGroup] = []  # in the order each group first appeared
        self.selected: GroupKey | None = None
        # The instance shown (index into the group); None: the newest, only while ``following``. Once the user
        # picks, steps or reads, it holds still as more instances arrive (issue 32).
        self.instance: int | None = None
        self.following = True  # until the user picks a row, the newest group (and its newest) is the selected one
        self._width = 0
        # what the table shows, top first: (group, its count, its newest instance, the pods' names)
        self._drawn: list[tuple[GroupKey, int, Finding, dict]] = []
        self.pods: dict[str, None] = {}  # the run's pods, in the order met (a finding's, or the session's)
        self._names: dict[str, str] = {}  # their short names, when there are several
        table.add_column("sev", key="sev", width=_SEV_WIDTH)
        table.add_column("finding", key="finding")

    def add(self, f: Finding) -> None:
        self.note_pods([f.pod] if f.pod else [])
        group, new = self.grouper.add(f)
        if new:
            self.order.append(group)

    def note_pods(self, pods: list[str]) -> None:
        """The run's pods (each finding's are noted as it is filed): several, and every row names its pod."""
        if any(p not in self.pods for p in pods):
            self.pods.update(dict.fromkeys(pods))
            self._names = short_names(self.pods) if len(self.pods) > 1 else {}

    def replace(self, findings: list[Finding]) -> None:
        """File ``findings`` instead of those filed so far: the same run's, some in their joined form. Groups
        keep their place; a selected group that is no more hands the selection to the group of the finding that
        took its newest in (one quoting the same evidence, or of the same connection), else to the newest."""
        old = self.current()
        place = {g.key: i for i, g in enumerate(self.order)}
        self.grouper = Grouper()
        order: list[FindingGroup] = []
        for f in findings:
            self.note_pods([f.pod] if f.pod else [])
            group, new = self.grouper.add(f)
            if new:
                order.append(group)
        self.order = sorted(order, key=lambda g: place.get(g.key, len(place)))  # stable: new ones in arrival order
        g = self.group(self.selected)
        if g is None and old is not None:
            taken_in = next((f for f in findings if set(f.evidence) & set(old.evidence)), None) or next(
                (f for f in findings if f.flow == old.flow and f.detector == old.detector), None)
            if taken_in is not None:
                self.selected, self.instance = group_key(taken_in), None
                if not self.following and (took := self.group(self.selected)) is not None:
                    self.instance = took.instances.index(taken_in) if taken_in in took.instances else took.count - 1
            else:
                self.selected, self.instance, self.following = None, None, True
        elif g is not None and self.instance is not None and self.instance >= g.count:
            self.instance = g.count - 1

    def drawn_now(self) -> list[tuple]:
        return [(g.key, g.count, g.newest, self._names, g.key == self.selected) for g in self.groups()]

    def up_to_date(self) -> bool:
        """Whether the table shows every group filed, each with its count (what a redraw would draw)."""
        return _same(self._drawn, self.drawn_now())

    def groups(self) -> list[FindingGroup]:
        """Top row first: the newest group, as the list has always shown the newest finding first."""
        return list(reversed(self.order))

    def group(self, key: GroupKey | None) -> FindingGroup | None:
        return next((g for g in self.order if g.key == key), None)

    def current(self) -> Finding | None:
        """The finding the detail, the packets pane and `s` refer to: the selected group's chosen instance."""
        g = self.group(self.selected)
        if g is None:
            return None
        return g.instances[min(self.instance, g.count - 1)] if self.instance is not None else g.newest

    def pin(self) -> None:
        """The user read, picked or stepped: the selected problem and instance hold still from now on, a new
        group does not take the selection and a new instance does not replace the one shown."""
        self.following = False
        g = self.group(self.selected)
        if g is not None and self.instance is None:
            self.instance = g.count - 1

    def step(self, by: int) -> bool:
        """Move to an older (-1) or newer (+1) instance of the selected group; False at either end. ``by`` past
        an end goes to that end (``step(len)``: the newest)."""
        g = self.group(self.selected)
        if g is None:
            return False
        at = self.instance if self.instance is not None else g.count - 1
        to = min(max(at + by, 0), g.count - 1)
        self.pin()
        if to == at:
            return False
        self.instance = to
        return True

    def _cells(self, g: FindingGroup, width: int) -> tuple[list, int]:
        f = g.newest
        lines = [one_line(line) for line in label_lines(g, width, self._names)]  # the title quotes the traffic
        # A mark, not only the cursor's colour, tells the selected row (a terminal may show no colour).
        mark = Text(_MARK, style="bold") if g.key == self.selected else Text(" ")
        sev = mark + Text(_SHORT[f.severity], style=SEVERITY_STYLE[f.severity]) + Text(f"\n ×{g.count}")
        return [sev, Text(lines[0], style="bold") + Text("\n" + "\n".join(lines[1:]))], max(len(lines), 2)

    def redraw(self, width: int) -> None:
        """Draw the groups into the table if anything changed (a group, a count, the width), keeping the cursor
        on the selected group (the newest group while ``following``)."""
        groups = self.groups()
        if groups and (self.following or self.selected is None) and groups[0].key != self.selected:
            self.selected, self.instance = groups[0].key, None
        text_width = max(width - _SEV_WIDTH - 2 * _PADDING - 2, 16)  # 2: the scrollbar
        drawn = self.drawn_now()
        if [d[0] for d in drawn] == [d[0] for d in self._drawn] and width == self._width:
            for now, before, g in zip(drawn, self._drawn, groups):
                if not _same([now], [before]):  # a count moved, or the newest was joined: update in place, the
                    (sev, finding), _ = self._cells(g, text_width)  # cursor stays where it is
                    self.table.update_cell(repr(g.key), "finding", finding)
                    self.table.update_cell(repr(g.key), "sev", sev)
            self._drawn = drawn
            return
        self._drawn, self._width = drawn, width
        self.table.columns["finding"].width = text_width  # type: ignore[index]
        self.table.clear()
        for g in groups:
            cells, height = self._cells(g, text_width)
            self.table.add_row(*cells, key=repr(g.key), height=height)
        row = next((i for i, g in enumerate(groups) if g.key == self.selected), 0)
        if row:
            self.table.move_cursor(row=row, animate=False)

    def select_key(self, row_key: str) -> bool:
        """The user highlighted the row ``row_key``; True when that is another group (its newest instance is
        then the current finding)."""
        g = next((g for g in self.order if repr(g.key) == row_key), None)
        if g is None or g.key == self.selected:
            return False
        self.following = False
        self.selected, self.instance = g.key, g.count - 1
        self.redraw(self._width)  # the mark moves to it
        return True


def _same(a: list[tuple], b: list[tuple]) -> bool:
    """Whether two drawings are alike: the same groups, counts and pods' names, each newest the same object."""
    return len(a) == len(b) and all(x[0] == y[0] and x[1] == y[1] and x[2] is y[2] and x[3] == y[3]
                                    and x[4] == y[4] for x, y in zip(a, b))
