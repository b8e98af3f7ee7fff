"""Where an exec's or attach's bytes go, whatever carries them: WebSocket channels or SPDY streams.

`CommandIO` is what exec_session.py and attach.py use: `connected()`, `stdout(data)`, `stderr(data)`, `events()` (what
the client sends: ("stdin", bytes), ("stdin-eof", b""), ("resize", json bytes); it ends when the client is gone),
`finish(status)` (the error-channel payload, then the end of every stream) and `status_json` (v4 and later report
the exit as a metav1.Status JSON, older protocols as text).

- `WsIO`: channel-prefixed WebSocket messages (channels.py), the protocols v5/v4/v1 of remotecommand.
- `SpdyIO`: one SPDY stream per `streamType` header (error, stdin, stdout, stderr, resize), protocols
  v4/v3/v2/v1.channel.k8s.io, as the kubelet's pkg/kubelet/cri/streaming/remotecommand/httpstream.go: it waits
  for every stream the query asked for (error + stdin/stdout/stderr + resize when tty and v3+), at most
  STREAM_CREATION_TIMEOUT_S, then runs; at the end stdout/stderr get FIN, the error stream the status and FIN,
  the rest RST and the connection GOAWAY (its conn.Close()).
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from aiohttp import WSMsgType, web

from .channels import CLOSE, ERROR, RESIZE, STDERR, STDIN, STDOUT, FrameError, Framing
from .httpstream import SpdySession, SpdyStream

SPDY_EXEC_PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io")
STREAM_CREATION_TIMEOUT_S = 30.0  # the kubelet's default streamCreationTimeout


class CommandIO:
    """Interface; see the module docstring."""

    status_json: bool = True

    async def connected(self) -> None:
        """Tell the client the process runs (only WebSockets have a way to)."""

    async def stdout(self, data: bytes) -> None:
        raise NotImplementedError

    async def stderr(self, data: bytes) -> None:
        raise NotImplementedError

    def events(self) -> AsyncIterator[tuple[str, bytes]]:
        raise NotImplementedError

    async def finish(self, status: bytes | None) -> None:
        """Send `status` on the error channel (None: nothing) and end the session. Never raises ConnectionError."""
        raise NotImplementedError


class WsIO(CommandIO):
    def __init__(self, ws: web.WebSocketResponse, framing: Framing, lowest: int) -> None:
        self._ws = ws
        self._framing = framing
        self._lowest = lowest  # the channel of the "connected" empty frame: the lowest one the server writes to
        self.status_json = framing.status_json

    async def _send(self, channel: int, payload: bytes) -> None:
        frame = self._framing.encode(channel, payload)
        if isinstance(frame, str):
            await self._ws.send_str(frame)
        else:
            await self._ws.send_bytes(frame)

    async def connected(self) -> None:
        await self._send(self._lowest, b"")

    async def stdout(self, data: bytes) -> None:
        await self._send(STDOUT, data)

    async def stderr(self, data: bytes) -> None:
        await self._send(STDERR, data)

    async def events(self) -> AsyncIterator[tuple[str, bytes]]:
        async for msg in self._ws:
            if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                continue
            try:
                channel, payload = self._framing.decode(msg.data)
            except FrameError:
                continue
            if channel == STDIN:
                yield "stdin", payload
            elif channel == CLOSE and self._framing.close_signal and payload[:1] == bytes((STDIN,)):
                yield "stdin-eof", b""
            elif channel == RESIZE:
                yield "resize", payload

    async def finish(self, status: bytes | None) -> None:
        try:
            if status is not None:
                await self._send(ERROR, status)
            await self._ws.close()
        except (ConnectionError, RuntimeError):
            pass


class SpdyIO(CommandIO):
    """Built by `collect_streams` once the client opened every stream."""

    def __init__(self, session: SpdySession, protocol: str, streams: dict[str, SpdyStream]) -> None:
        self._session = session
        self._streams = streams
        self.protocol = protocol
        self.status_json = protocol == "v4.channel.k8s.io"

    async def stdout(self, data: bytes) -> None:
        if (s := self._streams.get("stdout")) is not None:
            await s.write(data)

    async def stderr(self, data: bytes) -> None:
        if (s := self._streams.get("stderr")) is not None:
            await s.write(data)

    async def events(self) -> AsyncIterator[tuple[str, bytes]]:
        queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()

        async def read(kind: str, stream: SpdyStream) -> None:
            while data := await stream.read():
                await queue.put((kind, data))
            if kind == "stdin":
                await queue.put(("stdin-eof", b""))

        async def gone() -> None:
            await self._session.closed.wait()
            await queue.put(None)

        tasks = [asyncio.ensure_future(gone())]
        for kind in ("stdin", "resize"):
            if (stream := self._streams.get(kind)) is not None:
                tasks.append(asyncio.ensure_future(read(kind, stream)))
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            for task in tasks:
                task.cancel()

    async def finish(self, status: bytes | None) -> None:
        try:
            for kind in ("stdout", "stderr"):
                if (s := self._streams.get(kind)) is not None:
                    await s.close()
            if (s := self._streams.get("error")) is not None:
                if status:
                    await s.write(status)
                await s.close()
            await self._session.close()
        except (ConnectionError, RuntimeError):
            pass


async def collect_streams(session: SpdySession, protocol: str, stdin: bool, stdout: bool, stderr: bool,
                          tty: bool) -> SpdyIO | None:
    """Wait until the client opened the error stream and every stream it asked for; None when it left or took
    longer than STREAM_CREATION_TIMEOUT_S (the kubelet then just ends the connection)."""
    wanted = 1 + stdin + stdout + stderr + (tty and protocol != "v2.channel.k8s.io" and protocol != "channel.k8s.io")
    streams: dict[str, SpdyStream] = {}
    try:
        async with asyncio.timeout(STREAM_CREATION_TIMEOUT_S):
            while len(streams) < wanted:
                stream = await session.accept()
                if stream is None:
                    return None
                kind = stream.header("streamtype")
                if kind in ("error", "stdin", "stdout", "stderr", "resize"):
                    streams[kind] = stream
    except TimeoutError:
        await session.close()
        return None
    return SpdyIO(session, protocol, streams)
