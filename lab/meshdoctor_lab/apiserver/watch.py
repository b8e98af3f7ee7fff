"""`?watch=true` on pod lists: JSON lines of watch events until timeoutSeconds or the client leaves.

Events are ADDED for what exists (newer than the `resourceVersion` asked from), then MODIFIED on every change; lab
pods are never deleted while a watch runs (a DELETE ends the pod's record but not the watch). When the client asks
for server-side printing (`kubectl get -w`: `Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), each event's
object is a Table of that one row, and only the first event carries the column definitions, as the API server's
watch encoder does (apiserver/pkg/endpoints/handlers/watch.go, for the Table transform of a watch).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable

from aiohttp import web

from .pod_table import pod_table
from .store import Store

DEFAULT_TIMEOUT_S = 1800.0
log = logging.getLogger("meshdoctor.apiserver")


async def serve_watch(request: web.Request, store: Store, matching: Callable[[], list[dict[str, Any]]],
                      as_table: bool) -> web.StreamResponse:
    timeout = float(request.query.get("timeoutSeconds") or DEFAULT_TIMEOUT_S)
    since = int(request.query.get("resourceVersion") or 0)
    content_type = "application/json;as=Table;g=meta.k8s.io;v=v1" if as_table else "application/json"
    log.info("watch pods: %s", "Table rows" if as_table else "objects")
    resp = web.StreamResponse(headers={"Content-Type": content_type})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        await _events(resp, store, matching, since, time.monotonic() + timeout, as_table)
        await resp.write_eof()
    except ConnectionError:
        pass  # the client stopped watching
    return resp


async def _events(resp: web.StreamResponse, store: Store, matching: Callable[[], list[dict[str, Any]]],
                  since: int, deadline: float, as_table: bool) -> None:
    seen: dict[str, str] = {}
    first = True
    while True:
        for obj in matching():
            name, rv = obj["metadata"]["name"], obj["metadata"]["resourceVersion"]
            if seen.get(name) == rv:
                continue
            kind = "ADDED" if name not in seen else "MODIFIED"
            seen[name] = rv
            if int(rv) <= since and kind == "ADDED" and since:
                continue
            if as_table:
                body = pod_table([obj], int(rv), time.time(), columns=first)
            else:
                body = obj
            first = False
            await resp.write(json.dumps({"type": kind, "object": body}).encode() + b"\n")
        left = deadline - time.monotonic()
        if left <= 0:
            break
        async with store.changed:
            try:
                await asyncio.wait_for(store.changed.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass
