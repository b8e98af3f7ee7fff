"""The findings of a run still going on as its report would give them: each with the lines it explains, and the two
hops of one request (or the two ends of one eth0 connection) one finding, across the pods of a watch.

A pipeline hands each finding on as it concludes it (``on_finding``), before the access-log lines that its
packets explain have been attached to it, and before the finding of the other pod's half of the same request is
known: those are ``finish``'s work (Pipeline.finish, and commands/watch/live.py merge_reports across pods). A front
end that shows findings during the run asks a ``LiveJoin`` for the view instead, on a timer: it is made again only
when a pipeline concluded a finding or read a line since, and at most every ``every_s`` seconds, because the join
of the hops costs up to the findings squared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .findings import Finding
from .hops import join_hops
from .pipeline import Pipeline
from .upstream_pod import HeldPod, point_to_upstream

EVERY_S = 1.0  # seconds between two joins at most: a finding is seen in its joined form this long after it
SHARE = 0.2  # at most this share of the time goes to joining: a join that took 0.3 s waits 1.5 s for the next


@dataclass(frozen=True, slots=True)
class JoinedView:
    """The findings so far as a report would give them (``findings``), and how many findings the pipelines had
    concluded when it was made (``covers``, their ``emitted`` summed): those concluded later are not in it yet, and
    are the ``covers``-th and on of what ``on_finding`` was called with."""

    findings: tuple[Finding, ...]
    covers: int


class LiveJoin:
    """The joined view over ``pipelines`` (called for the pipelines made so far: one per pod). ``clock`` is
    monotonic seconds."""

    def __init__(self, pipelines: Callable[[], Sequence[Pipeline]], every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pipelines = pipelines
        self.every_s = every_s
        self.clock = clock
        self.joins = 0  # how many times the view was made
        self._view: JoinedView | None = None
        self._made_of: tuple | None = None
        self._made_at = 0.0
        self._took = 0.0  # seconds the last join took

    def view(self) -> JoinedView | None:
        """The newest view, made again if anything changed and the last was made ``every_s`` ago or more, and
        longer where joining takes more than SHARE of the time (or every pipeline has finished); None before the
        first pipeline."""
        pipelines = list(self.pipelines())
        if not pipelines:
            return None
        made_of = tuple((id(p), p.emitted, p.correlator.kept, p.finished) for p in pipelines)
        if made_of == self._made_of:
            return self._view
        now = self.clock()
        finished = all(p.finished for p in pipelines)
        if self._view is not None and now - self._made_at < max(self.every_s, self._took / SHARE) and not finished:
            return self._view
        self._made_of, self._made_at = made_of, now
        self.joins += 1
        self._view = JoinedView(tuple(joined(pipelines)), sum(p.emitted for p in pipelines))
        self._took = self.clock() - now
        return self._view


def joined(pipelines: Sequence[Pipeline]) -> list[Finding]:
    """Each pipeline's findings so far (Pipeline.so_far); with several pods, their hops joined across pods in time
    order, with each pod's unquoted 5xx lines, and a caller's 503 UC told where its upstream pod is in the run
    (core/upstream_pod.py), as commands/watch/live.py's merge_reports does at the end."""
    if len(pipelines) == 1:
        return pipelines[0].so_far()[0]
    findings: list[Finding] = []
    logged: list = []
    for p in pipelines:
        own, lines = p.so_far()
        findings += own
        logged += lines
    held = [HeldPod(p.ctx.pod, p.addresses(), p.stats.by_iface) for p in pipelines if p.ctx.pod is not None]
    return point_to_upstream(join_hops(sorted(findings, key=lambda f: f.ts), logged), held)
