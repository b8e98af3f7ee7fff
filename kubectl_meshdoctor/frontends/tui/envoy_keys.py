"""The triage desk's Envoy pane keys: `l` loggers, `c` clusters, `a` access log, `k` the /stats counters that
moved. A mixin of MeshDoctorApp (app.py): which panes the session offers (Session.panes) and opening them. The
panes themselves are in loggers.py, envoy.py and stats_pane.py (pod_pane.py: what c and k share); what they show
comes from the session, which knows whether it is a sidecar asked now or files read (the panes only learn which
file a dump is)."""

from __future__ import annotations

from collections.abc import Callable

from textual.binding import Binding

from .session import ACCESS_LOG, CLUSTERS, COUNTERS, LOGGERS, Session

# Each pane key's action -> the pane it opens (Session.panes names them).
PANE_OF_ACTION = {"loggers": LOGGERS, "clusters": CLUSTERS, "access_log": ACCESS_LOG, "counters": COUNTERS}

# In the footer at every width (s44: a new user at 80x24 saw only `a` and never found the others): the
# descriptions are short so that, with the main keys, they fit 80 columns in the compact footer; `?` says more.
ENVOY_BINDINGS = [Binding("l", "loggers", "Levels"),
                  Binding("c", "clusters", "Clusters"),
                  Binding("a", "access_log", "Log"),
                  Binding("k", "counters", "Stats")]


class EnvoyPaneKeys:
    """The app's Envoy pane keys. The host sets ``session`` and ``offered`` (Session.panes at the start), calls
    ``note_panes`` on its refresh timer and ``pane_offered`` from its check_action."""

    session: Session
    offered: frozenset[str]

    def note_panes(self) -> None:
        """A pane the session offers since the last tick (a first access-log line read) gets its key, in the footer
        and `?` alike."""
        now = self.session.panes()
        if now != self.offered:
            self.offered = now
            self.refresh_bindings()

    def pane_offered(self, action: str) -> bool:
        """Whether ``action``'s key works now: not a pane's key, or its pane is offered. A pane not offered is no
        key at all, as any key no pane binds: absent from the footer and `?`, and pressing it does nothing (Textual
        runs no action its check_action refuses). A line saying so would be a line for a key the screen never
        named; live panes whose proxy is not known yet are offered, and say that when pressed."""
        pane = PANE_OF_ACTION.get(action)
        return pane is None or pane in self.offered

    def _not_yet(self, what: str) -> None:
        self._on_progress(f"the proxy is not known yet: {what} are available once capturing")

    def action_loggers(self) -> None:
        """The sidecar's log levels, changed with a key (only once the run has found the proxy); `p` steps
        through the pods."""
        if self.session.loggers() is None:
            self._not_yet("loggers")
            return
        from .loggers import LoggersScreen

        self.push_screen(LoggersScreen(self.session.loggers, self.session.pane_pods(LOGGERS)))

    def action_clusters(self) -> None:
        from .envoy import ClustersScreen

        self._open_per_pod(CLUSTERS, self.session.clusters, ClustersScreen)

    def action_access_log(self) -> None:
        from .envoy import AccessLogScreen

        self.push_screen(AccessLogScreen(self.session.access_log, self.session.pod(), self.session.redact,
                                         self.session.access_logs, self.selected))

    def action_counters(self) -> None:
        from .stats_pane import CountersScreen

        self._open_per_pod(COUNTERS, self.session.counters, CountersScreen)

    def _open_per_pod(self, pane: str, fetch_of: Callable[[str | None], object], screen: type) -> None:
        """A PodPane (pod_pane.py) over ``fetch_of``, once the session has the first pod's."""
        if fetch_of(None) is None:
            self._not_yet(pane)
            return
        self.push_screen(screen(fetch_of, self.session.pane_pods(pane), lambda pod: self.session.dump_of(pane, pod)))
