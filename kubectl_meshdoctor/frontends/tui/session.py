"""What the triage desk (app.py) talks to: a ``Session``, one capture run, live or recorded. Kept apart from the
app so the commands that build sessions need no screen library to do so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.findings import Finding
from kubectl_meshdoctor.core.live_join import JoinedView
from kubectl_meshdoctor.core.pipeline import PipelineStats
from kubectl_meshdoctor.core.report_model import Report
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry


@dataclass(slots=True)
class SessionHooks:
    """What a session calls back into, and the stop signal it must honour."""

    on_finding: Callable[[Finding], None]
    progress: Callable[[str], None]
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class Loggers(Protocol):
    """The sidecar's loggers as the `l` pane drives them (commands.log_level.LoggerControl); both calls block."""

    @property
    def pod(self) -> str: ...

    def levels(self) -> dict[str, str]: ...

    def apply(self, spec: str) -> dict[str, str]: ...


class Session:
    """One capture run, live or recorded, as the triage desk sees it. ``run`` and ``stats`` are the run itself;
    the rest answer what the screen polls (at most twice a second), with defaults for what a run does not have
    (offline there is no proxy to ask). Nothing here may block but ``save_evidence``, which runs in a thread."""

    describe: str = ""  # shown in the header: context, namespace, target, or the files
    redact: bool = True  # hide secret header values on screen (--no-redact)
    exit_when_done: bool = False  # leave the screen when the run ends by itself (watch --duration)
    saves_evidence: bool = False  # whether save_evidence can write a finding's packets (s)
    live: bool = False  # a run on the cluster, whose sidecar the Envoy panes can reach (not recorded files)

    async def run(self, hooks: SessionHooks) -> Report | None:
        """Run the capture, report through ``hooks`` as it goes, honour ``hooks.stop``; return the report."""
        raise NotImplementedError

    def stats(self) -> PipelineStats:
        """Counts so far."""
        raise NotImplementedError

    def pod(self) -> str | None:
        """The pod whose sidecar the Envoy panes show, once known."""
        return None

    def pods(self) -> list[str]:
        """The pods of the run known so far, in the order the run names them ([] when it names none)."""
        return []

    def joined(self) -> JoinedView | None:
        """The findings so far as the report would give them (core/live_join.py), asked on a timer; None when the
        session has no such view (the findings as handed to ``on_finding`` are shown)."""
        return None

    def loggers(self) -> Loggers | None:
        """The sidecar's loggers, once the proxy is known."""
        return None

    def clusters(self, pod: str | None = None) -> Callable[[], dict] | None:
        """A fetcher of ``pod``'s sidecar's /clusters (parsed, envoy.clusters.parse_clusters; the first pod's when
        None), once known; it blocks."""
        return None

    def access_log(self) -> list[AccessLogEntry]:
        """The access-log lines followed so far, in log order."""
        return []

    def access_logs(self) -> dict[str, list[AccessLogEntry]]:
        """Each pod's access-log lines so far, in its log's order, when the run has several pods ({} otherwise)."""
        return {}

    def problems(self) -> list[str]:
        """Input trouble so far (a lost capture stream), one line each."""
        return []

    def packets(self) -> Sequence[PacketEvent]:
        """The latest packets analysed, oldest first (bounded)."""
        return ()

    def drops(self) -> dict[str, int | None]:
        """Capture -> packets the kernel dropped (None: not known yet)."""
        return {}

    def save_evidence(self, finding: Finding, path: str, overwrite: bool) -> str:
        """Write ``finding``'s packets to a pcapng at ``path``; return a one-line summary. Raises
        frontends.evidence_pcap.SaveError; NotImplementedError when ``saves_evidence`` is False."""
        raise NotImplementedError
