"""How the triage desk ends when it is not asked with `q`: SIGTERM (kill, a closing tmux, systemd) and SIGHUP
(the terminal closed). Either stops the session as `q` does, so tcpdump ends in the pod and the caller removes
what it made (the spool of capture bytes); the default action would end the process there and then."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable

from kubectl_meshdoctor.exit_codes import by_signal

HANGUP_GRACE_S = 10.0  # seconds a hung-up screen may take to wind down before we leave without it
# Seconds a stopped session may take to wind down before the screen leaves with the findings so far: the clean end
# of a live watch takes 0.3 s in the lab; an API server that stops answering would hold it for the client's
# timeouts and retries.
WIND_DOWN_S = 2.0


class StopSignals:
    """Installs handlers for ``signals`` on the app's event loop. ``on_stop(sig)`` is called on the loop for each
    one (the app stops its session, and leaves at once on a second). After SIGHUP, if the process is still
    running ``HANGUP_GRACE_S`` seconds later, ``abandon()`` runs (it removes what must not outlive us) and the
    process exits 128+SIGHUP."""

    def __init__(self, signals: tuple[int, ...], on_stop: Callable[[int], None],
                 abandon: Callable[[], None] | None = None) -> None:
        self.signals = signals
        self.on_stop = on_stop
        self.abandon = abandon
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: dict[int, object] = {}

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for sig in self.signals:
            if sig == signal.SIGHUP:
                # A Python-level handler, not the loop's: it runs on the main thread at once, even while that
                # thread waits on Textual's output queue, whose writer thread dies of the first EIO.
                self._previous[sig] = signal.signal(sig, self._hung_up)
            else:
                loop.add_signal_handler(sig, self.on_stop, sig)

    def remove(self) -> None:
        for sig in self.signals:
            if sig in self._previous:
                signal.signal(sig, self._previous.pop(sig))  # type: ignore[arg-type]
            elif self._loop is not None:
                self._loop.remove_signal_handler(sig)

    def _hung_up(self, sig: int, _frame) -> None:
        # Every write to a hung-up terminal fails (EIO): what is still drawn, and the report, go nowhere instead.
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.on_stop, sig)
        timer = threading.Timer(HANGUP_GRACE_S, self._leave)
        timer.daemon = True
        timer.start()

    def _leave(self) -> None:
        # The screen did not wind down (a wedged output thread): nobody is watching it, so leave without it.
        try:
            if self.abandon is not None:
                self.abandon()
        finally:
            os._exit(by_signal(signal.SIGHUP))
