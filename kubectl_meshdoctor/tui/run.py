"""Wiring the live ``watch`` core to the app (the app itself knows nothing of Kubernetes)."""

from __future__ import annotations

import sys

from ..envoy.clusters import parse_clusters
from ..kube.admin import EnvoyAdmin
from ..kube.client import Kube
from ..loglevel import LoggerControl
from ..live import WatchOptions, WatchState, watch
from ..pipeline import Pipeline
from ..report import RENDERERS
from .app import MeshDoctorApp, Session, SessionHooks


def live_session(kube: Kube, opts: WatchOptions, redact: bool = True) -> Session:
    """A Session that runs ``watch`` on the cluster with a fresh pipeline."""
    pipeline_box: list[Pipeline] = []
    state = WatchState()
    empty = Pipeline.with_detectors()

    async def run(hooks: SessionHooks):
        pipeline = Pipeline.with_detectors(on_finding=hooks.on_finding, redact=redact)
        pipeline_box.append(pipeline)
        return await watch(kube, opts, pipeline, hooks.stop, hooks.progress, state)

    describe = (f"context {kube.context}  namespace {opts.namespace}  "
                f"{opts.target.kind}/{opts.target.name}")
    controls: dict[str, LoggerControl] = {}

    def loggers() -> LoggerControl | None:
        if state.pod is None:
            return None
        if state.pod not in controls:
            controls[state.pod] = LoggerControl(EnvoyAdmin(kube, opts.namespace, state.pod, opts.admin_port))
        return controls[state.pod]

    def clusters():
        control = loggers()
        if control is None:
            return None
        return lambda: parse_clusters(control.admin.get("/clusters", {"format": "json"}).body)

    return Session(run=run, stats=lambda: (pipeline_box[0] if pipeline_box else empty).stats,
                   describe=describe, phase=lambda: state.phase, exit_when_done=opts.duration_s is not None,
                   loggers=loggers, clusters=clusters, pod=lambda: state.pod,
                   access_log=lambda: pipeline_box[0].correlator.entries() if pipeline_box else [])


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
