"""Events parsed in a reader's thread, handed to the asyncio event loop in batches, with back-pressure.

The live readers parse in the thread that reads their stream (a capture's pump, live/pod_fields.py; the followed
istio-proxy log, sources/proxy_log.py), so the event loop does no per-line work. Each batch crosses in one
``call_soon_threadsafe``. A reader that runs ahead of the loop must wait rather than grow an unbounded queue: the
wait holds up its stream, and so tcpdump (whose kernel buffer then counts drops) or the API server's log stream,
as a full pipe would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

E = TypeVar("E")


class LoopHandoff(Generic[E]):
    """Batches of events for ``on_event``, called on ``loop`` in the order they were handed on. Past
    ``max_pending`` events handed on and not yet fed, ``hand_on`` waits, looking every ``wait_s`` seconds whether
    the loop is still there. Once ``close`` was called (nothing will read further events) or the loop has closed,
    events are dropped and nobody waits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[E], None], max_pending: int,
                 wait_s: float) -> None:
        self._loop, self._on_event = loop, on_event
        self._max_pending, self._wait_s = max_pending, wait_s
        self._pending = 0
        self._cond = threading.Condition()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def hand_on(self, events: Sequence[E]) -> None:
        """From the reader's thread: queue ``events`` on the loop; waits while too many are pending. Never raises."""
        with self._cond:
            while self._pending > self._max_pending and not self._closed:
                self._cond.wait(self._wait_s)
                if self._loop.is_closed():
                    return
            if self._closed:
                return
            self._pending += len(events)
        try:
            self._loop.call_soon_threadsafe(self._feed, events)
        except RuntimeError:  # the event loop has closed: nothing will read them
            self.close()

    def queue_here(self, events: Sequence[E]) -> None:
        """From the loop's own thread: queue ``events`` behind those handed on before, without waiting."""
        with self._cond:
            self._pending += len(events)
        self._loop.call_soon(self._feed, events)

    def close(self) -> None:
        """Nothing will read further events: a reader waiting to hand some on stops waiting."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _feed(self, events: Sequence[E]) -> None:
        try:
            for ev in events:
                self._on_event(ev)
        finally:
            with self._cond:
                self._pending -= len(events)
                self._cond.notify_all()
