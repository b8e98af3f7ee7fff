"""The streaming routes of the lab API server: exec, attach and port-forward, over whichever transport the client
asks for (WebSocket channel.k8s.io subprotocols, SPDY/3.1, or SPDY tunnelled in a WebSocket for port-forward).

A mixin of LabApiServer (routes.py), which provides what the mixin declares it needs (store, registry, background,
_denied, _fault, _pod_or_404): declared here, so that this module needs nothing of routes.py (no import cycle). The HTTP answers before an upgrade (400 for a bad query or container, 403 for a deny fault) are
the API server's; after it, failures travel on the error stream as the kubelet sends them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .channels import EXEC_PROTOCOLS, ERROR, STDERR, STDOUT, Framing
from .exec_session import ExecOptions, ExecSession, failure_status
from .httpstream import is_spdy_upgrade, negotiate, upgrade_spdy
from .status import query_flag, status_failure, status_response
from .remotecommand import SPDY_EXEC_PROTOCOLS, CommandIO, WsIO, collect_streams
from .exec_registry import ProcessRegistry
from .store import PodRecord, Store

log = logging.getLogger("meshdoctor.apiserver")


class StreamingRoutes:
    """exec, attach, portforward handlers (see the module docstring)."""

    # What the API server this is mixed into provides.
    store: Store
    registry: ProcessRegistry
    background: set[asyncio.Task[Any]]
    _denied: Callable[..., web.Response | None]
    _fault: Callable[[str], Awaitable[tuple[web.Response | None, Any]]]
    _pod_or_404: Callable[[web.Request], PodRecord | web.Response]

    def _container(self, record: PodRecord, container: str) -> str | web.Response:
        """The container an exec/attach names (the only one when it names none), or the API's 400."""
        name = record.spec.name
        names = [c["name"] for c in self.store.pod_json(record)["spec"]["containers"]]
        ephemeral = [c["name"] for c in record.ephemeral]
        if not container:
            if len(names) != 1:
                return status_response(status_failure(
                    400, f"a container name must be specified for pod {name}, choose one of: "
                         f"[{' '.join(names)}] or one of the init containers: [istio-init]"
                         + (f" or one of the ephemeral containers: [{' '.join(ephemeral)}]" if ephemeral else "")))
            container = names[0]
        if container not in names and container not in ephemeral and container != "istio-init":
            return status_response(status_failure(400, f"container {container} is not valid for pod {name}"))
        return container

    async def _command_io(self, request: web.Request, opts: ExecOptions, what: str
                          ) -> tuple[CommandIO | None, web.StreamResponse]:
        """Upgrade to the client's streaming transport: a WebSocket (channel.k8s.io subprotocols) or SPDY/3.1
        (X-Stream-Protocol-Version). (None, response) when that failed or the client left before its streams."""
        ws = web.WebSocketResponse(protocols=EXEC_PROTOCOLS, timeout=2.0, max_msg_size=16 << 20, compress=False)
        if ws.can_prepare(request):
            await ws.prepare(request)
            framing = Framing(ws.ws_protocol or "")
            log.info("%s: websocket %s", what, framing.protocol or "channel.k8s.io")
            lowest = STDOUT if opts.stdout else STDERR if opts.stderr and not opts.tty else ERROR
            return WsIO(ws, framing, lowest), ws
        if not is_spdy_upgrade(request):
            return None, status_response(status_failure(400, "Upgrade request required"))
        protocol = negotiate(request, SPDY_EXEC_PROTOCOLS)
        if isinstance(protocol, web.Response):
            return None, protocol
        resp, session = await upgrade_spdy(request, protocol)
        log.info("%s: SPDY/3.1 %s", what, protocol)
        # The kubelet's NewOptions: a terminal has no separate stderr stream.
        io = await collect_streams(session, protocol, opts.stdin, opts.stdout, opts.stderr and not opts.tty,
                                   opts.tty)
        return io, resp

    def _exec_options(self, request: web.Request, command: bool) -> ExecOptions | web.Response:
        opts = ExecOptions(
            command=tuple(request.query.getall("command", [])),
            container=request.query.get("container", ""),
            stdin=query_flag(request, "stdin"),
            stdout=query_flag(request, "stdout"),
            stderr=query_flag(request, "stderr"),
            tty=query_flag(request, "tty"),
        )
        if not (opts.stdin or opts.stdout or opts.stderr):
            return status_response(status_failure(400, "you must specify at least 1 of stdin, stdout, stderr"))
        if command and not opts.command:
            return status_response(status_failure(400, "you must specify at least one command for the container"))
        return opts

    def _not_running(self, record: PodRecord, container: str) -> bool:
        state = record.ephemeral_state.get(container)
        ephemeral = [c["name"] for c in record.ephemeral]
        return container == "istio-init" or (container in ephemeral and (state is None or state.phase != "running"))

    async def _admit_pod(self, request: web.Request, subresource: str) -> web.StreamResponse | tuple:
        """What every streaming route checks first, in the API server's order: RBAC, faults, the pod. A Response
        to send back, or (record, fault rule)."""
        ns, name = request.match_info["ns"], request.match_info["name"]
        # A WebSocket upgrade is a GET, authorized as get and (since 1.35) also create.
        for verb in ("get", "create"):
            if (resp := self._denied(verb, "pods", subresource, ns=ns, name=name)) is not None:
                return resp
        resp, rule = await self._fault(subresource)
        if resp is not None:
            return resp
        record = self._pod_or_404(request)
        if isinstance(record, web.Response):
            return record
        return record, rule

    async def _admit(self, request: web.Request, subresource: str) -> web.StreamResponse | tuple:
        """What exec and attach check before the upgrade: _admit_pod, then the options and the container. A
        Response to send back, or (record, options, container, fault rule)."""
        admitted = await self._admit_pod(request, subresource)
        if not isinstance(admitted, tuple):
            return admitted
        record, rule = admitted
        opts = self._exec_options(request, command=subresource == "exec")
        if isinstance(opts, web.Response):
            return opts
        container = self._container(record, opts.container)
        if isinstance(container, web.Response):
            return container
        return record, opts, container, rule

    async def _upgrade(self, request: web.Request, record: PodRecord, opts: ExecOptions,
                       container: str, what: str) -> tuple[Any, web.StreamResponse]:
        """The upgraded stream (None when the upgrade was refused, or the container is not running and the
        client was told so) and the response to return."""
        io, resp = await self._command_io(request, opts, what)
        if io is not None and self._not_running(record, container):
            await io.finish(failure_status(io, f'container not found ("{container}")', "NotFound"))
            return None, resp
        return io, resp

    async def exec(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, "exec")
        if not isinstance(admitted, tuple):
            return admitted
        record, opts, container, rule = admitted
        io, resp = await self._upgrade(request, record, opts, container,
                                       f"exec {record.spec.name}/{container} {list(opts.command)}")
        if io is None:
            return resp
        session = ExecSession(io, request, self.registry, record.spec.netns, opts,
                              rule.drop_after_bytes if rule is not None else None, self.background,
                              drop_at_stdin_close=rule is not None and rule.drop_at_stdin_close, container=container)
        await session.run()
        return resp

    async def attach(self, request: web.Request) -> web.StreamResponse:
        from .attach import serve_attach

        admitted = await self._admit(request, "attach")
        if not isinstance(admitted, tuple):
            return admitted
        record, opts, container, _ = admitted
        io, resp = await self._upgrade(request, record, opts, container, f"attach {record.spec.name}/{container}")
        if io is None:
            return resp
        await serve_attach(io, self.store, record, container, opts)
        return resp

    async def portforward(self, request: web.Request) -> web.StreamResponse:
        from .portforward import serve_portforward

        admitted = await self._admit_pod(request, "portforward")
        if not isinstance(admitted, tuple):
            return admitted
        record, rule = admitted
        return await serve_portforward(request, record.spec.netns, record.spec.uid,
                                       rule.drop_after_bytes if rule is not None else None)
