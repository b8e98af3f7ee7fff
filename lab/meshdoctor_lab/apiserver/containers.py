"""Ephemeral containers made real: a detached process in the pod's network namespace, with kubelet-like status.

Lifecycle: `waiting: ContainerCreating` until the process is started, then `running` (startedAt), then
`terminated` with the exit code (reason Completed for 0, Error otherwise) forever; it is never restarted.
Its stdout and stderr go to `state_dir/<pod>/<container>.log`, which the log endpoint serves; an interactive one
(`stdin` or `tty`) gets a ContainerIO (containerio.py) that also feeds attached clients.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from .containerio import ContainerIO
from .exec_registry import ProcessRegistry, netns_argv
from .store import EphemeralState, PodRecord, Store

log = logging.getLogger("meshdoctor.apiserver")

DEFAULT_COMMAND = ["sleep", "3600"]


def container_argv(entry: dict[str, Any]) -> list[str]:
    """command + args; an image's entrypoint is unknown here, so nothing at all means a long sleep."""
    argv = list(entry.get("command") or []) + list(entry.get("args") or [])
    return argv or list(DEFAULT_COMMAND)


def log_path(state_dir: Path, pod: str, container: str) -> Path:
    return state_dir / pod / f"{container}.log"


class EphemeralRunner:
    """Starts ephemeral containers and keeps their status in the pod record up to date."""

    def __init__(self, store: Store, registry: ProcessRegistry, faults: Callable[[], Any]) -> None:
        self._store = store
        self._registry = registry
        self._faults = faults  # returns the current Faults table (it is replaced by POST /_lab/faults)
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, record: PodRecord, entry: dict[str, Any]) -> None:
        """Begin running `entry` (already validated and stored in record.ephemeral)."""
        state = EphemeralState(name=entry["name"], image=entry.get("image", ""), netns=record.spec.netns)
        record.ephemeral_state[state.name] = state
        task = asyncio.get_running_loop().create_task(self._run(record, state, container_argv(entry), entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, record: PodRecord, state: EphemeralState, argv: list[str], entry: dict[str, Any]) -> None:
        faults = self._faults()
        if faults.ephemeral_waiting_reason:
            # An image that never arrives: the container stays waiting forever, as with ImagePullBackOff.
            state.waiting_reason = faults.ephemeral_waiting_reason
            state.waiting_message = faults.ephemeral_waiting_message
            await self._store.touch(record)
            return
        if faults.ephemeral_start_delay_s > 0:
            await asyncio.sleep(faults.ephemeral_start_delay_s)
        out_path = log_path(self._store.config.state_dir, record.spec.name, state.name)
        if entry.get("stdin") or entry.get("tty"):
            await self._run_interactive(record, state, argv, entry, out_path)
            return
        try:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out: Any = open(out_path, "ab")
        except OSError:
            out = subprocess.DEVNULL
        try:
            proc = await self._registry.spawn(netns_argv(state.netns, argv), stdin=subprocess.DEVNULL,
                                              stdout=out, stderr=subprocess.STDOUT)
        except (OSError, RuntimeError) as exc:
            await self._failed(record, state, exc)
            return
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # the child holds its own copy
        await self._running(record, state, proc, argv)

    async def _run_interactive(self, record: PodRecord, state: EphemeralState, argv: list[str],
                               entry: dict[str, Any], out_path: Path) -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        io = ContainerIO(out_path, tty=bool(entry.get("tty")), stdin_once=bool(entry.get("stdinOnce")))
        try:
            proc = await self._registry.spawn(netns_argv(state.netns, argv), **io.child_stdio())
        except (OSError, RuntimeError) as exc:
            io.failed()
            await self._failed(record, state, exc)
            return
        io.started(proc)
        state.io = io
        await self._running(record, state, proc, argv)

    async def _failed(self, record: PodRecord, state: EphemeralState, exc: BaseException) -> None:
        log.warning("ephemeral container %s/%s failed to start: %s", record.spec.name, state.name, exc)
        state.phase, state.exit_code, state.finished_at = "terminated", 128, time.time()
        await self._store.touch(record)

    async def _running(self, record: PodRecord, state: EphemeralState, proc: asyncio.subprocess.Process,
                       argv: list[str]) -> None:
        state.phase, state.started_at, state.pid = "running", time.time(), proc.pid
        await self._store.touch(record)
        log.info("ephemeral container %s/%s running pid %d: %s", record.spec.name, state.name, proc.pid, argv)
        rc = await self._registry.wait(proc)
        state.phase, state.exit_code, state.finished_at = "terminated", rc, time.time()
        await self._store.touch(record)
        log.info("ephemeral container %s/%s exited %d", record.spec.name, state.name, rc)

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
