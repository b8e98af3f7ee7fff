"""The live path of ``watch``: pod -> debug container -> tcpdump on lo and eth0 -> tshark -> pipeline.

Blocking Kubernetes calls run in worker threads so the caller's event loop (the TUI's) never stalls on them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .correlate import attach_counters, attach_kernel_counters
from .kernel import counter_deltas, read_counters
from .events import ContextEvent
from .istio.redirect import redirect_map_from_annotations
from .kube.capture import ExecCapture
from .kube.client import Kube, KubeError
from .kube.debug import DEFAULT_IMAGE, DEFAULT_TTL_S, ensure_debug_container
from .kube.rbac import preflight
from .kube.target import Target, check_capturable, resolve_pods
from .pipeline import Pipeline
from .proxy import SIDECAR_CONTAINER, close_proxy, open_proxy
from .report import Report
from .sources.tshark import read_stream

IFACES = ("lo", "eth0")
LISTEN_TIMEOUT_S = 30.0


def _wait_listening(captures: list[ExecCapture], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for cap in captures:
        cap.listening.wait(max(0.0, deadline - time.monotonic()))


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """``duration_s`` None means until ``stop`` is set; ``write_pcap_dir`` keeps the raw captures (on request
    only: captures carry secrets)."""

    target: Target
    namespace: str
    duration_s: float | None = None
    image: str = DEFAULT_IMAGE
    ttl_s: int = DEFAULT_TTL_S
    write_pcap_dir: Path | None = None
    ifaces: tuple[str, ...] = IFACES
    admin_port: int = 15000  # the sidecar's Envoy admin port (--proxy-admin-port)
    profile: str = "least"  # the debug container's capabilities: least (NET_RAW) or netadmin
    start_timeout_s: float = 120.0  # how long the debug container may take to run


@dataclass(slots=True)
class WatchState:
    """What a front end may show while the run goes on."""

    phase: str = "starting"
    pod: str | None = None
    container: str | None = None
    captures: list[ExecCapture] = field(default_factory=list)
    pcap_files: dict[str, str] = field(default_factory=dict)


async def watch(kube: Kube, opts: WatchOptions, pipeline: Pipeline, stop: asyncio.Event,
                progress: Callable[[str], None] = lambda s: None, state: WatchState | None = None) -> Report:
    """Capture ``opts.target`` until ``opts.duration_s`` passes, ``stop`` is set, or every stream ends.

    Returns the report; the tcpdumps are stopped before it returns, whatever happened. Raises KubeError for
    refusals before the capture starts (not found, not running, no sidecar, PATCH forbidden).
    """
    state = state or WatchState()
    state.phase = "resolving"
    progress(f"resolving {opts.target.kind}/{opts.target.name} in namespace {opts.namespace}")
    pods = await asyncio.to_thread(resolve_pods, kube, opts.target, opts.namespace)
    pod = pods[0]
    await asyncio.to_thread(check_capturable, pod)
    pod_name = pod.metadata.name
    state.pod = pod_name
    pipeline.ctx.pod = pod_name
    pipeline.context(ContextEvent(time.time(), "redirect-map",
                                  redirect_map=redirect_map_from_annotations(pod.metadata.annotations)))
    state.phase = "preflight"
    progress(f"checking RBAC in namespace {pod.metadata.namespace}")
    warnings = await asyncio.to_thread(preflight, kube, pod.metadata.namespace)
    state.phase = "debug-container"
    dbg = await asyncio.to_thread(ensure_debug_container, kube, pod, opts.image, opts.ttl_s, opts.start_timeout_s,
                                  progress, opts.profile)
    state.container = dbg.name

    max_s = int(opts.duration_s + 60) if opts.duration_s else opts.ttl_s
    readers = []
    problems: list[dict] = [{"where": f"pod/{pod_name}", "what": w} for w in warnings]
    kernel_before = await _kernel_counters(kube, pod, dbg.name, problems)
    progress(f"reading Envoy admin and following the {SIDECAR_CONTAINER} log of pod/{pod_name}")
    proxy = await open_proxy(kube, pod.metadata.namespace, pod_name, pipeline, opts.admin_port)
    state.phase = "capturing"
    try:
        for iface in opts.ifaces:
            read_fd, write_fd = os.pipe()
            tee = None
            if opts.write_pcap_dir is not None:
                opts.write_pcap_dir.mkdir(parents=True, exist_ok=True)
                tee = str(opts.write_pcap_dir / f"{pod_name}-{iface}.pcap")
                state.pcap_files[iface] = tee
            cap = ExecCapture(kube, pod.metadata.namespace, pod_name, dbg.name, iface, max_s, write_fd, tee)
            state.captures.append(cap)
            cap.start()
            readers.append(asyncio.create_task(read_stream(read_fd, f"{pod_name}/{iface}", iface, pipeline.feed)))
        progress(f"waiting for tcpdump on {', '.join(opts.ifaces)} in pod/{pod_name} ({dbg.name})")
        await asyncio.to_thread(_wait_listening, state.captures, LISTEN_TIMEOUT_S)
        # --duration counts from here: the time spent adding the container and starting tcpdump is not capture.
        progress(f"capturing {', '.join(opts.ifaces)} in pod/{pod_name} via {dbg.name}")
        waiters = [asyncio.create_task(stop.wait())] + readers
        timeout = opts.duration_s
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        waiters[0].cancel()
    finally:
        state.phase = "stopping"
        for cap in state.captures:
            cap.stop()
        for cap in state.captures:
            await asyncio.to_thread(cap.join, 30.0)
        results = await asyncio.gather(*readers, return_exceptions=True)
        state.phase = "done"
    for cap, res in zip(state.captures, results):
        where = f"pod/{pod_name} {cap.iface}"
        if cap.error:
            problems.append({"where": where, "what": cap.error})
        if isinstance(res, BaseException) and not stop.is_set():
            # After a user's Ctrl-C the terminal signals tshark too; its death then is the stop, not a fault.
            problems.append({"where": where, "what": f"tshark failed: {str(res).splitlines()[0] if str(res) else type(res).__name__}"})
        if cap.dropped_by_kernel:
            problems.append({"where": where, "what": f"tcpdump: {cap.dropped_by_kernel} packets dropped by kernel"})
    moved = await close_proxy(proxy)
    problems += proxy.problems
    kernel_after = await _kernel_counters(kube, pod, dbg.name, problems) if kernel_before else {}
    kernel = counter_deltas(kernel_before, kernel_after) if kernel_after else {}
    findings = attach_kernel_counters(attach_counters(pipeline.finish(), moved), kernel)
    source = {"kind": "live", "pods": [pod_name], "namespace": pod.metadata.namespace, "container": dbg.name,
              "container_reused": dbg.reused, "interfaces": list(opts.ifaces)}
    if state.pcap_files:
        source["files"] = dict(state.pcap_files)
    envoy = {"version": proxy.version, "counters_moved": moved,
             "access_log_lines": proxy.follower.lines if proxy.follower else 0}
    return Report(source, pipeline.stats, findings, problems, envoy=envoy, kernel=kernel)


async def _kernel_counters(kube: Kube, pod, container: str, problems: list[dict]) -> dict[str, int]:
    """The pod namespace's kernel counters, or {} with the reason added to ``problems``."""
    try:
        return await asyncio.to_thread(read_counters, kube, pod.metadata.namespace, pod.metadata.name, container)
    except KubeError as e:
        problems.append({"where": f"pod/{pod.metadata.name}", "what": str(e)})
        return {}
