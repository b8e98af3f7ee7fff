"""The counters pane (`k`): a sidecar's /stats that moved, one row a stat, by its full name. Offline, between the
`/stats` dumps given (or every stat not zero since Envoy's start, for one dump), read once; live, since the run's
first read of the sidecar's /stats, read again every COUNTERS_REFRESH_S. The cluster stats that explain failures
(envoy.stats.is_cluster_failure_stat) are shown red. With several pods `p` goes to the next pod's."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Header, Input, Static

from kubectl_meshdoctor.core.events import EnvoyCountersEvent
from kubectl_meshdoctor.envoy.istio_cluster import parse_istio_cluster
from kubectl_meshdoctor.envoy.stats import is_cluster_failure_stat, split_cluster_stat

from ..shown import one_line
from .envoy import row_matches
from .footer import KeysFooter
from .plain import PlainStatic, PlainTable
from .pod_pane import PodPane

COUNTERS_REFRESH_S = 5.0  # a sidecar's whole /stats is large (MBs with many clusters): not every 2 s


def _since(view: EnvoyCountersEvent) -> str:
    """From when the counts run, as the status line says it."""
    if view.since == "Envoy's start":
        uptime = f", {view.uptime_s:.0f} s after it" if view.uptime_s is not None else ""
        return f"not zero since Envoy's start (one dump{uptime})"
    if view.since == "the first dump":
        return "moved between the dumps"
    return f"moved since {view.since}'s first read of /stats (read again every {COUNTERS_REFRESH_S:.0f} s)"


NARROW = 120  # below this many columns a cluster's name is shown short, before the stat (s46: at 80, off-screen)
SHORT_CLUSTER = 26  # a short cluster name at most, cut with "…" (a service of a long name)


def _columns(table: DataTable, label: str, narrow: bool) -> None:
    table.add_column(label, key="count")  # first: a stat's name is long, and an 80-column screen cuts it
    if narrow:  # the cluster, short, before the stat: a stat of no cluster leaves an empty column of its width
        table.add_column("cluster", key="cluster")
    table.add_column("stat", key="stat")
    if not narrow:
        # last: Istio's cluster names (outbound|5000||svc.ns.svc.cluster.local) are long; the stat before them
        # stays whole (all 15 rows of one cluster read alike otherwise)
        table.add_column("cluster", key="cluster")


def short_cluster(name: str) -> str:
    """An Istio cluster's name, ``direction|port|subset|hostname`` (Istio's model.BuildSubsetKey,
    pilot/pkg/model/service.go), as ``out reviews.shop:9080 v1``: the direction in a word, the hostname up to its
    ``.svc.`` (the service and its namespace), the port, the subset; cut with "…" at SHORT_CLUSTER. Any other
    name (``BlackHoleCluster``, ``xds-grpc``) as it is, cut alike."""
    c = parse_istio_cluster(name)
    if c is not None and c.port is not None:
        host = c.host.split(".svc.", 1)[0]
        name = f"{'out' if c.direction == 'outbound' else 'in'} {host}:{c.port}" + (f" {c.subset}" if c.subset else "")
    return name if len(name) <= SHORT_CLUSTER else name[:SHORT_CLUSTER - 1] + "…"


def stat_cells(name: str, value: int) -> tuple[Text, Text, Text]:
    """The counters pane's row for stat ``name``: its value, the stat (of a cluster's, what follows the cluster's
    name, envoy.stats.split_cluster_stat), the cluster ("" for a stat of no cluster)."""
    split = split_cluster_stat(name)
    stat, cluster = (split[1], split[0]) if split is not None else (name, "")
    style = "bold red" if split is not None and is_cluster_failure_stat(split[1]) else ""
    return Text(str(value)), Text(one_line(stat), style=style), Text(one_line(cluster))


def shown_cells(cells: tuple[Text, Text, Text], narrow: bool) -> tuple[Text, ...]:
    """``stat_cells``' row in the columns' order (``_columns``): narrow, the cluster short before the stat."""
    count, stat, cluster = cells
    return (count, Text(short_cluster(cluster.plain)), stat) if narrow else cells


class CountersScreen(PodPane):
    """``fetch(pod)`` gives a pod's fetcher of its moved stats (Session.counters: EnvoyCountersEvent, whose
    ``stats`` are shown); ``pods``, ``dump_of``: as PodPane's. The sidecar's are read again every
    COUNTERS_REFRESH_S and with `f`; dumps once."""

    BINDINGS = [Binding("escape,k", "app.pop_screen", "back"), Binding("slash", "filter", "filter"),
                Binding("f", "refresh", "refresh now"), Binding("p", "next_pod", "next pod")]
    CSS = "#counters-status { height: auto; padding: 0 1; background: $boost; }"
    READS = "/stats"

    def __init__(self, fetch: Callable[[str | None], Callable[[], EnvoyCountersEvent] | None], pods: list[str],
                 dump_of: Callable[[str | None], str | None] = lambda pod: None) -> None:
        super().__init__(fetch, pods, dump_of)
        self.filter_text = ""
        self.view: EnvoyCountersEvent | None = None
        self.narrow = False  # the columns as drawn: the cluster short, before the stat (``_columns``)

    def compose(self) -> ComposeResult:
        yield Header(icon="")
        yield PlainStatic("reading /stats ...", id="counters-status", markup=False)
        yield Input(placeholder="filter: any part of a stat's name, Enter to apply", id="counters-filter")
        table = PlainTable(id="counters", cursor_type="row", zebra_stripes=True)
        self.narrow = self.app.size.width < NARROW
        _columns(table, "moved", self.narrow)
        yield table
        yield KeysFooter()

    def on_mount(self) -> None:
        self.set_title("Envoy counters", "/stats dumps")
        self.query_one("#counters", DataTable).focus()  # keys go to the screen; / moves to the filter
        self.action_refresh()
        self.set_interval(COUNTERS_REFRESH_S, self.tick)

    def action_next_pod(self) -> None:
        self.view = None
        self.query_one("#counters", DataTable).clear()
        self.step()
        self.set_title("Envoy counters", "/stats dumps")
        self.action_refresh()

    def set_status(self, text: str) -> None:
        self.query_one("#counters-status", Static).update(text)

    def show(self, view: EnvoyCountersEvent) -> None:
        self.view = view
        table = self.query_one("#counters", DataTable)
        table.clear()
        # one dump's stats are totals (and gauges) since Envoy started, not what moved
        label = "value" if view.since == "Envoy's start" else "moved"
        narrow = self.size.width < NARROW
        if str(next(iter(table.columns.values())).label) != label or narrow != self.narrow:
            self.narrow = narrow
            table.clear(columns=True)
            _columns(table, label, narrow)
        shown = 0
        for name, value in sorted(view.stats.items()):
            cells = stat_cells(name, value)
            if row_matches(cells, self.filter_text):  # the whole names, whatever the screen shows of them
                table.add_row(*shown_cells(cells, narrow))
                shown += 1
        pod = f"pod/{one_line(self.pod)}: " if len(self.pods) > 1 else ""
        filt = f", filter {self.filter_text!r}: {shown} shown" if self.filter_text else ""
        self.set_status(one_line(f"{pod}{len(view.stats)} stats {_since(view)}{filt} ({view.source})", 400))

    def on_resize(self) -> None:
        """Across NARROW columns the cluster moves (short before the stat, or whole after it): redrawn."""
        if self.view is not None and (self.size.width < NARROW) != self.narrow:
            self.show(self.view)

    def action_filter(self) -> None:
        self.query_one("#counters-filter", Input).focus()

    @on(Input.Submitted, "#counters-filter")
    def _apply_filter(self, event: Input.Submitted) -> None:
        self.filter_text = event.value
        self.query_one("#counters", DataTable).focus()
        if self.view is not None:
            self.show(self.view)
