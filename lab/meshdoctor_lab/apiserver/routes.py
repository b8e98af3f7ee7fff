"""The HTTP routes of the lab API server (aiohttp), with bearer-token auth, RBAC-like denies and faults.

All state lives in the `LabApiServer` object: the pod store, the process registry, the faults table.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from typing import Any, Awaitable, Callable

from aiohttp import web

from . import authz, discovery, k8sproto
from .containers import EphemeralRunner
from .faults import Faults, FaultSpecError
from .labelsel import SelectorError, field_matcher, label_matcher
from .objects import LabConfig, list_json, namespace_json
from .status import forbidden, not_found, query_flag, status_failure, status_response
from .patch import ApiError, decode_and_validate
from .exec_registry import ProcessRegistry
from .store import PodRecord, Store
from .pod_table import pod_table
from .streaming import StreamingRoutes
from .watch import serve_watch

log = logging.getLogger("meshdoctor.apiserver")

USER = "meshdoctor-lab"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _wants_table(request: web.Request) -> bool:
    """kubectl get asks for server-side printing; the Python client never does."""
    accept = request.headers.get("Accept", "")
    return "as=Table" in accept and "g=meta.k8s.io" in accept


async def _review_body(request: web.Request) -> Any:
    """The review object the client sent, as JSON would carry it: JSON, or Kubernetes protobuf (kubectl >= 1.33
    sends that first). Raises ValueError on an unreadable body, LookupError on another media type."""
    ctype = request.headers.get("Content-Type", "application/json").split(";")[0].strip().lower()
    if ctype == k8sproto.PROTOBUF:
        return k8sproto.decode_review(await request.read())
    if ctype not in ("application/json", ""):
        raise LookupError(ctype)
    return await request.json()


class LabApiServer(StreamingRoutes):
    """One lab's API server. Create, `await start()` inside the loop, serve `app`, `await shutdown()`."""

    def __init__(self, config: LabConfig, token: str) -> None:
        self.config = config
        self.token = token
        self.store = Store(config)
        self.registry = ProcessRegistry()
        self.faults = Faults()
        self.runner = EphemeralRunner(self.store, self.registry, lambda: self.faults)
        self.background: set[asyncio.Task[Any]] = set()
        self.websockets: set[web.WebSocketResponse] = set()
        self.app = web.Application(middlewares=[self._log_mw, self._auth_mw], client_max_size=16 << 20)
        self._routes()

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.registry.start()

    async def shutdown(self) -> None:
        """Kill every process we started, then let open sockets finish (they see the exits)."""
        await self.registry.shutdown()
        await self.runner.shutdown()
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)

    def _routes(self) -> None:
        r = self.app.router
        r.add_get("/version", self.version)
        r.add_get("/api", self.api_versions)
        r.add_get("/api/v1", self.api_v1)
        r.add_get("/apis", self.api_groups)
        r.add_get("/apis/apps/v1", self.apps_v1)
        r.add_get("/apis/authorization.k8s.io/v1", self.authorization_v1)
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.healthz)
        r.add_get("/livez", self.healthz)
        r.add_get("/api/v1/namespaces", self.list_namespaces)
        r.add_get("/api/v1/namespaces/{ns}", self.get_namespace)
        r.add_get("/api/v1/pods", self.list_pods)
        r.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}", self.get_pod)
        r.add_delete("/api/v1/namespaces/{ns}/pods/{name}", self.delete_pod)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}/ephemeralcontainers", self.get_pod)
        r.add_patch("/api/v1/namespaces/{ns}/pods/{name}/ephemeralcontainers", self.patch_ephemeral)
        r.add_route("GET", "/api/v1/namespaces/{ns}/pods/{name}/exec", self.exec)
        r.add_route("POST", "/api/v1/namespaces/{ns}/pods/{name}/exec", self.exec)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self.pod_log)
        r.add_route("GET", "/api/v1/namespaces/{ns}/pods/{name}/portforward", self.portforward)
        r.add_route("POST", "/api/v1/namespaces/{ns}/pods/{name}/portforward", self.portforward)
        r.add_get("/api/v1/events", self.list_events)
        r.add_get("/api/v1/namespaces/{ns}/events", self.list_events)
        r.add_get("/apis/apps/v1/deployments", self.list_deployments)
        r.add_get("/apis/apps/v1/namespaces/{ns}/deployments", self.list_deployments)
        r.add_get("/apis/apps/v1/namespaces/{ns}/deployments/{name}", self.get_deployment)
        r.add_route("GET", "/api/v1/namespaces/{ns}/pods/{name}/attach", self.attach)
        r.add_route("POST", "/api/v1/namespaces/{ns}/pods/{name}/attach", self.attach)
        r.add_post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", self.ssar)
        r.add_post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", self.ssrr)
        r.add_get("/_lab/faults", self.get_faults)
        r.add_post("/_lab/faults", self.set_faults)
        r.add_delete("/_lab/faults", self.clear_faults)

    # ------------------------------------------------------------------------------------------ middleware

    @web.middleware
    async def _log_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        t0 = time.monotonic()
        status: int | str = "-"
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as exc:
            status = exc.status
            if exc.status == 404:
                return status_response(status_failure(
                    404, "the server could not find the requested resource", details={}))
            if exc.status == 405:
                return status_response(status_failure(
                    405, "the server does not allow this method on the requested resource"))
            raise
        finally:
            log.info("%s %s -> %s %.1fms", request.method, request.path_qs, status, (time.monotonic() - t0) * 1e3)

    @web.middleware
    async def _auth_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in ("/healthz", "/readyz", "/livez"):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        if header != f"Bearer {self.token}":
            return status_response(status_failure(401, "Unauthorized"))
        return await handler(request)

    # ------------------------------------------------------------------------------------------ helpers

    async def _fault(self, operation: str) -> tuple[web.Response | None, Any]:
        """Apply the faults table to one request: (a response to send instead, the rule that matched)."""
        rule = self.faults.take(operation)
        if rule is None:
            return None, None
        if rule.delay_s > 0:
            await asyncio.sleep(rule.delay_s)
        if rule.status:
            msg = rule.message or f"lab fault injected on {operation}"
            return status_response(status_failure(rule.status, msg, rule.reason)), rule
        return None, rule

    def _denied(self, verb: str, resource: str, subresource: str = "", group: str = "", ns: str = "",
                name: str = "") -> web.Response | None:
        if self.faults.denied(verb, resource, subresource, group, ns, name):
            return status_response(forbidden(USER, verb, resource, subresource, group, ns, name))
        return None

    def _pod_or_404(self, request: web.Request) -> PodRecord | web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        record = self.store.get(ns, name)
        if record is None:
            return status_response(not_found("pods", name))
        return record

    # ------------------------------------------------------------------------------------------ discovery

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response(discovery.VERSION)

    async def api_versions(self, request: web.Request) -> web.Response:
        host = request.host
        return web.json_response(discovery.api_versions(host))

    async def api_v1(self, request: web.Request) -> web.Response:
        return web.json_response(discovery.CORE_V1_RESOURCES)

    async def api_groups(self, request: web.Request) -> web.Response:
        return web.json_response(discovery.API_GROUPS)

    async def apps_v1(self, request: web.Request) -> web.Response:
        return web.json_response(discovery.APPS_V1_RESOURCES)

    async def authorization_v1(self, request: web.Request) -> web.Response:
        return web.json_response(discovery.AUTHORIZATION_V1_RESOURCES)

    # ------------------------------------------------------------------------------------------ namespaces

    def _namespace(self) -> dict[str, Any]:
        created = min((r.created for r in self.store.pods.values()), default=time.time())
        return namespace_json(self.store.namespace, created)

    async def list_namespaces(self, request: web.Request) -> web.Response:
        return web.json_response(list_json("NamespaceList", "v1", [self._namespace()], self.store.resource_version))

    async def get_namespace(self, request: web.Request) -> web.Response:
        name = request.match_info["ns"]
        if name != self.store.namespace:
            return status_response(not_found("namespaces", name))
        return web.json_response(self._namespace())

    # ------------------------------------------------------------------------------------------ pods

    async def list_pods(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info.get("ns", "")
        if (resp := self._denied("watch" if query_flag(request, "watch") else "list", "pods", ns=ns)) is not None:
            return resp
        resp, _ = await self._fault("list_pods")
        if resp is not None:
            return resp
        try:
            by_label = label_matcher(request.query.get("labelSelector"))
            by_field = field_matcher(request.query.get("fieldSelector"))
        except SelectorError as exc:
            return status_response(status_failure(400, str(exc)))

        def matching() -> list[dict[str, Any]]:
            out = []
            for record in self.store.pods.values():
                if ns and ns != self.store.namespace:
                    continue
                obj = self.store.pod_json(record)
                if by_label(obj["metadata"]["labels"]) and by_field(obj):
                    out.append(obj)
            return out

        if query_flag(request, "watch"):
            return await serve_watch(request, self.store, matching, _wants_table(request))
        if _wants_table(request):
            return web.json_response(pod_table(matching(), self.store.resource_version, time.time()))
        return web.json_response(list_json("PodList", "v1", matching(), self.store.resource_version))

    async def list_events(self, request: web.Request) -> web.Response:
        """core/v1 events: the kubelet's about the lab pods' containers (container_status.py); fieldSelector on
        the fields a real server selects events by (involvedObject.name, reason, ...)."""
        ns = request.match_info.get("ns", "")
        if (resp := self._denied("list", "events", ns=ns)) is not None:
            return resp
        try:
            by_field = field_matcher(request.query.get("fieldSelector"), kind="Event")
        except SelectorError as exc:
            return status_response(status_failure(400, str(exc)))
        items = [] if ns and ns != self.store.namespace else [
            e for record in self.store.pods.values() for e in self.store.events_json(record) if by_field(e)]
        return web.json_response(list_json("EventList", "v1", items, self.store.resource_version))

    async def delete_pod(self, request: web.Request) -> web.Response:
        """The pod goes away as on a node: its record first, then every process we run in its network namespace
        (ephemeral containers, exec sessions) is killed, so their streams end as a container's death ends
        them. Answers the Pod as it was, like the API server's delete (no grace period is modelled)."""
        ns, name = request.match_info["ns"], request.match_info["name"]
        if (resp := self._denied("delete", "pods", ns=ns, name=name)) is not None:
            return resp
        record = self._pod_or_404(request)
        if isinstance(record, web.Response):
            return record
        obj = self.store.pod_json(record)
        del self.store.pods[name]
        in_netns = set(await asyncio.to_thread(_netns_pids, record.spec.netns))
        for pid in set(self.registry.live_pids()) & in_netns:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await self.store.touch(record)
        return web.json_response(obj)

    async def get_pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        sub = "ephemeralcontainers" if request.path.endswith("/ephemeralcontainers") else ""
        if (resp := self._denied("get", "pods", sub, ns=ns, name=name)) is not None:
            return resp
        resp, _ = await self._fault("get_pod")
        if resp is not None:
            return resp
        record = self._pod_or_404(request)
        if isinstance(record, web.Response):
            return record
        if _wants_table(request) and not sub:
            return web.json_response(pod_table([self.store.pod_json(record)], self.store.resource_version,
                                                time.time()))
        return web.json_response(self.store.pod_json(record))

    async def patch_ephemeral(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if (resp := self._denied("patch", "pods", "ephemeralcontainers", ns=ns, name=name)) is not None:
            return resp
        resp, _ = await self._fault("patch_ephemeralcontainers")
        if resp is not None:
            return resp
        record = self._pod_or_404(request)
        if isinstance(record, web.Response):
            return record
        raw = await request.read()
        dry_run = "All" in request.query.getall("dryRun", [])
        async with record.lock:
            try:
                entries, warnings = decode_and_validate(
                    name, self.store.pod_json(record), request.headers.get("Content-Type", ""), raw,
                    record.ephemeral, record.container_names())
            except ApiError as exc:
                return status_response(exc.body)
            headers = {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)} if warnings else None
            if dry_run:
                preview = self.store.pod_json(record)
                preview["spec"]["ephemeralContainers"] = entries
                return web.json_response(preview, headers=headers)
            old = {c["name"] for c in record.ephemeral}
            new = [e for e in entries if e["name"] not in old]
            if new:
                record.ephemeral = entries
                await self.store.touch(record)
                for entry in new:
                    self.runner.start(record, entry)
            return web.json_response(self.store.pod_json(record), headers=headers)

    # ------------------------------------------------------------------------------------------ logs

    async def pod_log(self, request: web.Request) -> web.StreamResponse:
        from .pod_log import serve_log

        ns, name = request.match_info["ns"], request.match_info["name"]
        if (resp := self._denied("get", "pods", "log", ns=ns, name=name)) is not None:
            return resp
        resp, _ = await self._fault("log")
        if resp is not None:
            return resp
        record = self._pod_or_404(request)
        if isinstance(record, web.Response):
            return record
        return await serve_log(request, self.store, record)

    # ------------------------------------------------------------------------------------------ deployments

    async def list_deployments(self, request: web.Request) -> web.Response:
        ns = request.match_info.get("ns", "")
        if (resp := self._denied("list", "deployments", group="apps", ns=ns)) is not None:
            return resp
        try:
            by_label = label_matcher(request.query.get("labelSelector"))
            by_field = field_matcher(request.query.get("fieldSelector"), kind="Deployment")
        except SelectorError as exc:
            return status_response(status_failure(400, str(exc)))
        items = []
        if not ns or ns == self.store.namespace:
            for record in self.store.pods.values():
                obj = self.store.deployment_json(record)
                if by_label(obj["metadata"]["labels"]) and by_field(obj):
                    items.append(obj)
        return web.json_response(list_json("DeploymentList", "apps/v1", items, self.store.resource_version))

    async def get_deployment(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if (resp := self._denied("get", "deployments", group="apps", ns=ns, name=name)) is not None:
            return resp
        resp, _ = await self._fault("get_deployment")
        if resp is not None:
            return resp
        record = self.store.get(ns, name)
        if record is None:
            return status_response(not_found("deployments", name, group="apps"))
        return web.json_response(self.store.deployment_json(record))

    # ------------------------------------------------------------------------------------------ authorization

    async def ssar(self, request: web.Request) -> web.Response:
        return await self._review(request, "ssar", authz.access_review)

    async def ssrr(self, request: web.Request) -> web.Response:
        return await self._review(request, "ssrr", authz.rules_review)

    async def _review(self, request: web.Request, operation: str,
                      answer: Callable[[Faults, Any], dict[str, Any]]) -> web.Response:
        resp, _ = await self._fault(operation)
        if resp is not None:
            return resp
        try:
            return web.json_response(answer(self.faults, await _review_body(request)), status=201)
        except LookupError as exc:
            return status_response(status_failure(
                415, f"the body of the request was in an unknown format ({exc}) - accepted media types include: "
                     f"application/json, {k8sproto.PROTOBUF}"))
        except (ValueError, authz.ReviewError):
            return status_response(status_failure(400, "the body of the request was in an unknown format"))

    # ------------------------------------------------------------------------------------------ lab admin

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.raw)

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            self.faults = Faults.parse(await request.json())
        except (ValueError, FaultSpecError) as exc:
            return status_response(status_failure(400, f"bad faults: {exc}"))
        return web.json_response(self.faults.raw)

    async def clear_faults(self, request: web.Request) -> web.Response:
        self.faults = Faults()
        return web.json_response({})


def _netns_pids(netns: str) -> list[int]:
    """Pids running in a network namespace (``ip netns pids``), empty when it cannot tell."""
    try:
        out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(p) for p in out.split() if p.isdigit()]
