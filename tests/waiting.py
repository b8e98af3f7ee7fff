"""Waiting on a condition with a deadline: the one way tests wait (never a sleep-and-hope)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(what: str, timeout: float, ready: Callable[[], T], poll_s: float = 0.05) -> T:
    """Call ``ready`` every ``poll_s`` seconds until it returns something truthy, and return that; raise
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not true after {timeout} s")
        time.sleep(poll_s)
