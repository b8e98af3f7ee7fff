"""What the triage desk (app.py) talks to: a ``Session``, one capture run, live or recorded. Kept apart from the
app so the commands that build sessions need no screen library to do so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kubectl_meshdoctor.core.events import EnvoyCountersEvent, PacketEvent
from kubectl_meshdoctor.core.findings import Finding
from kubectl_meshdoctor.core.live_join import JoinedView
from kubectl_meshdoctor.core.pipeline import PipelineStats
from kubectl_meshdoctor.core.report_model import Report
from kubectl_meshdoctor.envoy.access_log import AccessLogEntry


# The Envoy panes a session may offer (Session.panes): the sidecar's loggers (l), clusters and hosts (c), access
# log (a) and the /stats counters that moved (k).
LOGGERS, CLUSTERS, ACCESS_LOG, COUNTERS = "loggers", "clusters", "access_log", "counters"
SIDECAR_PANES = frozenset({LOGGERS, CLUSTERS, ACCESS_LOG})


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
    # the same at 80 columns, where the status line shows it beside the counts: kubectl's short words (``ns/x
    # ctx/y``) so that the namespace and context stay readable (s46); "" when ``describe`` is short already
    describe_short: str = ""
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

    def pod_of(self, source: str) -> str | None:
        """The pod whose capture a packet's ``source`` (PacketEvent.source) is, when the run names pods: the packets
        pane names it where one packet is seen in two pods. A live watch names each capture ``pod/iface``
        (live/run.py), so does this default; a run that names its captures otherwise says so. None: not known."""
        pod, sep, _ = source.rpartition("/")
        return pod if sep and pod in self.pods() else None

    def joined(self) -> JoinedView | None:
        """The findings so far as the report would give them (core/live_join.py), asked on a timer; None when the
        session has no such view (the findings as handed to ``on_finding`` are shown)."""
        return None

    def panes(self) -> frozenset[str]:
        """The Envoy panes the session offers now (LOGGERS, CLUSTERS, ACCESS_LOG, COUNTERS): those it has, or
        will have once the run reaches the proxy; asked on a timer, so the set may grow. A pane not offered is
        not on screen at all (no key, no help line). A session that says nothing offers the sidecar's three."""
        return SIDECAR_PANES

    def pane_pods(self, pane: str) -> list[str]:
        """The pods whose ``pane`` the session can show, in the run's order (the pane's `p` steps through them);
        [] when the run names none."""
        return self.pods() or ([pod] if (pod := self.pod()) else [])

    def loggers(self, pod: str | None = None) -> Loggers | None:
        """``pod``'s sidecar's loggers (the first pod's when None), once the proxy is known."""
        return None

    def clusters(self, pod: str | None = None) -> Callable[[], dict] | None:
        """A fetcher of ``pod``'s /clusters (parsed, envoy.clusters.parse_clusters; the first pod's when None):
        its sidecar's now, or the dump given (``dump_of``); None while not known. It blocks, and raises
        what reading raises (envoy.clusters.FormatError, OSError, kube.client.KubeError)."""
        return None

    def dump_of(self, pane: str, pod: str | None = None) -> str | None:
        """The dump file(s) ``pane`` (CLUSTERS, COUNTERS) reads for ``pod``, comma-separated; None when it asks
        the sidecar, now (and may ask again)."""
        return None

    def counters(self, pod: str | None = None) -> Callable[[], EnvoyCountersEvent] | None:
        """A fetcher of ``pod``'s /stats that moved (the first pod's when None): between the dumps given, or
        since Envoy's start for one dump (sources.envoy_files.read_counters), or since the run's first read of
        the sidecar's; its ``since`` and ``source`` say which. None when the session has none. It blocks, and
        raises what reading raises."""
        return None

    def access_log(self) -> list[AccessLogEntry]:
        """The access-log lines followed so far, in log order."""
        return []

    def access_log_count(self) -> int:
        """How many access-log lines access_log() would give (the status line asks twice a second)."""
        return len(self.access_log())

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
