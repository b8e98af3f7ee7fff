"""`watch` in the TUI: a Session over the live path (live.py), one fresh pipeline per pod."""

from __future__ import annotations

import heapq
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from kubectl_meshdoctor.commands.log_level import LoggerControl
from kubectl_meshdoctor.commands.tui import KEEP_RECENT, evidence_saver, pods_lines, run_session
from kubectl_meshdoctor.commands.watch.live import WatchOptions, WatchState, watch
from kubectl_meshdoctor.core.events import EnvoyCountersEvent, PacketEvent
from kubectl_meshdoctor.core.findings import Finding
from kubectl_meshdoctor.core.live_join import JoinedView, LiveJoin
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats, merged_stats
from kubectl_meshdoctor.core.report_model import Report
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.clusters import parse_clusters
from kubectl_meshdoctor.kube.admin import EnvoyAdmin
from kubectl_meshdoctor.kube.client import Kube, KubeError
from kubectl_meshdoctor.kube.target import describe_targets
from kubectl_meshdoctor.private_dirs import private_dir_prefix
from kubectl_meshdoctor.frontends.tui.session import COUNTERS, SIDECAR_PANES, Session, SessionHooks
from kubectl_meshdoctor.live.sidecar_link import stats_moved


def _recent(pipelines: list[Pipeline]) -> list:
    if len(pipelines) == 1:
        return list(pipelines[0].recent)
    return list(heapq.merge(*(list(p.recent) for p in pipelines), key=lambda ev: ev.ts))


class RunLoggerControl(LoggerControl):
    """The loggers pane's control during a watch: also raises the loggers the run's detectors read to debug for the
    run, or puts them back (the pane's v; commands/envoy_debug.py)."""

    def __init__(self, admin: EnvoyAdmin, state: WatchState) -> None:
        super().__init__(admin)
        self._state = state

    def toggle_run_debug(self) -> tuple[dict[str, str], str]:
        """Blocks. -> (the levels the proxy lists afterwards, one line saying what was done). Raises KubeError."""
        debug = self._state.debug
        if debug is None:
            raise KubeError("the watch has not reached the proxy yet")
        said = debug.toggle()
        return self.levels(), said


def watch_described(target: str, namespace: str, context: str | None) -> tuple[str, str]:
    """The watch's header line, ``pod/x  namespace n  context c``, and its short form for the 80-column status
    line, ``pod/x  ns/n  ctx/c`` (kubectl's ``ns`` short name; the context left out when there is none). The pod
    first in both: a narrow terminal cuts a line's end, and the pod is what the user must not lose."""
    ctx, short = (f"  context {context}", f"  ctx/{context}") if context else ("", "")
    return f"{target}  namespace {namespace}{ctx}", f"{target}  ns/{namespace}{short}"


class LiveSession(Session):
    """``watch`` on the cluster (live.py) with one fresh pipeline per pod; the findings shown joined as the report
    will join them (core/live_join.py); the Envoy panes show a pod's sidecar (the first, or the one asked for),
    reached through the same port-forward as ``log-level``."""

    saves_evidence = True
    live = True

    def __init__(self, kube: Kube, opts: WatchOptions, redact: bool = True) -> None:
        self.kube = kube
        self.opts = opts
        self.redact = redact
        self.saves_evidence = opts.dissect == "local"  # --dissect pod: the packets stay in the pod
        self.exit_when_done = opts.duration_s is not None
        target = describe_targets(opts.targets, opts.selector)
        self.describe, self.describe_short = watch_described(target, opts.namespace, kube.context)
        self.pipelines: list[Pipeline] = []
        self.state = WatchState()
        self._controls: dict[str, LoggerControl] = {}
        self.joiner = LiveJoin(lambda: self.pipelines)  # the findings shown: joined as the report will be

    def new_pipeline(self, hooks: SessionHooks, pod: str) -> Pipeline:
        """A pod's pipeline, handing its findings to ``hooks`` and kept for the panes and the joined view."""
        self.pipelines.append(Pipeline.with_detectors(on_finding=hooks.on_finding, redact=self.redact, pod=pod,
                                                      keep_recent=KEEP_RECENT))
        return self.pipelines[-1]

    async def run(self, hooks: SessionHooks) -> Report:
        return await watch(self.kube, self.opts, lambda pod: self.new_pipeline(hooks, pod), hooks.stop,
                           hooks.progress, self.state)

    def joined(self) -> JoinedView | None:
        return self.joiner.view()

    def _states(self) -> list[WatchState]:
        return [self.state, *self.state.pods]

    def stats(self) -> PipelineStats:
        return merged_stats(self.pipelines) if self.pipelines else PipelineStats()

    def pod(self) -> str | None:
        return self.state.pod or next((s.pod for s in self.state.pods if s.pod), None)

    def pods(self) -> list[str]:
        named = [st.pod for st in self.state.pods if st.pod]
        return named or [p.ctx.pod for p in self.pipelines if p.ctx.pod] or ([self.state.pod] if self.state.pod else [])

    def loggers(self, pod: str | None = None) -> LoggerControl | None:
        pod = pod or self.pod()
        if pod is None:
            return None
        if pod not in self._controls:
            state = next((st for st in self._states() if st.pod == pod), self.state)
            self._controls[pod] = RunLoggerControl(EnvoyAdmin(self.kube, self.opts.namespace, pod,
                                                              self.opts.admin_port), state)
        return self._controls[pod]

    def clusters(self, pod: str | None = None) -> Callable[[], dict] | None:
        control = self.loggers(pod)
        if control is None:
            return None
        return lambda: parse_clusters(control.admin.get("/clusters", {"format": "json"}).body)

    def panes(self) -> frozenset[str]:
        return SIDECAR_PANES | {COUNTERS}

    def counters(self, pod: str | None = None) -> Callable[[], EnvoyCountersEvent] | None:
        """``pod``'s sidecar's /stats now against the run's first read of them (WatchState.stats_before)."""
        control = self.loggers(pod)
        if control is None:
            return None
        state = next((st for st in self._states() if st.pod == control.pod), self.state)
        return lambda: stats_moved(control.admin, state.stats_before)

    def access_log(self) -> list[AccessLogEntry]:
        return [e for p in self.pipelines for e in p.correlator.entries()]

    def access_log_count(self) -> int:
        return sum(p.correlator.entries_count() for p in self.pipelines)

    def access_logs(self) -> dict[str, list[AccessLogEntry]]:
        return pods_lines(self.pipelines)

    def problems(self) -> list[str]:
        streams = [f"pod/{st.pod} {line}" for st in self._states() for line in st.stream_problems]
        # said while the run goes on, not only in the report: the screen shows no error for them, and says why
        return streams + [f"pod/{p.ctx.pod} {note}" for p in self.pipelines
                          if (note := p.correlator.before_capture_note()) is not None]

    def drops(self) -> dict[str, int | None]:
        return {f"{cap.pod}/{cap.iface}": cap.dropped_by_kernel for st in self._states() for cap in st.captures}

    def packets(self) -> Sequence[PacketEvent]:
        return _recent(self.pipelines) if self.pipelines else ()

    def capture_files(self) -> dict[str, str]:
        """Evidence source (``pod/iface``) -> the file holding its bytes (--write-pcap, else the spool)."""
        return {f"{st.pod}/{iface}": path for st in self._states() for iface, path in
                {**st.spool_files, **st.pcap_files}.items() if st.pod}

    def save_evidence(self, finding: Finding, path: str, overwrite: bool) -> str:
        return evidence_saver(self.capture_files)(finding, path, overwrite)


def run_tui(kube: Kube, opts: WatchOptions, output: str, redact: bool = True) -> int:
    """``watch`` in the TUI. Without --write-pcap the capture bytes go to a private spool (owner-only, capped)
    so `s` can save a finding's packets; it is deleted when the screen closes."""
    spool = None
    if opts.write_pcap_dir is None and opts.dissect == "local":  # --dissect pod: no pcap bytes come to keep
        try:
            spool = Path(tempfile.mkdtemp(prefix=private_dir_prefix("spool")))  # mode 0700
            opts = replace(opts, spool_dir=spool)
        except OSError:  # no usable temporary directory: the capture goes on, `s` says it keeps no bytes
            spool = None

    def remove_spool() -> None:
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)

    try:
        return run_session(LiveSession(kube, opts, redact), output, remove_spool)
    finally:
        remove_spool()
