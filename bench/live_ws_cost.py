"""What reading one exec websocket frame costs the reader's process: websocket-client (the official Kubernetes
client's transport) against aiohttp's ``ws_connect`` (its frame reader is compiled: aiohttp/_websocket/reader_c).

A server process (aiohttp) sends ``--frames`` binary frames of ``--size`` bytes (a channel byte, then a
capture's bytes: tcpdump -U in the pod sends about a packet a frame), paced at ``--rate`` frames a second
(0: as fast as it can), over a local TCP socket; the reader runs in a process of its own and counts its own
CPU (user + system, time.process_time) from the first frame to the last.

    python bench/live_ws_cost.py --frames 50000 --size 151 --rate 10000

Prints one line a reader and round: frames, CPU seconds, microseconds of CPU a frame.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import time


def _serve(port_q: mp.Queue, frames: int, size: int, rate: float) -> None:
    from aiohttp import web

    payload = b"\x01" + os.urandom(size - 1)  # channel 1: stdout, as the exec stream's frames

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"), compress=False)
        await ws.prepare(request)
        start = time.monotonic()
        for i in range(frames):
            if rate and i % 10 == 0:  # pace in steps of ten frames: asyncio's sleeps are not finer than that
                due = start + i / rate
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
            await ws.send_bytes(payload)
        await ws.send_bytes(b"\x03" + b'{"status":"Success"}')
        await ws.close()
        return ws

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/exec", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock)
        await site.start()
        port_q.put(sock.getsockname()[1])
        await asyncio.sleep(3600)

    asyncio.run(main())


def _read_websocket_client(url: str, out: mp.Queue) -> None:
    import websocket

    ws = websocket.create_connection(url, subprotocols=["v5.channel.k8s.io", "v4.channel.k8s.io"],
                                     skip_utf8_validation=False)
    n = 0
    cpu0 = None
    while True:
        opcode, frame = ws.recv_data_frame(True)  # what live/pump.py calls a frame
        if cpu0 is None:
            cpu0 = time.process_time()
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            break
        if frame.data[:1] == b"\x01":
            n += 1
    out.put((n, time.process_time() - cpu0))


def _read_aiohttp(url: str, out: mp.Queue, gather_s: float = 0.0) -> None:
    import aiohttp

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pending = [False]

        def let_gather() -> None:
            # Runs once the reading task waits on an empty queue: every frame of the last read is handed on; the
            # loop then sleeps so that the next burst gathers in the socket (live/pump.py's GATHER_S).
            pending[0] = False
            time.sleep(gather_s)

        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url, protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"),
                                          autoping=True, max_msg_size=0) as ws:
                n = 0
                cpu0 = None
                while True:
                    msg = await ws.receive()
                    if cpu0 is None:
                        cpu0 = time.process_time()
                    if msg.type != aiohttp.WSMsgType.BINARY:
                        break
                    if msg.data[:1] == b"\x01":
                        n += 1
                    if gather_s and not pending[0]:
                        pending[0] = True
                        loop.call_soon(let_gather)
                out.put((n, time.process_time() - cpu0))

    asyncio.run(main())


def frame_args(ap: argparse.ArgumentParser) -> None:
    """The options of the frames sent: how many, their size, their rate, the rounds."""
    ap.add_argument("--frames", type=int, default=50000)
    ap.add_argument("--size", type=int, default=151)
    ap.add_argument("--rate", type=float, default=10000.0)
    ap.add_argument("--rounds", type=int, default=2)


def against_server(a: argparse.Namespace, reader, extra: tuple = ()) -> tuple:
    """What ``reader(url, queue, *extra)``, in a process of its own, put in its queue once it has read the frames a
    server process of ours sent (``_serve``); both processes are gone afterwards."""
    ctx = mp.get_context("spawn")
    port_q: mp.Queue = ctx.Queue()
    server = ctx.Process(target=_serve, args=(port_q, a.frames, a.size, a.rate), daemon=True)
    server.start()
    try:
        url = f"ws://127.0.0.1:{port_q.get(timeout=30)}/exec"
        out: mp.Queue = ctx.Queue()
        client = ctx.Process(target=reader, args=(url, out, *extra))
        client.start()
        result = out.get(timeout=a.frames / max(a.rate, 1000) + 60)
        client.join(30)
        return result
    finally:
        server.kill()  # our own child, by its handle
        server.join(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    frame_args(ap)
    ap.add_argument("--gather-ms", type=float, default=5.0, help="aiohttp, gathered: the loop sleeps this long "
                    "once a read's frames are all handed on")
    a = ap.parse_args()
    readers = {"websocket-client": (_read_websocket_client, ()), "aiohttp": (_read_aiohttp, ()),
               "aiohttp gathered": (_read_aiohttp, (a.gather_ms / 1000,))}
    for _ in range(a.rounds):
        for name, (reader, extra) in readers.items():
            n, cpu = against_server(a, reader, extra)
            print(f"{name:17s} frames {n:6d}  size {a.size}  rate {a.rate:.0f}/s  CPU {cpu:6.3f} s  "
                  f"{cpu / max(n, 1) * 1e6:6.2f} us a frame", flush=True)


if __name__ == "__main__":
    main()
