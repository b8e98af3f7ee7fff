"""The Textual front end of ``watch``: a sink of the pipeline that only renders.

The app is given a ``Session``: a coroutine that runs the capture (live, or a recorded file in tests) and
reports through callbacks. It never touches pyshark or the Kubernetes client itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Header, Static

from ..findings import Finding, Severity
from ..pipeline import PipelineStats
from ..report import Report

_SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


@dataclass(slots=True)
class SessionHooks:
    """What a session calls back into, and the stop signal it must honour."""

    on_finding: Callable[[Finding], None]
    progress: Callable[[str], None]
    stop: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class Session:
    """A capture run for the app: ``run(hooks)`` returns the final report; ``stats()`` is polled for counts;
    ``describe`` is shown in the header (context, namespace, target)."""

    run: Callable[[SessionHooks], Awaitable[Report]]
    stats: Callable[[], PipelineStats]
    describe: str
    phase: Callable[[], str] = lambda: ""
    exit_when_done: bool = False  # leave the screen when the run ends by itself (watch --duration)
    loggers: Callable[[], object | None] = lambda: None  # a LoggerControl once the proxy is known
    clusters: Callable[[], Callable[[], dict] | None] = lambda: None  # a /clusters fetcher once known
    access_log: Callable[[], list] = lambda: []  # the access-log entries followed so far
    pod: Callable[[], str | None] = lambda: None
    problems: Callable[[], list[str]] = lambda: []  # input trouble so far (a lost capture stream), one line each


def finding_detail(f: Finding) -> str:
    """The detail pane's text for one finding (Rich markup-free on purpose: titles carry brackets)."""
    lines = [f"{f.severity.value.upper()}  {f.detector}  Envoy flags: {', '.join(f.envoy_flags) or '-'}",
             f.title, "", f"flow: {f.flow.client} -> {f.flow.server} on {f.flow.iface}"]
    if f.response_code_details:
        lines.append(f"envoy details: {f.response_code_details}")
    if f.pod:
        lines.append(f"pod: {f.pod}")
    lines.append("evidence:")
    lines += [f"  {e.source} frame {e.frame}: {e.what}" for e in f.evidence]
    lines += ["", f.explanation, "", "fix:", f.remediation]
    return "\n".join(lines)


class MeshDoctorApp(App[Report | None]):
    """Findings as they arrive, packet/flow counts per interface, a detail view; ``q`` stops cleanly."""

    TITLE = "kubectl meshdoctor"
    CSS = """
    #status { height: auto; padding: 0 1; background: $boost; }
    #findings { height: 1fr; }
    #pods { height: auto; max-height: 12; display: none; }
    #pods.many { display: block; }
    #detail-box { height: 1fr; border-top: solid $primary; }
    #detail { padding: 0 1; }
    """
    BINDINGS = [Binding("q", "quit_clean", "Quit (stops the capture)"),
                Binding("l", "loggers", "Envoy loggers"),
                Binding("c", "clusters", "Envoy clusters"),
                Binding("a", "access_log", "access log"),
                Binding("ctrl+c", "quit_clean", "Quit", show=False)]

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.hooks = SessionHooks(on_finding=self._on_finding, progress=self._on_progress)
        self.findings: list[Finding] = []
        self.report: Report | None = None
        self.last_progress = "starting"
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(self._status_text(), id="status")
        with Vertical():
            pods = DataTable(id="pods", cursor_type="none", zebra_stripes=True)
            for column in ("pod", "lo pkts", "eth0 pkts", "errors", "warnings"):
                pods.add_column(column, key=column)
            yield pods
            table = DataTable(id="findings", cursor_type="row", zebra_stripes=True)
            table.add_column("#", key="n")
            table.add_columns("severity", "detector", "flags", "flow", "finding")
            yield table
            with VerticalScroll(id="detail-box"):
                yield Static("No findings yet. Capturing...", id="detail", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.session.describe
        self.set_interval(0.5, self._refresh_status)
        self._run_session()

    @work(exclusive=True, exit_on_error=False)
    async def _run_session(self) -> None:
        try:
            self.report = await self.session.run(self.hooks)
            self.last_progress = "capture ended"
        except Exception as e:  # shown on screen and returned to the CLI, never a traceback
            self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.last_progress = f"error: {self.error}"
        self._refresh_status()
        if self.hooks.stop.is_set() or self.session.exit_when_done:
            self.exit(self.report)

    def _on_progress(self, message: str) -> None:
        self.last_progress = message
        self._refresh_status()

    def _on_finding(self, f: Finding) -> None:
        self.findings.append(f)
        table = self.query_one("#findings", DataTable)
        from rich.text import Text

        n = len(self.findings)
        table.add_row(n, Text(f.severity.value, style=_SEVERITY_STYLE[f.severity]), f.detector,
                      ",".join(f.envoy_flags), f"{f.flow.client} -> {f.flow.server}", f.title, key=str(n - 1))
        following = table.cursor_row == 0  # the user has not moved away from the newest finding
        table.sort("n", reverse=True)  # newest first
        if following:
            table.move_cursor(row=0)
            self._show(f)

    def _show(self, f: Finding) -> None:
        self.query_one("#detail", Static).update(finding_detail(f))

    @on(DataTable.RowHighlighted, "#findings")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self._show(self.findings[int(event.row_key.value)])

    def _pod_rows(self) -> dict[str, list]:
        """pod -> [lo packets, eth0 packets, errors, warnings] when several pods are captured (``pod/iface``)."""
        rows: dict[str, list] = {}
        for key, st in self.session.stats().by_iface.items():
            pod, sep, iface = key.rpartition("/")
            if not sep:
                return {}
            row = rows.setdefault(pod, [0, 0, 0, 0])
            row[0 if iface == "lo" else 1] += st.packets
        for f in self.findings:
            if f.pod in rows:
                rows[f.pod][2 if f.severity is Severity.ERROR else 3] += f.severity is not Severity.INFO
        return rows

    def _refresh_pods(self) -> None:
        rows = self._pod_rows()
        table = self.query_one("#pods", DataTable)
        table.set_class(bool(rows), "many")
        for pod, values in sorted(rows.items()):
            if pod in table.rows:
                for column, value in zip(("lo pkts", "eth0 pkts", "errors", "warnings"), values):
                    table.update_cell(pod, column, value)
            else:
                table.add_row(pod, *values, key=pod)

    def _status_text(self) -> str:
        st = self.session.stats()
        if len({k.rpartition("/")[0] for k in st.by_iface}) > 1:
            ifaces = f"{len({k.rpartition('/')[0] for k in st.by_iface})} pods: {st.packets} pkts"
        else:
            ifaces = "  ".join(f"{k}: {v.packets} pkts" for k, v in sorted(st.by_iface.items())) or "no packets yet"
        errors = sum(1 for f in self.findings if f.severity is Severity.ERROR)
        warnings = sum(1 for f in self.findings if f.severity is Severity.WARNING)
        problems = self.session.problems()
        trouble = f"\nproblems ({len(problems)}): {problems[-1]}" if problems else ""
        return (f"{ifaces}  flows: {st.flows_seen}  findings: {errors} error, {warnings} warning\n"
                f"{self.last_progress}{trouble}")

    def _refresh_status(self) -> None:
        self.query_one("#status", Static).update(self._status_text())
        self._refresh_pods()

    def action_loggers(self) -> None:
        """The sidecar's log levels, changed with a key (only once the run has found the proxy)."""
        control = self.session.loggers()
        if control is None:
            self.last_progress = "the proxy is not known yet: loggers are available once capturing"
            self._refresh_status()
            return
        from .loggers import LoggersScreen

        self.push_screen(LoggersScreen(control))

    def action_clusters(self) -> None:
        fetch = self.session.clusters()
        if fetch is None:
            self.last_progress = "the proxy is not known yet: clusters are available once capturing"
            self._refresh_status()
            return
        from .envoy import ClustersScreen

        self.push_screen(ClustersScreen(fetch, self.session.pod() or "?"))

    def action_access_log(self) -> None:
        from .envoy import AccessLogScreen

        self.push_screen(AccessLogScreen(self.session.access_log, self.session.pod() or "?"))

    async def action_quit_clean(self) -> None:
        """Stop the capture (the tcpdumps end in the pod) and leave once the session has wound down."""
        self.last_progress = "stopping: ending tcpdump in the pod ..."
        self._refresh_status()
        self.hooks.stop.set()
        if self.report is not None or self.error is not None:
            self.exit(self.report)
