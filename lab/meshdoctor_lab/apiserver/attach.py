"""`pods/{name}/attach`: connect the client's streams to a running container, as `kubectl attach` and
`kubectl debug -it` expect (the kubelet's pkg/kubelet/cri/streaming/remotecommand/attach.go ServeAttach).

- An interactive ephemeral container (stdin/tty, containerio.py): its output from now on goes to the client, the
  client's stdin to the container (when both asked for it), resizes to its terminal. The attach ends with a
  Success status when the container's output ends (it exited), or when the client leaves (the container runs on).
- Any other container (`app`, `istio-proxy`, a non-interactive ephemeral one): there is no stdin to join, so the
  attach follows the container's output from now on (its log file, from the end), until the container exits or
  the client leaves. stdin from the client is read and dropped, as a runtime does for a container without stdin.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from .containerio import ContainerIO
from .containers import log_path
from .pod_log import tail_file
from .exec_session import ExecOptions
from .remotecommand import CommandIO
from .store import PodRecord, Store

log = logging.getLogger("meshdoctor.apiserver")

SUCCESS = json.dumps({"metadata": {}, "status": "Success"}).encode()


async def serve_attach(io: CommandIO, store: Store, record: PodRecord, container: str, opts: ExecOptions) -> None:
    """Run one attach on established client streams until it ends (never raises ConnectionError)."""
    state = record.ephemeral_state.get(container)
    cio = state.io if state is not None else None
    await io.connected()
    if isinstance(cio, ContainerIO):
        output = asyncio.ensure_future(_from_container(io, cio))
        client = asyncio.ensure_future(_from_client(io, cio if opts.stdin else None))
    else:
        output = asyncio.ensure_future(_follow(io, store, record, container))
        client = asyncio.ensure_future(_from_client(io, None))
    done, _ = await asyncio.wait({output, client}, return_when=asyncio.FIRST_COMPLETED)
    for task in (output, client):
        task.cancel()
    await asyncio.gather(output, client, return_exceptions=True)
    if output in done and output.exception() is None:
        # The container's output ended: the kubelet reports the attach as a success (v1: nothing at all).
        await io.finish(SUCCESS if io.status_json else None)
    else:
        await io.finish(None)


async def _from_container(io: CommandIO, cio: ContainerIO) -> None:
    queue = cio.subscribe()
    try:
        while (item := await queue.get()) is not None:
            kind, data = item
            await (io.stdout(data) if kind == "stdout" else io.stderr(data))
    finally:
        cio.unsubscribe(queue)


async def _from_client(io: CommandIO, cio: ContainerIO | None) -> None:
    """Client events until it leaves; returns then."""
    async for kind, payload in io.events():
        if cio is None:
            continue
        if kind == "stdin":
            await cio.write_stdin(payload)
        elif kind == "stdin-eof":
            cio.client_closed_stdin()
        elif kind == "resize":
            for line in payload.splitlines():  # SPDY's resize stream is a sequence of JSON objects
                if line.strip():
                    cio.resize(line)


async def _follow(io: CommandIO, store: Store, record: PodRecord, container: str) -> None:
    path = log_path(store.config.state_dir, record.spec.name, container)
    try:
        offset = os.stat(path).st_size
    except OSError:
        offset = 0
    log.info("attach %s/%s: following its output from byte %d", record.spec.name, container, offset)

    def exited() -> bool:
        state = record.ephemeral_state.get(container)
        return state is not None and state.phase == "terminated"

    async for data in tail_file(path, offset, exited):
        if data:
            await io.stdout(data)
