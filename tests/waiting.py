"""Waiting on a condition with a deadline: the one way tests wait (never a sleep-and-hope).

``wait_until`` for plain tests and threads, ``wait_until_async`` for a test that runs on an event loop (its pauses
let the loop's other tasks run; a blocking sleep there would stop the very thing awaited).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

SHOWN_CHARS = 500  # of what was last seen, in the failure message: a listing or a buffer can be long


def _poll_pause(what: str, timeout: float, deadline: float, poll_s: float, seen: object) -> float:
    """Seconds to pause before the next look: ``poll_s``, or less so that the last look falls on the deadline.
    Raises AssertionError naming ``what`` and the last value ``seen`` once the deadline has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        shown = repr(seen)
        if len(shown) > SHOWN_CHARS:
            shown = shown[:SHOWN_CHARS] + f"... ({len(shown)} chars)"
        raise AssertionError(f"{what}: not true after {timeout:.3g} s; last seen: {shown}")
    return min(poll_s, left)


def wait_until(what: str, timeout: float, ready: Callable[[], T], poll_s: float = 0.05, *,
               ok: Callable[[T], object] = bool) -> T:
    """Call ``ready`` every ``poll_s`` seconds until ``ok`` of what it returns is true (by default: until it
    returns something truthy), and return that value. After ``timeout`` seconds raise AssertionError naming
    ``what`` and the value last returned: let ``ready`` return what it looked at (a listing, a count) and ``ok``
    judge it, and a failure shows the state it ended in."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if ok(value):
            return value
        time.sleep(_poll_pause(what, timeout, deadline, poll_s, value))


async def wait_until_async(what: str, timeout: float, ready: Callable[[], T | Awaitable[T]], poll_s: float = 0.01,
                           *, ok: Callable[[T], object] = bool,
                           pause: Callable[[float], Awaitable[object]] = asyncio.sleep) -> T:
    """``wait_until`` on an event loop: between looks the loop runs its other tasks. ``ready`` may be a coroutine
    function (a connect attempt, say); each look is awaited whole, so it should not hang. ``pause(seconds)`` is
    awaited between looks: a Textual test passes its pilot's, which also lets the screen catch up."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if inspect.isawaitable(value):
            value = await value
        if ok(value):
            return value
        await pause(_poll_pause(what, timeout, deadline, poll_s, value))
