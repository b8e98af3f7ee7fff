"""`pods/{name}/portforward`: over SPDY (kubectl; pfspdy.py) or over WebSocket channels (the Python client).

The channel WebSocket (v4.channel.k8s.io, kubelet framing) makes one TCP connection per port of the `ports` query.

Port i uses data channel 2*i and error channel 2*i+1; both first carry the port as 2-byte little-endian. The
kubelet dials localhost:<port> inside the pod's network namespace; here a short-lived thread enters the namespace
(setns affects only the calling thread), creates and connects the socket there, and exits. A socket stays in the
namespace it was created in, so the event loop can use it afterwards.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import struct
import threading
from typing import Any

from aiohttp import WSMsgType, web

from . import pfspdy
from .channels import PORTFORWARD_PROTOCOLS, FrameError, Framing
from .httpstream import TUNNEL_PREFIX, is_spdy_upgrade, negotiate, tunnel_spdy, upgrade_spdy
from .status import status_failure, status_response
from .pfspdy import DropCounter

log = logging.getLogger("meshdoctor.apiserver")
PORTFORWARD_SPDY = "portforward.k8s.io"
TUNNEL_PROTOCOL = TUNNEL_PREFIX + PORTFORWARD_SPDY

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
CONNECT_TIMEOUT_S = 5.0
READ_CHUNK = 64 * 1024


def _dial_in_thread(netns: str, family: int, addr: tuple[Any, ...]) -> socket.socket:
    """Connect from inside `netns`. Raises OSError (e.g. ECONNREFUSED)."""
    fd = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(addr)
        sock.setblocking(False)
        return sock
    except OSError:
        sock.close()
        raise


def _settle(fut: "asyncio.Future[socket.socket]", result: socket.socket | None, exc: BaseException | None) -> None:
    if fut.done():  # the waiter was cancelled: do not leak the connected socket
        if result is not None:
            result.close()
    elif exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)  # type: ignore[arg-type]


async def dial_netns(netns: str, family: int, addr: tuple[Any, ...]) -> socket.socket:
    """Run `_dial_in_thread` on a fresh thread that dies afterwards (a pooled thread would stay in the pod
    namespace and poison later work such as DNS lookups)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[socket.socket] = loop.create_future()

    def work() -> None:
        try:
            result = _dial_in_thread(netns, family, addr)
        except BaseException as exc:  # handed to the loop, re-raised by the awaiting coroutine
            loop.call_soon_threadsafe(_settle, fut, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, fut, result, None)

    threading.Thread(target=work, name=f"dial-{netns}", daemon=True).start()
    return await fut


def _go_err(exc: OSError) -> str:
    return "connect: " + (os.strerror(exc.errno).lower() if exc.errno else str(exc))


async def connect_localhost(netns: str, uid: str, port: int) -> tuple[socket.socket | None, str]:
    """(socket, "") or (None, the containerd-style error text the kubelet sends on the error channel)."""
    try:
        return await dial_netns(netns, socket.AF_INET, ("127.0.0.1", port)), ""
    except OSError as exc4:
        try:
            return await dial_netns(netns, socket.AF_INET6, ("::1", port, 0, 0)), ""
        except OSError as exc6:
            return None, (
                f"error forwarding port {port} to pod {uid}, uid : failed to execute portforward in network "
                f'namespace "/var/run/netns/{netns}": failed to connect to localhost:{port} inside namespace '
                f'"{uid}", IPv4: dial tcp4 127.0.0.1:{port}: {_go_err(exc4)} IPv6 dial tcp6 [::1]:{port}: '
                f"{_go_err(exc6)} ")


def parse_ports(values: list[str]) -> list[int]:
    """Raises ValueError with the API's wording on a bad port list."""
    ports: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            port = int(part)
            if not 0 < port < 65536:
                raise ValueError(f"port {port} must be > 0 and < 65536")
            ports.append(port)
    return ports


async def serve_portforward(request: web.Request, netns: str, uid: str,
                            drop_after_bytes: int | None = None) -> web.StreamResponse:
    """One port-forward request, on whichever transport the client asked for (see pfspdy.py for SPDY)."""
    drop = DropCounter(drop_after_bytes, lambda: request.transport.close() if request.transport else None)

    async def dial(port: int) -> tuple[socket.socket | None, str]:
        return await connect_localhost(netns, uid, port)

    ws = web.WebSocketResponse(protocols=(TUNNEL_PROTOCOL, *PORTFORWARD_PROTOCOLS), timeout=2.0,
                               max_msg_size=16 << 20, compress=False)
    ready = ws.can_prepare(request)
    if ready.ok and ready.protocol == TUNNEL_PROTOCOL:
        await ws.prepare(request)
        log.info("portforward %s: websocket %s", uid, TUNNEL_PROTOCOL)
        session, reading = await tunnel_spdy(ws, pfspdy.validate)
        await pfspdy.serve(session, dial, drop)
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        return ws
    if not ready.ok and is_spdy_upgrade(request):
        protocol = negotiate(request, (PORTFORWARD_SPDY,))
        if isinstance(protocol, web.Response):
            return protocol
        resp, session = await upgrade_spdy(request, protocol, pfspdy.validate)
        log.info("portforward %s: SPDY/3.1 %s", uid, protocol)
        await pfspdy.serve(session, dial, drop)
        return resp
    # The channel WebSocket (v4.channel.k8s.io, the Python client's): ports from the query.
    try:
        ports = parse_ports(request.query.getall("ports", []))
    except ValueError as exc:
        return status_response(status_failure(400, str(exc)))
    if not ports:
        return status_response(status_failure(400, 'query parameter "ports" is required'))
    if not ready.ok:
        return status_response(status_failure(400, "Upgrade request required"))
    await ws.prepare(request)
    framing = Framing(ws.ws_protocol or "")
    log.info("portforward %s: websocket %s", uid, framing.protocol or "channel.k8s.io")

    async def send(channel: int, payload: bytes) -> None:
        frame = framing.encode(channel, payload)
        if isinstance(frame, str):
            await ws.send_str(frame)
        else:
            await ws.send_bytes(frame)

    for i, port in enumerate(ports):
        await send(2 * i, struct.pack("<H", port))
        await send(2 * i + 1, struct.pack("<H", port))

    writers: dict[int, asyncio.StreamWriter] = {}
    pumps: list[asyncio.Task[None]] = []

    async def pump(channel: int, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(READ_CHUNK):
            n = drop.allow(len(chunk))
            if n:
                await send(channel, chunk[:n])
            if n < len(chunk):
                drop.cut()
                return

    for i, port in enumerate(ports):
        sock, error = await connect_localhost(netns, uid, port)
        if sock is None:
            await send(2 * i + 1, error.encode())
            continue
        reader, writer = await asyncio.open_connection(sock=sock)
        writers[2 * i] = writer
        pumps.append(asyncio.create_task(pump(2 * i, reader)))

    async def from_client() -> None:
        async for msg in ws:
            if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                continue
            try:
                channel, payload = framing.decode(msg.data)
            except FrameError:
                continue
            writer = writers.get(channel)
            if writer is not None and not writer.is_closing():
                writer.write(payload)
                try:
                    await writer.drain()
                except ConnectionError:
                    pass

    reader_task = asyncio.create_task(from_client())
    # The stream ends when the pod side has closed every connection, or when the client goes away.
    all_pumps = asyncio.gather(*pumps, return_exceptions=True) if pumps else asyncio.sleep(0)
    pumps_done = asyncio.ensure_future(all_pumps)
    await asyncio.wait({reader_task, pumps_done}, return_when=asyncio.FIRST_COMPLETED)
    for writer in writers.values():
        writer.close()
    for task in pumps:
        task.cancel()
    if not ws.closed:
        try:
            await ws.close()
        except (ConnectionError, RuntimeError):
            pass
    reader_task.cancel()
    await asyncio.gather(reader_task, pumps_done, return_exceptions=True)
    return ws

