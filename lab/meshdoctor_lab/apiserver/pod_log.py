"""`pods/{name}/log`: serve `state_dir/<pod>/<container>.log`, optionally following it like `tail -f`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from .containers import log_path
from .status import status_failure, status_response
from .store import PodRecord, Store

POLL_S = 0.1  # how often a follow re-checks the file for new bytes
TAIL_WINDOW = 8 << 20  # tailLines looks at most this many bytes back


async def tail_file(path: Path, offset: int, finished: Callable[[], bool]) -> AsyncIterator[bytes]:
    """The bytes of ``path`` from ``offset`` on, then new bytes as they are appended (checked every POLL_S
    seconds), until ``finished()`` says the writer is gone and everything is read. Between checks it yields b"",
    so a caller can stop following (a plain read takes the first item). A file that shrinks (truncated or
    replaced) is read again from its start, as ``tail -F`` does."""
    while True:
        try:
            size = os.stat(path).st_size
        except OSError:
            size = 0
        if size < offset:
            offset = 0
        data = b""
        if size > offset:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(size - offset)
            offset += len(data)
        yield data
        if finished() and size <= offset:
            return
        await asyncio.sleep(POLL_S)


def _error(code: int, message: str) -> web.Response:
    return status_response(status_failure(code, message))


def _tail_offset(path: Path, lines: int) -> int:
    """Byte offset where the last `lines` lines of `path` start (0 when the file is shorter)."""
    try:
        size = path.stat().st_size
    except OSError:
        return 0
    start = max(0, size - TAIL_WINDOW)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    body = data[:-1] if data.endswith(b"\n") else data
    if lines <= 0:
        return size
    idx = len(body)
    for _ in range(lines):
        idx = body.rfind(b"\n", 0, idx)
        if idx < 0:
            return start
    return start + idx + 1


async def serve_log(request: web.Request, store: Store, record: PodRecord) -> web.StreamResponse:
    """The log of one container; 400 Status for a missing/ambiguous container or one that never started."""
    pod = record.spec.name
    names = [n for n in record.container_names() if n != "istio-init"]
    inits = [n for n in record.container_names() if n == "istio-init"]
    ephemeral = [c["name"] for c in record.ephemeral]
    container = request.query.get("container", "")
    if not container and len(names) > 1:
        return _error(400, f"a container name must be specified for pod {pod}, choose one of: [{' '.join(names)}]"
                           + (f" or one of the init containers: [{' '.join(inits)}]" if inits else "")
                           + (f" or one of the ephemeral containers: [{' '.join(ephemeral)}]" if ephemeral else ""))
    container = container or names[0]
    if container not in names and container not in ephemeral and container not in inits:
        return _error(400, f"container {container} is not valid for pod {pod}")
    if request.query.get("previous", "").lower() == "true":
        return _error(400, f'previous terminated container "{container}" in pod "{pod}" not found')
    state = record.ephemeral_state.get(container)
    if container in ephemeral and (state is None or state.phase == "waiting"):
        reason = state.waiting_reason if state else "ContainerCreating"
        return _error(400, f'container "{container}" in pod "{pod}" is waiting to start: {reason}')
    follow = request.query.get("follow", "").lower() in ("true", "1")
    limit = int(request.query["limitBytes"]) if request.query.get("limitBytes") else None
    path = log_path(store.config.state_dir, pod, container)
    offset = _tail_offset(path, int(request.query["tailLines"])) if request.query.get("tailLines") else 0

    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    sent = 0
    # An exited ephemeral container's log can grow no more: the follow ends, as kubectl logs -f does.
    async for data in tail_file(path, offset, lambda: state is not None and state.phase == "terminated"):
        if limit is not None:
            data = data[: max(0, limit - sent)]
        if data:
            await resp.write(data)
            sent += len(data)
        if not follow or (limit is not None and sent >= limit):
            break
        if request.transport is None or request.transport.is_closing():
            return resp  # the follower left: nothing more to send, as the real API server just drops it
    try:
        await resp.write_eof()
    except ConnectionResetError:  # the client left between the last chunk and the end
        pass
    return resp
