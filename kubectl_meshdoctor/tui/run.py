"""Wiring the live ``watch`` core to the app (the app itself knows nothing of Kubernetes)."""

from __future__ import annotations

import sys

from ..envoy.clusters import parse_clusters
from ..kube.admin import EnvoyAdmin
from ..kube.client import Kube
from ..loglevel import LoggerControl
from ..live import WatchOptions, WatchState, watch
from ..pipeline import Pipeline, PipelineStats
from ..report import RENDERERS
from .app import MeshDoctorApp, Session, SessionHooks


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


def live_session(kube: Kube, opts: WatchOptions, redact: bool = True) -> Session:
    """A Session that runs ``watch`` on the cluster with one fresh pipeline per pod."""
    pipelines: list[Pipeline] = []
    state = WatchState()

    async def run(hooks: SessionHooks):
        def make_pipeline(pod: str) -> Pipeline:
            pipelines.append(Pipeline.with_detectors(on_finding=hooks.on_finding, redact=redact, pod=pod))
            return pipelines[-1]

        return await watch(kube, opts, make_pipeline, hooks.stop, hooks.progress, state)

    target = f"-l {opts.selector}" if opts.selector else f"{opts.target.kind}/{opts.target.name}"
    describe = f"context {kube.context}  namespace {opts.namespace}  {target}"
    controls: dict[str, LoggerControl] = {}

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
        return [f"pod/{cap.pod} {cap.iface}: {cap.error}" for st in (state, *state.pods) for cap in st.captures
                if cap.error]

    return Session(run=run, stats=lambda: merged_stats(pipelines) if pipelines else PipelineStats(),
                   problems=problems,
                   describe=describe, phase=lambda: state.phase, exit_when_done=opts.duration_s is not None,
                   loggers=loggers, clusters=clusters, pod=first_pod, access_log=access_log)


def run_tui(kube: Kube, opts: WatchOptions, output: str, redact: bool = True) -> int:
    """Run the TUI; on exit print the report (``output`` format) so the findings outlive the screen."""
    app = MeshDoctorApp(live_session(kube, opts, redact))
    report = app.run()
    if app.error:
        sys.stderr.write(f"kubectl meshdoctor: error: {app.error}\n")
        return 2
    if report is None:
        return 0
    for p in report.problems:
        sys.stderr.write(f"problem: {p['where']}: {p['what']}\n")
    sys.stdout.write(RENDERERS[output](report))
    return report.exit_code()
