"""The tests' one way to wait (tests/waiting.py): the value awaited comes back, a failure says what was awaited
and what was last seen, and no pause runs past the deadline, however long the poll interval."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from .waiting import wait_until, wait_until_async


def test_the_first_value_ok_accepts_is_returned():
    counts = itertools.count()
    assert wait_until("three looks", 5, lambda: next(counts), poll_s=0.001, ok=lambda n: n >= 3) == 3
    assert wait_until("a truthy look", 5, iter([0, "", "yes"]).__next__, poll_s=0.001) == "yes"


def test_a_timeout_names_what_and_the_last_look_and_ends_at_the_deadline():
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"^the listing: not true after 0.2 s; last seen: 'no DROP yet'$"):
        wait_until("the listing", 0.2, lambda: "no DROP yet", poll_s=30, ok=lambda text: "DROP" not in text)
    assert time.monotonic() - t0 < 5  # not the 30 s poll interval: the last pause ends at the deadline


def test_a_long_last_look_is_cut_in_the_message():
    with pytest.raises(AssertionError, match=r"last seen: 'xxx+\.\.\. \(10002 chars\)$"):
        wait_until("a short buffer", 0.01, lambda: "x" * 10_000, ok=lambda text: len(text) < 10)


async def test_the_async_twin_lets_the_loop_run_while_it_waits():
    flag = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, flag.set)  # only a loop that runs sets it
    assert await wait_until_async("the flag set by the loop", 5, flag.is_set)


async def test_the_async_twin_awaits_a_coroutine_look_and_fails_like_the_sync_one():
    looks = itertools.count()

    async def look() -> int:  # awaited by the waiter, as a connect attempt would be
        return next(looks)

    assert await wait_until_async("two looks", 5, look, ok=lambda n: n == 2) == 2
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"^never: not true after 0.2 s; last seen: None$"):
        await wait_until_async("never", 0.2, lambda: None, poll_s=30)
    assert time.monotonic() - t0 < 5
