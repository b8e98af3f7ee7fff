"""The live path of `watch`: pod -> debug container -> tcpdump on lo and eth0 -> tshark -> pipeline -> report.

Blocking Kubernetes calls run in worker threads so the caller's event loop (the TUI's) never stalls on them.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes.client import ApiClient

from kubectl_meshdoctor.commands.envoy_debug import EnvoyDebug
from kubectl_meshdoctor.commands.watch.stopping import unless_stopped
from kubectl_meshdoctor.commands.watch.ticking import QuietTicker
from kubectl_meshdoctor.core.events import (
    KernelCountersEvent,
    ListenersEvent,
    PodEvent,
    RedirectMapEvent,
)
from kubectl_meshdoctor.core.findings import Problem, undissectable_problem
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats
from kubectl_meshdoctor.core.report_model import KernelSide, LiveSource, PerPodSide, Report, SidecarSide
from kubectl_meshdoctor.istio.redirect import redirect_map_from_annotations
from kubectl_meshdoctor.kube.capture import ExecCapture, replaceable
from kubectl_meshdoctor.kube.client import Kube, KubeError
from kubectl_meshdoctor.kube.debug import DEFAULT_IMAGE, DEFAULT_TTL_S, ensure_debug_container
from kubectl_meshdoctor.kube.rbac import preflight
from kubectl_meshdoctor.kube.target import Target, capturable_pods
from kubectl_meshdoctor.lint import lint_pod
from kubectl_meshdoctor.sources.capture_filter import FULL_FILTER, lean_filter, without_admin
from kubectl_meshdoctor.sources.dissector import SharedDissector, Stream
from kubectl_meshdoctor.sources.kernel import WATCHED, counter_deltas, read_kernel
from kubectl_meshdoctor.sources.pod_fields import PodFieldStream, pod_tshark_args
from kubectl_meshdoctor.sources.sidecar import SIDECAR_CONTAINER, close_proxy, log_summary, open_proxy

IFACES = ("lo", "eth0")
LISTEN_TIMEOUT_S = 30.0
READ_GRACE_S = 30.0  # how long each tshark may go on reading after the capture was stopped


def _wait_listening(captures: list[ExecCapture], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for cap in captures:
        cap.listening.wait(max(0.0, deadline - time.monotonic()))


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """``duration_s`` None means until ``stop`` is set (or every capture stream has ended); ``write_pcap_dir``
    keeps the raw captures (on request only: captures carry secrets)."""

    target: Target | None
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
    # "local": tcpdump's pcap crosses the exec stream into one tshark here (sources/dissector.py); "pod": each
    # stream's tshark runs in the debug container and only its lines cross (sources/pod_fields.py): no pcap
    # bytes here, so neither write_pcap_dir nor spool_dir.
    dissect: str = "local"
    # Raise the loggers the detectors read to debug on each sidecar for the run (commands/envoy_debug.py).
    envoy_debug: bool = False


@dataclass(slots=True)
class WatchState:
    """What a front end may show while the run goes on."""

    phase: str = "starting"
    pod: str | None = None
    container: str | None = None
    captures: list[ExecCapture] = field(default_factory=list)
    pcap_files: dict[str, str] = field(default_factory=dict)
    spool_files: dict[str, str] = field(default_factory=dict)  # iface -> the spool copy (WatchOptions.spool_dir)
    tshark_errors: dict[str, str] = field(default_factory=dict)  # iface -> what went wrong with its tshark
    # "iface: why" for each stream or tshark that went wrong, in the order they ended (shown while the run goes on)
    stream_problems: list[str] = field(default_factory=list)
    pods: list["WatchState"] = field(default_factory=list)  # one per pod when watching many
    debug: EnvoyDebug | None = None  # the pod's Envoy log levels for the run (--envoy-debug, the TUI's v)


PipelineFactory = Callable[[str], Pipeline]
MAX_PODS = 50  # pods one watch captures at once
MAX_PARALLEL_SETUP = 8  # pods set up at once (container, exec, port-forward): bounded load on the API server


async def watch(kube: Kube, opts: WatchOptions, pipelines: PipelineFactory | Pipeline, stop: asyncio.Event,
                progress: Callable[[str], None] = lambda s: None, state: WatchState | None = None) -> Report:
    """Capture every pod ``opts`` names until ``opts.duration_s`` passes, ``stop`` is set, or every stream
    ends; one pipeline per pod (``pipelines(pod_name)``; a single Pipeline for one pod), findings tagged with
    their pod. Returns the merged report; every tcpdump is stopped before it returns. Raises KubeError for
    refusals before any capture starts."""
    state = state or WatchState()
    state.phase = "resolving"
    what = f"-l {opts.selector}" if opts.selector else f"{opts.target.kind}/{opts.target.name}"
    progress(f"resolving {what} in namespace {opts.namespace}")
    pods = await unless_stopped(stop, capturable_pods, kube, opts.target, opts.selector, opts.namespace, MAX_PODS)
    if opts.write_pcap_dir is not None:  # before any pod is touched
        paths = [pcap_path(opts.write_pcap_dir, pod.metadata.name, iface) for pod in pods for iface in opts.ifaces]
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
    factory = pipelines if callable(pipelines) else (lambda _: pipelines)  # a Pipeline itself is not callable
    # One tshark for every stream of every pod (sources/dissector.py): ~160 MB, not ~160 MB a stream.
    shared = SharedDissector()

    async def one(pod, st: WatchState, setup: asyncio.Semaphore | None) -> Report:
        return await watch_pod(kube, opts, pod, factory(pod.metadata.name), stop, progress, st, setup, shared)

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
    for pod, r in zip(pods, reports):
        name = pod.metadata.name
        if isinstance(r, BaseException):
            problems.append(Problem(f"pod/{name}", str(r).splitlines()[0] if str(r) else type(r).__name__))
            continue
        stats.packets += r.stats.packets
        stats.flows_seen += r.stats.flows_seen
        stats.findings_dropped += r.stats.findings_dropped
        for iface, st in r.stats.by_iface.items():
            stats.by_iface[f"{name}/{iface}"] = st
        for iface, n in r.stats.frames_read.items():
            stats.frames_read[f"{name}/{iface}"] = n
        if r.envoy is not None:
            envoy[name] = r.envoy
        findings += r.findings
        problems += r.problems
        sources.append(r.source)
        for k, v in (r.kernel.moved if r.kernel is not None else {}).items():
            kernel[f"{name}/{k}"] = v
    if not sources:
        raise KubeError("no pod could be captured: " + "; ".join(p.line() for p in problems))
    return Report(LiveSource.merged(sources), stats, sorted(findings, key=lambda f: f.ts), problems,
                  kernel=KernelSide(kernel), envoy=PerPodSide(envoy),
                  captured_nothing=all(r.captured_nothing for r in reports if not isinstance(r, BaseException)))


async def watch_pod(kube: Kube, opts: WatchOptions, pod, pipeline: Pipeline, stop: asyncio.Event,
                    progress: Callable[[str], None], state: WatchState,
                    setup: asyncio.Semaphore | None = None, shared: SharedDissector | None = None) -> Report:
    """Capture one pod: preflight, debug container, tcpdumps, Envoy side, kernel counters. Its streams are
    dissected by ``shared`` (the watch's; a new one if None)."""
    shared = shared or SharedDissector()
    pod_name = pod.metadata.name
    state.pod = pod_name
    pipeline.ctx.pod = pod_name
    pipeline.correlator.pod = pod_name
    pipeline.context(RedirectMapEvent(time.time(), redirect_map_from_annotations(pod.metadata.annotations)))
    statuses = (pod.status.container_statuses if pod.status else None) or []
    app_statuses = [st for st in statuses if st.name != SIDECAR_CONTAINER]
    pipeline.context(PodEvent(time.time(), pod_name, sum(st.restart_count or 0 for st in app_statuses)))
    # The spec's own warnings first (docs/DESIGN.md: lint runs at the start of watch); they never fail the run.
    pipeline.add_findings(lint_pod(ApiClient().sanitize_for_serialization(pod)))
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
        kernel_before = await _kernel_counters(kube, pod, dbg.name, problems, pipeline)
        progress(f"reading Envoy admin and following the {SIDECAR_CONTAINER} log of pod/{pod_name}")
        ticker = QuietTicker(pipeline)
        proxy = await open_proxy(kube, pod.metadata.namespace, pod_name, ticker.wrap(pipeline.context),
                                 opts.admin_port)
        ticker.idle = proxy.log.idle if proxy.log else None
        max_s = int(opts.duration_s + 60) if opts.duration_s else opts.ttl_s
        state.debug = EnvoyDebug(kube, pod, dbg.name, proxy.admin, pipeline.envoy_loggers(), opts.admin_port,
                                 time.time() + max_s, progress)

    ticking = asyncio.create_task(ticker.run())
    try:
        streams: list[Stream | PodFieldStream] = []
        readers: list[asyncio.Future] = []  # each stream's ReadResult
        ended: list[asyncio.Future] = []  # each stream over: its pump has ended

        def pump_done(cap: ExecCapture, _: asyncio.Future) -> None:
            """``cap``'s stream is over; the dissector goes on with the others: say so, with why."""
            if cap.error:
                state.stream_problems.append(f"{cap.iface}: {cap.error}")
            going = [c.iface for c, e in zip(state.captures, ended) if not e.done()]
            if not cap.stop_asked and not stop.is_set() and going:
                progress(f"capturing {', '.join(going)} in pod/{pod_name} via {dbg.name}; {cap.iface} ended: "
                         f"{cap.error or 'tcpdump exited'}")

        def reader_done(cap: ExecCapture, reader: asyncio.Future) -> None:
            """tshark is done with ``cap``'s stream: say what went wrong at once, and if tshark went first (killed,
            crashed) end tcpdump in the pod too, rather than stream into a broken pipe while the others go on."""
            asked = cap.stop_asked  # by us: --duration passed, or the user stopped
            cap.stop()
            why = _tshark_trouble(cap, reader, asked, stop.is_set())
            if why:
                state.tshark_errors[cap.iface] = why
            if why:
                state.stream_problems.append(f"{cap.iface}: {why}")
            if why and not asked and not stop.is_set():
                progress(f"pod/{pod_name} {cap.iface}: {why}; its capture is stopped")

        waits: list[asyncio.Task] = []
        state.phase = "capturing"
        try:
            async with setup:
                streams = _start_captures(kube, opts, pod, dbg.name, max_s, state, pipeline, ended, shared)
                readers += [s.result for s in streams]
                for cap, e in zip(state.captures, ended):
                    e.add_done_callback(functools.partial(pump_done, cap))
                progress(f"waiting for tcpdump on {', '.join(opts.ifaces)} in pod/{pod_name} ({dbg.name})")
                await asyncio.to_thread(_wait_listening, state.captures, LISTEN_TIMEOUT_S)
                # A raise an earlier run left is put back (only a reused container can hold one), then ours.
                await asyncio.to_thread(state.debug.start, opts.envoy_debug, dbg.reused)
                for cap, reader in zip(state.captures, readers):
                    reader.add_done_callback(functools.partial(reader_done, cap))
            # --duration counts from here: the time spent adding the container and starting tcpdump is not capture.
            progress(f"capturing {', '.join(opts.ifaces)} in pod/{pod_name} via {dbg.name}")
            # One stream lost (or one tcpdump ended) is reported and the other interfaces keep capturing: a collision
            # on eth0 is evidence whether or not lo is still seen. The capture ends when every stream has.
            waits.append(asyncio.create_task(stop.wait()))
            if ended:
                waits.append(asyncio.create_task(asyncio.wait(ended)))  # cancelling it never cancels the readers
            await asyncio.wait(waits, timeout=opts.duration_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            state.phase = "stopping"
            for cap in state.captures:
                cap.stop()
            # tcpdump flushes, the streams end, each tshark reads to the end. One that stopped reading (stalled)
            # would hold the report up for ever, and its full pipe the capture thread: it is killed instead.
            # The watch's tshark may also read other pods' streams, still capturing: what counts is that it reads.
            if opts.dissect == "pod":  # each result comes when its pump has ended (in STOP_GRACE_S at most)
                if readers:
                    await asyncio.wait(readers, timeout=READ_GRACE_S)
                late = {r for r in readers if not r.done()}
            else:
                late = set() if await shared.settle(streams, READ_GRACE_S) else {r for r in readers if not r.done()}
                if late:
                    shared.abandon()
            for cap, reader in zip(state.captures, readers):
                if reader in late or (shared.abandoned and reader.cancelled()):
                    why = (f"tshark still reading {READ_GRACE_S:.0f} s after the capture was stopped: killed; the "
                           f"rest of pod/{pod_name}/{cap.iface} was not analysed")
                    state.tshark_errors[cap.iface] = why
                    state.stream_problems.append(f"{cap.iface}: {why}")
                    reader.cancel()
            for cap in state.captures:
                await asyncio.to_thread(cap.join, 30.0)
            results = await asyncio.gather(*readers, return_exceptions=True)
            state.phase = "done"
        captures: dict[str, dict] = {}
        for cap, res in zip(state.captures, results):
            where = f"pod/{pod_name} {cap.iface}"
            if cap.error:
                problems.append(Problem(where, cap.error))
            if cap.tee_error and cap.tee_path in state.pcap_files.values():  # a spool's is the TUI's to say
                problems.append(Problem(where, cap.tee_error))
            if cap.iface in state.tshark_errors:
                problems.append(Problem(where, state.tshark_errors[cap.iface]))
            if cap.dropped_by_kernel:
                problems.append(Problem(where, f"tcpdump: {cap.dropped_by_kernel} packets dropped by kernel"))
            read = None if isinstance(res, BaseException) else res.frames_read
            if read is not None:
                pipeline.stats.frames_read[cap.iface] = read
            captures[cap.iface] = {"captured": cap.captured, "dropped_by_kernel": cap.dropped_by_kernel,
                                   "frames_read": read, "bytes": cap.bytes_received}
            if cap.captured is not None and read is not None and read < cap.captured:
                problems.append(Problem(where, f"{cap.captured - read} of {cap.captured} captured packets were not "
                                               f"read by tshark"))
            if not isinstance(res, BaseException) and res.undissectable:
                problems.append(undissectable_problem(where, res.undissectable, res.undissectable_frames))
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
    await asyncio.to_thread(state.debug.finish)
    counters = await close_proxy(proxy)
    problems += proxy.problems + [Problem(f"pod/{pod_name} {SIDECAR_CONTAINER}", p) for p in state.debug.problems]
    kernel_after = await _kernel_counters(kube, pod, dbg.name, problems) if kernel_before else {}
    # The run-wide list plus whatever a loaded detector declares, so an outside detector's counters back it too.
    watched = dict.fromkeys([*WATCHED, *(n for d in pipeline.detectors for n in d.kernel_counters)])
    kernel = counter_deltas(kernel_before, kernel_after, tuple(watched)) if kernel_after else {}
    pipeline.context(counters)
    pipeline.context(KernelCountersEvent(time.time(), kernel))
    findings = pipeline.finish()
    source = {"kind": "live", "pods": [pod_name], "namespace": pod.metadata.namespace, "container": dbg.name,
              "container_reused": dbg.reused, "interfaces": list(opts.ifaces), "captures": captures,
              "capture_filter": "full" if opts.full_capture else "lean", "dissect": opts.dissect}
    if state.pcap_files:
        source["files"] = dict(state.pcap_files)
    envoy = {"version": proxy.version, "counters_moved": {k: dict(v) for k, v in counters.moved.items()},
             **log_summary(proxy)}
    if (debug := state.debug.report()) is not None:
        envoy["debug"] = debug
    # No tcpdump ever said "listening on" (no such device, no tcpdump, every exec refused): nothing was captured.
    # Every stream lost on the way (the API server or the network dropped them) before a frame was read is no
    # capture either: scripts read the exit code, not the problems. An idle pod, one stream of several lost, or
    # a pod deleted after its packets were read, still had a capture.
    nothing = not any(cap.heard_listening for cap in state.captures) or (
        bool(state.captures) and all(cap.failed for cap in state.captures)
        and not any(c["frames_read"] for c in captures.values()))
    return Report(LiveSource.of_pod(source), pipeline.stats, findings, problems, envoy=SidecarSide.of(envoy),
                  kernel=KernelSide(kernel), captured_nothing=nothing)


def _tshark_trouble(cap: ExecCapture, reader: asyncio.Task, stop_asked: bool, user_stopped: bool) -> str | None:
    """One line on what went wrong with the tshark that read ``cap``'s stream (``reader``, done), or None.

    After a user's Ctrl-C (``user_stopped``) the terminal signals tshark too: its death by SIGINT, or a crash
    report then, is the stop and not a fault; a SIGKILL or SIGSEGV still is."""
    if reader.cancelled():
        return None
    exc = reader.exception()
    if exc is not None:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None if user_stopped else f"tshark failed: {reason}"
    res = reader.result()
    if not res.error:
        return None
    if res.killed_by is not None:
        return None if user_stopped and res.killed_by == signal.SIGINT else f"tshark: {res.error}"
    if user_stopped:
        return None
    # tshark's complaints at the end of its input (cut short, not a capture file) follow from how the stream
    # ended: cap.error, set before that end reached tshark, says why when it was lost, and a stream we closed
    # ourselves (no half-close before v5) may end mid-record.
    return None if cap.error or stop_asked else f"tshark: {res.error}"


def pcap_path(directory: Path, pod: str, iface: str) -> Path:
    """Where --write-pcap keeps the capture of ``pod``'s ``iface``."""
    return directory / f"{pod}-{iface}.pcap"


def _start_captures(kube: Kube, opts: WatchOptions, pod, container: str, max_s: int, state: WatchState,
                    pipeline: Pipeline, ended: list, shared: SharedDissector) -> list[Stream | PodFieldStream]:
    """One tcpdump exec stream per interface, each pumped into a Stream of ``shared`` (or, with ``opts.dissect``
    "pod", a PodFieldStream of its tshark's lines) -> the streams; a future per stream is appended to ``ended``,
    done when its pump has ended."""
    pod_name = pod.metadata.name
    loop = asyncio.get_running_loop()
    in_pod = opts.dissect == "pod"
    out: list[Stream | PodFieldStream] = []
    for iface in opts.ifaces:
        source = f"{pod_name}/{iface}"
        stream = (PodFieldStream(source, iface, pipeline.feed, loop) if in_pod
                  else shared.stream(source, iface, pipeline.feed))
        out.append(stream)
        tee, limit = None, None
        if in_pod:
            pass  # no pcap bytes come: nothing to keep
        elif opts.write_pcap_dir is not None:
            opts.write_pcap_dir.mkdir(parents=True, exist_ok=True)
            tee = str(pcap_path(opts.write_pcap_dir, pod_name, iface))
            state.pcap_files[iface] = tee
        elif opts.spool_dir is not None:
            tee, limit = str(opts.spool_dir / f"{pod_name}-{iface}.pcap"), opts.spool_limit
            state.spool_files[iface] = tee
        bpf = FULL_FILTER if opts.full_capture else lean_filter(iface)
        if iface == "lo":
            bpf = without_admin(bpf, opts.admin_port)
        cap = ExecCapture(kube, pod.metadata.namespace, pod_name, container, iface, max_s, -1, tee, limit,
                          tee_replace=opts.overwrite_pcap or opts.write_pcap_dir is None,  # a spool is ours
                          bpf=bpf, tshark_args=pod_tshark_args() if in_pod else None)
        done = loop.create_future()
        ended.append(done)
        cap.on_data = stream.wrote
        cap.on_end = functools.partial(_pump_ended, stream, loop, done)
        state.captures.append(cap)
        cap.start()
    return out


def _pump_ended(stream: Stream | PodFieldStream, loop: asyncio.AbstractEventLoop, fut: asyncio.Future) -> None:
    """From a pump's thread: its stream is over; mark ``fut`` done on ``loop`` (nothing if the loop has closed)."""
    stream.ended()
    try:
        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))
    except RuntimeError:
        pass


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
