"""The counters pane (`k`): a sidecar's /stats that moved, one row a stat, by its full name. Offline, between the
`/stats` dumps given (or every stat not zero since Envoy's start, for one dump), read once; live, since the run's
first read of the sidecar's /stats, read again every COUNTERS_REFRESH_S. The cluster stats that explain failures
(envoy.stats.is_cluster_failure_stat) are shown red. With several pods `p` goes to the next pod's."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from kubectl_meshdoctor.core.events import EnvoyCountersEvent
from kubectl_meshdoctor.envoy.stats import is_cluster_failure_stat, split_cluster_stat

from ..shown import one_line
from .envoy import pod_of, row_matches, why
from .plain import PlainStatic, PlainTable

COUNTERS_REFRESH_S = 5.0  # a sidecar's whole /stats is large (MBs with many clusters): not every 2 s


def _since(view: EnvoyCountersEvent) -> str:
    """From when the counts run, as the status line says it."""
    if view.since == "Envoy's start":
        uptime = f", {view.uptime_s:.0f} s after it" if view.uptime_s is not None else ""
        return f"not zero since Envoy's start (one dump{uptime})"
    if view.since == "the first dump":
        return "moved between the dumps"
    return f"moved since {view.since}'s first read of /stats (read again every {COUNTERS_REFRESH_S:.0f} s)"


def _failure(name: str) -> bool:
    split = split_cluster_stat(name)
    return split is not None and is_cluster_failure_stat(split[1])


def _columns(table: DataTable, label: str) -> None:
    table.add_column(label, key="count")  # first: a stat's name is long, and an 80-column screen cuts it
    table.add_column("stat", key="stat")


class CountersScreen(Screen):
    """``fetch(pod)`` gives a pod's fetcher of its moved stats (Session.counters: EnvoyCountersEvent, whose
    ``stats`` are shown); ``pods`` are the run's ([]: one, unnamed); ``dump_of(pod)`` the dump files, None when
    the sidecar is asked now (then the pane reads again on a timer and with `f`)."""

    BINDINGS = [Binding("escape,k", "app.pop_screen", "back"), Binding("slash", "filter", "filter"),
                Binding("f", "refresh", "refresh now"), Binding("p", "next_pod", "next pod")]
    CSS = "#counters-status { height: auto; padding: 0 1; background: $boost; }"

    def __init__(self, fetch: Callable[[str | None], Callable[[], EnvoyCountersEvent] | None], pods: list[str],
                 dump_of: Callable[[str | None], str | None] = lambda pod: None) -> None:
        super().__init__()
        self.fetch_of = fetch
        self.dump_of = dump_of
        self.pods: list[str | None] = list(pods) or [None]
        self.at = 0
        self.filter_text = ""
        self.view: EnvoyCountersEvent | None = None

    @property
    def pod(self) -> str | None:
        return self.pods[self.at]

    def _asked(self) -> str | None:
        return self.pod if len(self.pods) > 1 else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "refresh":
            return self.dump_of(self._asked()) is None  # dumps read the same every time
        return len(self.pods) > 1 if action == "next_pod" else True

    def compose(self) -> ComposeResult:
        yield Header()
        yield PlainStatic("reading /stats ...", id="counters-status", markup=False)
        yield Input(placeholder="filter: any part of a stat's name, Enter to apply", id="counters-filter")
        table = PlainTable(id="counters", cursor_type="row", zebra_stripes=True)
        _columns(table, "moved")
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self._title()
        self.query_one("#counters", DataTable).focus()  # keys go to the screen; / moves to the filter
        self.action_refresh()
        self.set_interval(COUNTERS_REFRESH_S, self._tick)

    def _tick(self) -> None:
        if self.dump_of(self._asked()) is None:
            self.action_refresh()

    def _title(self) -> None:
        which = f" ({self.at + 1} of {len(self.pods)}; p: next pod)" if len(self.pods) > 1 else ""
        dump = self.dump_of(self._asked())
        # the files are on the status line: a path in the title would push the pod out of an 80-column one
        self.sub_title = ("/stats dumps" if dump is not None else "Envoy counters") + pod_of(self.pod) + which

    def action_next_pod(self) -> None:
        self.at = (self.at + 1) % len(self.pods)
        self.view = None
        self.query_one("#counters", DataTable).clear()
        self.query_one("#counters-status", Static).update(f"reading /stats{pod_of(self.pod)} ...")
        self._title()
        self.refresh_bindings()
        self.action_refresh()

    @work(thread=True, exclusive=True, group="counters")
    def action_refresh(self) -> None:
        pod = self.pod
        try:
            fetch = self.fetch_of(self._asked())
            if fetch is None:
                raise LookupError(f"the proxy{pod_of(pod)} is not known yet")
            view = fetch()
        except Exception as e:  # shown, never raised: a damaged dump, an unreachable proxy
            self.app.call_from_thread(self._shown_if, pod, self._status, f"cannot read /stats{pod_of(pod)}: {why(e)}")
            return
        self.app.call_from_thread(self._shown_if, pod, self._show, view)

    def _shown_if(self, pod: str | None, show: Callable, *args) -> None:
        if pod == self.pod:  # a read of the pod left behind (p pressed meanwhile) is not this pane's
            show(*args)

    def _status(self, text: str) -> None:
        self.query_one("#counters-status", Static).update(text)

    def _show(self, view: EnvoyCountersEvent) -> None:
        self.view = view
        table = self.query_one("#counters", DataTable)
        table.clear()
        # one dump's stats are totals (and gauges) since Envoy started, not what moved
        label = "value" if view.since == "Envoy's start" else "moved"
        if str(next(iter(table.columns.values())).label) != label:
            table.clear(columns=True)
            _columns(table, label)
        shown = 0
        for name, value in sorted(view.stats.items()):
            cells = (Text(str(value)), Text(one_line(name), style="bold red" if _failure(name) else ""))
            if row_matches(cells, self.filter_text):
                table.add_row(*cells)
                shown += 1
        pod = f"pod/{one_line(self.pod)}: " if len(self.pods) > 1 else ""
        filt = f", filter {self.filter_text!r}: {shown} shown" if self.filter_text else ""
        self._status(one_line(f"{pod}{len(view.stats)} stats {_since(view)}{filt} ({view.source})", 400))

    def action_filter(self) -> None:
        self.query_one("#counters-filter", Input).focus()

    @on(Input.Submitted, "#counters-filter")
    def _apply_filter(self, event: Input.Submitted) -> None:
        self.filter_text = event.value
        self.query_one("#counters", DataTable).focus()
        if self.view is not None:
            self._show(self.view)
