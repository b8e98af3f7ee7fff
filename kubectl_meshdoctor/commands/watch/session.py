"""`watch` in the TUI: a Session over the live path (live.py), one fresh pipeline per pod."""

from __future__ import annotations

import heapq
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from kubectl_meshdoctor.commands.log_level import LoggerControl
from kubectl_meshdoctor.commands.tui import KEEP_RECENT, evidence_saver, run_session
from kubectl_meshdoctor.commands.watch.live import WatchOptions, WatchState, watch
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats
from kubectl_meshdoctor.envoy.clusters import parse_clusters
from kubectl_meshdoctor.kube.admin import EnvoyAdmin
from kubectl_meshdoctor.kube.client import Kube
from kubectl_meshdoctor.sinks.tui.session import Session, SessionHooks


def merged_stats(pipelines: list[Pipeline]) -> PipelineStats:
    """Counts of every pod's pipeline; interfaces as ``pod/iface`` when there is more than one pod."""
    if len(pipelines) == 1:
        return pipelines[0].stats
    out = PipelineStats()
    for p in pipelines:
        out.packets += p.stats.packets
        out.flows_seen += p.stats.flows_seen
        for iface, st in p.stats.by_iface.items():
            out.by_iface[f"{p.ctx.pod}/{iface}"] = st
    return out


def _recent(pipelines: list[Pipeline]) -> list:
    if len(pipelines) == 1:
        return list(pipelines[0].recent)
    return list(heapq.merge(*(list(p.recent) for p in pipelines), key=lambda ev: ev.ts))


def live_session(kube: Kube, opts: WatchOptions, redact: bool = True) -> Session:
    """A Session that runs ``watch`` on the cluster with one fresh pipeline per pod."""
    pipelines: list[Pipeline] = []
    state = WatchState()

    async def run(hooks: SessionHooks):
        def make_pipeline(pod: str) -> Pipeline:
            pipelines.append(Pipeline.with_detectors(on_finding=hooks.on_finding, redact=redact, pod=pod,
                                                     keep_recent=KEEP_RECENT))
            return pipelines[-1]

        return await watch(kube, opts, make_pipeline, hooks.stop, hooks.progress, state)

    target = f"-l {opts.selector}" if opts.selector else f"{opts.target.kind}/{opts.target.name}"
    describe = f"context {kube.context}  namespace {opts.namespace}  {target}"
    controls: dict[str, LoggerControl] = {}

    def states() -> list[WatchState]:
        return [state, *state.pods]

    def first_pod() -> str | None:
        return state.pod or next((s.pod for s in state.pods if s.pod), None)

    def loggers() -> LoggerControl | None:
        pod = first_pod()
        if pod is None:
            return None
        if pod not in controls:
            controls[pod] = LoggerControl(EnvoyAdmin(kube, opts.namespace, pod, opts.admin_port))
        return controls[pod]

    def clusters():
        control = loggers()
        if control is None:
            return None
        return lambda: parse_clusters(control.admin.get("/clusters", {"format": "json"}).body)

    def access_log() -> list:
        return [e for p in pipelines for e in p.correlator.entries()]

    def problems() -> list[str]:
        return [f"pod/{st.pod} {line}" for st in states() for line in st.stream_problems]

    def drops() -> dict[str, int | None]:
        return {f"{cap.pod}/{cap.iface}": cap.dropped_by_kernel for st in states() for cap in st.captures}

    def capture_files() -> dict[str, str]:
        """Evidence source (``pod/iface``) -> the file holding its bytes (--write-pcap, else the spool)."""
        return {f"{st.pod}/{iface}": path for st in states() for iface, path in
                {**st.spool_files, **st.pcap_files}.items() if st.pod}

    return Session(run=run, stats=lambda: merged_stats(pipelines) if pipelines else PipelineStats(),
                   problems=problems, drops=drops, packets=lambda: _recent(pipelines) if pipelines else (),
                   describe=describe, phase=lambda: state.phase, exit_when_done=opts.duration_s is not None,
                   loggers=loggers, clusters=clusters, pod=first_pod, access_log=access_log,
                   save_evidence=evidence_saver(capture_files), redact=redact)


def run_tui(kube: Kube, opts: WatchOptions, output: str, redact: bool = True) -> int:
    """``watch`` in the TUI. Without --write-pcap the capture bytes go to a private spool (owner-only, capped)
    so `s` can save a finding's packets; it is deleted when the screen closes."""
    spool = None
    if opts.write_pcap_dir is None:
        spool = Path(tempfile.mkdtemp(prefix="meshdoctor-spool-"))  # mode 0700
        opts = replace(opts, spool_dir=spool)
    try:
        return run_session(live_session(kube, opts, redact), output)
    finally:
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
