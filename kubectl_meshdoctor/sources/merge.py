"""Several capture streams delivered as one, in time order (lo and eth0 of one pod, read by separate tsharks).

Each reader pushes events as tshark yields them; an event is released once every unfinished stream has shown
a later (or equal) time, so the output is ordered. A stream that runs ahead in capture time (a file with fewer
packets per second reaches later times sooner) is held back: its reader awaits ``gate()`` before reading more,
and the gate stays shut while that stream has ``high_water`` events waiting, so tshark blocks on its full pipe
instead of Python buffering the file (memory stays flat however long the capture). ``max_buffered`` is a last
bound across all streams (events are then released slightly out of order rather than held without limit).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kubectl_meshdoctor.core.events import PacketEvent

R = TypeVar("R")
Gate = Callable[[], Awaitable[None]]
Reader = Callable[[Callable[[PacketEvent], None], Gate], Awaitable[R]]


MAX_BUFFERED = 200_000
HIGH_WATER = 5_000


async def merge_by_time(readers: list[Reader], on_event: Callable[[PacketEvent], None],
                        max_buffered: int = MAX_BUFFERED, high_water: int = HIGH_WATER) -> list[R | BaseException]:
    """Run every reader concurrently, calling ``on_event`` in timestamp order; returns each reader's result
    (or the exception it raised), in the order given. Each reader is called as ``reader(push, gate)``; the gate
    bounds memory only if the reader awaits it before it reads more input (analyze's readers that share one
    tshark await it between chunks, and size ``max_buffered`` for a whole chunk per stream)."""
    n = len(readers)
    if n == 1:  # already in order: nothing to merge or hold back (one capture stream, no access log)
        async def open_gate() -> None:
            pass
        return list(await asyncio.gather(readers[0](on_event, open_gate), return_exceptions=True))
    buffers: list[deque[PacketEvent]] = [deque() for _ in range(n)]
    done = [False] * n
    buffered = 0
    open_gates = [asyncio.Event() for _ in range(n)]
    for g in open_gates:
        g.set()

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
            if len(buffers[i]) < high_water:
                open_gates[i].set()

    def push_to(i: int) -> Callable[[PacketEvent], None]:
        def push(ev: PacketEvent) -> None:
            nonlocal buffered
            buffers[i].append(ev)
            buffered += 1
            if len(buffers[i]) >= high_water:
                open_gates[i].clear()
            drain()
        return push

    def gate_of(i: int) -> Gate:
        async def gate() -> None:
            await open_gates[i].wait()
        return gate

    async def run(i: int):
        try:
            return await readers[i](push_to(i), gate_of(i))
        finally:
            done[i] = True
            drain()

    return list(await asyncio.gather(*(run(i) for i in range(n)), return_exceptions=True))


DUPLICATE_WINDOW_S = 1.0  # capture seconds a packet's fingerprint is remembered: the merge releases in time order


class SeenOnce:
    """The packets of one capture given twice in other forms (a pcapng conversion, a gzip or a cut-short copy of
    the same file): each packet counted once, from the stream that had it first. Two detectors' worth of state
    fed the same SYN twice invent failures (a 'retransmitted' SYN, a syn-timeout).

    A packet's fingerprint is its time (microseconds), frame number (a copy keeps the numbering; two pods'
    captures of one packet on the wire do not share it), endpoints, sequence and acknowledgment numbers, flags
    and payload length; only a packet from another ``source`` with the same fingerprint is a duplicate (a
    stream's own packets never are). ``__call__`` says whether to drop ``ev``; ``dropped`` counts the dropped
    by (source, first source)."""

    def __init__(self) -> None:
        # Packets by their time in microseconds, the fingerprint's first field: one packet there (the common case:
        # its fingerprint is built only when another packet shares its microsecond), else its fingerprints.
        # Building every packet's fingerprint was a tenth of the detectors' process on bench/gen's short mix.
        self._seen: dict[int, PacketEvent | dict[tuple, str]] = {}
        # (first seen, microsecond, the packet held alone or None, its fingerprint or None), in time order
        self._order: deque[tuple] = deque()
        self.dropped: dict[tuple[str, str], int] = {}

    def __call__(self, ev: PacketEvent) -> bool:
        return self._check(ev.ts, ev.source, ev, _fingerprint)

    def row(self, row: tuple) -> bool:
        """``__call__`` for an event given as the tuple of PacketEvent's fields, its flags an int (what
        sources/event_columns.py's Packer takes)."""
        return self._check(row[0], row[2], row, _row_fingerprint)

    def _check(self, ts: float, source: str, item, fingerprint) -> bool:
        order, seen = self._order, self._seen
        cutoff = ts - DUPLICATE_WINDOW_S
        while order and order[0][0] < cutoff:
            _, us, what, fp = order.popleft()
            held = seen[us]
            if held is what:
                del seen[us]
            else:  # a fingerprint of a microsecond that held several
                del held[fingerprint(what) if fp is None else fp]
                if not held:
                    del seen[us]
        us = round(ts * 1e6)
        held = seen.get(us)
        if held is None:
            seen[us] = item
            order.append((ts, us, item, None))
            return False
        fp = fingerprint(item)
        if type(held) is not dict:
            if fingerprint(held) != fp:
                seen[us] = {fingerprint(held): _held_source(held), fp: source}
                order.append((ts, us, None, fp))
                return False
            first = _held_source(held)
        else:
            first = held.get(fp)
            if first is None:
                held[fp] = source
                order.append((ts, us, None, fp))
                return False
        if first == source:
            return False
        self.dropped[(source, first)] = self.dropped.get((source, first), 0) + 1
        return True


def _held_source(item) -> str:
    """The source of what SeenOnce holds: a PacketEvent or a row."""
    return item[2] if type(item) is tuple else item.source


def _fingerprint(ev: PacketEvent) -> tuple:
    """SeenOnce's fingerprint of a packet (its docstring)."""
    return (round(ev.ts * 1e6), ev.frame, ev.src, ev.sport, ev.dst, ev.dport, ev.seq, ev.ack, ev.flags._value_,
            ev.payload_len)


def _row_fingerprint(row: tuple) -> tuple:
    """_fingerprint of a row (SeenOnce.row)."""
    return (round(row[0] * 1e6), row[3], row[4], row[5], row[6], row[7], row[9], row[10], row[8], row[11])
