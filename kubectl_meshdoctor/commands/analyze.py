"""`kubectl meshdoctor analyze FILE...`: what people already hold (captures, the sidecar's access log, admin
dumps) through the same pipeline as a live capture, offline."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import signal
import sys
import time
import zlib
from collections.abc import Callable, Sequence

from kubectl_meshdoctor.commands.capture_meta import named_by_watch
from kubectl_meshdoctor.commands.outside_span import context_problems, outside_capture
from kubectl_meshdoctor.commands.console import error, progress_line
from kubectl_meshdoctor.commands.tui import KEEP_RECENT, evidence_saver, pods_lines
from kubectl_meshdoctor.core.events import ClustersEvent, EnvoyCountersEvent, PacketEvent
from kubectl_meshdoctor.core.findings import Finding, Problem, undissectable_problem
from kubectl_meshdoctor.core.live_join import JoinedView, LiveJoin
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats, merged_stats
from kubectl_meshdoctor.core.report_model import (
    DumpCounters,
    FilesSide,
    FilesSource,
    LogLinesRead,
    Report,
    merge_pod_reports,
)
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.clusters import FormatError
from kubectl_meshdoctor.envoy.log_format import LogFormat, LogFormatError, compile_format
from kubectl_meshdoctor.exit_codes import by_signal
from kubectl_meshdoctor.frontends.report import rendered_for
from kubectl_meshdoctor.frontends.shown import files_described
from kubectl_meshdoctor.frontends.tui.session import ACCESS_LOG as LOG_PANE
from kubectl_meshdoctor.frontends.tui.session import CLUSTERS as CLUSTERS_PANE
from kubectl_meshdoctor.frontends.tui.session import COUNTERS as COUNTERS_PANE
from kubectl_meshdoctor.frontends.tui.session import Session, SessionHooks
from kubectl_meshdoctor.private_dirs import remove_stale_private_dirs
from kubectl_meshdoctor.sources import files, read_plan
from kubectl_meshdoctor.sources.captools import CaptureSummary, capture_summary
from kubectl_meshdoctor.sources.envoy_files import clusters_summary, read_access_log, read_clusters, read_counters
from kubectl_meshdoctor.sources.files import CaptureArg, InputError
from kubectl_meshdoctor.sources.reader_process import read_pair
from kubectl_meshdoctor.sources.pod_inputs import by_pod, pod_inputs
from kubectl_meshdoctor.sources.merge import HIGH_WATER, MAX_BUFFERED, SeenOnce, merge_by_time
from kubectl_meshdoctor.sources.read_plan import read_capture


async def analyze(args: list[CaptureArg], pipeline: Pipeline, jobs: int | None = None,
                  log_format: LogFormat | None = None) -> Report:
    """Run every input through ``pipeline`` and build the report. Each file's kind comes from its content
    (sources.files.input_kind): captures are read by at most ``jobs`` tshark processes at once (None:
    sources.read_plan.JOBS), access logs alongside them in capture-time order, so the correlator and the detectors
    see lines and packets as `watch` does; `/stats` dumps give the counters that moved, `/clusters` dumps the
    hosts Envoy would not route to. ``log_format``: the mesh's own access-log format (--log-format). A file
    that cannot be read or is of no known kind is a problem of the report, and the others are read; InputError
    (one line) only when no input can be read at all. The report says ``captured_nothing`` when nothing in any
    input was read (its exit code is then 2). ValueError for ``jobs`` < 1."""
    jobs = read_plan.JOBS if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    kinds, refused = _kinds(args, log_format)
    # A capture whose name says no interface is lo or eth0 by its content: the detectors act on those two.
    args = [files.with_role(a) if kinds.get(a.path) == files.CAPTURE else a for a in args]
    args, problems = _distinct([a for a in args if a.path in kinds], kinds)
    problems = refused + problems
    for parent in dict.fromkeys(os.path.dirname(os.path.abspath(a.path)) for a in args):
        remove_stale_private_dirs(parent)
    captures = [a for a in args if kinds[a.path] == files.CAPTURE]
    logs = [a for a in args if kinds[a.path] == files.ENVOY_LOG]
    # A pod's lo and eth0 merged into one pcapng whose interfaces have no name: each frame its own role.
    roles = {a.path: r for a in captures if (r := files.mixed_roles(a)) is not None}
    problems += [Problem(path, r.told) for path, r in roles.items()]
    slots = asyncio.Semaphore(jobs)
    shared = jobs < len(captures)
    # Captures that can share one stream go through one tshark, in capture-time order (sources/interleave.py).
    header = read_plan.interleave_header([a.path for a in captures])
    seen_once = SeenOnce() if len(captures) > 1 else None
    if header is not None:  # every packet from one reader, which drops the ones seen_once drops
        readers = [functools.partial(_interleaved, captures, header, seen_once)]
    else:
        readers = [functools.partial(read_capture, a, slots, shared) for a in captures]
    readers += [functools.partial(read_access_log, a.path, log_format=log_format, only_pod=a.line_pod,
                                  except_pods=a.except_pods) for a in logs]
    # Sharing tshark, every stream may hold a whole chunk while the others wait for the slot: the merge must hold
    # that much to keep capture-time order (without editcap files are read whole, and order is best effort).
    held = len(captures) * (read_plan.CHUNK_PACKETS + HIGH_WATER) if shared else 0
    dedup = seen_once if header is None else None

    def on_event(ev) -> None:
        if isinstance(ev, PacketEvent):
            mixed = roles.get(ev.source) if roles else None
            if mixed is not None and (role := mixed.role(ev.frame)) is not None:
                ev = dataclasses.replace(ev, iface=role)
            if dedup is None or not dedup(ev):
                pipeline.feed(ev)
        else:
            pipeline.context(ev)

    results = await merge_by_time(readers, on_event, max_buffered=max(MAX_BUFFERED, held), high_water=HIGH_WATER)
    if header is not None:
        results = (results[0] if isinstance(results[0], list) else [results[0]] * len(captures)) + results[1:]
    for result in results:
        if isinstance(result, OSError):
            raise InputError(f"cannot read: {result}") from None
        if isinstance(result, BaseException):
            raise result
    summaries: dict[str, CaptureSummary | None] = {}
    for a, result in zip(captures, results):
        if result.frames_read is not None:
            pipeline.stats.frames_read[a.path] = result.frames_read
        if result.cut_short:
            # One capinfos run a capture: its summary serves the check for a packetless capture below too.
            summaries[a.path] = summary = capture_summary(a.path)
            whole = summary.frames if summary is not None else None
            last = whole if whole is not None else result.last_frame
            if result.frames_read is None and whole is not None:
                # tshark stops at the cut without its count: the whole frames before it were read (a fuzz case:
                # one frame of no TCP, then the cut, reported as nothing read)
                pipeline.stats.frames_read[a.path] = whole
            problems.append(Problem(a.path, f"capture cut short in the middle of a packet after frame {last}; "
                                            f"analysed up to there", cut_after_frame=last))
        elif result.error:
            problems.append(Problem(a.path, f"tshark: {result.error}"))
        if result.undissectable:
            problems.append(undissectable_problem(a.path, result.undissectable, result.undissectable_frames))
    for (source, first), n in sorted(seen_once.dropped.items() if seen_once else ()):
        problems.append(Problem(source, f"{n} packet(s) also in {first} (the same capture in another form?): "
                                        f"counted once"))
    envoy: FilesSide | None = None
    read_dumps = 0
    if logs or any(k in (files.STATS, files.CLUSTERS) for k in kinds.values()):
        envoy, read_dumps = _envoy_side(args, kinds, logs, results[len(captures):], pipeline, problems)
    findings = outside_capture(pipeline.finish(), pipeline.stats)
    only_captures = all(k == files.CAPTURE for k in kinds.values())
    pod = args[0].pod if args else None  # analyze_pods gives one pod's files at a time
    source = FilesSource(tuple(a.path for a in args), None if only_captures else dict(kinds), pod,
                         {a.path: a.iface for a in captures} if pod is not None else None)
    # A capture read is one that held traffic. Not: a pcap header alone, one cut short before its first frame
    # ended, one whose frames no tool can count, a pcapng cut inside its first blocks (read as a "mime" file),
    # frames of no byte each (zeros after a pcap header). One capinfos run tells, for a capture with no packet.
    empty: set[str] = set()
    for a, r in zip(captures, results):
        if r.packets:
            continue
        info = summaries[a.path] if a.path in summaries else capture_summary(a.path)
        frames = r.frames_read if r.frames_read is not None else (info.frames if info is not None else None)
        if not frames and (not r.error or r.cut_short):
            if not r.error:
                problems.append(Problem(a.path, "no frame in it (a capture's header alone)"))
        elif info is not None and info.file_type == "mime":
            problems.append(Problem(a.path, "read as no capture: its first blocks are damaged (tshark took it for "
                                            "a file of another kind); nothing in it was read"))
        elif info is not None and info.data_bytes == 0 and not r.error:
            problems.append(Problem(a.path, f"{frames} frames, every one empty (no byte captured): not a capture "
                                            f"of traffic (damaged, or no pcap after its header)"))
        else:
            continue
        empty.add(a.path)
    read_captures = sum(1 for a, r in zip(captures, results) if (not r.error or r.cut_short) and a.path not in empty)
    read_logs = sum(1 for r in results[len(captures):] if r.readable)
    return Report(source, pipeline.stats, findings, problems + context_problems(pipeline, [a.path for a in logs]),
                  envoy=envoy, captured_nothing=not (read_captures or read_logs or read_dumps), logged=pipeline.logged,
                  addresses=pipeline.addresses())


async def analyze_pods(args: list[CaptureArg], new_pipeline: Callable[[str | None], Pipeline],
                       jobs: int | None = None, log_format: LogFormat | None = None,
                       skipped: Sequence[Problem] = ()) -> Report:
    """``analyze`` for each pod of ``args`` (sources/pod_inputs.py) through a pipeline of its own,
    ``new_pipeline(pod)``, one pod after another: the same connection seen from a caller's and a server's eth0
    is two views, not one flow. One report (core/report_model.py merge_pod_reports); a pod none of whose files
    can be read is a problem, and InputError (one line) only when no pod's can. ``skipped``: what the arguments
    held that is not read (PodInputs.skipped), among the report's problems."""
    groups = by_pod(args)
    if len(groups) == 1 and groups[0][0] is None:
        report = await analyze(args, new_pipeline(None), jobs, log_format)
        return dataclasses.replace(report, problems=[*skipped, *report.problems])
    reports: list[Report] = []
    failed: list[Problem] = list(skipped)
    for pod, inputs in groups:
        try:
            reports.append(await analyze(inputs, new_pipeline(pod), jobs, log_format))
        except InputError as e:
            failed.append(Problem(f"pod/{pod}", str(e)))
    if not reports:
        raise InputError("; ".join(p.line() for p in failed))
    return merge_pod_reports(reports, failed)


def _kinds(args: list[CaptureArg], log_format: LogFormat | None = None) -> tuple[dict[str, str], list[Problem]]:
    """Each input's kind, and a problem for each one that cannot be read or is of no known kind: one refused
    file must not end the run, when the file beside it holds the answer. InputError (one line) when no input
    can be read at all."""
    kinds: dict[str, str] = {}
    refused: list[Problem] = []
    for a in args:
        try:
            if os.path.isfile(a.path) and os.path.getsize(a.path) == 0:  # said as it is, not "not a capture"
                raise InputError(f"{a.path}: empty (0 bytes): nothing to read")
            kinds[a.path] = files.input_kind(a.path, log_format)
        except InputError as e:
            refused.append(Problem(a.path, str(e).removeprefix(f"{a.path}: ")))
    if not kinds:
        if len(refused) == 1:
            raise InputError(refused[0].line())
        raise InputError(f"none of the {len(refused)} inputs can be read: "
                         + "; ".join(p.line() for p in refused))
    return kinds, refused


async def _interleaved(captures: list[CaptureArg], header: bytes, seen_once: SeenOnce | None, push, gate) -> list:
    """merge_by_time's reader for the captures sharing one stream: in time order, so no gate (reader_process)."""
    return await read_pair([a.path for a in captures], [a.path for a in captures], [a.iface for a in captures],
                           [a.explicit for a in captures], header, push, seen_once)


def _distinct(args: list[CaptureArg], kinds: dict[str, str]) -> tuple[list[CaptureArg], list[Problem]]:
    """Each file's bytes once: the same frames read twice make flows of their own (a SYN seen twice is a
    retransmission). One file however it was spelt (``a.log``, ``./a.log``, a link to it) is read once, silently;
    a capture given again with another interface, or another file with the same bytes (same size, then the same
    digest), is read once too, with a problem that names the one left out."""
    out: list[CaptureArg] = []
    problems: list[Problem] = []
    by_size: dict[int, list[CaptureArg]] = {}
    digests: dict[str, str] = {}

    def digest(path: str) -> str:
        if path not in digests:
            try:
                digests[path] = files.content_digest(path)
            except OSError as e:
                raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
        return digests[path]

    for a in args:
        size = os.stat(a.path).st_size  # input_kind has read it: it exists
        capture = kinds[a.path] == files.CAPTURE
        twin = next((k for k in by_size.get(size, ()) if os.path.samefile(k.path, a.path)), None)
        same_file = twin is not None
        if twin is None:
            twin = next((k for k in by_size.get(size, ()) if digest(k.path) == digest(a.path)), None)
        if twin is None:
            by_size.setdefault(size, []).append(a)
            out.append(a)
        elif not same_file or (capture and a.iface != twin.iface):
            iface = f", on interface {twin.iface}" if capture and a.iface != twin.iface else ""
            what = f"given again with interface {a.iface}" if same_file else f"the same bytes as {twin.path}"
            problems.append(Problem(a.path, f"{what}: read once{iface}"))
    return out, problems


_DUMP_ERRORS = (FormatError, OSError, EOFError, zlib.error)  # looked like a dump at its head, broken further on


def _envoy_side(args: list[CaptureArg], kinds: dict[str, str], logs: list[CaptureArg], reads: list,
                pipeline: Pipeline, problems: list[Problem]) -> tuple[FilesSide, int]:
    """The report's Envoy side of an offline run (what the logs held, the `/stats` dumps' counters, the
    `/clusters` dumps' clusters), after feeding the dumps' counters and clusters to ``pipeline`` as a watch feeds
    the sidecar's at its end; and how many dumps were read. A dump that cannot be read is a problem, and the rest
    is read."""
    logs_read = LogLinesRead(sum(r.entries for r in reads), sum(r.lines for r in reads),
                             sum(r.component for r in reads), sum(r.facts for r in reads), sum(r.other for r in reads))
    dumped: DumpCounters | None = None
    for a, r in zip(logs, reads):
        problems += [Problem(a.path, what) for what in r.problems]
        if a.explicit:
            problems.append(Problem(a.path, f"a log has no interface: :{a.iface} ignored"))
    read = 0
    stats = [a.path for a in args if kinds[a.path] == files.STATS]
    if stats:
        try:
            counters, notes = read_counters(stats, time.time())
            problems += [Problem(", ".join(stats), note) for note in notes]
        except _DUMP_ERRORS as e:
            problems.append(Problem(", ".join(stats), f"not read: {str(e).splitlines()[0]}"))
        else:
            read += len(stats)
            dumped = DumpCounters({k: dict(v) for k, v in counters.moved.items()},
                                  "first dump" if counters.since == "the first dump" else "Envoy's start",
                                  counters.uptime_s)
            pipeline.context(counters)
    clusters: dict = {}
    for a in args:
        if kinds[a.path] == files.CLUSTERS:
            try:
                clusters.update(clusters_summary(read_clusters(a.path)))
                read += 1
            except _DUMP_ERRORS as e:
                problems.append(Problem(a.path, f"not read: {str(e).splitlines()[0]}"))
    if clusters:
        pipeline.context(ClustersEvent(time.time(), {name: c["hosts"] for name, c in clusters.items()},
                                       {name: {h: tuple(flags) for h, flags in c["unhealthy"].items()}
                                        for name, c in clusters.items()},
                                       ", ".join(a.path for a in args if kinds[a.path] == files.CLUSTERS)))
    return FilesSide(logs_read, dumped, clusters or None), read


class FileSession(Session):
    """Capture files (``sources.files.CaptureArg``, each with its pod, if any) through the real pipeline, one a
    pod, then on screen until q like a live run (``analyze --tui``, and the TUI's tests). ``jobs``: tsharks at
    once (as ``analyze``'s). The Envoy panes show what the files hold: the access-log lines read, the /clusters
    and /stats dumps given (each pod's); there is no sidecar to ask, so no loggers."""

    saves_evidence = True

    def __init__(self, captures: list[CaptureArg], redact: bool = True, jobs: int | None = None,
                 log_format: LogFormat | None = None, skipped: Sequence[Problem] = ()) -> None:
        self.captures = captures
        self.skipped = tuple(skipped)
        self.log_format = log_format
        self.redact = redact
        self.jobs = jobs
        self.describe = files_described([c.path for c in captures])
        self._pipelines = [Pipeline.with_detectors(redact=redact)]
        self._save = evidence_saver({c.path: c.path for c in captures})
        self.joiner = LiveJoin(lambda: self._pipelines)
        self._dumps: dict[str, dict[str | None, list[str]]] = {CLUSTERS_PANE: {}, COUNTERS_PANE: {}}
        self._log_seen = False

    def _find_dumps(self) -> dict[str, dict[str | None, list[str]]]:
        """The /clusters and /stats dumps given: pane -> pod -> paths, in the order given. One that cannot be
        read is still the pane's (it says why); the report names it among its problems too."""
        found: dict[str, dict[str | None, list[str]]] = {CLUSTERS_PANE: {}, COUNTERS_PANE: {}}
        for c in self.captures:
            try:
                kind = files.input_kind(c.path, self.log_format)
            except InputError:
                continue
            pane = {files.CLUSTERS: CLUSTERS_PANE, files.STATS: COUNTERS_PANE}.get(kind)
            if pane is not None and c.path not in found[pane].get(c.pod, ()):
                found[pane].setdefault(c.pod, []).append(c.path)
        return found

    def _dump_paths(self, pane: str, pod: str | None) -> list[str]:
        by_pod = self._dumps.get(pane, {})
        return by_pod.get(pod, []) if pod is not None else next(iter(by_pod.values()), [])

    async def run(self, hooks: SessionHooks) -> Report:
        self._dumps = await asyncio.to_thread(self._find_dumps)
        self._pipelines = []

        def new_pipeline(pod: str | None) -> Pipeline:
            self._pipelines.append(Pipeline.with_detectors(pod=pod, on_finding=hooks.on_finding,
                                                           redact=self.redact, keep_recent=KEEP_RECENT))
            return self._pipelines[-1]

        hooks.progress(f"reading {', '.join(c.path for c in self.captures)}")
        report = await analyze_pods(self.captures, new_pipeline, jobs=self.jobs, log_format=self.log_format,
                                    skipped=self.skipped)
        hooks.progress(f"files read: {report.stats.packets} packets analysed; q quits")
        await hooks.stop.wait()
        return report

    def stats(self) -> PipelineStats:
        return merged_stats(self._pipelines) if self._pipelines else PipelineStats()

    def packets(self) -> Sequence[PacketEvent]:
        if len(self._pipelines) == 1:
            return self._pipelines[0].recent
        return sorted((ev for p in self._pipelines for ev in p.recent), key=lambda ev: ev.ts)[-KEEP_RECENT:]

    def access_log(self) -> list[AccessLogEntry]:
        """The lines of the access logs given, as the correlators hold them (the same the report quotes)."""
        return [e for p in self._pipelines for e in p.correlator.entries()]

    def access_log_count(self) -> int:
        return sum(p.correlator.entries_count() for p in self._pipelines)

    def access_logs(self) -> dict[str, list[AccessLogEntry]]:
        return pods_lines(self._pipelines)

    def pods(self) -> list[str]:
        return [p.ctx.pod for p in self._pipelines if p.ctx.pod]

    def pod_of(self, source: str) -> str | None:
        # offline a packet's source is its capture file's path (CaptureArg.path), the file given for one pod
        return next((c.pod for c in self.captures if c.path == source), None)

    def panes(self) -> frozenset[str]:
        # The access log once a line was read (a log of Envoy's own lines alone has none to show).
        self._log_seen = self._log_seen or any(p.correlator.entries() for p in self._pipelines)
        return frozenset({pane for pane, by_pod in self._dumps.items() if by_pod}
                         | ({LOG_PANE} if self._log_seen else set()))

    def pane_pods(self, pane: str) -> list[str]:
        if pane in self._dumps:
            return [pod for pod in self._dumps[pane] if pod is not None]
        return super().pane_pods(pane)

    def clusters(self, pod: str | None = None) -> Callable[[], dict] | None:
        paths = self._dump_paths(CLUSTERS_PANE, pod)
        if not paths:
            return None

        def fetch() -> dict:
            out: dict = {}
            for path in paths:
                out.update(read_clusters(path))
            return out

        return fetch

    def counters(self, pod: str | None = None) -> Callable[[], EnvoyCountersEvent] | None:
        paths = self._dump_paths(COUNTERS_PANE, pod)
        return (lambda: read_counters(paths, time.time())[0]) if paths else None

    def dump_of(self, pane: str, pod: str | None = None) -> str | None:
        return ", ".join(self._dump_paths(pane, pod)) or None

    def joined(self) -> JoinedView | None:
        return self.joiner.view()

    def save_evidence(self, finding: Finding, path: str, overwrite: bool) -> str:
        return self._save(finding, path, overwrite)


# How long a thread holds the GIL before another that wants it gets it, while a report is made (no screen to keep
# responsive). The pass, merger and reader threads of a capture pair all want it all the time; at Python's 5 ms
# each forced hand-over moved the work to a thread on the other core with cold caches: on bench/gen's short mix
# (1M packets) analyze used 19.7-20.2 s of CPU at 5 ms, 18.0-18.8 s at 50 ms, 18.9-19.1 s at 200 ms, the same
# report at each (bench/RESULTS.md).
REPORT_SWITCH_INTERVAL_S = 0.05


def run(args) -> int:
    """`kubectl meshdoctor analyze FILE...`: the report of the captures, or the TUI with --tui."""
    try:
        inputs = named_by_watch(pod_inputs(args.files))
    except InputError as e:
        return error(str(e))
    try:
        log_format = compile_format(args.log_format) if getattr(args, "log_format", None) else None
    except LogFormatError as e:
        return error(f"--log-format: {e}")
    captures = list(inputs.files)
    if args.tui:
        from kubectl_meshdoctor.commands.tui import run_session

        try:
            for c in captures:
                files.input_kind(c.path, log_format)
        except InputError as e:
            return error(str(e))
        if not (sys.stdout.isatty() and sys.stdin.isatty()):
            return error("--tui needs a terminal (drop --tui to print the report)")
        return run_session(FileSession(captures, args.redact, args.jobs, log_format, inputs.skipped), args.output)

    stopped_by: list[int] = []

    async def run():
        # Ctrl-C, SIGTERM and SIGHUP cancel the run, so tshark and editcap are stopped and the chunk files beside
        # the user's capture are removed. Only the first does: a second Ctrl-C must not cut that cleanup short.
        loop, task = asyncio.get_running_loop(), asyncio.current_task()

        def on_signal(sig: int) -> None:
            stopped_by.append(sig)
            if len(stopped_by) == 1:
                task.cancel()

        stoppers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        for sig in stoppers:
            loop.add_signal_handler(sig, on_signal, sig)
        pipelines: list[Pipeline] = []

        def new_pipeline(pod: str | None) -> Pipeline:
            pipelines.append(Pipeline.with_detectors(pod=pod, redact=args.redact))
            return pipelines[-1]

        ticker = asyncio.create_task(progress_line(pipelines, "analyzing"))
        try:
            return await analyze_pods(captures, new_pipeline, jobs=args.jobs, log_format=log_format,
                                      skipped=inputs.skipped)
        finally:
            ticker.cancel()
            # Removed while the loop runs: asyncio.run closes the loop's wakeup pipe before it removes them, and a
            # signal in between printed "Exception ignored ... Bad file descriptor" with a traceback.
            for sig in stoppers:
                loop.remove_signal_handler(sig)
                if stopped_by:  # already on the way out: a repeated Ctrl-C must not interrupt the exit either
                    signal.signal(sig, signal.SIG_IGN)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(REPORT_SWITCH_INTERVAL_S)
    try:
        report = asyncio.run(run())
    except InputError as e:
        return error(str(e))
    except asyncio.CancelledError:
        if not stopped_by:
            raise
        return by_signal(stopped_by[0])
    finally:
        sys.setswitchinterval(switch)
    sys.stdout.write(rendered_for(args.output, report, sys.stdout))
    return report.exit_code()
