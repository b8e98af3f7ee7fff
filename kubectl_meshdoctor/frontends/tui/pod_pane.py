"""What the clusters (envoy.py) and counters (stats_pane.py) panes share: one pod's sidecar, or dumps, at a time,
`p` to the next; read in a worker thread through the session's fetcher, again on a timer and with `f` while it is
the sidecar's now, once for a dump (it reads the same every time)."""

from __future__ import annotations

from collections.abc import Callable

from textual import work
from textual.screen import Screen

from ..shown import one_line


def pod_of(pod: str | None) -> str:
    """`` of pod/NAME`` for a pane's title and lines ("" when the run names no pod: one recorded pod's files)."""
    return one_line(f" of pod/{pod}") if pod is not None else ""


def why(e: BaseException) -> str:
    """What went wrong, in one line: the error's first line, else its kind (an OSError may say nothing)."""
    return one_line(str(e).splitlines()[0] if str(e).strip() else type(e).__name__)


class PodPane(Screen):
    """``fetch_of(pod)``: a pod's fetcher (Session.clusters, Session.counters; None while its proxy is not known),
    called in a worker thread; ``pods``: the run's ([]: one, unnamed; `p` goes to the next); ``dump_of(pod)``: the
    dump files read for a pod, None when its sidecar is asked now. A subclass names what it reads (``READS``, e.g.
    ``/clusters``) and draws it (``show``) and its status line (``set_status``); its BINDINGS hold `f` (action
    refresh) and `p` (action next_pod)."""

    READS = ""

    def __init__(self, fetch_of: Callable[[str | None], Callable[[], object] | None], pods: list[str],
                 dump_of: Callable[[str | None], str | None] = lambda pod: None) -> None:
        super().__init__()
        self.fetch_of = fetch_of
        self.dump_of = dump_of
        self.pods: list[str | None] = list(pods) or [None]
        self.at = 0

    @property
    def pod(self) -> str | None:
        return self.pods[self.at]

    def asked(self) -> str | None:
        """The pod to ask the session for: None (its first) when the pane has one pod."""
        return self.pod if len(self.pods) > 1 else None

    def dumped(self) -> str | None:
        """The dump files the pod shown is read from; None for its sidecar, now."""
        return self.dump_of(self.asked())

    def which(self) -> str:
        """`` (1 of 2; p: next pod)`` with several pods, else ""."""
        return f" ({self.at + 1} of {len(self.pods)}; p: next pod)" if len(self.pods) > 1 else ""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "refresh":
            return self.dumped() is None  # a dump reads the same every time
        return len(self.pods) > 1 if action == "next_pod" else True

    def set_title(self, live: str, dump: str) -> None:
        # a dump's files are on the status line: a path in the title would push the pod out of an 80-column one
        self.sub_title = (dump if self.dumped() is not None else live) + pod_of(self.pod) + self.which()

    def step(self) -> None:
        """To the next pod (the subclass clears what it showed, then reads)."""
        self.at = (self.at + 1) % len(self.pods)
        self.set_status(f"reading {self.READS}{pod_of(self.pod)} ...")
        self.refresh_bindings()

    def tick(self) -> None:
        """The timer's read: the sidecar's only."""
        if self.dumped() is None:
            self.action_refresh()

    @work(thread=True, exclusive=True, group="pod-pane")
    def action_refresh(self) -> None:
        pod = self.pod
        try:
            fetch = self.fetch_of(self.asked())
            if fetch is None:
                raise LookupError(f"the proxy{pod_of(pod)} is not known yet")
            got = fetch()
        except Exception as e:  # shown, never raised: a damaged dump, an unreachable proxy
            self.app.call_from_thread(self._shown_if, pod, self.set_status,
                                      f"cannot read {self.READS}{pod_of(pod)}: {why(e)}")
            return
        self.app.call_from_thread(self._shown_if, pod, self.show, got)

    def _shown_if(self, pod: str | None, show: Callable, *args) -> None:
        if pod == self.pod:  # a read of the pod left behind (p pressed meanwhile) is not this pane's
            show(*args)

    def show(self, got) -> None:
        raise NotImplementedError

    def set_status(self, text: str) -> None:
        raise NotImplementedError
