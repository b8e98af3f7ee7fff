"""SPDY/3.1 server sessions as the kubelet runs them (k8s.io/apimachinery/pkg/util/httpstream/spdy over
moby/spdystream): the client opens every stream, the server answers each SYN_STREAM with an empty SYN_REPLY and
then reads and writes data frames on it.

Two carriers (a `Link`): the HTTP connection itself after `101 Switching Protocols` with `Upgrade: SPDY/3.1`
(`upgrade_spdy`, the taking-over that aiohttp's WebSocketResponse does: swap the connection's parser for ours),
and a WebSocket whose binary messages carry the SPDY byte stream, subprotocol `SPDY/3.1+portforward.k8s.io`
(`tunnel_spdy`, apiserver/pkg/util/proxy/streamtunnel.go; message boundaries mean nothing, as in client-go's
TunnelingConnection).

Streams: `await session.accept()` -> SpdyStream (headers such as `streamtype`, `port`, `requestid`), `read()` ->
bytes (b"" at the client's FIN or RST), `write(data)`, `close()` (FIN), `reset()`. Flow control: the client sends
no WINDOW_UPDATE that matters (spdystream has none), so only our own buffering bounds memory: the carrier stops
reading while more than `READ_LIMIT` received bytes wait unread.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from aiohttp import WSMsgType, web

from . import spdy

log = logging.getLogger("meshdoctor.apiserver")

SPDY_31 = "SPDY/3.1"
TUNNEL_PREFIX = "SPDY/3.1+"  # apimachinery/pkg/util/portforward constants.WebsocketsSPDYTunnelingPrefix
READ_LIMIT = 1 << 20
WRITE_CHUNK = 32 * 1024  # spdystream copies in 32 KiB; any size up to 16 MiB is valid


class SpdyStream:
    """One client-opened stream. Data arrives in `_inbox` (None = the client will send no more)."""

    def __init__(self, session: "SpdySession", frame: spdy.SynStream) -> None:
        self.session = session
        self.stream_id = frame.stream_id
        self.headers = frame.headers
        self._inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.remote_done = False
        self.local_done = False
        self.reset_by_peer = False

    def header(self, name: str) -> str:
        return spdy.header(self.headers, name) or ""

    def _deliver(self, data: bytes | None) -> None:
        if self.remote_done:
            return
        if data is None:
            self.remote_done = True
        else:
            self.session.buffered += len(data)
        self._inbox.put_nowait(data)

    async def read(self) -> bytes:
        """The next data the client sent; b"" once it half-closed (FIN) or reset the stream."""
        if self._inbox.empty() and self.remote_done:
            return b""
        data = await self._inbox.get()
        if data is None:
            self._inbox.put_nowait(None)  # later reads see the end too
            return b""
        self.session.buffered -= len(data)
        self.session.resume_if_room()
        return data

    async def write(self, data: bytes) -> None:
        """Send `data` (in frames of at most WRITE_CHUNK). Raises ConnectionError when the connection is gone;
        data for a stream the client reset is dropped."""
        if self.reset_by_peer:
            return
        for i in range(0, len(data), WRITE_CHUNK):
            await self.session.send(spdy.Data(self.stream_id, data[i:i + WRITE_CHUNK]))

    async def close(self) -> None:
        """Half-close our side (an empty data frame with FLAG_FIN, as spdystream's Stream.Close)."""
        if not self.local_done:
            self.local_done = True
            await self.session.send(spdy.Data(self.stream_id, b"", fin=True))

    async def reset(self) -> None:
        """RST_STREAM CANCEL: both directions end now (spdystream's Stream.Reset)."""
        self._deliver(None)
        if not self.local_done:
            self.local_done = True
            await self.session.send(spdy.RstStream(self.stream_id, spdy.CANCEL))


class SpdySession:
    """The server side of one SPDY connection. Feed it bytes (`feed`, `feed_eof`); `accept` new streams.

    `validate(headers)` may refuse a stream (returns the reason): it is reset instead of answered, as the
    kubelet's NewStreamHandler errors do (apimachinery httpstream/spdy/connection.go newSpdyStream).
    """

    def __init__(self, write: Callable[[bytes], Awaitable[None]], pause: Callable[[bool], None],
                 validate: Callable[[spdy.Headers], str | None] | None = None) -> None:
        self._write = write
        self._pause = pause
        self._validate = validate
        self._framer = spdy.Framer()
        self._lock = asyncio.Lock()  # frames leave in encoding order: the header compressor is stateful
        self._new: asyncio.Queue[SpdyStream | None] = asyncio.Queue()
        self.streams: dict[int, SpdyStream] = {}
        self._last_id = 0
        self.buffered = 0
        self._paused = False
        self.closed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------------------------------- receiving

    def feed(self, data: bytes) -> None:
        if self.closed.is_set():
            return
        try:
            frames = self._framer.feed(data)
        except spdy.SpdyError as exc:
            log.info("spdy: ending the session: %s", exc)
            self._spawn(self.goaway(1))
            return
        for frame in frames:
            self._on_frame(frame)
        if self.buffered > READ_LIMIT and not self._paused:
            self._paused = True
            self._pause(True)

    def resume_if_room(self) -> None:
        if self._paused and self.buffered <= READ_LIMIT // 2:
            self._paused = False
            self._pause(False)

    def feed_eof(self) -> None:
        """The connection is gone: every stream ends, `accept` returns None."""
        for stream in self.streams.values():
            stream._deliver(None)
        self._new.put_nowait(None)
        self.closed.set()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_frame(self, frame: spdy.Frame) -> None:
        if isinstance(frame, spdy.SynStream):
            # 2.3.2: client streams are odd and increase; spdystream resets anything else with PROTOCOL_ERROR.
            if frame.stream_id % 2 == 0 or frame.stream_id <= self._last_id:
                self._spawn(self.send(spdy.RstStream(frame.stream_id, spdy.PROTOCOL_ERROR)))
                return
            self._last_id = frame.stream_id
            refused = self._validate(frame.headers) if self._validate else None
            if refused:
                log.info("spdy: refusing stream %d: %s", frame.stream_id, refused)
                self._spawn(self.send(spdy.RstStream(frame.stream_id, spdy.CANCEL)))
                return
            stream = SpdyStream(self, frame)
            self.streams[frame.stream_id] = stream
            if frame.fin:
                stream._deliver(None)
            self._spawn(self._reply(stream))
        elif isinstance(frame, spdy.Data):
            stream = self.streams.get(frame.stream_id)
            if stream is not None:  # data for a stream we do not know is dropped, as spdystream does
                if frame.data:
                    stream._deliver(frame.data)
                if frame.fin:
                    stream._deliver(None)
        elif isinstance(frame, spdy.RstStream):
            stream = self.streams.get(frame.stream_id)
            if stream is not None:
                stream.local_done = stream.reset_by_peer = True  # no frame may follow a reset (2.6.3)
                stream._deliver(None)
        elif isinstance(frame, spdy.Ping):
            if frame.ping_id % 2 == 1:  # 2.6.5: echo the client's (odd) pings
                self._spawn(self.send(frame))
        elif isinstance(frame, spdy.GoAway):
            self.feed_eof()
        # SETTINGS, WINDOW_UPDATE, HEADERS, SYN_REPLY: nothing to act on for a kubelet-like server.

    async def _reply(self, stream: SpdyStream) -> None:
        await self.send(spdy.SynReply(stream.stream_id))
        self._new.put_nowait(stream)

    async def accept(self) -> SpdyStream | None:
        """The next stream the client opened (already answered), None once the connection ended."""
        stream = await self._new.get()
        if stream is None:
            self._new.put_nowait(None)
        return stream

    # ------------------------------------------------------------------------------------------- sending

    async def send(self, frame: spdy.Frame) -> None:
        """Raises ConnectionError when the connection is gone."""
        async with self._lock:
            if self.closed.is_set() and not isinstance(frame, spdy.GoAway):
                raise ConnectionResetError("SPDY connection closed")
            await self._write(self._framer.encode(frame))

    async def goaway(self, status: int = 0) -> None:
        """GOAWAY with the last stream we took, then no more frames (spdystream Connection.Close)."""
        try:
            await self.send(spdy.GoAway(self._last_id, status))
        except (ConnectionError, RuntimeError):
            pass
        self.feed_eof()

    async def close(self) -> None:
        """Reset what is still open, say GOAWAY (the kubelet's conn.Close())."""
        for stream in list(self.streams.values()):
            if not stream.local_done:
                try:
                    await stream.reset()
                except (ConnectionError, RuntimeError):
                    break
        await self.goaway()
        for task in list(self._tasks):
            task.cancel()


class _Feeder:
    """Stands in for aiohttp's payload parser after the upgrade: every received byte goes to the session."""

    def __init__(self, session: SpdySession) -> None:
        self._session = session

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self._session.feed(bytes(data))
        return False, b""

    def feed_eof(self) -> None:
        self._session.feed_eof()

    def set_exception(self, exc: BaseException, exc_cause: BaseException | None = None) -> None:
        self._session.feed_eof()


def is_spdy_upgrade(request: web.Request) -> bool:
    """`Connection: Upgrade` and `Upgrade: SPDY/3.1` (apimachinery httpstream/spdy/upgrade.go UpgradeResponse)."""
    return "upgrade" in request.headers.get("Connection", "").lower() and \
        SPDY_31.lower() in request.headers.get("Upgrade", "").lower()


def negotiate(request: web.Request, supported: tuple[str, ...]) -> str | web.Response:
    """httpstream.Handshake: the first protocol of the client's `X-Stream-Protocol-Version` list we support, or
    the error response (400 without the header, 403 naming what we accept)."""
    offered = [p.strip() for v in request.headers.getall("X-Stream-Protocol-Version", []) for p in v.split(",")
               if p.strip()]
    if not offered:
        return web.Response(status=400, text="unable to upgrade: X-Stream-Protocol-Version is required\n")
    for protocol in offered:
        if protocol in supported:
            return protocol
    return web.Response(status=403, headers=[("X-Accepted-Stream-Protocol-Versions", p) for p in supported],
                        text=f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
                             f"server accepts {list(supported)}\n")


async def upgrade_spdy(request: web.Request, protocol: str,
                       validate: Callable[[spdy.Headers], str | None] | None = None
                       ) -> tuple[web.StreamResponse, SpdySession]:
    """Answer 101 with `Upgrade: SPDY/3.1` and take the connection over. Raises ConnectionResetError when the
    client is already gone."""
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("connection lost before the upgrade")
    proto = request.protocol

    async def write(data: bytes) -> None:
        if transport.is_closing():
            raise ConnectionResetError("connection closed")
        transport.write(data)
        await proto._drain_helper()  # as aiohttp's own WebSocketWriter waits for the transport to drain

    def pause(on: bool) -> None:
        if not transport.is_closing():
            transport.pause_reading() if on else transport.resume_reading()

    session = SpdySession(write, pause, validate)
    resp = web.StreamResponse(status=101, headers={"Connection": "Upgrade", "Upgrade": SPDY_31,
                                                   "X-Stream-Protocol-Version": protocol})
    resp.force_close()
    # The parser is swapped before the 101 leaves: the client sends its first SYN_STREAM as soon as it reads it.
    proto.set_parser(_Feeder(session))  # type: ignore[arg-type]
    proto.keep_alive(False)
    await resp.prepare(request)
    return resp, session


async def tunnel_spdy(ws: web.WebSocketResponse,
                      validate: Callable[[spdy.Headers], str | None] | None = None
                      ) -> tuple[SpdySession, asyncio.Task[None]]:
    """A SPDY session over a prepared WebSocket (binary messages = SPDY bytes). Returns the session and the task
    that reads the socket (it ends, and the session with it, when the socket closes)."""
    room = asyncio.Event()
    room.set()

    def pause(on: bool) -> None:
        room.clear() if on else room.set()

    async def write(data: bytes) -> None:
        await ws.send_bytes(data)

    session = SpdySession(write, pause, validate)

    async def pump() -> None:
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    session.feed(msg.data)
                    await room.wait()
        finally:
            session.feed_eof()

    return session, asyncio.ensure_future(pump())
