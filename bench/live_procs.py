"""The processes bench/live starts and how it reads them: watch, the load generator and the planter.

Every child leads its own session, so stopping one signals its process group and whatever the child left in
it goes too. Lines are stamped with time.time() as they arrive: the clock of the packets' capture times, which
the latency from a planted failure's deciding packet to its finding line needs.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

CAPTURING = re.compile(r"^capturing .* in pod/(\S+) via ")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Line:
    t: float  # time.time() on arrival
    text: str


@dataclass
class Child:
    """A process group we started (each child leads its own session) and how to read its stdout."""

    name: str
    proc: subprocess.Popen
    lines: list[Line] = field(default_factory=list)
    reader: threading.Thread | None = None

    def follow_lines(self) -> None:
        def run() -> None:
            for raw in self.proc.stdout:
                self.lines.append(Line(time.time(), raw.decode(errors="replace").rstrip("\n")))
        self.reader = threading.Thread(target=run, name=f"read-{self.name}", daemon=True)
        self.reader.start()

    def events(self) -> list[dict]:
        out = []
        for line in self.lines:
            if line.text.startswith("{"):
                try:
                    out.append(json.loads(line.text))
                except ValueError:
                    pass
        return out


def spawn(name: str, argv: list[str], children: list[Child], **kw) -> Child:
    kw.setdefault("stdin", subprocess.DEVNULL)
    proc = subprocess.Popen(argv, start_new_session=True, **kw)
    child = Child(name, proc)
    children.append(child)
    return child


def stop_child(child: Child, first: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Signal the child's process group (first `first`, then SIGKILL) until the child is gone."""
    proc = child.proc
    for sig, wait_s in ((first, grace), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # anything the child left in its group
    except ProcessLookupError:
        pass


class StderrTTY:
    """watch's stderr as a pseudo-terminal; lines stamped as they arrive, the TTY's redraws cleaned off."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.lines: list[Line] = []
        self.capturing = threading.Event()
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watch-stderr", daemon=True)

    def start(self) -> None:
        os.close(self.slave)  # the child holds its own copy; EOF (EIO) comes when it exits
        self._thread.start()

    def _run(self) -> None:
        pending = b""
        try:
            while True:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    break
                if not data:
                    break
                now = time.time()
                pending += data
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    text = ANSI.sub("", raw.decode(errors="replace").rstrip("\r").rsplit("\r", 1)[-1]).strip()
                    if not text:
                        continue
                    self.lines.append(Line(now, text))
                    if CAPTURING.match(text):
                        self.capturing.set()
        finally:
            self.closed.set()

    def close(self) -> None:
        try:
            os.close(self.master)
        except OSError:
            pass
