"""What the triage desk (app.py) talks to: a ``Session``, one capture run, live or recorded. Kept apart from the
app so the commands that build sessions need no screen library to do so."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.findings import Finding
from kubectl_meshdoctor.core.pipeline import PipelineStats
from kubectl_meshdoctor.sinks.report import Report


@dataclass(slots=True)
class SessionHooks:
    """What a session calls back into, and the stop signal it must honour."""

    on_finding: Callable[[Finding], None]
    progress: Callable[[str], None]
    stop: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class Session:
    """A capture run for the app: ``run(hooks)`` returns the final report; ``stats()`` is polled for counts;
    ``describe`` is shown in the header (context, namespace, target)."""

    run: Callable[[SessionHooks], Awaitable[Report]]
    stats: Callable[[], PipelineStats]
    describe: str
    phase: Callable[[], str] = lambda: ""
    exit_when_done: bool = False  # leave the screen when the run ends by itself (watch --duration)
    loggers: Callable[[], object | None] = lambda: None  # a LoggerControl once the proxy is known
    clusters: Callable[[], Callable[[], dict] | None] = lambda: None  # a /clusters fetcher once known
    access_log: Callable[[], list] = lambda: []  # the access-log entries followed so far
    pod: Callable[[], str | None] = lambda: None
    problems: Callable[[], list[str]] = lambda: []  # input trouble so far (a lost capture stream), one line each
    packets: Callable[[], Sequence[PacketEvent]] = lambda: ()  # the latest packets analysed, oldest first
    drops: Callable[[], dict[str, int | None]] = lambda: {}  # capture -> packets dropped (None: not known yet)
    # Writes the finding's packets to a pcapng path (overwrite?) and returns a one-line summary; raises
    # sinks.evidence_pcap.SaveError. None when the session keeps no capture bytes.
    save_evidence: Callable[[Finding, str, bool], str] | None = None
    redact: bool = True
