"""A run that waits on the API server still stops at once when the user asks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from kubectl_meshdoctor.kube.client import KubeError


class Stopped(KubeError):
    """The user stopped the run (a signal, q) while it waited on the API server, before any capture."""


async def unless_stopped(stop: asyncio.Event, fn: Callable, *args):
    """``fn(*args)`` (a blocking API call) in a daemon thread, or Stopped as soon as ``stop`` is set: a signal must
    end the run at once, not after the client's timeouts and retries (30 s, four times) against a server that
    accepts connections and never answers. The thread is left to end on its own timeout; a daemon, it does not
    hold the process's exit. Raises what ``fn`` raises."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(how: Callable[[], None]) -> None:
        try:
            loop.call_soon_threadsafe(lambda: done.done() or how())
        except RuntimeError:
            pass  # the loop has closed: the run is over, nobody waits for this any more

    def call() -> None:
        try:
            result = fn(*args)
        except BaseException as e:  # noqa: BLE001 (handed to the waiter, raised there)
            settle(lambda e=e: done.set_exception(e))  # bound now: Python unbinds ``e`` when the block ends
        else:
            settle(lambda: done.set_result(result))

    threading.Thread(target=call, name=f"api-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if done.done():
        return done.result()
    done.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no "never retrieved" noise
    raise Stopped("stopped while waiting for the API server; nothing was captured")
