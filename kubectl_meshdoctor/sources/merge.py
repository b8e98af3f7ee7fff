"""Several capture streams delivered as one, in time order (lo and eth0 of one pod, read by separate tsharks).

Each reader pushes events as tshark yields them; an event is released once every unfinished stream has shown
a later (or equal) time, so the output is ordered while each stream is read at full speed. Buffers stay small
while the streams advance together; ``max_buffered`` bounds them when one stream runs far ahead (its events
are then released slightly out of order rather than held without limit).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..events import PacketEvent

R = TypeVar("R")
Reader = Callable[[Callable[[PacketEvent], None]], Awaitable[R]]


async def merge_by_time(readers: list[Reader], on_event: Callable[[PacketEvent], None],
                        max_buffered: int = 200_000) -> list[R | BaseException]:
    """Run every reader concurrently, calling ``on_event`` in timestamp order; returns each reader's result
    (or the exception it raised), in the order given."""
    n = len(readers)
    buffers: list[deque[PacketEvent]] = [deque() for _ in range(n)]
    done = [False] * n
    buffered = 0

    def drain() -> None:
        nonlocal buffered
        while True:
            waiting = any(not done[i] and not buffers[i] for i in range(n))
            if waiting and buffered <= max_buffered:
                return
            heads = [(buffers[i][0].ts, i) for i in range(n) if buffers[i]]
            if not heads:
                return
            _, i = min(heads)
            buffered -= 1
            on_event(buffers[i].popleft())

    def push_to(i: int) -> Callable[[PacketEvent], None]:
        def push(ev: PacketEvent) -> None:
            nonlocal buffered
            buffers[i].append(ev)
            buffered += 1
            drain()
        return push

    async def run(i: int):
        try:
            return await readers[i](push_to(i))
        finally:
            done[i] = True
            drain()

    return list(await asyncio.gather(*(run(i) for i in range(n)), return_exceptions=True))
