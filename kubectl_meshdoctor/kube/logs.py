"""Following a container's log through the API (pods/log, follow=true): the sidecar's access log and Envoy's own
log."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .client import Kube, api_error_message

MAX_LINE_BYTES = 64 * 1024  # longer lines are cut: an access-log line is a few hundred bytes


@dataclass(slots=True)
class LogFollower:
    """Streams new lines of ``container``'s log to ``on_line`` from a thread until ``stop``.

    ``error`` says why the stream ended early (one line), None after a clean stop. A line ``on_line`` raised on
    is dropped and counted in ``dropped`` (``drop_reason``: the first one's exception type), and the stream goes on:
    one line nobody expected must not end the following of every line after it. ``on_burst`` (if given) is called
    after the lines of each piece the API handed over, ``on_end`` once the stream is over (both from the thread),
    so a consumer can hand lines on in batches."""

    kube: Kube
    namespace: str
    pod: str
    container: str
    on_line: Callable[[str], None]
    on_burst: Callable[[], None] | None = None
    on_end: Callable[[], None] | None = None
    error: str | None = None
    lines: int = 0
    dropped: int = 0
    drop_reason: str | None = None
    _buf: bytes = b""
    _stop: threading.Event = field(default_factory=threading.Event)
    _resp: object | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"log-{self.pod}-{self.container}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        # Closing the response from here would wait for the reader's buffer lock; shutting the socket down
        # makes the blocked read return instead, and the reader closes the response itself.
        sock = getattr(getattr(self._resp, "connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def feed(self, chunk: bytes) -> None:
        """Hand every line that ``chunk`` completes to ``on_line``; a partial last line waits for the next."""
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        for line in lines:
            self.lines += 1
            try:
                self.on_line(line[:MAX_LINE_BYTES].decode("utf-8", "replace").rstrip("\r"))
            except Exception as e:
                self.dropped += 1
                if self.drop_reason is None:
                    # The kind only: a parser's message may quote the line, and the line may hold a secret.
                    self.drop_reason = type(e).__name__
        if len(self._buf) > MAX_LINE_BYTES:
            self._buf = b""
        if lines and self.on_burst is not None:
            self.on_burst()

    def _run(self) -> None:
        try:
            self._resp = self.kube.core.read_namespaced_pod_log(
                self.pod, self.namespace, container=self.container, follow=True, tail_lines=0,
                _preload_content=False)
            for chunk in self._resp.stream(4096):
                if self._stop.is_set():
                    return
                self.feed(chunk)
            if not self._stop.is_set():
                self.error = f"the {self.container} log stream ended (pod restarted or connection lost)"
        except Exception as e:  # reported by the caller, never lost silently
            if not self._stop.is_set():
                self.error = f"following the {self.container} log: {api_error_message(e)}"
        finally:
            if self._resp is not None:
                try:
                    self._resp.close()
                except Exception:
                    pass
            if self.on_end is not None:
                self.on_end()
