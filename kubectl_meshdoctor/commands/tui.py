"""Runs a session in the TUI (frontends/tui) and prints its report when the screen closes; what both `watch` and
`analyze --tui` share."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Mapping

from kubectl_meshdoctor.core.findings import Finding
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.exit_codes import EXIT_OK, EXIT_USAGE
from kubectl_meshdoctor.frontends.evidence_pcap import save_evidence
from kubectl_meshdoctor.frontends.report import rendered_for
from kubectl_meshdoctor.frontends.shown import one_line
from kubectl_meshdoctor.frontends.tui.session import Session

KEEP_RECENT = 10_000  # packets per pipeline the packets pane can filter (the reader yields only telling ones)


def evidence_saver(sources: Mapping[str, str] | Callable[[], Mapping[str, str]]):
    """``Session.save_evidence`` over capture files: ``sources`` maps evidence sources to files (or is a
    callable returning that map as it is at the time of saving)."""

    def save(f: Finding, path: str, overwrite: bool) -> str:
        files = sources() if callable(sources) else sources
        saved = save_evidence(f, files, path, overwrite)
        frames = ", ".join(f"{src}: {len(n)} frames" for src, n in saved.frames.items())
        return f"saved {saved.packets} packets to {saved.path} ({frames})"

    return save


def pods_lines(pipelines: list[Pipeline]) -> dict[str, list[AccessLogEntry]]:
    """Each pod's access-log lines as its pipeline's correlator holds them (Session.access_logs), when there are
    several pods ({} otherwise)."""
    if len(pipelines) < 2:
        return {}
    return {p.ctx.pod or "?": p.correlator.entries() for p in pipelines}


def run_session(session: Session, output: str, abandon: Callable[[], None] | None = None) -> int:
    """Run the app; on exit print the report (``output`` format) so the findings outlive the screen. SIGTERM and
    SIGHUP stop it as `q` does; ``abandon`` runs if a hung-up screen cannot wind down (frontends/tui/signals.py)."""
    from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp  # textual is imported only to draw

    app = MeshDoctorApp(session, (signal.SIGTERM, signal.SIGHUP), abandon)
    report = app.run()
    try:
        if app.error:
            sys.stderr.write(f"kubectl meshdoctor: error: {one_line(app.error)}\n")
            return EXIT_USAGE
        if report is None:
            return EXIT_OK
        for p in report.problems:
            sys.stderr.write(f"problem: {one_line(p.line())}\n")
        sys.stdout.write(rendered_for(output, report, sys.stdout))
        sys.stdout.flush()
    except OSError:  # the terminal is gone (SIGHUP): nobody is left to read it, and that is no error of ours
        pass
    code = EXIT_USAGE if app.error else report.exit_code() if report is not None else EXIT_OK
    if app.held:  # the threads the API server holds are not waited for
        from kubectl_meshdoctor.commands.watch.headless_stop import leave_now

        if abandon is not None:
            abandon()
        leave_now(code)
    return code
