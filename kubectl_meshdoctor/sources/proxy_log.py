"""The followed ``istio-proxy`` log, live: its access-log lines and Envoy's own component log (the debug lines of
``pool``, ``connection``, ``router``, ...) as the events the pipeline reads, the way sources/envoy_files.py reads
a saved log.

The follower (kube/logs.py) reads in a thread; lines are parsed there, in the order Envoy wrote them, and each
burst's events are handed to the event loop at once (at most MAX_PENDING waiting: beyond that the follower
waits, and the API server's stream with it), as the capture's streams do (live/pod_fields.py). A busy proxy at
debug writes thousands of lines a second; each costs one parse here and no work on the loop unless it is an
access-log line or a fact a detector reads.

A header dump spans lines (``request headers complete`` and the ``'name', 'value'`` lines after it): the
ComponentLogReader joins them, and an entry still open when the stream goes quiet (formats without Istio's
closing ``\\tthread=N``) is handed on by ``idle`` once no line came for QUIET_S, or at the end.

Lines are numbered from the start of the follow (the follower asks for no earlier line), under one source name
per pod, ``pod/NAME istio-proxy``: the evidence of a finding points into that stream.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubectl_meshdoctor.core.events import AccessLogEvent, EnvoyLogEvent
from kubectl_meshdoctor.envoy.access_log import looks_like_access_log, parse_line
from kubectl_meshdoctor.envoy.component_facts import fact_of
from kubectl_meshdoctor.envoy.component_log import (
    ComponentLine,
    ComponentLogReader,
    is_continuation,
    parse_component_line,
)
from kubectl_meshdoctor.envoy.story import log_ref
from kubectl_meshdoctor.loop_handoff import LoopHandoff

MAX_PENDING = 20_000  # events handed to the loop and not yet read there: beyond this the follower waits
QUIET_S = 0.5  # seconds without a line after which an open multi-line entry is taken as complete
_WAIT_S = 0.2  # how long a waiting follower sleeps before it looks at the loop again


def log_source(pod: str, container: str = "istio-proxy") -> str:
    """The source name of a pod's followed log, as evidence names it: ``pod/NAME istio-proxy``."""
    return f"pod/{pod} {container}"


@dataclass(slots=True)
class LogCounts:
    """What the followed log held so far: ``lines`` read; ``access_log`` lines among them; ``component`` entries of
    Envoy's own log (a multi-line entry counts once), ``facts`` among them a detector reads; ``unreadable`` lines
    that start as access-log lines but give no entry; ``other`` lines of no known kind (pilot-agent's, an app's),
    counted and skipped."""

    lines: int = 0
    access_log: int = 0
    component: int = 0
    facts: int = 0
    unreadable: int = 0
    other: int = 0


class ProxyLogStream:
    """One pod's followed log to events on ``loop``: ``on_event`` gets each AccessLogEvent and EnvoyLogEvent there, in
    log order. ``line``, ``burst`` and ``ended`` are called from the follower's thread (LogFollower's on_line,
    on_burst and on_end); ``idle`` from the loop."""

    def __init__(self, source: str, loop: asyncio.AbstractEventLoop,
                 on_event: Callable[[AccessLogEvent | EnvoyLogEvent], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.counts = LogCounts()
        self.on_event = on_event
        self._clock = clock
        self._reader = ComponentLogReader()
        self._lock = threading.Lock()  # the reader and the batch: the follower's thread and the loop's idle()
        self._batch: list[AccessLogEvent | EnvoyLogEvent] = []
        self._last_line = clock()
        self._last_ts = 0.0  # Envoy's time of the latest entry that had one: for entries without a time
        self._handoff: LoopHandoff[AccessLogEvent | EnvoyLogEvent] = LoopHandoff(loop, self._on, MAX_PENDING,
                                                                                   _WAIT_S)

    # -- the follower's thread ----------------------------------------------------------------------------
    def line(self, text: str) -> None:
        """One line of the log (without its newline). Raises ValueError for a line that starts as an access-log
        line but cannot be read: the follower counts it as dropped (kube/logs.py) and the report says how many."""
        unreadable = False
        with self._lock:
            counts = self.counts
            counts.lines += 1
            number = counts.lines
            self._last_line = self._clock()
            entry = parse_line(text)
            if entry is not None:
                self._take(self._reader.flush())
                counts.access_log += 1
                self._batch.append(AccessLogEvent(time.time(), entry, self.source, number))
                return
            head = parse_component_line(text)
            if head is not None or (self._reader.open and is_continuation(text)):
                self._take(self._reader.feed(text, number, head))
                return
            self._take(self._reader.flush())
            if looks_like_access_log(text):  # Envoy's own lines share the log; this one is neither
                counts.unreadable += 1
                unreadable = True
            elif text.strip():
                counts.other += 1
        if unreadable:
            raise ValueError("a line that starts as an access-log line could not be read")

    def burst(self) -> None:
        """The follower read a burst of lines: hand what they gave to the loop."""
        with self._lock:
            events, self._batch = self._batch, []
        if events:
            self._handoff.hand_on(events)

    def ended(self) -> None:
        """The stream is over: the entry still open is complete."""
        with self._lock:
            self._take(self._reader.flush())
            events, self._batch = self._batch, []
        if events:
            self._handoff.hand_on(events)

    # -- the loop's thread --------------------------------------------------------------------------------
    def idle(self) -> None:
        """From the loop, now and then: an entry still open with no line for QUIET_S is complete (a header dump
        in a format that does not close it). Its events queue behind those handed on before, in log order."""
        with self._lock:
            if not self._reader.open or self._clock() - self._last_line < QUIET_S:
                return
            self._take(self._reader.flush())
            events, self._batch = self._batch, []
        if events:
            self._handoff.queue_here(events)

    def close(self) -> None:
        """Nothing will read further events (the run is over): a follower waiting to hand some on stops."""
        self._handoff.close()

    # -- inside ---------------------------------------------------------------------------------------------
    def _take(self, done: list[tuple[int, ComponentLine]]) -> None:
        """Complete component-log entries to EnvoyLogEvents for the facts a detector reads (under the lock)."""
        for number, entry in done:
            self.counts.component += 1
            if entry.ts is not None:
                self._last_ts = entry.ts
            fact = fact_of(entry)
            if fact is not None:
                self.counts.facts += 1
                self._batch.append(EnvoyLogEvent(entry.ts or self._last_ts or time.time(), fact,
                                                 log_ref(self.source, number, entry, fact.kind)))

    def _on(self, ev: AccessLogEvent | EnvoyLogEvent) -> None:
        self.on_event(ev)
