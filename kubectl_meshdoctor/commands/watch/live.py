"""The live path of `watch`: pod -> debug container -> tcpdump on lo and eth0 -> tshark -> pipeline -> report.

Blocking Kubernetes calls run in worker threads so the caller's event loop (the TUI's) never stalls on them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kubernetes.client import ApiClient

from kubectl_meshdoctor.commands.capture_meta import META_NAME, CaptureMeta, write_meta
from kubectl_meshdoctor.commands.envoy_debug import EnvoyDebug
from kubectl_meshdoctor.commands.watch.stopping import unless_stopped
from kubectl_meshdoctor.commands.watch.ticking import QuietTicker
from kubectl_meshdoctor.core.events import (
    CaptureStartEvent,
    ContainerEvent,
    KernelCountersEvent,
    ListenersEvent,
    PodEvent,
    RedirectMapEvent,
)
from kubectl_meshdoctor.core.findings import Problem
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats
from kubectl_meshdoctor.core.hops import join_hops
from kubectl_meshdoctor.core.upstream_pod import HeldPod, point_to_upstream
from kubectl_meshdoctor.core.report_model import (KernelSide, LiveSource, PerPodSide, PodCapture, Report,
                                                  SidecarSide)
from kubectl_meshdoctor.istio.redirect import redirect_map_from_annotations
from kubectl_meshdoctor.kube.client import Kube, KubeError, api_call
from kubectl_meshdoctor.kube.debug import DEFAULT_IMAGE, DEFAULT_TTL_S, ensure_debug_container
from kubectl_meshdoctor.kube.pod_events import container_events
from kubectl_meshdoctor.kube.rbac import EVENTS, preflight
from kubectl_meshdoctor.kube.target import Target, capturable_pods, describe_targets
from kubectl_meshdoctor.lint import lint_pod
from kubectl_meshdoctor.lint.sidecar import pod_event
from kubectl_meshdoctor.live.capture_copy import pcap_path, pod_pcap_dir, replaceable, usable_pod_dir
from kubectl_meshdoctor.live.dissect import SharedDissector
from kubectl_meshdoctor.live.kernel import WATCHED, counter_deltas, read_kernel
from kubectl_meshdoctor.live.run import CapturePlan, CaptureState, LiveRun
from kubectl_meshdoctor.live.sidecar_link import SIDECAR_CONTAINER, close_proxy, log_summary, open_proxy

IFACES = ("lo", "eth0")


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """``duration_s`` None means until ``stop`` is set (or every capture stream has ended); ``write_pcap_dir``
    keeps the raw captures (on request only: captures carry secrets)."""

    targets: tuple[Target, ...]  # pod/x and deploy/x as named (kube/target.py parse_targets); () with selector
    namespace: str
    duration_s: float | None = None
    selector: str | None = None  # -l: every running pod with these labels
    image: str = DEFAULT_IMAGE
    ttl_s: int = DEFAULT_TTL_S
    write_pcap_dir: Path | None = None
    overwrite_pcap: bool = False  # --overwrite: replace files of the same name in write_pcap_dir (never a link)
    ifaces: tuple[str, ...] = IFACES
    admin_port: int = 15000  # the sidecar's Envoy admin port (--proxy-admin-port)
    profile: str = "least"  # the debug container's capabilities: least (NET_RAW) or netadmin
    start_timeout_s: float = 120.0  # how long the debug container may take to run
    # A private copy of the capture bytes, so a front end can save a finding's packets; unlike write_pcap_dir it
    # is not reported, is capped at spool_limit bytes per stream, and its owner deletes it.
    spool_dir: Path | None = None
    spool_limit: int = 1 << 30
    full_capture: bool = False  # every TCP packet (the pcap files are for Wireshark), not only what detectors read
    # "local": tcpdump's pcap crosses the exec stream into one tshark here (live/dissect.py); "pod": each
    # stream's tshark runs in the debug container and only its lines cross (live/pod_fields.py): no pcap
    # bytes here, so neither write_pcap_dir nor spool_dir.
    dissect: str = "local"
    # Raise the loggers the detectors read to debug on each sidecar for the run (commands/envoy_debug.py).
    envoy_debug: bool = False

    def capture_plan(self, max_seconds: int) -> CapturePlan:
        """How each pod is captured (live/run.py), its tcpdumps ending by themselves after ``max_seconds``."""
        return CapturePlan(self.ifaces, max_seconds, self.dissect, self.write_pcap_dir, self.overwrite_pcap,
                           self.spool_dir, self.spool_limit, self.full_capture, self.admin_port)


@dataclass(slots=True)
class WatchState(CaptureState):
    """What a front end may show while the run goes on: the capture's (live/run.py), and the pod's."""

    pod: str | None = None
    container: str | None = None
    pods: list["WatchState"] = field(default_factory=list)  # one per pod when watching many
    debug: EnvoyDebug | None = None  # the pod's Envoy log levels for the run (--envoy-debug, the TUI's v)
    stats_before: dict = field(default_factory=dict)  # the sidecar's /stats at the run's start (the TUI's k)

    def steps(self) -> tuple[str, ...]:
        """Where the run and each of its pods are (their phases): what a stopped watch sees move as it winds down."""
        return (self.phase, *(p.phase for p in self.pods))


PipelineFactory = Callable[[str], Pipeline]


class CaptureStarts:
    """When every pod's capture has begun, each pod's pipeline learns the latest start (CaptureStartEvent): a
    request that began earlier is context, for its packets could not be seen, nor, across pods, the other hop's
    line (each pod's log is followed from its own setup on). Until then each pod judges from its own start; a pod
    that never starts leaves the rest judged from their own."""

    def __init__(self, pods: int) -> None:
        self.pods = pods
        self.pipelines: list[Pipeline] = []
        self.latest = 0.0

    def started(self, pipeline: Pipeline, ts: float) -> None:
        # Its own start at once: a request decided before it began is context (Correlator.await_capture).
        pipeline.context(CaptureStartEvent(ts))
        self.pipelines.append(pipeline)
        self.latest = max(self.latest, ts)
        if len(self.pipelines) == self.pods:
            for p in self.pipelines:
                p.context(CaptureStartEvent(self.latest))
MAX_PODS = 100  # pods one watch captures at once: bench/many --pods 100 met issue 34's goals (bench/RESULTS.md)
MAX_PARALLEL_SETUP = 8  # pods set up at once (container, exec, port-forward): bounded load on the API server


async def watch(kube: Kube, opts: WatchOptions, pipelines: PipelineFactory | Pipeline, stop: asyncio.Event,
                progress: Callable[[str], None] = lambda s: None, state: WatchState | None = None) -> Report:
    """Capture every pod ``opts`` names until ``opts.duration_s`` passes, ``stop`` is set, or every stream
    ends; one pipeline per pod (``pipelines(pod_name)``; a single Pipeline for one pod), findings tagged with
    their pod. Returns the merged report; every tcpdump is stopped before it returns. Raises KubeError for
    refusals before any capture starts."""
    state = state or WatchState()
    state.phase = "resolving"
    what = describe_targets(opts.targets, opts.selector)
    progress(f"resolving {what} in namespace {opts.namespace}")
    pods = await unless_stopped(stop, capturable_pods, kube, opts.targets, opts.selector, opts.namespace, MAX_PODS)
    several = len(pods) > 1
    if opts.write_pcap_dir is not None:  # before any pod is touched
        dirs = [pod_pcap_dir(opts.write_pcap_dir, pod.metadata.name, several) for pod in pods]
        for d in dirs if several else ():
            try:
                usable_pod_dir(d)
            except OSError as e:
                raise KubeError(f"--write-pcap: {d}: {e.strerror} (remove it, or give another directory)") from None
        paths = [pcap_path(d, pod.metadata.name, iface) for d, pod in zip(dirs, pods) for iface in opts.ifaces]
        for path in paths:  # root must not write through a link someone planted, nor into a FIFO, --overwrite or not
            try:
                replaceable(str(path))
            except OSError as e:
                raise KubeError(f"--write-pcap: {path}: {e.strerror} (remove it, or give another directory)") from None
        taken = [path for path in paths if os.path.lexists(path)] if not opts.overwrite_pcap else []
        if taken:
            more = f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""
            raise KubeError(f"--write-pcap: {taken[0]}{more} exists; give --overwrite to replace "
                            f"{'them' if more else 'it'}, or another directory")
        # Which pod each file is of, for analyze DIR (commands/capture_meta.py): the directory's name need not be it.
        for d, pod in zip(dirs, pods):
            metas = [CaptureMeta(pcap_path(d, pod.metadata.name, iface).name, pod.metadata.name,
                                 pod.metadata.namespace, iface) for iface in opts.ifaces]
            try:
                write_meta(d, metas)
            except OSError as e:
                raise KubeError(f"--write-pcap: {d / META_NAME}: {e.strerror or e} (remove it, or give another "
                                f"directory)") from None
    factory = pipelines if callable(pipelines) else (lambda _: pipelines)  # a Pipeline itself is not callable
    starts = CaptureStarts(len(pods))
    # One tshark for every stream of every pod (live/dissect.py): ~160 MB, not ~160 MB a stream.
    shared = SharedDissector()

    async def one(pod, st: WatchState, setup: asyncio.Semaphore | None) -> Report:
        own = opts if opts.write_pcap_dir is None else replace(
            opts, write_pcap_dir=pod_pcap_dir(opts.write_pcap_dir, pod.metadata.name, several))
        return await watch_pod(kube, own, pod, factory(pod.metadata.name), stop, progress, st, setup, shared,
                               starts)

    try:
        if len(pods) == 1:
            return await one(pods[0], state, None)
        progress(f"capturing {len(pods)} pods: {', '.join(p.metadata.name for p in pods)}")
        state.phase = "capturing"  # each pod's own phase is in state.pods
        setup = asyncio.Semaphore(MAX_PARALLEL_SETUP)
        states = [WatchState() for _ in pods]
        state.pods = states
        reports = await asyncio.gather(*(one(pod, st, setup) for pod, st in zip(pods, states)),
                                       return_exceptions=True)
        state.phase = "done"
        return merge_reports(pods, reports)
    finally:
        shared.abandon()  # nothing left to read by now, unless the watch itself was cancelled
        await shared.close()


def merge_reports(pods: list, reports: list) -> Report:
    """One report for many pods: interfaces (and their frames read) as ``pod/iface``, every finding (already
    tagged with its pod), each sidecar's Envoy side under ``envoy.per_pod``, a pod whose setup failed as a
    problem."""
    stats = PipelineStats()
    findings, problems, sources, kernel, envoy = [], [], [], {}, {}
    logged: list = []  # each pod's 5xx lines no finding of its own quotes, for the other hop's finding
    held: list[HeldPod] = []  # each pod's addresses and captures: a caller's 503 UC told where its upstream is
    for pod, r in zip(pods, reports):
        name = pod.metadata.name
        if isinstance(r, BaseException):
            problems.append(Problem(f"pod/{name}", str(r).splitlines()[0] if str(r) else type(r).__name__))
            continue
        stats.packets += r.stats.packets
        stats.flows_seen += r.stats.flows_seen
        stats.findings_dropped += r.stats.findings_dropped
        stats.missed = stats.missed or r.stats.missed  # every pod's pipeline loads the same detectors
        for iface, st in r.stats.by_iface.items():
            stats.by_iface[f"{name}/{iface}"] = st
        for iface, n in r.stats.frames_read.items():
            stats.frames_read[f"{name}/{iface}"] = n
        if r.envoy is not None:
            envoy[name] = r.envoy
        findings += r.findings
        logged += r.logged
        held.append(HeldPod(name, r.addresses, r.stats.by_iface))
        problems += r.problems
        sources.append(r.source)
        for k, v in (r.kernel.moved if r.kernel is not None else {}).items():
            kernel[f"{name}/{k}"] = v
    if not sources:
        raise KubeError("no pod could be captured: " + "; ".join(p.line() for p in problems))
    # A caller pod's relayed 5xx and the server pod's finding of the same request are one (core/hops.py).
    joined = point_to_upstream(join_hops(sorted(findings, key=lambda f: f.ts), logged), held)
    return Report(LiveSource.merged(sources), stats, joined, problems,
                  kernel=KernelSide(kernel), envoy=PerPodSide(envoy),
                  captured_nothing=all(r.captured_nothing for r in reports if not isinstance(r, BaseException)))


async def watch_pod(kube: Kube, opts: WatchOptions, pod, pipeline: Pipeline, stop: asyncio.Event,
                    progress: Callable[[str], None], state: WatchState,
                    setup: asyncio.Semaphore | None = None, shared: SharedDissector | None = None,
                    starts: CaptureStarts | None = None) -> Report:
    """Capture one pod: preflight, debug container, tcpdumps, Envoy side, kernel counters. Its streams are
    dissected by ``shared`` (the watch's; a new one if None)."""
    shared = shared or SharedDissector()
    pod_name = pod.metadata.name
    state.pod = pod_name
    pipeline.ctx.pod = pod_name
    pipeline.correlator.pod = pod_name
    pipeline.context(RedirectMapEvent(time.time(), redirect_map_from_annotations(pod.metadata.annotations)))
    as_json = ApiClient().sanitize_for_serialization(pod)
    # The spec's own warnings first (docs/DESIGN.md: lint runs at the start of watch); they never fail the run.
    pipeline.add_findings(lint_pod(as_json))
    setup = setup or asyncio.Semaphore(1)
    async with setup:  # the API-heavy part; the capture itself then runs for every pod at once
        state.phase = "preflight"
        progress(f"checking RBAC in namespace {pod.metadata.namespace}")
        warnings = await unless_stopped(stop, preflight, kube, pod.metadata.namespace)
        state.phase = "debug-container"
        dbg = await unless_stopped(stop, ensure_debug_container, kube, pod, opts.image, opts.ttl_s,
                                   opts.start_timeout_s, progress, opts.profile)
        state.container = dbg.name
        problems: list[Problem] = [Problem(f"pod/{pod_name}", w) for w in warnings]
        # preflight has said it once where `list events` is denied
        events_denied = any(str(EVENTS) in w for w in warnings)
        history = () if events_denied else await _container_events(kube, pod, problems, stop)
        pipeline.context(replace(pod_event(as_json, time.time()), history=history))
        kernel_before = await _kernel_counters(kube, pod, dbg.name, problems, pipeline)
        progress(f"reading Envoy admin and following the {SIDECAR_CONTAINER} log of pod/{pod_name}")
        ticker = QuietTicker(pipeline)
        pipeline.correlator.await_capture()  # the log is followed from now on, the capture begins later
        proxy = await open_proxy(kube, pod.metadata.namespace, pod_name, ticker.wrap(pipeline.context),
                                 opts.admin_port)
        ticker.idle = proxy.log.idle if proxy.log else None
        state.stats_before = proxy.stats_before
        max_s = int(opts.duration_s + 60) if opts.duration_s else opts.ttl_s
        state.debug = EnvoyDebug(kube, pod, dbg.name, proxy.admin, pipeline.envoy_loggers(), opts.admin_port,
                                 time.time() + max_s, progress)

    run = LiveRun(kube, pod, dbg.name, opts.capture_plan(max_s), pipeline.feed, state, shared, stop, progress)
    ticking = asyncio.create_task(ticker.run())
    try:
        state.phase = "capturing"
        try:
            async with setup:
                await run.start()
                (starts or CaptureStarts(1)).started(pipeline, time.time())
                # A raise an earlier run left is put back (only a reused container can hold one), then ours.
                await asyncio.to_thread(state.debug.start, opts.envoy_debug, dbg.reused)
            # --duration counts from here: the time spent adding the container and starting tcpdump is not capture.
            await run.wait(opts.duration_s)
        finally:
            await run.stop()
            capture_ended = time.time()
            pipeline.correlator.judged_until = capture_ended  # a line begun later had no packet to be seen
        captured = run.report()
        problems += captured.problems
        pipeline.stats.frames_read.update(captured.frames_read)
    except BaseException:
        # Cancelled or failed mid-capture: the port-forward and the log follow must still end, or their
        # threads outlive the event loop (an abort at interpreter exit); a raise comes down in the pod.
        ticking.cancel()
        state.debug.abandon()
        try:
            await close_proxy(proxy)
        except Exception:
            pass
        raise
    ticking.cancel()
    # Each step of the wind-down says itself in the phase: a stopped watch waits while the steps go on
    # (headless_stop.within_grace), a hundred pods' take seconds.
    state.phase = "log levels"
    await asyncio.to_thread(state.debug.finish)
    state.phase = "sidecar log and counters"
    counters = await close_proxy(proxy, capture_ended)
    problems += proxy.problems + [Problem(f"pod/{pod_name} {SIDECAR_CONTAINER}", p) for p in state.debug.problems]
    state.phase = "kernel counters"
    kernel_after = await _kernel_counters(kube, pod, dbg.name, problems) if kernel_before else {}
    state.phase = "reporting"
    # The run-wide list plus whatever a loaded detector declares, so an outside detector's counters back it too.
    watched = dict.fromkeys([*WATCHED, *(n for d in pipeline.detectors for n in d.kernel_counters)])
    kernel = counter_deltas(kernel_before, kernel_after, tuple(watched)) if kernel_after else {}
    pipeline.context(counters)
    pipeline.context(KernelCountersEvent(time.time(), kernel))
    lifecycle = {d.id for d in pipeline.detectors if d.pod_runs}
    if any(f.detector in lifecycle for f in pipeline.findings):
        # a lifecycle finding: the sidecar's runs that ended or began while it was watched (its events)
        pipeline.context(await _pod_at_end(kube, pod, as_json, events_denied))
    findings = pipeline.finish()
    if (context := pipeline.correlator.before_capture_note()) is not None:
        problems.append(Problem(f"pod/{pod_name} {SIDECAR_CONTAINER}", context))
    capture = PodCapture(dbg.name, dbg.reused, tuple(opts.ifaces), captured.captures,
                         "full" if opts.full_capture else "lean", opts.dissect, dict(state.pcap_files) or None)
    envoy = SidecarSide(proxy.version, {k: dict(v) for k, v in counters.moved.items()}, log_summary(proxy),
                        state.debug.report())
    nothing = captured.captured_nothing  # scripts read the exit code, not the problems
    return Report(LiveSource((pod_name,), pod.metadata.namespace, capture), pipeline.stats, findings, problems,
                  envoy=envoy, kernel=KernelSide(kernel), captured_nothing=nothing, logged=pipeline.logged,
                  addresses=pipeline.addresses())


async def _container_events(kube: Kube, pod, problems: list[Problem],
                            stop: asyncio.Event) -> tuple[ContainerEvent, ...]:
    """The kubelet's events about the pod's containers (kube/pod_events.py); none, and a problem line, where
    they cannot be read (RBAC without `list events`): the run goes on without them."""
    try:
        return await unless_stopped(stop, _read_events, kube, pod)
    except KubeError as e:
        problems.append(Problem(f"pod/{pod.metadata.name}", f"its events were not read: {e}"))
        return ()


def _read_events(kube: Kube, pod) -> tuple[ContainerEvent, ...]:
    """kube/pod_events.py's reading of the pod's events, as the core's ContainerEvents. Raises KubeError."""
    return tuple(ContainerEvent(*e) for e in container_events(kube, pod.metadata.namespace, pod.metadata.name,
                                                              pod.metadata.uid))


async def _pod_at_end(kube: Kube, pod, as_json: dict, events_denied: bool) -> PodEvent:
    """The pod as the capture ends: its status read again (the one read at the start where it is gone: a
    termination watched) and the kubelet's events since (none where they cannot be read; said at the start)."""
    name, namespace = pod.metadata.name, pod.metadata.namespace
    try:
        fresh = await asyncio.to_thread(api_call, kube, f"reading pod/{name} again", kube.core.read_namespaced_pod,
                                        name, namespace)
        as_json = ApiClient().sanitize_for_serialization(fresh)
    except KubeError:
        pass
    history: tuple[ContainerEvent, ...] = ()
    if not events_denied:
        try:
            history = await asyncio.to_thread(_read_events, kube, pod)
        except KubeError:
            pass
    return replace(pod_event(as_json, time.time()), history=history)


async def _kernel_counters(kube: Kube, pod, container: str, problems: list[Problem],
                           pipeline: Pipeline | None = None) -> dict[str, int]:
    """The pod namespace's kernel counters, or {} with the reason added to ``problems``; the sockets that listen
    go to ``pipeline`` as a ListenersEvent, when given."""
    try:
        counters, listening = await asyncio.to_thread(read_kernel, kube, pod.metadata.namespace,
                                                      pod.metadata.name, container)
    except KubeError as e:
        problems.append(Problem(f"pod/{pod.metadata.name}", str(e)))
        return {}
    if pipeline is not None:
        pipeline.context(ListenersEvent(time.time(), listening))
    return counters
