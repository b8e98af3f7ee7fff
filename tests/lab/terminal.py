"""A program on a real pseudo-terminal, as a person's shell runs it: kubectl's interactive sessions, and the
meshdoctor TUI when a test must signal or kill the process that draws it."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..waiting import wait_until


@dataclass
class Terminal:
    """``argv`` on a pseudo-terminal of ``rows`` x ``cols`` (40 x 120 unless told); the child is the session
    leader, so closing the terminal (``hang_up``) sends it SIGHUP as a closing window does."""

    pid: int
    fd: int
    out: bytes = b""

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], rows: int = 40, cols: int = 120) -> "Terminal":
        pid, fd = pty.fork()
        if pid == 0:  # the child: becomes the program, on the terminal's slave side
            try:
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)  # never run the rest of pytest in the forked child
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        return cls(pid, fd)

    def _read(self, timeout: float) -> bool:
        """Read what the program drew within ``timeout`` seconds; False once it closed the terminal."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the program exited and closed the terminal
            chunk = b""
        self.out += chunk
        return bool(chunk)

    def expect(self, text: bytes, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not on the terminal after {timeout} s: {self.out[-500:]!r}"
            assert self._read(min(left, 0.5)), f"the program left before printing {text!r}: {self.out[-500:]!r}"

    def drain_until(self, what: str, timeout: float, condition: Callable[[], object]) -> object:
        """Keep reading the screen (a program whose terminal fills up stops drawing, and so stops) until
        ``condition()`` is true, at most ``timeout`` seconds; returns its value."""
        deadline = time.monotonic() + timeout
        while not (value := condition()):
            left = deadline - time.monotonic()
            assert left > 0, f"{what}: not within {timeout} s; the screen ended with {self.out[-300:]!r}"
            self._read(min(left, 0.2))
        return value

    def type(self, text: bytes) -> None:
        os.write(self.fd, text)

    def exit_code(self) -> int | None:
        """The program's exit code once it has ended (-N: killed by signal N), else None; reaps it."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return None
        return os.waitstatus_to_exitcode(status) if pid else None

    def wait(self, timeout: float = 30) -> int:
        code = self.drain_until("the program exited", timeout, lambda: (c := self.exit_code()) is not None and (c,))
        os.close(self.fd)
        self.fd = -1
        return code[0]

    def hang_up(self) -> None:
        """Close the terminal, as closing its window does: the kernel sends the session SIGHUP."""
        os.close(self.fd)
        self.fd = -1

    def wait_closed(self, timeout: float = 30) -> int:
        """``wait`` for a program whose terminal was closed (``hang_up``): nothing is left to read."""
        code = wait_until("the program exited", timeout, lambda: (c := self.exit_code()) is not None and (c,))
        return code[0]

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
