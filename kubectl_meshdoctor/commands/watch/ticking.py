"""The live pipeline's clock while no packet comes.

The pipeline ticks on packet time (core/pipeline.py: every TICK_EVERY_S of capture time), and a tick is what
ends a request's story gone quiet in Envoy's log and what reports a failing request nothing explained
(core/correlate.py, after its grace period). A pod that is quiet on the wire, or whose capture saw nothing the
detectors read, still logs: here the pipeline is ticked from the wall clock while packets are quiet, at the pod's
time as far as it can be told (the newest time the pod itself stamped, a packet's or an Envoy log line's, against
when it arrived here), a little behind, so a packet still on its way is not overtaken by much.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kubectl_meshdoctor.core.events import EnvoyLogEvent
from kubectl_meshdoctor.core.pipeline import Pipeline

EVERY_S = 0.5  # seconds of wall time between looks
QUIET_S = 1.0  # packets quiet this long: the wall clock drives the ticks, this far behind the pod's time


class QuietTicker:
    """Ticks ``pipeline`` while packets are quiet, and calls ``idle`` (sources/proxy_log.py: a multi-line entry
    left open completes) on every look. ``saw(ts)`` takes a time the pod stamped (seconds since the epoch) as it
    arrives; ``wall`` is the clock (time.time)."""

    def __init__(self, pipeline: Pipeline, idle: Callable[[], None] | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.pipeline = pipeline
        self.idle = idle
        self.wall = wall
        self.ticks = 0
        self._offset: float | None = None  # the pod's clock minus ours, at most (what arrives arrived after)
        self._packets = -1
        self._packets_at = wall()
        self._last_tick = 0.0

    def saw(self, ts: float) -> None:
        offset = ts - self.wall()
        if self._offset is None or offset > self._offset:
            self._offset = offset

    def wrap(self, on_event: Callable) -> Callable:
        """``on_event`` (the pipeline's context) that also notes the time of each Envoy log entry."""

        def noted(ev) -> None:
            if isinstance(ev, EnvoyLogEvent):
                self.saw(ev.ts)
            on_event(ev)

        return noted

    def look(self) -> bool:
        """One look: returns whether the pipeline was ticked."""
        if self.idle is not None:
            self.idle()
        now = self.wall()
        stats = self.pipeline.stats
        latest = max((s.last_ts for s in stats.by_iface.values() if s.last_ts is not None), default=None)
        if stats.packets != self._packets:
            self._packets, self._packets_at = stats.packets, now
            if latest is not None:
                self.saw(latest)
            return False
        if now - self._packets_at < QUIET_S:
            return False
        at = now + (self._offset or 0.0) - QUIET_S
        if at <= max(latest or 0.0, self._last_tick):
            return False  # never behind what the packets already ticked
        self.pipeline.tick(at)
        self._last_tick = at
        self.ticks += 1
        return True

    async def run(self) -> None:
        """Look every EVERY_S until cancelled."""
        while True:
            await asyncio.sleep(EVERY_S)
            self.look()
