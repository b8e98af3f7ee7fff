"""The stdio of an interactive ephemeral container (`stdin: true` and/or `tty: true`), shared by its attaches.

What the container runtime keeps for such a container, played here: with `tty` the process runs on a
pseudo-terminal (its controlling terminal, so a shell is interactive and ^C reaches it), output is one stream and
`resize` sets the window size (TIOCSWINSZ); without, stdin is a pipe we hold open and stdout/stderr are pipes.
Every output byte goes to the container's log file (what `kubectl logs` serves) and to every attached client.
Output before an attach is not replayed, as with a real runtime (hence kubectl's "If you don't see a command
prompt, try pressing enter."). With `stdinOnce`, the first attach that closes stdin closes it for the container
(core/v1 Container.stdinOnce).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import struct
import subprocess
import termios
from pathlib import Path
from typing import Any

log = logging.getLogger("meshdoctor.apiserver")

READ_CHUNK = 64 * 1024
MAX_QUEUED = 1024  # chunks an attached client may lag behind before it is dropped (memory stays bounded)


class ContainerIO:
    """Create, `child_stdio()` for the spawn, `started(proc)` once it runs; attaches `subscribe()`."""

    def __init__(self, log_file: Path | None, tty: bool, stdin_once: bool) -> None:
        """`log_file` None: output only to subscribers (an `exec -t`, which has no log)."""
        self.tty = tty
        self.stdin_once = stdin_once
        self._log_file = log_file
        self._subscribers: set[asyncio.Queue[tuple[str, bytes] | None]] = set()
        self._master: int | None = None
        self._slave: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stdin_closed = False
        self.done = asyncio.Event()

    def child_stdio(self) -> dict[str, Any]:
        """Keyword arguments for ProcessRegistry.spawn (stdin, stdout, stderr, controlling_tty)."""
        if not self.tty:
            return {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
                    "controlling_tty": False}
        self._master, self._slave = os.openpty()
        return {"stdin": self._slave, "stdout": self._slave, "stderr": self._slave, "controlling_tty": True}

    def started(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        if self._slave is not None:
            os.close(self._slave)  # the child holds it; the master sees EIO once the child's copies close
            self._slave = None
        if self._master is not None:
            os.set_blocking(self._master, False)
            asyncio.get_running_loop().add_reader(self._master, self._on_master)
        else:
            for stream, kind in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
                if stream is not None:
                    self._tasks.append(asyncio.ensure_future(self._pump(stream, kind)))

    def failed(self) -> None:
        """The process could not be started: release the terminal."""
        for fd in (self._slave, self._master):
            if fd is not None:
                os.close(fd)
        self._slave = self._master = None
        self._finish()

    # ------------------------------------------------------------------------------------------- output

    def _emit(self, kind: str, data: bytes) -> None:
        if self._log_file is not None:
            try:
                with open(self._log_file, "ab") as f:
                    f.write(data)
            except OSError:
                pass
        for queue in list(self._subscribers):
            if queue.qsize() >= MAX_QUEUED:
                self._subscribers.discard(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait((kind, data))

    def _on_master(self) -> None:
        assert self._master is not None
        try:
            data = os.read(self._master, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO: every slave descriptor is closed, the process is gone
            data = b""
        if data:
            self._emit("stdout", data)
            return
        asyncio.get_running_loop().remove_reader(self._master)
        os.close(self._master)
        self._master = None
        self._finish()

    async def _pump(self, stream: asyncio.StreamReader, kind: str) -> None:
        while chunk := await stream.read(READ_CHUNK):
            self._emit(kind, chunk)
        if all(t.done() or t is asyncio.current_task() for t in self._tasks):
            self._finish()

    def _finish(self) -> None:
        self.done.set()
        for queue in self._subscribers:
            queue.put_nowait(None)
        self._subscribers.clear()

    def subscribe(self) -> asyncio.Queue[tuple[str, bytes] | None]:
        """Output from now on: ("stdout" | "stderr", bytes), then None when the container's output ended."""
        queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
        if self.done.is_set():
            queue.put_nowait(None)
        else:
            self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[tuple[str, bytes] | None]) -> None:
        self._subscribers.discard(queue)

    # ------------------------------------------------------------------------------------------- input

    async def write_stdin(self, data: bytes) -> None:
        if self._stdin_closed:
            return
        if self._master is not None:
            os.write(self._master, data)  # a terminal's input buffer; short interactive writes
        elif self._proc is not None and self._proc.stdin is not None and not self._proc.stdin.is_closing():
            try:
                self._proc.stdin.write(data)
                await self._proc.stdin.drain()
            except (ConnectionError, BrokenPipeError):
                pass

    def client_closed_stdin(self) -> None:
        """An attached client sent stdin EOF: only a stdinOnce container's stdin closes (a terminal gets ^D)."""
        if not self.stdin_once or self._stdin_closed:
            return
        self._stdin_closed = True
        if self._master is not None:
            os.write(self._master, b"\x04")
        elif self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()

    def resize(self, payload: bytes) -> None:
        """`{"Width": w, "Height": h}` (client-go TerminalSize) -> TIOCSWINSZ; ignored without a terminal."""
        if self._master is None:
            return
        try:
            size = json.loads(payload)
            rows, cols = int(size["Height"]), int(size["Width"])
        except (ValueError, KeyError, TypeError):
            return
        try:
            fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        except OSError as exc:
            log.info("resize: %s", exc)
