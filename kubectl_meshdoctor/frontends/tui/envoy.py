"""Envoy panes: the sidecar's clusters and hosts (counters that moved are highlighted) and its access log
(response flags coloured, filterable). They render what the session hands them and fetch nothing themselves
but through the session's callables, in worker threads. With several pods each pane keeps them apart: `p` goes
to the next pod's sidecar (the clusters pane: one pod's /clusters at a time, each a fetch of its own), and the
access log names each line's pod, or shows one pod's lines."""

from __future__ import annotations

import time
from collections.abc import Callable

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Header, Input, Static

from kubectl_meshdoctor.core.findings import Finding
from kubectl_meshdoctor.core.hop_path import flags_logger
from kubectl_meshdoctor.core.redact import redact_target
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.clusters import Cluster
from kubectl_meshdoctor.envoy.numbers import UINT64_DIGITS, ascii_int

from ..shown import one_line
from .footer import KeysFooter
from .plain import PlainStatic, PlainTable
from .pod_names import short_names
from .pod_pane import PodPane

HOST_COUNTERS = ("cx_active", "cx_connect_fail", "cx_total", "rq_active", "rq_error", "rq_timeout", "rq_total")
FLAG_STYLE = {"UC": "bold red", "UF": "bold red", "UPE": "bold magenta", "URX": "red", "UH": "red", "UT": "yellow",
              "UO": "yellow", "DC": "dim", "NR": "yellow"}
REFRESH_S = 2.0
# Columns a cluster's name keeps at least beside HOST_COUNTERS' columns; with less room (80 columns: s44, the table
# cut its last column off) the counters leave the table, and the highlighted host's are under it instead.
MIN_CLUSTER = 24


def flags_text(flags: tuple[str, ...]) -> Text:
    if not flags:
        return Text("-", style="dim")
    out = Text()
    for i, f in enumerate(flags):
        if i:
            out.append(",")
        out.append(f, style=FLAG_STYLE.get(f, "bold"))
    return out


def access_log_cells(e: AccessLogEntry, redact: bool = True) -> tuple[str | Text, ...]:
    """The cells of ``e``'s access-log row, as the pane shows them: what the pane draws and what its filter
    matches are this one rendering."""
    ms = round(e.ts * 1000)  # as Envoy printed it: .768 must not read .767
    request = redact_target(f"{e.method} {e.path}", redact) if e.method else "TCP"
    # Text, never a str: a DataTable reads a str cell as markup, and a path from the traffic may hold `[/]`;
    # its control bytes escaped before Rich's Text drops some of them (frontends/shown.py).
    return (Text(time.strftime("%H:%M:%S", time.localtime(ms // 1000)) + f".{ms % 1000:03d}"),
            Text(str(e.code), style="bold red" if e.code >= 500 or e.code == 0 else ""),
            flags_text(e.flags), Text(one_line(e.upstream_host or "-")), Text(one_line(request)),
            Text(one_line(e.details or "-")))


def row_matches(cells: tuple[str | Text, ...], filter_text: str) -> bool:
    """Whether ``filter_text`` (case-insensitive, surrounding blanks ignored) is in the shown text of a cell."""
    f = filter_text.strip().casefold()
    return not f or any(f in str(cell).casefold() for cell in cells)


class ClustersScreen(PodPane):
    """One row per (cluster, host) from GET /clusters of one pod's sidecar, refreshed every REFRESH_S, or from the
    dump given (read once); a counter that grew since the previous refresh is shown bold on yellow. Click a column
    header to sort by it. The cluster's name takes the columns the others leave, cut with "…"; under the table the
    highlighted host whole, with every counter (where the name would have less than MIN_CLUSTER columns beside
    them, the table has none). ``fetch``,
    ``pods``, ``dump_of``: as PodPane's (Session.clusters)."""

    BINDINGS = [Binding("escape,c", "app.pop_screen", "back"), Binding("f", "refresh", "refresh now"),
                Binding("p", "next_pod", "next pod")]
    CSS = """#clusters-status { height: auto; padding: 0 1; background: $boost; }
    #clusters { height: 1fr; }
    #clusters-host { height: auto; padding: 0 1; border-top: solid $primary; }"""
    READS = "/clusters"

    def __init__(self, fetch: Callable[[str | None], Callable[[], dict[str, Cluster]] | None],
                 pods: list[str], dump_of: Callable[[str | None], str | None] = lambda pod: None) -> None:
        super().__init__(fetch, pods, dump_of)
        self.previous: dict[tuple[str, str], dict[str, int]] = {}
        self.sort_column: str | None = None
        self._rows: dict[str, _HostRow] = {}  # what the table shows, by row key
        self._width = -1  # the width the table's columns were laid out for

    def action_next_pod(self) -> None:
        self.previous = {}  # another sidecar's counters: nothing grew since this one's last refresh
        self.query_one("#clusters", DataTable).clear()
        self.step()
        self.set_title("Envoy clusters", "/clusters dump")
        self.action_refresh()

    def compose(self) -> ComposeResult:
        yield Header(icon="")
        yield PlainStatic("reading /clusters ...", id="clusters-status", markup=False)
        yield PlainTable(id="clusters", cursor_type="row", zebra_stripes=True)
        yield PlainStatic("", id="clusters-host", markup=False)
        yield KeysFooter()

    def on_mount(self) -> None:
        self.set_title("Envoy clusters", "/clusters dump")
        self.action_refresh()
        self.set_interval(REFRESH_S, self.tick)

    def set_status(self, text: str) -> None:
        self.query_one("#clusters-status", Static).update(text)

    def show(self, clusters: dict[str, Cluster]) -> None:
        moved = 0
        current: dict[tuple[str, str], dict[str, int]] = {}
        self._rows = {}
        for cluster in clusters.values():
            for host in cluster.hosts:
                key = (cluster.name, host.endpoint)
                values = {name: getattr(host, name) for name in HOST_COUNTERS}
                before = self.previous.get(key, values)
                cells = []
                for name in HOST_COUNTERS:
                    grew = values[name] > before.get(name, values[name])
                    moved += grew
                    cells.append(Text(str(values[name]), style="bold black on yellow" if grew else ""))
                health = Text(",".join(host.health_flags) or "healthy", style="" if host.healthy else "bold red")
                self._rows["|".join(key)] = _HostRow(one_line(cluster.name), one_line(host.endpoint), tuple(cells),
                                                         health)
                current[key] = values
        self.previous = current
        self._lay_out()
        # Say what the table shows: one row a host, so a cluster without hosts has no row.
        empty = sum(1 for c in clusters.values() if not c.hosts)
        without = f" ({_count(empty, 'cluster')} {'has' if empty == 1 else 'have'} no hosts)" if empty else ""
        pod = f"pod/{one_line(self.pod)}: " if len(self.pods) > 1 else ""
        dump = self.dumped()
        since = (f"{moved} counters moved since the last refresh (every {REFRESH_S:.0f} s)" if dump is None
                 else one_line(f"as dumped in {dump}"))
        self.set_status(f"{pod}{_count(len(current), 'host')} of {_count(len(clusters), 'cluster')}{without}; "
                         f"{since}")

    def on_resize(self, event) -> None:
        if event.size.width != self._width:
            self.call_after_refresh(self._lay_out)  # the table's new width is known after the layout

    def _lay_out(self) -> None:
        """The table's columns for its width, and its rows: the cluster's name as wide as the rest leave."""
        table = self.query_one("#clusters", DataTable)
        self._width = self.size.width
        at = table.cursor_row
        for counters in (True, False):
            shown = [*(HOST_COUNTERS if counters else ()), "health"]
            widths = {"host": max([4, *(cell_len(r.host) for r in self._rows.values())])}
            for i, name in enumerate(shown):
                widths[name] = max([len(name), *(r.cells(counters)[i].cell_len for r in self._rows.values())])
            pad = 2 * table.cell_padding
            room = (table.size.width - sum(w + pad for w in widths.values()) - pad
                    - table.styles.scrollbar_size_vertical)
            if room >= MIN_CLUSTER:
                break
        table.clear(columns=True)
        table.add_column("cluster", key="cluster", width=max(room, 12))
        for name, width in widths.items():
            table.add_column(name, key=name, width=width)
        for key, row in self._rows.items():
            table.add_row(Text(row.cluster, no_wrap=True, overflow="ellipsis"), row.host, *row.cells(counters),
                          key=key)
        if self.sort_column in widths or self.sort_column == "cluster":
            table.sort(self.sort_column, key=_sort_key, reverse=self.sort_column in HOST_COUNTERS)
        if self._rows:
            table.move_cursor(row=min(at, table.row_count - 1))
        self._show_host()

    @on(DataTable.RowHighlighted, "#clusters")
    def _show_host(self) -> None:
        """The highlighted host whole under the table: its cluster, endpoint, health and every counter."""
        table = self.query_one("#clusters", DataTable)
        row = None
        if table.row_count and table.is_valid_row_index(table.cursor_row):
            row = self._rows.get(table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value)
        out = Text()
        if row is not None:
            out.append(f"{row.cluster}  {row.host}  ")
            out.append_text(row.health)
            for i, (name, value) in enumerate(zip(HOST_COUNTERS, row.counters)):
                out.append("\n" if i == 0 else "  ")
                out.append(f"{name} ")
                out.append_text(value)
        self.query_one("#clusters-host", Static).update(out)

    @on(DataTable.HeaderSelected, "#clusters")
    def _sort(self, event: DataTable.HeaderSelected) -> None:
        self.sort_column = str(event.column_key.value)
        event.data_table.sort(self.sort_column, key=_sort_key, reverse=self.sort_column in HOST_COUNTERS)


@dataclass(frozen=True)
class _HostRow:
    """One host of the clusters table: its cluster's name and endpoint (one line each), its counters' cells in
    HOST_COUNTERS' order (styled when grown) and its health."""

    cluster: str
    host: str
    counters: tuple[Text, ...]
    health: Text

    def cells(self, counters: bool) -> list[Text]:
        """The cells after the host: the counters (when ``counters``) and the health."""
        return [*(self.counters if counters else ()), self.health]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _sort_key(value) -> tuple:
    text = value.plain if isinstance(value, Text) else str(value)
    # ASCII digits only: a cluster named `²` passes isdigit() and would make int() kill the sort.
    number = ascii_int(text, max_digits=UINT64_DIGITS)
    return (0, number, "") if number is not None else (1, 0, text)


# details last: its long values (upstream_reset_before_response_started{...}) pushed the upstream host and the
# request past the right of an 80-column screen; cut at the right, they are still in the row (and the filter)
LOG_COLUMNS = ("time", "code", "flags", "upstream host", "request", "details")


class AccessLogScreen(Screen):
    """The access-log lines followed so far, newest first; ``/`` filters by flag or any text of the line. With
    several pods (``by_pod``: Session.access_logs) each row starts with its pod's short name, and `p` shows one
    pod's lines, the next's, then every pod's again. Opened on a ``finding`` with response flags that no line read
    carries, its status says whose sidecar logs them and how to read that log (``logged_elsewhere``)."""

    BINDINGS = [Binding("escape,a", "app.pop_screen", "back"), Binding("slash", "filter", "filter"),
                Binding("p", "next_pod", "next pod")]
    # The table takes what is left: a table of its own height scrolled the screen, the status out of sight.
    CSS = "#log-status { height: auto; padding: 0 1; background: $boost; }\n#access-log { height: 1fr; }"

    def __init__(self, entries: Callable[[], list[AccessLogEntry]], pod: str | None, redact: bool = True,
                 by_pod: Callable[[], dict[str, list[AccessLogEntry]]] | None = None,
                 finding: Finding | None = None) -> None:
        """``pod``: whose sidecar wrote the lines; None for the logs ``analyze --tui`` was given. ``finding``: the
        one selected when the pane was opened."""
        super().__init__()
        self.finding = finding
        self.entries = entries
        self.by_pod = by_pod or (lambda: {})
        self.pod = pod
        self.redact = redact
        self.filter_text = ""
        self.only: str | None = None  # the one pod whose lines are shown (p), None: every pod's
        self._pods: list[str] = []  # the pods the table has a column for, when several
        self._shown: tuple = ()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return len(self._pods) > 1 if action == "next_pod" else True

    def action_next_pod(self) -> None:
        pods = [None, *self._pods]
        self.only = pods[(pods.index(self.only) + 1) % len(pods)] if self.only in pods else None
        self.refresh_entries(force=True)

    def _rows(self) -> tuple[list[tuple[str | Text, ...]], int, int]:
        """The rows shown (oldest first), the lines there are and how many carry response flags."""
        logs = self.by_pod()
        if len(logs) < 2:
            entries = self.entries()
            return ([cells for cells in (access_log_cells(e, self.redact) for e in entries)
                     if row_matches(cells, self.filter_text)], len(entries), sum(1 for e in entries if e.flags))
        if list(logs) != self._pods:
            self._pods = list(logs)
            table = self.query_one("#access-log", DataTable)
            table.clear(columns=True)
            for name in ("pod", *LOG_COLUMNS):
                table.add_column(name, key=name)
            self.refresh_bindings()  # p is shown now
        names = short_names(logs)
        lines = sorted(((e.ts, n, pod, e) for pod, entries in logs.items() if self.only in (None, pod)
                        for n, e in enumerate(entries)), key=lambda x: x[:2])
        rows = [cells for cells in ((Text(names[pod]), *access_log_cells(e, self.redact)) for _, _, pod, e in lines)
                if row_matches(cells, self.filter_text)]
        return rows, len(lines), sum(1 for *_, e in lines if e.flags)

    def compose(self) -> ComposeResult:
        yield Header(icon="")
        yield PlainStatic("", id="log-status", markup=False)
        yield Input(placeholder="filter: a flag (UC) or any text, Enter to apply", id="log-filter")
        table = PlainTable(id="access-log", cursor_type="row", zebra_stripes=True)
        for name in LOG_COLUMNS:
            table.add_column(name, key=name)
        yield table
        yield KeysFooter()

    def _title(self) -> str:
        """Whose lines the pane shows: one pod (or the files given), every pod's with their count, or the one pod
        ``p`` stepped to, numbered as the c and l panes number theirs."""
        if len(self._pods) > 1:
            if self.only is None:
                return f"Envoy access log of {len(self._pods)} pods (p: one pod's lines)"
            at = f"{self._pods.index(self.only) + 1} of " if self.only in self._pods else "one of "
            return one_line(f"Envoy access log of pod/{self.only} ({at}{len(self._pods)}; p: next pod)")
        return one_line(f"Envoy access log of {f'pod/{self.pod}' if self.pod else 'the files given'}")

    def on_mount(self) -> None:
        self.sub_title = self._title()
        self.query_one("#access-log", DataTable).focus()  # keys go to the screen; / moves to the filter
        self.refresh_entries()
        self.set_interval(1.0, self.refresh_entries)

    def matches(self, e: AccessLogEntry) -> bool:
        # Matched against the row as shown, every column and nothing else: a filter on the raw line would miss
        # what the pane writes itself (`TCP`, `-`, the local time) and tell, by what it keeps, whether a hidden
        # token is there.
        return row_matches(access_log_cells(e, self.redact), self.filter_text)

    def refresh_entries(self, force: bool = False) -> None:
        counted = (len(self.entries()), tuple(len(v) for v in self.by_pod().values()))
        if counted == self._shown and not force:
            return
        self._shown = counted
        rows, total, failing = self._rows()
        self.sub_title = self._title()  # the pods are known once their lines are
        table = self.query_one("#access-log", DataTable)
        table.clear()
        for cells in reversed(rows):
            table.add_row(*cells)
        filt = f", filter {self.filter_text!r}: {len(rows)} shown" if self.filter_text else ""
        pods = ""
        if len(self._pods) > 1:
            pods = (f"pod/{one_line(self.only)} (p: next pod): " if self.only is not None
                    else f"{len(self._pods)} pods (p: one pod's lines): ")
        note = logged_elsewhere(self.finding, [*self.entries(), *(e for v in self.by_pod().values() for e in v)],
                                self.pod)
        self.query_one("#log-status", Static).update(
            f"{pods}{total} access-log lines, {failing} with response flags{filt}" + (f"\n{note}" if note else ""))

    def action_filter(self) -> None:
        self.query_one("#log-filter", Input).focus()

    @on(Input.Submitted, "#log-filter")
    def _apply_filter(self, event: Input.Submitted) -> None:
        self.filter_text = event.value
        self.query_one("#access-log", DataTable).focus()
        self.refresh_entries(force=True)


def logged_elsewhere(f: Finding | None, entries: list[AccessLogEntry], pod: str | None) -> str:
    """For a selected finding ``f`` whose response flags no line of ``entries`` carries: which flags it explains,
    that the lines read have none, whose sidecar logs them (core.hop_path.flags_logger) and how to read that log;
    "" when a line carries one, or ``f`` has no flag. ``pod``: the pod whose log this is (None: files given)."""
    logger = flags_logger(f) if f is not None else None
    if logger is None or any(set(logger.flags) & set(e.flags) for e in entries):
        return ""
    flags = ", ".join(logger.flags)
    pod = (f.pod or pod) if pod else None  # of several pods watched, the finding's own
    these = f"pod/{pod}'s sidecar logged none" if pod else "the lines read carry none"
    head = f"The selected {f.detector} explains {flags}: {these}."
    if not logger.caller_ip:
        return one_line(f"{head} This pod's sidecar logs them: none logged yet, or its access log is off.")
    ip = logger.caller_ip
    both = f"or watch both: kubectl meshdoctor watch pod/{pod} pod/POD" if pod else "and give analyze that log too"
    return one_line(f"{head} The caller's sidecar at {ip} logs them (it opened the connection; a "
                    f"caller without a sidecar logs none).") + "\n" + one_line(
        f"Read it: kubectl get pods -A --field-selector status.podIP={ip}, then kubectl logs -n NS POD -c "
        f"istio-proxy ({both}); no pod found: the caller is outside the mesh, and only its own client saw the "
        f"failure")
