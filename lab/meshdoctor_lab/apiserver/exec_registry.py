"""Every process the API server starts (ephemeral containers, exec sessions), so that none outlives it.

The server plays the kubelet: its children run inside pod network namespaces via `ip netns exec`. Each child gets
its own session (so a signal for the server's terminal does not reach it) and PR_SET_PDEATHSIG (so a SIGKILLed
server does not leave it behind). The server makes itself a child subreaper, so whatever those children fork and
orphan still lands under it and is found and killed at shutdown.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import signal
import termios
import time
from typing import Any

import psutil

from meshdoctor_lab.istio_proxy import as_istio_proxy

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _child_setup(parent_pid: int, controlling_tty: bool) -> None:
    """Runs in the child between fork and exec (after its setsid and the stdio dup2s): die with the server; with
    `controlling_tty`, make stdin (a pty slave) the new session's controlling terminal, as a runtime does for a
    `tty: true` container."""
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the server died before prctl took effect
        os._exit(1)
    if controlling_tty:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)


SIDECAR = "istio-proxy"


def netns_argv(netns: str, argv: list[str], container: str = "") -> list[str]:
    """The argv that runs `argv` (no shell) inside the named network namespace, as the container's user: the
    istio-proxy container runs as uid/gid 1337 (Istio's injection template), the others as root."""
    if container == SIDECAR:
        argv = as_istio_proxy(*argv)
    return ["ip", "netns", "exec", netns, *argv]


class ProcessRegistry:
    """Spawns and tracks child processes; `shutdown` ends all of them and their descendants."""

    def __init__(self) -> None:
        self._tracked: dict[int, asyncio.subprocess.Process] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        """Become a child subreaper and start reaping orphans that get re-parented to us."""
        _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self._reaper = asyncio.get_running_loop().create_task(self._reap_orphans())

    async def spawn(self, argv: list[str], *, stdin: Any, stdout: Any, stderr: Any,
                    controlling_tty: bool = False) -> asyncio.subprocess.Process:
        """Start `argv` detached (own session). Raises OSError when it cannot be started, RuntimeError after
        shutdown began."""
        if self._closed:
            raise RuntimeError("server is shutting down")
        parent = os.getpid()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True,
            preexec_fn=lambda: _child_setup(parent, controlling_tty), limit=1 << 16,
        )
        self._tracked[proc.pid] = proc
        return proc

    async def wait(self, proc: asyncio.subprocess.Process) -> int:
        """Wait for `proc` and return its exit code as the kubelet reports it (signal N -> 128 + N)."""
        try:
            rc = await proc.wait()
        finally:
            if proc.returncode is not None:
                self._tracked.pop(proc.pid, None)
        return 128 - rc if rc < 0 else rc

    def live_pids(self) -> list[int]:
        """Pids of every live descendant of the server (tracked children and whatever they forked)."""
        try:
            return [p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            return []

    async def _reap_orphans(self) -> None:
        # Orphans re-parented to us are not known to asyncio's child watcher; reap exactly those, never a tracked
        # pid (that would steal its exit status from asyncio).
        while True:
            await asyncio.sleep(1.0)
            try:
                for child in psutil.Process().children():
                    if child.pid not in self._tracked and child.status() == psutil.STATUS_ZOMBIE:
                        try:
                            os.waitpid(child.pid, os.WNOHANG)
                        except ChildProcessError:
                            pass
            except psutil.Error:
                pass

    async def shutdown(self, grace_s: float = 2.0) -> None:
        """SIGTERM every descendant (whole process groups), SIGKILL what is left after `grace_s` seconds."""
        self._closed = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                procs = psutil.Process().children(recursive=True)
            except psutil.Error:
                procs = []
            for p in procs:
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
            for pid in list(self._tracked):
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and self.live_pids():
                await asyncio.sleep(0.05)
            if not self.live_pids():
                break
        waits = [p.wait() for p in self._tracked.values()]
        if waits:
            await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), timeout=grace_s)
        if self._reaper is not None:
            self._reaper.cancel()
        # Collect re-parented orphans killed above.
        for p in psutil.Process().children():
            if p.pid not in self._tracked:
                try:
                    os.waitpid(p.pid, os.WNOHANG)
                except ChildProcessError:
                    pass
