"""Port-forward over SPDY streams (`portforward.k8s.io`), as kubectl does it: raw SPDY/3.1 after an HTTP upgrade,
or the same SPDY tunnelled in a WebSocket (`SPDY/3.1+portforward.k8s.io`, kubectl >= 1.31 by default).

For every local connection kubectl opens two streams with the same `port` and `requestID` headers: `error`
(kubectl half-closes it at once and reads it to the end) and `data` (the bytes). Once both are there we dial
localhost:<port> inside the pod's network namespace and splice; a failed dial is written as text on the error
stream, which makes kubectl report it. When the pod side closes, the data stream gets FIN; when kubectl closes
the data stream, the pod socket gets a write shutdown and its answer still flows back. Then both streams get FIN.
Rules from the kubelet's pkg/kubelet/cri/streaming/portforward/httpstream.go: a stream without a valid `port`
or with a `streamType` other than error/data is refused; a stream without `requestID` (clients before 1.3) is
paired by stream id (error = id, data = id - 2); a pair incomplete after STREAM_CREATION_TIMEOUT_S is an error.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Callable

from . import spdy
from .httpstream import SpdySession, SpdyStream

log = logging.getLogger("meshdoctor.apiserver")

STREAM_CREATION_TIMEOUT_S = 30.0
READ_CHUNK = 64 * 1024
Dialer = Callable[[int], Any]  # port -> awaitable (socket | None, error text)


def validate(headers: spdy.Headers) -> str | None:
    """Why a stream is refused, None when it is valid (httpstream.go httpStreamReceived)."""
    port = spdy.header(headers, "port")
    if not port:
        return '"port" header is required'
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f'unable to parse "{port}" as a port'
    kind = spdy.header(headers, "streamtype")
    if kind not in ("error", "data"):
        return f'invalid stream type "{kind}"' if kind else '"streamType" header is required'
    return None


class DropCounter:
    """The drop_after_bytes fault: how many pod->client bytes may still pass before the connection is cut."""

    def __init__(self, limit: int | None, cut: Callable[[], None]) -> None:
        self.left = limit
        self._cut = cut

    def allow(self, size: int) -> int:
        """How many of `size` bytes to send; fewer means: send those, then `cut()`."""
        if self.left is None:
            return size
        n = min(size, self.left)
        self.left -= n
        return n

    def cut(self) -> None:
        log.info("portforward: dropping the connection (fault)")
        self._cut()


async def serve(session: SpdySession, dial: Dialer, drop: DropCounter) -> None:
    """Serve port-forward requests until the client closes the connection."""
    pairs: dict[str, dict[str, SpdyStream]] = {}
    tasks: set[asyncio.Task[None]] = set()

    def start(coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        while (stream := await session.accept()) is not None:
            kind = stream.header("streamtype")
            request_id = stream.header("requestid") or str(stream.stream_id - (2 if kind == "data" else 0))
            pair = pairs.setdefault(request_id, {})
            if kind in pair:
                start(_error(pair.get("error") or stream, f"error processing stream for request {request_id}: "
                                                             f"{kind} stream already assigned"))
                continue
            pair[kind] = stream
            if len(pair) == 1:
                start(_expire(pairs, request_id))
            if len(pair) == 2:
                del pairs[request_id]
                start(_forward(pair["data"], pair["error"], dial, drop))
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await session.close()


async def _error(stream: SpdyStream, message: str) -> None:
    try:
        await stream.write(message.encode())
    except (ConnectionError, RuntimeError):
        pass


async def _expire(pairs: dict[str, dict[str, SpdyStream]], request_id: str) -> None:
    await asyncio.sleep(STREAM_CREATION_TIMEOUT_S)
    pair = pairs.pop(request_id, None)
    if pair and "error" in pair:
        await _error(pair["error"], f"timed out waiting for streams of request {request_id}")


async def _forward(data: SpdyStream, error: SpdyStream, dial: Dialer, drop: DropCounter) -> None:
    port = int(data.header("port"))
    sock, failure = await dial(port)
    try:
        if sock is None:
            await _error(error, failure)
        else:
            reader, writer = await asyncio.open_connection(sock=sock)
            try:
                await _splice(data, reader, writer, drop)
            finally:
                writer.close()
        # Both streams end either way (the kubelet's deferred Close of each): kubectl waits for that.
        for stream in (data, error):
            await stream.close()
    except (ConnectionError, RuntimeError):
        pass  # the client's connection is gone: nothing more to tell it


async def _splice(data: SpdyStream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  drop: DropCounter) -> None:
    async def to_pod() -> None:
        while chunk := await data.read():
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # kubectl closed its side: half-close ours, the answer still comes back

    async def to_client() -> None:
        while chunk := await reader.read(READ_CHUNK):
            n = drop.allow(len(chunk))
            if n:
                await data.write(chunk[:n])
            if n < len(chunk):
                drop.cut()
                return
        await data.close()

    up, down = asyncio.ensure_future(to_pod()), asyncio.ensure_future(to_client())
    try:
        # Done when the pod side is done; kubectl resetting the data stream (it does once its copy ends) ends
        # both, a mere half-close of kubectl's side leaves the answer flowing.
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        if down not in done and not data.reset_by_peer and up.exception() is None:
            await asyncio.wait({down})
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
        try:
            writer.transport.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
