"""The triage desk: the Textual front end of ``watch`` (and ``analyze --tui``), a sink of the pipeline.

The app is given a ``Session`` (session.py): it runs the capture (live, or recorded files), reports through
hooks, and answers the polls for counts, recent packets and the sidecar's panes. It never touches pyshark or
the Kubernetes client itself. Panes are refreshed from timers (at most twice a second), never per packet, so a
busy pod cannot starve the screen of frames.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import DataTable, Header, Input, Static

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.findings import PACKET, Finding, Problem
from kubectl_meshdoctor.core.live_join import JoinedView
from kubectl_meshdoctor.core.redact import redact_target
from kubectl_meshdoctor.core.report_model import Report, ScreenSource
from kubectl_meshdoctor.frontends.report import RENDERERS

from .detail_pane import DetailPane
from .envoy_keys import ENVOY_BINDINGS, EnvoyPaneKeys
from .save_key import SaveKey
from .footer import KeysFooter
from .signals import WIND_DOWN_S, StopSignals
from .status_line import status_text
from .findings_list import FindingsList, FindingsTable
from .pod_names import fill_pods, pod_rows
from .packet_filter import FilterError, PacketFilter, of_selected
from ..shown import one_line
from .packets_table import PacketsTable, Place
from .plain import PlainStatic, PlainTable
from .session import Session, SessionHooks

# Keys shown in the footer only outside the compact layout: at 80 columns the pane keys come first (`?` has these)
WIDE_ONLY = ("save", "export")
PACKET_ROWS = 100  # rows the packets pane shows at most (the newest that match): a redraw stays short
NARROW = 110  # below this many columns the panes stack
# Below either, one pane at a time (issue 32: at 80x24 the detail had 4 lines): the list, Enter the detail, Esc back.
COMPACT_WIDTH, COMPACT_HEIGHT = 100, 30


class MeshDoctorApp(SaveKey, EnvoyPaneKeys, App[Report | None]):
    """Findings as they arrive, a detail view with the ladder diagram, a packets pane, Envoy panes."""

    TITLE = "kubectl meshdoctor"
    # Textual's own command palette (^p: themes, screenshots) is no part of this tool: its key and the header's ⭘
    # that opens it would stand in the panes' footers beside ours
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #status { height: auto; padding: 0 1; background: $boost; }
    #main { height: 2fr; }
    #left { width: 45%; }
    #findings { height: 1fr; }
    #pods { height: auto; max-height: 12; display: none; }
    #pods.many { display: block; }
    #detail-box { width: 55%; border-left: solid $primary; overflow-x: auto; overflow-y: auto; }
    #detail, #explain { padding: 0 1; width: 100%; }
    #ladder { padding: 1 1; width: auto; text-wrap: nowrap; }
    #packets-box { height: 1fr; border-top: solid $primary; }
    #packets-title { padding: 0 1; color: $text-muted; }
    #filter { display: none; padding: 0 1; }
    #filter.shown { display: block; }
    #packets { height: 1fr; }
    Screen.narrow #main { layout: vertical; }
    Screen.narrow #left { width: 100%; height: 1fr; }
    Screen.narrow #detail-box { width: 100%; height: 1fr; border-left: none; border-top: solid $primary; }
    Screen.compact Header { display: none; }
    Screen.compact #status { text-wrap: nowrap; text-overflow: ellipsis; }
    Screen.compact #main { layout: vertical; height: 1fr; }
    Screen.compact #left { width: 100%; height: 1fr; }
    Screen.compact #pods { max-height: 5; }
    Screen.compact #detail-box, Screen.compact #packets-box { display: none; }
    Screen.compact.show-detail #left, Screen.compact.show-packets #main { display: none; }
    Screen.compact.show-detail #detail-box { display: block; width: 100%; height: 1fr; border: none; }
    Screen.compact.show-packets #packets-box { display: block; height: 1fr; border: none; }
    """
    # The footer shows the keys that matter first (after the findings table's Enter): at 80 columns (compact) the
    # main actions and every pane key (s44), Esc only where there is something to go back from; s and e where
    # there is room (WIDE_ONLY). Every key is in `?`.
    BINDINGS = [Binding("escape", "back", "Back", key_display="Esc"),
                Binding("question_mark", "help", "Help", key_display="?"),
                Binding("q", "quit_clean", "Quit"),
                Binding("slash", "filter", "Filter", key_display="/"),
                *ENVOY_BINDINGS,
                Binding("p", "pause", "Pause", show=False),
                Binding("s", "save", "Save"),
                Binding("e", "export", "Export"),
                # their twins, out of the footer: the keys still work where the shown ones are refused (WIDE_ONLY)
                Binding("s", "save(1)", "Save", show=False),
                Binding("e", "export(1)", "Export", show=False),
                Binding("left_square_bracket", "instance(-1)", "Older instance", show=False),
                Binding("right_square_bracket", "instance(1)", "Newer instance", show=False),
                Binding("n", "instance(0)", "Newest instance", show=False),
                Binding("ctrl+c", "quit_clean", "Quit", show=False)]

    def __init__(self, session: Session, stop_signals: tuple[int, ...] = (),
                 abandon: Callable[[], None] | None = None) -> None:
        """``stop_signals`` (e.g. SIGTERM, SIGHUP) stop the session as ``q`` does; a second one leaves at once;
        ``abandon`` is what must still be done if a hung-up screen cannot wind down (ending.StopSignals). Only
        the process's own app should take signals: a test's app would steal the test runner's handlers."""
        super().__init__()
        self.session = session
        self.offered = session.panes()  # the Envoy panes offered now (envoy_keys.py), asked again on the timer
        self.stop_signals = StopSignals(stop_signals, self._on_stop_signal, abandon)
        self.signalled: int | None = None  # the first stop signal that came
        self.held = False  # the session did not wind down within WIND_DOWN_S of the stop: left without it
        self.hooks = SessionHooks(on_finding=self._on_finding, progress=self._on_progress)
        self.findings: list[Finding] = []  # as handed to on_finding
        self._shown = 0  # findings already in the list; the rest wait for a refresh (or for p)
        self._view: JoinedView | None = None  # the findings as the report would give them (Session.joined)
        self.list: FindingsList | None = None  # the findings list's groups and selection, once mounted
        self.report: Report | None = None
        self.last_progress = "starting"
        self._progress_since = time.monotonic()
        self.error: str | None = None
        self.paused = False
        self.selected: Finding | None = None
        self.packet_filter = PacketFilter()
        self._filter_error = ""  # the last typed filter that did not parse, shown by the packets pane
        self._packets_key: tuple | None = None  # what the packets pane shows now, to skip needless redraws
        self._told = 0  # the session's problems told so far (_refresh_status)

    # -- layout -------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="")
        yield PlainStatic(self._status_text(), id="status", markup=False)
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield (pods := PlainTable(id="pods", cursor_type="none", zebra_stripes=True))
                for column in ("pod", "lo pkts", "eth0 pkts", "errors", "warnings"):
                    pods.add_column(column, key=column)
                yield FindingsTable(id="findings", cursor_type="row", zebra_stripes=True)
            yield DetailPane(self._pin, id="detail-box")
        with Vertical(id="packets-box"):
            # compact (one row, no border) and a placeholder of 78 columns: at 80x24 it was cut (s44), and its
            # border took two of the rows the packets need
            yield Input(placeholder="filter: ip, port, flags S F R P ., lo/eth0, frame:N; Enter applies, Esc clears",
                        id="filter", compact=True)
            yield PlainStatic("packets", id="packets-title", markup=False)
            yield PacketsTable(id="packets", cursor_type="row", zebra_stripes=True)
        yield KeysFooter()

    def on_mount(self) -> None:
        self._ui = (threading.get_ident(), asyncio.get_running_loop())
        self.stop_signals.install(asyncio.get_running_loop())
        self.list = FindingsList(self.query_one("#findings", DataTable))
        self.query_one("#findings", DataTable).focus()  # the arrow keys move through the findings at once
        self.sub_title = one_line(self.session.describe)
        self._apply_size(self.size.width, self.size.height)
        self.set_interval(0.5, lambda: self._on_timer(self._refresh))
        # the costliest pane: once a second is enough to read
        self.set_interval(1.0, lambda: self._on_timer(self._refresh_packets))
        self._run_session()

    def on_unmount(self) -> None:
        self.stop_signals.remove()

    def _on_stop_signal(self, sig: int) -> None:
        if self.signalled is not None:  # asked twice: leave now (the caller still removes what it made)
            self.exit(self.report)
            return
        self.signalled = sig
        self.run_worker(self.action_quit_clean(), exit_on_error=False)

    def on_resize(self, event) -> None:
        self._apply_size(event.size.width, event.size.height)
        self.call_after_refresh(self._show_new_findings)  # the panes' new widths are known after the layout

    def _apply_size(self, width: int, height: int) -> None:
        main = self.default_screen  # also while a pane (help, clusters) is on top of it
        main.set_class(width < NARROW, "narrow")
        main.set_class(width < COMPACT_WIDTH or height < COMPACT_HEIGHT, "compact")
        self._refresh_status()  # the header's line moves into the status line, or back

    def compact(self) -> bool:
        """One pane at a time: the list, the detail (Enter) or the packets (/); Esc goes back to the list."""
        return self.default_screen.has_class("compact")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "focus_next":
            return not self.compact()  # one pane shown: Tab has nowhere to go
        if action in WIDE_ONLY and not parameters:
            return not self.compact()  # out of the compact footer; its twin (with a parameter) does the same
        if action == "back":
            return self._can_go_back()
        return self.pane_offered(action)

    def _can_go_back(self) -> bool:
        """Whether Esc has something to do: a filter to clear, a pane shown in place of the list, or the focus
        away from the list. On the list itself it does nothing, and is not in the footer."""
        focused = self.screen.focused if self.screen is self.default_screen else None
        return bool(self.query_one("#filter", Input).has_class("shown") or self.packet_filter.text
                    or self.default_screen.has_class("show-detail") or self.default_screen.has_class("show-packets")
                    or (focused is not None and focused.id != "findings"))

    def _show_pane(self, pane: str | None) -> None:
        """In the compact layout show ``pane`` ("detail", "packets"; None: the list, focused in any layout)."""
        self.default_screen.set_class(pane == "detail", "show-detail")
        self.default_screen.set_class(pane == "packets", "show-packets")
        if pane is None:
            self.query_one("#findings", DataTable).focus()
        self.refresh_bindings()  # Esc's key comes and goes with a pane to go back from

    # -- the session --------------------------------------------------------------------------------------
    @work(exclusive=True, exit_on_error=False)
    async def _run_session(self) -> None:
        try:
            self.report = await self.session.run(self.hooks)
            if self.report is not None:  # what the report gives is what the list shows from now on
                self._view = JoinedView(tuple(self.report.findings), len(self.findings))
                self._show_new_findings(self._view, force=True)
            self._on_progress("capture ended")
        except Exception as e:  # shown on screen and returned to the CLI, never a traceback
            self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
            self._on_progress(f"error: {self.error}")
        if self.hooks.stop.is_set() or self.session.exit_when_done:
            self.exit(self.report)

    def _on_progress(self, message: str) -> None:
        ui = getattr(self, "_ui", None)
        if ui is not None and threading.get_ident() != ui[0]:
            # said from a thread of the watch's API calls (kube/debug.py waits on the debug container in one):
            # the screen is the event loop's, and Textual's widgets need its context (active_app)
            ui[1].call_soon_threadsafe(self._on_progress, message)
            return
        self.last_progress = message
        self._progress_since = time.monotonic()
        # A new phase (the files read to their end, the capture stopped): every pane shows it now, not at its
        # next tick, up to a second later for the packets pane.
        self._refresh()
        self._refresh_packets()

    def _on_finding(self, f: Finding) -> None:
        self.findings.append(f)
        if not self.paused:
            self._show_new_findings()

    # -- findings and detail ------------------------------------------------------------------------------
    def shown_findings(self) -> list[Finding]:
        """Every finding so far as the report would give them: the session's joined view, then those handed on
        since it was made; the findings as handed where the session joins none."""
        v = self._view
        return [*v.findings, *self.findings[v.covers:]] if v is not None else self.findings

    def _show_new_findings(self, view: JoinedView | None = None, force: bool = False) -> None:
        if self.list is None:
            return
        if view is not None and (view is not self._view or force):
            self._view = view  # a finding may be filed again in its joined form: its row is updated in place
            self.list.replace(self.shown_findings())
        else:
            for f in self.findings[self._shown:]:
                self.list.add(f)
        self._shown = len(self.findings)
        self.list.redraw(self.query_one("#findings", DataTable).size.width)
        current = self.list.current()
        if current is not None:
            self._select(current)  # also the same one: its instance line counts the instances since

    def _select(self, f: Finding) -> None:
        before, self.selected = self.selected, f
        g = self.list.group(self.list.selected) if self.list else None
        self.query_one(DetailPane).show(f, g, self.session.redact)
        if f is not before:
            self._refresh_packets()

    def _pin(self) -> None:
        """The user reads the detail (focused it, scrolled it): what it shows holds still."""
        if self.list is not None:
            self.list.pin()

    @on(DataTable.RowHighlighted, "#findings")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # Only a highlight of the row under the cursor now is the user's choice: Textual also posts them for
        # its own reasons (focus, a row added under the cursor, a redraw), delivered after the list changed.
        table = event.data_table
        key = event.row_key.value if event.row_key is not None else None
        if self.list is None or key is None or not table.is_valid_row_index(table.cursor_row) \
                or table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value != key:
            return
        if self.list.select_key(key) and (current := self.list.current()) is not None:
            self._select(current)

    @on(DataTable.RowSelected, "#findings")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter (or a click on the selected row) opens the detail: the whole screen in the compact layout."""
        self._pin()
        if self.compact():
            self._show_pane("detail")
        self.query_one(DetailPane).focus()

    def action_instance(self, by: int) -> None:
        """Step the detail (and packets, and `s`) to an older (-1) or newer (+1) instance of the group; 0: to
        the newest."""
        if self.list is not None and self.list.step(by or 1 << 30) and (current := self.list.current()) is not None:
            self._select(current)

    def action_back(self) -> None:
        """Esc: clear the packets filter, else leave the detail or packets for the list."""
        if self.query_one("#filter", Input).has_class("shown") or self.packet_filter.text:
            self.action_clear_filter()
        else:
            self._show_pane(None)

    # -- packets pane -------------------------------------------------------------------------------------
    def _packets_shown(self) -> tuple[str, list[PacketEvent]]:
        packets = self.session.packets()
        if self.packet_filter.text:
            title, keep = f"filter: {self.packet_filter.text}", self.packet_filter.matches
        elif self.selected is not None:
            title, keep = of_selected(self.selected)
        else:
            title, keep = "latest packets analysed", (lambda ev: True)
        rows = [ev for ev in packets if keep(ev)][-PACKET_ROWS:]
        return title, rows

    def _refresh_packets(self) -> None:
        if self.paused:
            return
        title, rows = self._packets_shown()
        key = (title, len(rows), rows[-1].frame if rows else 0, rows[-1].source if rows else "")
        if key == self._packets_key:
            return
        self._packets_key = key
        stats = self.session.stats()
        firsts = [s.first_ts for s in stats.by_iface.values() if s.first_ts is not None]
        t0 = min(firsts) if firsts else (rows[0].ts if rows else 0.0)
        evidence = {(e.source, e.frame) for e in self.selected.evidence if e.kind == PACKET} if self.selected else set()
        styles = ["bold" if (ev.source, ev.frame) in evidence else "" for ev in rows]
        # several pods see one packet (a request from one's eth0 to another's): each row names its capture's pod
        pods = self.session.pods()
        where = {src: self.session.pod_of(src) for src in {ev.source for ev in rows}} if len(pods) > 1 else {}
        self.query_one(PacketsTable).show([
            (Text(str(ev.frame), style=style), f"{ev.ts - t0:.3f}", Place(where.get(ev.source), ev.iface),
             ev.src_endpoint, ev.dst_endpoint, Text(ev.flags.short(), style="red" if ev.is_rst else style),
             ev.payload_len, redact_target(ev.http.start_line, self.session.redact) if ev.http else "")
            for ev, style in zip(rows, styles)], pods)
        self.query_one("#packets-title", Static).update(f"{title}: {len(rows)} packets"
                                                         + (" (evidence in bold)" if evidence else "")
                                                         + (f"  -  {self._filter_error}" if self._filter_error else ""))

    def action_filter(self) -> None:
        if self.compact():
            self._show_pane("packets")
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.focus()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        try:
            self.packet_filter = PacketFilter.parse(event.value)
        except FilterError as e:
            self._filter_error = str(e)
            self._packets_key = None
            self._refresh_packets()
            return
        self._filter_error = ""
        self._packets_key = None
        self._refresh_packets()
        self.query_one("#packets", DataTable).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("shown")
        self.packet_filter = PacketFilter()
        self._filter_error = ""
        self._packets_key = None
        self._refresh_packets()
        self._show_pane(None)

    # -- header -------------------------------------------------------------------------------------------
    def _status_text(self) -> str:
        return status_text(self.session, self.list.groups() if self.list else [], len(self.shown_findings()),
                           self.last_progress, time.monotonic() - self._progress_since,
                           self.report is not None or self.error is not None,
                           len(self.findings) - self._shown if self.paused else None,
                           # the header is hidden: its line, in short, beside the counts
                           one_line(self.session.describe_short or self.session.describe) if self.compact() else "",
                           self.size.width - 2, self.compact())

    def _on_timer(self, refresh: Callable[[], None]) -> None:
        """A timer's ``refresh`` of the panes, which are gone once the app is being torn down: a tick that
        came then (seen under load, as the test pilot's app exited) found no #status and failed the exit."""
        try:
            refresh()
        except NoMatches:
            if self.default_screen.query("#status"):
                raise  # the panes are there: a real fault, not the teardown

    def _refresh_status(self) -> None:
        self.query_one("#status", Static).update(self._status_text())
        problems = self.session.problems()
        if self.compact() and len(problems) > self._told:  # its status row has no room for the problem's text
            self.notify(one_line(problems[-1]), title=f"problems ({len(problems)})", severity="warning", timeout=10,
                        markup=False)
        self._told = len(problems)

    def _refresh(self) -> None:
        self._refresh_status()
        self.note_panes()
        if self.paused:
            return
        fill_pods(self.query_one("#pods", DataTable), pod_rows(self.session.stats(), self.shown_findings()))
        if self.list is not None:
            self.list.note_pods(self.session.pods())
        self._show_new_findings(self.session.joined() if self.report is None else None)

    # -- keys ---------------------------------------------------------------------------------------------
    def action_help(self) -> None:
        from .screens import HelpScreen

        self.push_screen(HelpScreen(self.offered))

    def action_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused:
            self._packets_key = None
            self._refresh()
        self._refresh_status()

    def action_export(self, _twin: int = 0) -> None:
        from .screens import PathPrompt

        default = os.path.join(os.getcwd(), "meshdoctor-report.md")
        self.push_screen(PathPrompt("Export the report so far (.md Markdown, .json JSON, else text)", default),
                         lambda answer: answer and self._export(*answer))

    def report_now(self) -> Report:
        """The report as it stands: every finding so far (also those held while paused)."""
        problems = [Problem("watch", p) for p in self.session.problems()]
        return self.report or Report(ScreenSource(self.session.describe), self.session.stats(),
                                     self.shown_findings(), problems)

    def _export(self, path: str, overwrite: bool) -> None:
        fmt = {".md": "markdown", ".markdown": "markdown", ".json": "json"}.get(os.path.splitext(path)[1], "text")
        try:
            if os.path.exists(path) and not overwrite:
                raise OSError(f"{path} exists")
            tmp = f"{path}.part"
            with open(tmp, "w") as fh:
                fh.write(RENDERERS[fmt](self.report_now()))
            os.replace(tmp, path)
        except OSError as e:
            self.notify(f"not exported: {e.strerror or e}", severity="error", timeout=8, markup=False)
            return
        self.notify(f"report ({fmt}, {len(self.shown_findings())} findings) written to {path}", timeout=8, markup=False)

    async def action_quit_clean(self) -> None:
        """Stop the capture (the tcpdumps end in the pod) and leave once the session has wound down."""
        self._on_progress("stopping: ending tcpdump in the pod ...")
        self.hooks.stop.set()
        if self.report is not None or self.error is not None:
            self.exit(self.report)
            return
        self.set_timer(WIND_DOWN_S, self._held_past_stop)

    def _held_past_stop(self) -> None:
        """The session is still winding down WIND_DOWN_S after the stop (an API server that does not answer holds
        its last calls): leave with what was found so far, said so."""
        if self.report is not None or self.error is not None or not self.is_running:
            return
        self.held = True
        now = self.report_now()
        self.exit(Report(now.source, now.stats, now.findings, [*now.problems, Problem(
            "watch", f"stopped, and the session did not wind down within {WIND_DOWN_S:g} s (the API server did "
                     f"not answer): the counters were not read and the log levels not put back (the debug "
                     f"container's timer puts them back); these are the findings so far")],
            captured_nothing=True))
