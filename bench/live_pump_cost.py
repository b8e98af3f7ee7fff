"""What the capture pump (live/pump.py ExecCapture._pump) costs its process a frame, on the same frames: run it
from whichever kubectl_meshdoctor is importable (``PYTHONPATH=OTHER_TREE`` measures another version), over a
local websocket from an aiohttp server sending ``--frames`` stdout frames of ``--size`` bytes at ``--rate`` a
second, then a status and a close. The pump hands its bursts to a callback that keeps nothing; the CPU counted
is the process's (user + system), from the first frame sent to the pump's return.

    python bench/live_pump_cost.py --frames 50000 --size 151 --rate 10000

A pump of websocket-client (before issue 34's change) is driven synchronously with the official client's
WebSocket; one of aiohttp runs in an event loop. Prints one line a round.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_ws_cost import against_server, frame_args  # noqa: E402


def _pump(url: str, out) -> None:  # out: a multiprocessing Queue
    import kubectl_meshdoctor
    from kubectl_meshdoctor.live.pump import ExecCapture

    cap = ExecCapture(None, "ns", "pod", "dbg", "lo", 5, -1, on_data=lambda _b: None)
    protocols = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
    if inspect.iscoroutinefunction(ExecCapture._pump):
        import aiohttp

        async def run() -> tuple:
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(url, protocols=protocols, max_msg_size=0) as ws:
                    cpu0 = time.process_time()
                    result = await cap._pump(ws, None)
                    return result, time.process_time() - cpu0

        result, cpu = asyncio.run(run())
        kind = "aiohttp"
    else:
        import websocket

        sock = websocket.create_connection(url, subprotocols=protocols)
        ws = types.SimpleNamespace(sock=sock, subprotocol=sock.subprotocol)
        cpu0 = time.process_time()
        result = cap._pump(ws, None)
        cpu = time.process_time() - cpu0
        kind = "websocket-client"
    out.put((kind, str(Path(kubectl_meshdoctor.__file__).parent.parent), cap.bytes_received, result[1], cpu))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    frame_args(ap)
    a = ap.parse_args()
    for _ in range(a.rounds):
        kind, tree, received, ended, cpu = against_server(a, _pump)
        frames = received // (a.size - 1)
        print(f"{kind:17s} ({tree}) frames {frames:6d} ended {ended!r}  CPU {cpu:6.3f} s  "
              f"{cpu / max(frames, 1) * 1e6:6.2f} us a frame", flush=True)


if __name__ == "__main__":
    main()
