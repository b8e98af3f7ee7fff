"""An exec session: one process in the pod's network namespace wired to the client's streams, like the kubelet.

The streams are a `CommandIO` (remotecommand.py): WebSocket channels or SPDY streams, the session does not care.

Bytes flow unchanged and as they arrive (reads of up to 64 KiB, each forwarded at once as one frame). Sending
awaits the socket's drain, so a slow client stops us reading the process's pipe and the process blocks, as it
would on a real pipe. When the client goes away first, the process's stdin is closed and its output pipes too
(it is not killed: it sees EOF / SIGPIPE as with any vanished reader) and it is reaped in the background.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .channels import STDERR, STDOUT
from .containerio import ContainerIO
from .exec_registry import ProcessRegistry, netns_argv
from .remotecommand import CommandIO

log = logging.getLogger("meshdoctor.apiserver")

READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class ExecOptions:
    """The exec query: argv (no shell), which streams are attached, tty (merges stderr into stdout)."""

    command: tuple[str, ...]
    container: str
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


class _Dropped(Exception):
    """A drop fault fired (drop_after_bytes, drop_at_stdin_close): the connection is cut as if the network failed."""


class _Protocol:
    """Anything with `status_json`: a Framing (WebSocket) or a CommandIO."""

    status_json: bool


def exit_status(framing: _Protocol, argv: tuple[str, ...], code: int) -> bytes | None:
    """The error-channel payload at exit: JSON Status for v4+, plain text (or nothing on success) for v1."""
    if framing.status_json:
        if code == 0:
            return json.dumps({"metadata": {}, "status": "Success"}).encode()
        text = f"command terminated with non-zero exit code: error executing command [{' '.join(argv)}], " \
               f"exit code {code}"
        return json.dumps({"metadata": {}, "status": "Failure", "message": text, "reason": "NonZeroExitCode",
                           "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}).encode()
    if code == 0:
        return None
    return f"command terminated with non-zero exit code: exit status {code}".encode()


def failure_status(framing: _Protocol, message: str, reason: str, code: int = 0) -> bytes:
    """A failure on the error channel before anything ran (e.g. container not running)."""
    if not framing.status_json:
        return message.encode()
    body: dict[str, Any] = {"metadata": {}, "status": "Failure", "message": message, "reason": reason}
    if code:
        body["code"] = code
    return json.dumps(body).encode()


class ExecSession:
    """Runs one exec on already established client streams. `run` returns when they are done with."""

    def __init__(self, io: CommandIO, request: web.Request, registry: ProcessRegistry, netns: str,
                 opts: ExecOptions, drop_after_bytes: int | None, background: set[asyncio.Task[Any]],
                 drop_at_stdin_close: bool = False, container: str = "") -> None:
        self._io = io
        self._request = request
        self._registry = registry
        self._netns = netns
        self._opts = opts
        self._container = container
        self._drop_after = drop_after_bytes
        self._drop_at_stdin_close = drop_at_stdin_close
        self._sent_stdout = 0
        self._background = background  # reaper tasks of processes whose client left; owned by the app

    async def send(self, channel: int, payload: bytes) -> None:
        await (self._io.stdout(payload) if channel == STDOUT else self._io.stderr(payload))

    async def run(self) -> None:
        if self._opts.tty and self._opts.stdout:
            await self._run_tty()
            return
        opts = self._opts
        try:
            proc = await self._registry.spawn(
                netns_argv(self._netns, list(opts.command), self._container),
                stdin=subprocess.PIPE if opts.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE if opts.stdout else subprocess.DEVNULL,
                stderr=(subprocess.STDOUT if opts.tty else subprocess.PIPE) if opts.stderr else subprocess.DEVNULL,
            )
        except (OSError, RuntimeError) as exc:
            await self._io.finish(failure_status(self._io, f"failed to exec in container: {exc}",
                                                 "InternalError", 500))
            return
        await self._io.connected()

        reader = asyncio.create_task(self._from_client(proc))
        pumps = []
        if proc.stdout is not None:
            pumps.append(asyncio.create_task(self._pump(proc.stdout, STDOUT)))
        if proc.stderr is not None:
            pumps.append(asyncio.create_task(self._pump(proc.stderr, STDERR)))
        finished = asyncio.create_task(self._finish(proc, pumps))
        done, _ = await asyncio.wait({reader, finished}, return_when=asyncio.FIRST_COMPLETED)

        if finished in done and finished.exception() is None:
            code = finished.result()
            await self._io.finish(exit_status(self._io, opts.command, code))
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self._close_stdin(proc)
            return

        # The client left (or the drop fault cut it): behave like the kubelet, leave the process be.
        if any(t in done and isinstance(t.exception(), _Dropped) for t in (reader, finished)):
            log.info("exec %s: dropping the stream after %d stdout bytes (fault)", opts.command, self._sent_stdout)
            transport = self._request.transport
            if transport is not None:
                # close(), not abort(): what was sent still arrives, then the stream just ends (no status, no
                # close frame). An RST would also discard bytes the client had not read yet, under load.
                transport.close()
        reader.cancel()
        finished.cancel()
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(reader, finished, *pumps, return_exceptions=True)
        self._close_stdin(proc)
        self._close_output(proc)
        if proc.returncode is None:
            task = asyncio.create_task(self._registry.wait(proc))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _run_tty(self) -> None:
        """`exec -t`: the command on a pseudo-terminal of its own (its controlling terminal, one output stream,
        resize sets the window size, stdin EOF is ^D), as a runtime runs a tty exec."""
        opts = self._opts
        term = ContainerIO(None, tty=True, stdin_once=True)
        try:
            proc = await self._registry.spawn(netns_argv(self._netns, list(opts.command), self._container),
                                              **term.child_stdio())
        except (OSError, RuntimeError) as exc:
            term.failed()
            await self._io.finish(failure_status(self._io, f"failed to exec in container: {exc}",
                                                 "InternalError", 500))
            return
        term.started(proc)
        output = term.subscribe()  # before the loop runs again: nothing the command prints is missed
        await self._io.connected()

        async def pump() -> int:
            while (item := await output.get()) is not None:
                await self._io.stdout(item[1])
            return await self._registry.wait(proc)

        async def from_client() -> None:
            async for kind, payload in self._io.events():
                if kind == "stdin" and opts.stdin:
                    await term.write_stdin(payload)
                elif kind == "stdin-eof":
                    term.client_closed_stdin()
                elif kind == "resize":
                    for line in payload.splitlines():
                        if line.strip():
                            term.resize(line)

        finished, reader = asyncio.ensure_future(pump()), asyncio.ensure_future(from_client())
        done, _ = await asyncio.wait({finished, reader}, return_when=asyncio.FIRST_COMPLETED)
        reader.cancel()
        if finished in done and finished.exception() is None:
            await self._io.finish(exit_status(self._io, opts.command, finished.result()))
        else:  # the client left: the command keeps its terminal until it ends, then is reaped
            term.unsubscribe(output)
            finished.cancel()
            reaper = asyncio.ensure_future(self._registry.wait(proc))
            self._background.add(reaper)
            reaper.add_done_callback(self._background.discard)
        await asyncio.gather(reader, finished, return_exceptions=True)

    async def _finish(self, proc: asyncio.subprocess.Process, pumps: list[asyncio.Task[None]]) -> int:
        """All output forwarded and the process exited -> its exit code. Raises _Dropped from a pump."""
        await asyncio.gather(*pumps)
        return await self._registry.wait(proc)

    async def _pump(self, stream: asyncio.StreamReader, channel: int) -> None:
        while True:
            chunk = await stream.read(READ_CHUNK)
            if not chunk:
                return
            if channel == STDOUT and self._drop_after is not None:
                room = self._drop_after - self._sent_stdout
                if len(chunk) >= room:
                    if room > 0:
                        await self.send(channel, chunk[:room])
                    self._sent_stdout += max(room, 0)
                    raise _Dropped()
            await self.send(channel, chunk)
            if channel == STDOUT:
                self._sent_stdout += len(chunk)

    async def _from_client(self, proc: asyncio.subprocess.Process) -> None:
        """Client stdin -> process stdin until the client is gone."""
        async for kind, payload in self._io.events():
            if kind == "stdin" and proc.stdin is not None and not proc.stdin.is_closing():
                try:
                    proc.stdin.write(payload)
                    await proc.stdin.drain()
                except (ConnectionError, BrokenPipeError):
                    pass
            elif kind == "stdin-eof":
                if self._drop_at_stdin_close:
                    raise _Dropped()
                self._close_stdin(proc)
            # "resize": no terminal behind an exec here (tty only merges stderr into stdout)

    @staticmethod
    def _close_stdin(proc: asyncio.subprocess.Process) -> None:
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()

    @staticmethod
    def _close_output(proc: asyncio.subprocess.Process) -> None:
        # Closing our read ends is what a vanished reader does to a pipe: the next write gets EPIPE/SIGPIPE.
        transport = getattr(proc, "_transport", None)
        for fd in (1, 2):
            pipe = transport.get_pipe_transport(fd) if transport is not None else None
            if pipe is not None:
                pipe.close()
