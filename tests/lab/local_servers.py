"""The lab's HTTP app run in-process on loopback, for sidecar tests that need no namespaces."""

from __future__ import annotations

import asyncio
import socket

from meshdoctor_lab.apps import HttpApp, HttpAppConfig


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def serve_app(config: HttpAppConfig) -> asyncio.Task[None]:
    """Start the app and return its task once it accepts connections (at most 2 s)."""
    task = asyncio.create_task(HttpApp(config).serve_forever())
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection(config.bind, config.port)
        except OSError:
            await asyncio.sleep(0.01)  # poll interval of this bounded readiness wait
            continue
        writer.close()
        return task
    raise AssertionError("app did not listen")
